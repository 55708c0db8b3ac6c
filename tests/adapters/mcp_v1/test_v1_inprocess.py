"""mcp 1.x in process: create_connected_server_and_client_session with FastMCP, both sides instrumented. Budget
transitions in process, alike on both majors: tests/adapters/scenarios/test_inprocess.py."""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp.server.fastmcp import Context, FastMCP
from mcp.shared.exceptions import McpError
from mcp.shared.memory import create_connected_server_and_client_session
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from .conftest import MCP_VERSION, Otel, make_config, no_usage_attributes

try:
    from mcp.shared.exceptions import UrlElicitationRequiredError
except ImportError:  # added in mcp 1.24
    UrlElicitationRequiredError = None  # type: ignore[assignment,misc]

URL_ELICITATION_REQUIRED = -32042
METHOD_NOT_FOUND = -32601
# From mcp 1.25 FastMCP lets a tool's UrlElicitationRequiredError through as a JSON-RPC error (before: isError).
ELICITATION_ERROR_PASSES_TOOLS = MCP_VERSION >= (1, 25)


def make_server() -> FastMCP:
    server = FastMCP("demo")

    @server.tool()
    def big(n: int) -> str:
        """Return n characters."""
        return "x" * n

    @server.tool()
    def boom() -> str:
        raise ValueError("tool failed")

    @server.tool()
    def mcp_err() -> str:
        # The one McpError that FastMCP 1.x (>= 1.25) lets through a tool (others become isError results).
        raise UrlElicitationRequiredError([])  # type: ignore[misc]

    @server.tool()
    async def asks(ctx: Context[Any, Any, Any]) -> str:
        message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text="hello?"))
        reply = await ctx.session.create_message(messages=[message], max_tokens=10)
        await ctx.info("sampled")  # a server->client notification
        assert isinstance(reply.content, types.TextContent)
        return reply.content.text

    @server.prompt()
    def greet(name: str) -> str:
        return f"Hello {name}"

    return server


async def sampling_callback(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text="hi!"), model="test-model"
    )


def by_name(spans: list[ReadableSpan], name: str, kind: SpanKind) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name and s.kind is kind]


def test_client_and_server_spans(otel: Otel, instrumented: Any) -> None:
    tracer = otel.tracer_provider.get_tracer("test")

    async def main() -> None:
        async with create_connected_server_and_client_session(make_server()) as client:
            with tracer.start_as_current_span("agent-step"):
                result = await client.call_tool("big", {"n": 40_000})
            assert isinstance(result.content[0], types.TextContent)
            assert result.content[0].text == "x" * 40_000

    anyio.run(main)
    spans = otel.spans()
    (step,) = [s for s in spans if s.name == "agent-step"]
    (client,) = by_name(spans, "tools/call big", SpanKind.CLIENT)
    (srv,) = by_name(spans, "tools/call big", SpanKind.SERVER)
    # One trace: agent-step -> CLIENT -> SERVER (parent extracted from params._meta).
    assert client.parent is not None and client.parent.span_id == step.context.span_id
    assert srv.parent is not None and srv.parent.span_id == client.context.span_id
    assert srv.context.trace_id == client.context.trace_id == step.context.trace_id
    for span in (client, srv):
        a = span.attributes
        assert span.instrumentation_scope.name == "mcp_token_otel"
        assert a["mcp.method.name"] == "tools/call"
        assert a["gen_ai.tool.name"] == "big"
        assert a["gen_ai.operation.name"] == "execute_tool"
        assert a["mcp.protocol.version"] == types.LATEST_PROTOCOL_VERSION
        assert a["mcp_token.input_tokens"] > 0
        assert a["mcp_token.output_tokens"] >= 10_000
        assert a["mcp_token.overhead_tokens"] > 0  # structuredContent duplicates the text
        assert 0 < a["mcp_token.overhead_ratio"] < 1
        assert a["mcp_token.risk_tier"] == "critical"
        assert a["mcp_token.estimator"] == "chars/4"
        assert a["mcp_token.session.state"] == "ok"
        assert a["mcp_token.session.tokens"] >= a["mcp_token.output_tokens"]
        assert a["mcp_token.session.utilization"] > 0
        assert "network.transport" not in a  # in-memory has no OTel value
        assert "mcp.session.id" not in a  # no protocol session in memory
        assert "error.type" not in a and span.status.status_code is StatusCode.UNSET
        assert no_usage_attributes(a)
        assert not any(k.startswith("gen_ai.tool.call.") for k in a)  # content capture is opt-in
        assert [e.name for e in span.events] == ["mcp_token.risk"]
        (risk,) = span.events
        assert risk.attributes is not None and risk.attributes["mcp_token.risk_tier"] == "critical"
        assert "critical" in str(risk.attributes["mcp_token.advisory"])
    assert client.attributes["jsonrpc.request.id"] == srv.attributes["jsonrpc.request.id"]
    assert client.attributes["mcp_token.output_tokens"] == srv.attributes["mcp_token.output_tokens"]
    # The handshake is traced too, and non-tool methods carry no gen_ai.operation.name.
    (init_client,) = by_name(spans, "initialize", SpanKind.CLIENT)
    (init_srv,) = by_name(spans, "initialize", SpanKind.SERVER)
    assert init_srv.parent is not None and init_srv.parent.span_id == init_client.context.span_id
    assert init_client.attributes["mcp.protocol.version"] == types.LATEST_PROTOCOL_VERSION
    assert "gen_ai.operation.name" not in init_client.attributes
    # Inbound notifications get a SERVER span with input tokens (as in 2.x), and stay off the budget.
    (initialized,) = by_name(spans, "notifications/initialized", SpanKind.SERVER)
    assert "mcp_token.input_tokens" in initialized.attributes
    assert "mcp_token.session.tokens" not in initialized.attributes


