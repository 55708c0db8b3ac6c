"""instrument() when things go wrong at set-up: the application keeps running, nothing is left half-done."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from mcp_token_otel.emitters.prometheus_metrics import PrometheusMetrics
from mcp_token_otel.instrumentation import instrument, prometheus_service, uninstrument

from .conftest import Otel, make_config


def test_an_sdk_whose_hooks_moved_is_left_untouched(otel: Otel, monkeypatch: pytest.MonkeyPatch) -> None:
    import mcp.shared.jsonrpc_dispatcher as jrd
    from mcp.client.session import ClientSession
    from mcp.server.lowlevel.server import Server

    before = (Server.__init__, ClientSession.__init__)
    monkeypatch.delattr(jrd, "otel_span")  # as if a release renamed the private hook
    assert instrument(make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider) is None
    assert (Server.__init__, ClientSession.__init__) == before  # what was patched first is restored
    uninstrument()  # nothing active: a no-op


def test_a_taken_metrics_port_is_reported_and_measuring_goes_on(otel: Otel, caplog: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        recorder = instrument(make_config(prometheus={"enabled": True, "port": port}),
                              tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
        try:
            assert recorder is not None
            assert prometheus_service() is not None and prometheus_service().server is None
            assert sum(isinstance(s, PrometheusMetrics) for s in recorder.sinks) == 1
            assert f"cannot serve /metrics on 127.0.0.1:{port}" in caplog.text
        finally:
            uninstrument()
