"""mcp 1.x: the shim is transparent to the application (``spans.propagate_context``).

What the application's code receives (the raw request params at the server, the tool handler's
``ctx.request_context.meta``, the sampling and elicitation callbacks' params) is the same with and without the
shim: in memory (trace context is propagated by default and taken out again by the receiving shim) and over
streamable HTTP (nothing is propagated by default; with ``always`` the receiving shim in this process takes it
out too). A request without params never gains any.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import mcp.types as types
import pytest
import uvicorn
from mcp.client.session import ClientSession
from mcp.server.fastmcp import Context, FastMCP
from mcp.shared.memory import create_connected_server_and_client_session
from opentelemetry.trace import SpanKind
from pydantic import BaseModel

from mcp_token_otel.config import ConfigError
from mcp_token_otel.instrumentation import instrument, uninstrument

from .conftest import Otel, free_port, make_config, streamable_http_client

Seen = dict[str, list[Any]]


class Answer(BaseModel):
    ok: bool


def dump(model: Any) -> Any:
    """A model as the application's code sees it: only the fields that were set (an absent _meta stays absent)."""
    if model is None or isinstance(model, Mapping):
        return model
    return model.model_dump(by_alias=True, mode="json", exclude_unset=True)


def make_server(seen: Seen) -> FastMCP:
    server = FastMCP("transparency")

    @server.tool()
    def greet(name: str, ctx: Context[Any, Any, Any]) -> str:
        seen["handler"].append(dump(ctx.request_context.meta))
        return f"hello {name}"

    @server.tool()
    async def ask(ctx: Context[Any, Any, Any]) -> str:
        message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text="pick one"))
        reply = await ctx.session.create_message(messages=[message], max_tokens=5, related_request_id=ctx.request_id)
        answer = await ctx.elicit("ok?", Answer)
        assert isinstance(reply.content, types.TextContent)
        return f"{reply.content.text} {answer.action}"

    low = server._mcp_server
    for request_type, handler in list(low.request_handlers.items()):

        async def recording(req: Any, _handler: Any = handler) -> Any:
            seen["requests"].append([req.method, None if req.params is None else dump(req.params)])
            return await _handler(req)

        low.request_handlers[request_type] = recording
    return server


def callbacks(seen: Seen) -> dict[str, Any]:
    async def sampling(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        seen["sampling"].append([dump(context.meta), dump(params)])
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="a"), model="m")

    async def elicitation(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        seen["elicitation"].append([dump(context.meta), dump(params)])
        return types.ElicitResult(action="accept", content={"ok": True})

    return {"sampling_callback": sampling, "elicitation_callback": elicitation}


async def script(client: ClientSession) -> None:
    await client.list_tools()
    results = [
        await client.call_tool("greet", {"name": "a"}),
        await client.call_tool("greet", {"name": "b"}, meta={"example.com/trace": "abc-123"}),
        await client.call_tool("ask", {}),
    ]
    assert not any(r.isError for r in results), results


def run(transport: str) -> Seen:
    seen: Seen = {"requests": [], "handler": [], "sampling": [], "elicitation": []}
    server = make_server(seen)

    async def main() -> None:
        with anyio.fail_after(30):
            if transport == "memory":
                async with create_connected_server_and_client_session(server, **callbacks(seen)) as client:
                    await script(client)
                return
            port = free_port()
            http = uvicorn.Server(
                uvicorn.Config(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")
            )
            async with anyio.create_task_group() as tg:
                tg.start_soon(http.serve)
                while not http.started:
                    await anyio.sleep(0.02)
                try:
                    async with (
                        streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write, _),
                        ClientSession(read, write, **callbacks(seen)) as client,
                    ):
                        await client.initialize()
                        await script(client)
                finally:
                    http.should_exit = True

    anyio.run(main)
    return seen


def instrumented_run(otel: Otel, transport: str, **spans: Any) -> Seen:
    config = make_config(spans=spans) if spans else make_config()
    instrument(config, tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    try:
        return run(transport)
    finally:
        uninstrument()


def joined(otel: Otel, method: str) -> bool | None:
    """Whether the SERVER spans of ``method`` are children of its CLIENT spans: True (all), False (none)."""
    clients = {s.context.span_id for s in otel.spans() if s.name == method and s.kind is SpanKind.CLIENT}
    servers = [s for s in otel.spans() if s.name == method and s.kind is SpanKind.SERVER]
    assert servers and len(clients) == len(servers)
    children = {s.parent is not None and s.parent.span_id in clients for s in servers}
    return children.pop() if len(children) == 1 else None


@pytest.mark.parametrize("transport", ["memory", "http"])
@pytest.mark.parametrize("mode", [None, "in_process", "always", "never"])
def test_handlers_and_callbacks_see_what_they_see_without_the_shim(
    otel: Otel, transport: str, mode: str | None
) -> None:
    baseline = run(transport)
    assert ["tools/list", None] in baseline["requests"]  # sent without params
    assert baseline["handler"] == [None, {"example.com/trace": "abc-123"}]
    assert len(baseline["sampling"]) == len(baseline["elicitation"]) == 1
    assert "traceparent" not in repr(baseline)
    got = instrumented_run(otel, transport, **({"propagate_context": mode} if mode else {}))
    assert got == baseline
    # Where context was propagated (it never reached a handler), client and server spans are one trace.
    propagated = mode == "always" or (mode in (None, "in_process") and transport == "memory")
    assert joined(otel, "tools/call greet") == propagated
    assert joined(otel, "sampling/createMessage") == propagated
    assert not joined(otel, "tools/list")  # no params: nothing to carry it in


def test_the_applications_own_traceparent_is_kept(otel: Otel) -> None:
    """A traceparent the application put in _meta itself is neither overwritten nor removed."""
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    seen: Seen = {"requests": [], "handler": [], "sampling": [], "elicitation": []}
    instrument(make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    try:

        async def main() -> None:
            async with create_connected_server_and_client_session(make_server(seen)) as client:
                # (mcp 1.30's FastMCP answers this call with isError by itself, with or without the shim.)
                await client.call_tool("greet", {"name": "a"}, meta={"traceparent": own})

        anyio.run(main)
    finally:
        uninstrument()
    sent = {"_meta": {"traceparent": own}, "name": "greet", "arguments": {"name": "a"}}
    assert seen["requests"] == [["tools/call", sent]]
    (server,) = [s for s in otel.spans() if s.name == "tools/call greet" and s.kind is SpanKind.SERVER]
    assert f"{server.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"


def test_a_bad_value_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"'spans\.propagate_context': expected one of in_process, always, never"):
        make_config(spans={"propagate_context": "yes"})
