"""The ``server`` label on live sessions and on the client's ``initialize`` request, through a real mcp 1.x
session (in memory): the 1.x adapter feeds the same recorder logic as 2.x
(tests/adapters/mcp_v2/test_v2_server_label.py)."""

from __future__ import annotations

import anyio
from mcp.server.fastmcp import FastMCP
from mcp.shared.memory import create_connected_server_and_client_session

from mcp_token_otel.instrumentation import instrument, uninstrument

from .conftest import Otel, make_config, samples

SERVER = "label-v1"


def test_v1_sessions_and_client_initialize_carry_the_server(otel: Otel) -> None:
    recorder = instrument(make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    assert recorder is not None
    server = FastMCP(SERVER)

    @server.tool()
    def ping() -> str:
        return "pong"

    live: list[list[tuple[dict[str, str], float]]] = []
    try:

        async def main() -> None:
            async with create_connected_server_and_client_session(server._mcp_server) as session:
                await session.call_tool("ping", {})
                live.append(samples(recorder, "mcp_token_sessions", state="ok"))

        anyio.run(main)
    finally:
        uninstrument()
    (open_sessions,) = live
    assert {(lab["side"], lab["server"]): v for lab, v in open_sessions if v} == {
        ("client", SERVER): 1, ("server", SERVER): 1}
    # the client's initialize, request and result, both recorded with the server its result named
    initialize = samples(recorder, "mcp_token_tokens_total", side="client", method="initialize")
    assert sorted((lab["direction"], lab["server"]) for lab, v in initialize if v > 0) == [
        ("input", SERVER), ("output", SERVER)]
    responses = samples(recorder, "mcp_token_message_tokens_count", side="client", method="initialize")
    assert [(lab["direction"], lab["server"], v) for lab, v in responses] == [("output", SERVER, 1.0)]
    assert recorder.error_counts == {}
