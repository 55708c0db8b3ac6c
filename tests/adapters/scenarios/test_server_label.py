"""The ``server`` label on live sessions, instrumentation errors, the configured budgets and the client's
``initialize`` request, through real sessions in memory (JSON-RPC, as over a transport) of either SDK major, on
both the Prometheus and the OpenTelemetry paths. The same figures without an SDK: tests/recorder/test_server_label.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from mcp_token_otel.instrumentation import instrument, uninstrument
from mcp_token_otel.recorder import TokenRecorder
from mcp_token_otel.semconv import A_SERVER_NAME, A_SESSION_STATE, M_SCOPE, M_SIDE, M_STAGE
from tests.helpers.faults import RaisingListener
from tests.helpers.support import Otel, make_config
from tests.helpers.support import scrape as scrape_recorder

from .sdk import Driver

Found = dict[str, list[tuple[dict[str, str], float]]]


def make_server(sdk: Driver, name: str) -> Any:
    server = sdk.server(name)

    @server.tool()
    def ping() -> str:
        """Answers pong."""
        return "pong"

    return server


def scrape(recorder: TokenRecorder) -> Found:
    return scrape_recorder(recorder).samples


def value(found: Found, name: str, **labels: str) -> float:
    rows = [v for lab, v in found.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(rows) == 1, (name, labels, found.get(name))
    return rows[0]


def instrumented(otel: Otel, **config: Any) -> TokenRecorder:
    recorder = instrument(make_config(**config), tracer_provider=otel.tracer_provider,
                          meter_provider=otel.meter_provider)
    assert recorder is not None
    return recorder


@pytest.fixture
def cleanup() -> Iterator[None]:
    yield
    uninstrument()


def test_live_sessions_per_server_and_the_client_initialize_with_its_server(otel: Otel, cleanup: None,
                                                                           sdk: Driver) -> None:
    recorder = instrumented(otel)
    seen: dict[str, Found] = {}

    async def main() -> None:
        async with sdk.connect(make_server(sdk, "alpha"), sdk.jsonrpc_mode) as a, \
                sdk.connect(make_server(sdk, "beta"), sdk.jsonrpc_mode) as b:
            assert sdk.text(await a.call_tool("ping", {})) == "pong"
            assert sdk.text(await b.call_tool("ping", {})) == "pong"
            seen["open"] = scrape(recorder)
            otel_points = otel.metrics()["mcp_token.sessions"]
            seen["otel"] = {"": [(dict(p.attributes), p.value) for p in otel_points]}

    anyio.run(main)
    found = seen["open"]
    for side in ("client", "server"):
        for server in ("alpha", "beta"):
            assert value(found, "mcp_token_sessions", side=side, server=server, state="ok") == 1
            assert value(found, "mcp_token_sessions", side=side, server=server, state="exhausted") == 0
        # no session is unnamed: no placeholder row, and never an empty server
        assert not [lab for lab, _ in found["mcp_token_sessions"] if lab["server"] in ("", "_unknown")]
    # ...and no other session is live
    assert {(lab["side"], lab["server"]): v for lab, v in found["mcp_token_sessions"] if v} == {
        ("client", "alpha"): 1, ("server", "alpha"): 1, ("client", "beta"): 1, ("server", "beta"): 1}
    # The client's initialize request is recorded with the server its result named, never with server="".
    for server in ("alpha", "beta"):
        assert value(found, "mcp_token_tokens_total", side="client", server=server, method="initialize",
                     direction="input") > 0
    assert not [lab for lab, _ in found["mcp_token_tokens_total"]
                if lab["method"] == "initialize" and lab["server"] == ""]
    # The OpenTelemetry gauge carries the server too.
    otel_rows = seen["otel"][""]
    for side in ("client", "server"):
        for server in ("alpha", "beta"):
            assert [v for attrs, v in otel_rows if attrs.get(M_SIDE) == side and attrs.get(A_SERVER_NAME) == server
                    and attrs.get(A_SESSION_STATE) == "ok"] == [1]
    # The sessions ended with their clients: the series stay, at 0.
    after = scrape(recorder)
    for side in ("client", "server"):
        for server in ("alpha", "beta"):
            assert value(after, "mcp_token_sessions", side=side, server=server, state="ok") == 0
    # The client's initialize, request and result, both recorded with the server its result named.
    initialize = [(lab, v) for lab, v in after["mcp_token_tokens_total"]
                  if lab["side"] == "client" and lab["method"] == "initialize"]
    assert sorted((lab["direction"], lab["server"]) for lab, v in initialize if v > 0) == [
        ("input", "alpha"), ("input", "beta"), ("output", "alpha"), ("output", "beta")]
    responses = [(lab, v) for lab, v in after["mcp_token_message_tokens_count"]
                 if lab["side"] == "client" and lab["method"] == "initialize"]
    assert sorted((lab["direction"], lab["server"], v) for lab, v in responses) == [
        ("output", "alpha", 1.0), ("output", "beta", 1.0)]
    assert recorder.error_counts == {}


def test_faults_and_budgets_carry_the_configured_server_name(otel: Otel, cleanup: None, sdk: Driver) -> None:
    recorder = instrumented(otel, metrics={"server_name": "billing"})
    recorder.listeners.append(RaisingListener())  # fails on every answer: each failure is a counted fault

    async def main() -> None:
        async with sdk.connect(make_server(sdk, "alpha"), sdk.jsonrpc_mode) as client:
            assert sdk.text(await client.call_tool("ping", {})) == "pong"

    anyio.run(main)
    recorder.flush()
    faults = recorder.error_counts["metrics"]
    assert faults >= 4  # every answer of the session (initialize, tools/call, both sides)
    found = scrape(recorder)
    assert value(found, "mcp_token_instrumentation_errors_total", stage="metrics", server="billing") == faults
    assert value(found, "mcp_token_instrumentation_errors_total", stage="estimate", server="billing") == 0
    assert value(found, "mcp_token_output_rate_budget_tokens_per_second", scope="tool", server="billing") == 100
    assert value(found, "mcp_token_sessions", side="server", server="billing", state="ok") == 0  # override wins
    points = otel.metrics()
    errors = [(dict(p.attributes), p.value) for p in points["mcp_token.instrumentation.errors"]]
    # As on /metrics, the estimate stage's series exists at 0 before any estimate fails.
    assert sorted(errors, key=lambda e: e[0][M_STAGE]) == [({M_STAGE: "estimate", A_SERVER_NAME: "billing"}, 0),
                                                          ({M_STAGE: "metrics", A_SERVER_NAME: "billing"}, faults)]
    budgets = {p.attributes[M_SCOPE]: p.attributes.get(A_SERVER_NAME) for p in points["mcp_token.output_rate_budget"]}
    assert budgets == {"tool": "billing", "service": "billing"}
