"""mcp 1.x: uninstrument() restores the SDK, also under an open session; instrument() is idempotent and may come
mid-session. Fault injection (no fault changes results, on any transport) and a blocked metrics path, alike on both
majors: tests/adapters/scenarios/test_faults.py."""

from __future__ import annotations

from typing import Any

import anyio
import mcp.client.stdio as client_stdio
import mcp.server.fastmcp.server as fastmcp_server
import mcp.server.stdio as server_stdio
from mcp.client.session import ClientSession
from mcp.client.streamable_http import StreamableHTTPTransport
from mcp.server.fastmcp import FastMCP
from mcp.server.session import ServerSession
from mcp.server.sse import SseServerTransport
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.shared.memory import create_connected_server_and_client_session
from mcp.shared.session import BaseSession, RequestResponder
from opentelemetry.trace import SpanKind

from mcp_token_otel.instrumentation import instrument, uninstrument
from tests.helpers.support import assert_client_call_recorded_once

from .conftest import Otel, make_config

N = 20

# Every attribute the 1.x adapter patches, as its owner holds it.
PATCHED: list[tuple[Any, str]] = [
    (BaseSession, "__init__"),
    (BaseSession, "__aexit__"),
    (BaseSession, "send_request"),
    (BaseSession, "send_notification"),
    (ClientSession, "_received_notification"),
    (ServerSession, "_received_notification"),
    (RequestResponder, "__enter__"),
    (RequestResponder, "__exit__"),
    (RequestResponder, "respond"),
    (StreamableHTTPTransport, "__init__"),
    (client_stdio, "_create_platform_compatible_process"),
    (StreamableHTTPServerTransport, "connect"),
    (SseServerTransport, "connect_sse"),
    (server_stdio, "stdio_server"),
    (fastmcp_server, "stdio_server"),
]


def snapshot() -> list[Any]:
    return [vars(owner).get(name) for owner, name in PATCHED]


def make_server() -> FastMCP:
    server = FastMCP("faults")

    @server.tool()
    def text(n: int) -> str:
        return "abc " * n

    @server.tool()
    def boom() -> str:
        raise ValueError("tool failed")

    return server


def calls() -> list[dict[str, Any]]:
    async def main() -> list[dict[str, Any]]:
        out = []
        with anyio.fail_after(30):
            async with create_connected_server_and_client_session(make_server()) as client:
                for i in range(N):
                    result = await client.call_tool("boom" if i % 7 == 6 else "text", {"n": i * 10})
                    out.append(result.model_dump())
        return out

    return anyio.run(main)


def test_uninstrument_restores_sdk(otel: Otel) -> None:
    from mcp_token_otel.instrumentation import McpTokenInstrumentor

    before = snapshot()
    instrument(make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    patched = snapshot()
    instrument()  # idempotent: nothing wrapped twice
    McpTokenInstrumentor().instrument()  # the other entry point: a no-op too
    assert snapshot() == patched
    assert all(a is not b for a, b in zip(before, patched, strict=True))
    uninstrument()
    uninstrument()  # idempotent
    after = snapshot()
    assert all(a is b for a, b in zip(before, after, strict=True)), [
        f"{owner.__name__}.{name}" for (owner, name), a, b in zip(PATCHED, before, after, strict=True) if a is not b
    ]
    # Names that exist on the classes only by inheritance were not turned into own attributes.
    assert "send_request" not in vars(ClientSession) and "__aexit__" not in vars(ServerSession)

    count = len(otel.spans())
    assert calls()  # still works, and nothing is measured any more
    assert len(otel.spans()) == count


def test_session_started_while_instrumented_survives_uninstrument(otel: Otel) -> None:
    """A session open across uninstrument() keeps working and stops being measured."""
    instrument(make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    try:

        async def main() -> None:
            async with create_connected_server_and_client_session(make_server()) as client:
                await client.call_tool("text", {"n": 1})
                uninstrument()
                await client.call_tool("text", {"n": 2})

        anyio.run(main)
    finally:
        uninstrument()
    assert len([s for s in otel.spans() if s.name == "tools/call text" and s.kind is SpanKind.CLIENT]) == 1


def test_double_instrument_one_span_per_call(otel: Otel) -> None:
    first = instrument(make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    second = instrument(make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    assert first is second
    try:

        async def main() -> None:
            async with create_connected_server_and_client_session(make_server()) as client:
                await client.call_tool("text", {"n": 100})

        anyio.run(main)
    finally:
        uninstrument()
    spans = otel.spans()
    assert len([s for s in spans if s.name == "tools/call text" and s.kind is SpanKind.CLIENT]) == 1
    assert len([s for s in spans if s.name == "tools/call text" and s.kind is SpanKind.SERVER]) == 1
    (span,) = [s for s in spans if s.name == "tools/call text" and s.kind is SpanKind.CLIENT]
    assert_client_call_recorded_once(otel, "text", span)


def test_instrument_mid_session(otel: Otel) -> None:
    """Sessions built before instrument() are measured from then on and still end their budget on exit."""
    recorder: Any = None

    async def main() -> None:
        nonlocal recorder
        async with create_connected_server_and_client_session(make_server()) as client:
            await client.call_tool("text", {"n": 1})
            # Built before instrument(), the sessions are not known to be in process: propagation is opt-in.
            recorder = instrument(
                make_config(spans={"propagate_context": "always"}),
                tracer_provider=otel.tracer_provider,
                meter_provider=otel.meter_provider,
            )
            await client.call_tool("text", {"n": 2})
            assert recorder.states()["client"]["ok"] == 1

    try:
        anyio.run(main)
    finally:
        uninstrument()
    (client,) = [s for s in otel.spans() if s.name == "tools/call text" and s.kind is SpanKind.CLIENT]
    (srv,) = [s for s in otel.spans() if s.name == "tools/call text" and s.kind is SpanKind.SERVER]
    assert srv.parent is not None and srv.parent.span_id == client.context.span_id
    assert "mcp.protocol.version" not in client.attributes  # the initialize result was not seen
    assert srv.attributes["mcp.protocol.version"]  # the server reads it from the session's client params
    assert recorder.states()["client"] == {"ok": 0, "warning": 0, "exhausted": 0}
    assert not recorder.error_counts