def test_handler_sees_server_span(otel: Otel, instrumented: Any) -> None:
    """The SERVER span is attached in the handler's task: tool code runs inside it."""
    from opentelemetry import trace

    server = make_server()
    seen: list[str] = []

    @server.tool()
    def current() -> str:
        seen.append(trace.get_current_span().name)  # type: ignore[attr-defined]
        return "ok"

    async def main() -> None:
        async with create_connected_server_and_client_session(server) as client:
            await client.call_tool("current", {})

    anyio.run(main)
    assert seen == ["tools/call current"]


def test_sampling_round_trip_is_one_trace(otel: Otel, instrumented: Any) -> None:
    """client tools/call -> server handler -> server sampling request (CLIENT) -> client callback (SERVER)."""

    async def main() -> None:
        async with create_connected_server_and_client_session(
            make_server(), sampling_callback=sampling_callback
        ) as client:
            result = await client.call_tool("asks", {})
            assert isinstance(result.content[0], types.TextContent) and result.content[0].text == "hi!"

    anyio.run(main)
    spans = otel.spans()
    (call,) = by_name(spans, "tools/call asks", SpanKind.CLIENT)
    (handler,) = by_name(spans, "tools/call asks", SpanKind.SERVER)
    (sample_out,) = by_name(spans, "sampling/createMessage", SpanKind.CLIENT)
    (sample_in,) = by_name(spans, "sampling/createMessage", SpanKind.SERVER)
    chain = [call, handler, sample_out, sample_in]
    for parent, child in itertools.pairwise(chain):
        assert child.parent is not None and child.parent.span_id == parent.context.span_id
    assert len({s.context.trace_id for s in chain}) == 1
    for span in (sample_out, sample_in):
        assert span.attributes["mcp_token.input_tokens"] > 0
        assert span.attributes["mcp_token.output_tokens"] > 0
        assert span.attributes["jsonrpc.request.id"]
    # The log notification the server sent was measured (metrics only: no span, no budget).
    points = otel.metrics()["mcp_token.tokens"]  # notifications are requests: their tokens in the counter
    sent = {(p.attributes["mcp_token.side"], p.attributes["mcp.method.name"]) for p in points}
    assert ("server", "notifications/message") in sent
    assert ("client", "notifications/message") in sent
    assert ("client", "notifications/initialized") in sent


def test_prompt_and_content_capture(otel: Otel) -> None:
    from mcp_token_otel.instrumentation import instrument, uninstrument

    instrument(
        make_config(spans={"capture_content": True, "max_content_chars": 50}),
        tracer_provider=otel.tracer_provider,
        meter_provider=otel.meter_provider,
    )
    try:

        async def main() -> None:
            async with create_connected_server_and_client_session(make_server()) as client:
                await client.get_prompt("greet", {"name": "Ada"})
                await client.call_tool("big", {"n": 500})

        anyio.run(main)
    finally:
        uninstrument()
    spans = otel.spans()
    for kind in (SpanKind.CLIENT, SpanKind.SERVER):
        (prompt,) = by_name(spans, "prompts/get greet", kind)
        assert prompt.attributes["gen_ai.prompt.name"] == "greet"
        assert "gen_ai.operation.name" not in prompt.attributes
        (tool,) = by_name(spans, "tools/call big", kind)
        assert tool.attributes["gen_ai.tool.call.arguments"] == '{"n": 500}'
        assert str(tool.attributes["gen_ai.tool.call.result"]).startswith('[{"type": "text", "text": "xxx')
        assert len(str(tool.attributes["gen_ai.tool.call.result"])) == 50


@pytest.mark.skipif(UrlElicitationRequiredError is None, reason="mcp < 1.24 has no UrlElicitationRequiredError")
def test_errors(otel: Otel, instrumented: Any) -> None:
    async def main() -> None:
        async with create_connected_server_and_client_session(make_server()) as client:
            result = await client.call_tool("boom", {})
            assert result.isError
            if ELICITATION_ERROR_PASSES_TOOLS:
                with pytest.raises(McpError) as info:
                    await client.call_tool("mcp_err", {})
                assert info.value.error.code == URL_ELICITATION_REQUIRED
            else:
                assert (await client.call_tool("mcp_err", {})).isError
            with pytest.raises(McpError) as info:  # FastMCP registers no subscribe handler
                await client.subscribe_resource("test://nothing")  # type: ignore[arg-type]
            assert info.value.error.code == METHOD_NOT_FOUND

    anyio.run(main)
    spans = otel.spans()
    for kind in (SpanKind.CLIENT, SpanKind.SERVER):
        (tool_error,) = by_name(spans, "tools/call boom", kind)
        assert tool_error.attributes["error.type"] == "tool_error"
        assert "rpc.response.status_code" not in tool_error.attributes
        assert tool_error.status.status_code is StatusCode.ERROR
        (rpc_error,) = by_name(spans, "tools/call mcp_err", kind)
        if ELICITATION_ERROR_PASSES_TOOLS:
            assert rpc_error.attributes["error.type"] == str(URL_ELICITATION_REQUIRED)
            assert rpc_error.attributes["rpc.response.status_code"] == str(URL_ELICITATION_REQUIRED)
        else:
            assert rpc_error.attributes["error.type"] == "tool_error"
            assert "rpc.response.status_code" not in rpc_error.attributes
        assert rpc_error.status.status_code is StatusCode.ERROR
        assert rpc_error.attributes["mcp_token.output_tokens"] > 0
        (unknown,) = by_name(spans, "resources/subscribe", kind)
        assert unknown.attributes["error.type"] == str(METHOD_NOT_FOUND)
        assert unknown.status.status_code is StatusCode.ERROR
