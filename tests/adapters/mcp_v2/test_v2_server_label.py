"""The ``server`` label on the families that lacked it (issue 11): live sessions, instrumentation errors, the
configured budgets, and the client's ``initialize`` request, through real mcp 2.x sessions (in memory), on
both the Prometheus and the OpenTelemetry paths."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer

from mcp_token_otel.core.measure import Policy, measure_request
from mcp_token_otel.instrumentation import instrument, uninstrument
from mcp_token_otel.recorder import TokenRecorder
from mcp_token_otel.semconv import A_SERVER_NAME, A_SESSION_STATE, M_SCOPE, M_SIDE, M_STAGE
from tests.helpers.faults import RaisingListener
from tests.helpers.support import scrape as scrape_recorder

from .conftest import Otel, make_config

Found = dict[str, list[tuple[dict[str, str], float]]]


def make_server(name: str) -> MCPServer:
    server = MCPServer(name)

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


def test_live_sessions_per_server_and_the_client_initialize_with_its_server(otel: Otel, cleanup: None) -> None:
    recorder = instrumented(otel)
    seen: dict[str, Found] = {}

    async def main() -> None:
        async with Client(make_server("alpha"), mode="legacy") as a, Client(make_server("beta"), mode="legacy") as b:
            assert (await a.call_tool("ping", {})).content[0].text == "pong"
            assert (await b.call_tool("ping", {})).content[0].text == "pong"
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
    assert recorder.error_counts == {}


def test_faults_and_budgets_carry_the_configured_server_name(otel: Otel, cleanup: None) -> None:
    recorder = instrumented(otel, metrics={"server_name": "billing"})
    recorder.listeners.append(RaisingListener())  # fails on every answer: each failure is a counted fault

    async def main() -> None:
        async with Client(make_server("alpha"), mode="legacy") as client:
            assert (await client.call_tool("ping", {})).content[0].text == "pong"

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


def _raising_estimator(text: str) -> int:
    raise RuntimeError("estimator down")


def test_faults_without_a_configured_name_carry_the_proxy_name_or_the_placeholder(otel: Otel) -> None:
    for name, expected in ((None, "_unknown"), ("px", "px")):
        recorder = TokenRecorder(make_config(), otel.tracer_provider, otel.meter_provider, server_name=name)
        recorder.policy = Policy(estimator=_raising_estimator, estimator_name="broken")
        call = recorder.begin("client", "tools/call", {"name": "t"}, "s1")
        call.open()  # a fault
        call.close()
        found = scrape(recorder)
        assert recorder.error_counts["estimate"] == 1
        assert value(found, "mcp_token_instrumentation_errors_total", stage="estimate", server=expected) == 1
        recorder.close()


def test_an_initialize_that_never_gets_its_result_is_still_recorded(otel: Otel) -> None:
    recorder = TokenRecorder(make_config(), otel.tracer_provider, otel.meter_provider)
    params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}
    measured = measure_request("initialize", params, recorder.policy)
    call = recorder.begin("client", "initialize", params, "conn-1")
    call.open()
    found = scrape(recorder)
    assert "mcp_token_tokens_total" not in found or not [
        lab for lab, _ in found["mcp_token_tokens_total"] if lab["method"] == "initialize"]
    call.close()  # the connection dropped before the result
    recorder.end_session("client", "conn-1")
    found = scrape(recorder)
    assert value(found, "mcp_token_tokens_total", side="client", method="initialize",
                 direction="input") == measured.total_tokens
    recorder.close()


def test_a_failed_initialize_is_recorded_with_its_error(otel: Otel) -> None:
    recorder = TokenRecorder(make_config(), otel.tracer_provider, otel.meter_provider)
    call = recorder.begin("client", "initialize", {"protocolVersion": "1999-01-01"}, "conn-2")
    call.open()
    call.error({"code": -32602, "message": "bad version"})
    call.close()
    found = scrape(recorder)
    # one request and its error, each counted once (requests have no histogram by default: their counter)
    assert value(found, "mcp_token_tokens_total", side="client", server="_unknown", method="initialize",
                 direction="input") > 0
    assert value(found, "mcp_token_message_tokens_count", side="client", server="_unknown", method="initialize",
                 direction="output") == 1
    recorder.close()
