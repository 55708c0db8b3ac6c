"""instrument() when things go wrong at set-up: the application keeps running, nothing is left half-done."""

from __future__ import annotations

import socket
from typing import Any

import anyio
import pytest

from mcp_token_otel.instrumentation import instrument, metrics_app, prometheus_service, uninstrument
from tests.helpers.faults import shared_files_mode
from tests.helpers.support import Scrape, scrape

from .conftest import Otel, free_port, make_config


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
            assert f"cannot serve /metrics on 127.0.0.1:{port}" in caplog.text
            call = recorder.begin("client", "tools/call", {"name": "t"}, None)
            call.open()
            call.result({"content": [{"type": "text", "text": "measured " * 20}]})
            call.close()
            # The registry still serves the recorder's metrics (to mount with metrics_app()), each once.
            served = Scrape(prometheus_service().exposition().decode())
            labels = {"tool": "t", "direction": "output"}
            tokens = served.value("mcp_token_tokens_total", **labels)
            assert tokens > 0 and tokens == scrape(recorder).value("mcp_token_tokens_total", **labels)
            assert metrics_app() is not None
        finally:
            uninstrument()


def test_a_missing_multiprocess_directory_is_logged_and_nothing_is_half_done(
    otel: Otel, caplog: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """PROMETHEUS_MULTIPROC_DIR naming a directory that does not exist: instrument() neither raises nor leaves
    anything half-built; it says so once and this process's metrics stay in memory (docs/configuration.md: the
    multiprocess files are the optional part skipped), served on /metrics and through OpenTelemetry; a second
    call is the same recorder."""
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    missing = tmp_path / "gone"
    shared_files_mode(monkeypatch, missing)  # as prometheus-client sets itself up with the variable set at start
    recorder = instrument(make_config(prometheus={"enabled": True, "port": 0}),
                          tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    try:
        assert recorder is not None
        assert instrument() is recorder
        assert caplog.text.count(f"PROMETHEUS_MULTIPROC_DIR={str(missing)!r}") == 1
        assert not missing.exists()  # nothing written anywhere
        service = prometheus_service()
        assert service is not None and service.server is not None  # /metrics serves the in-memory metrics
        assert metrics_app() is not None
        server = MCPServer("multiproc")

        @server.tool()
        def hello() -> str:
            return "hello " * 50

        async def main() -> None:
            async with Client(server, mode="legacy") as client:
                await client.call_tool("hello", {})

        anyio.run(main)
        assert any(s.attributes.get("mcp_token.output_tokens") for s in otel.spans() if s.name == "tools/call hello")
        labels = {"side": "server", "tool": "hello", "direction": "output"}
        served = Scrape(service.exposition().decode()).value("mcp_token_tokens_total", **labels)
        assert served > 0
        assert [p.value for p in otel.metrics()["mcp_token.tokens"] if p.attributes.get("gen_ai.tool.name") == "hello"
                and p.attributes["mcp_token.direction"] == "output"
                and p.attributes["mcp_token.side"] == "server"] == [served]
        assert recorder.error_counts == {}
    finally:
        uninstrument()


def test_a_failing_sdk_hook_closes_the_metrics_server_it_started(
    otel: Otel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All or nothing: /metrics started before the hooks is stopped again when hooking fails."""
    import mcp.shared.jsonrpc_dispatcher as jrd

    port = free_port()
    monkeypatch.delattr(jrd, "otel_span")
    assert instrument(make_config(prometheus={"enabled": True, "port": port}),
                      tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider) is None
    assert prometheus_service() is None
    with socket.socket() as again:  # the port is free again: the server was closed
        again.bind(("127.0.0.1", port))


def test_otlp_set_up_that_fails_is_logged_and_measuring_goes_on(
    otel: Otel, caplog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """otel.configure with an exporter that cannot be built: the project's configure_otel path raises inside
    instrument(), which logs one line and instruments with the providers it was given."""
    from mcp_token_otel.emitters import otel_setup

    def broken_exporter() -> Any:
        raise ImportError("no module named grpc (exporter fault)")

    monkeypatch.setattr(otel_setup, "span_exporter", broken_exporter)
    monkeypatch.setattr(otel_setup, "_tracing_unconfigured", lambda: True)
    monkeypatch.setattr(otel_setup, "_metrics_unconfigured", lambda: False)
    recorder = instrument(make_config(otel={"configure": True}),
                          tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    try:
        assert recorder is not None
        assert "cannot set up OTLP export (otel.configure), measuring without it: no module named grpc" in caplog.text
    finally:
        uninstrument()


def test_an_estimator_whose_extra_is_missing_is_a_config_error(otel: Otel, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from mcp.server.lowlevel.server import Server

    from mcp_token_otel.config import ConfigError
    from mcp_token_otel.core import estimators

    monkeypatch.setitem(sys.modules, "tiktoken", None)  # as if the exact extra were not installed
    monkeypatch.setattr(estimators, "_encodings", {})  # and no encoding was loaded earlier in this process
    before = Server.__init__
    with pytest.raises(ConfigError, match=r"config key 'estimator': .*pip install 'mcp-token-otel\[exact\]'"):
        instrument(make_config(estimator="tiktoken:o200k_base"),
                   tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    assert Server.__init__ is before
