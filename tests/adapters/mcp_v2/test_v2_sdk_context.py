"""mcp 2.x: the shim carries trace context only where the SDK itself would.

A global tracer provider can be set while the SDK's own tracer (``mcp.shared._otel._tracer``) makes no spans:
another library's fixture points it at a ``NoOpTracer``, as the SDK's own test suite does between tests. The
SDK then injects into ``_meta`` only the context the application made current. The shim's spans must not
become that context: every request, ``ctx.meta`` and the sampling and elicitation callbacks' params must be
exactly what they are without the shim.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator, Mapping
from typing import Any

import anyio
import mcp.shared._otel as sdk_otel
import pytest
import uvicorn
from mcp import Client, types
from mcp.server.mcpserver import Context, MCPServer
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from pydantic import BaseModel

from tests.helpers.support import Otel, instrumented_session

from .conftest import UNTRACED_META

TRACE_KEYS = ("traceparent", "tracestate", "baggage")


class Answer(BaseModel):
    ok: bool


def _normal(value: Any) -> Any:
    """Trace-context values replaced by their key's name (the ids differ from run to run)."""
    if isinstance(value, Mapping):
        return {k: (f"<{k}>" if k in TRACE_KEYS else _normal(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return value


def _dump(value: Any) -> Any:
    """A model or a mapping as the application reads it, trace-context values normalized."""
    if isinstance(value, Mapping) or value is None:
        return _normal(value)
    return _normal(value.model_dump(by_alias=True, mode="json", exclude_none=True))


def _app(seen: dict[str, list[Any]]) -> MCPServer:
    server = MCPServer("sdk-context")

    async def record_params(ctx: Any, call_next: Any) -> Any:
        if ctx.request_id is not None:
            seen["requests"].append([ctx.method, _normal(ctx.params)])
        return await call_next(ctx)

    server._lowlevel_server.middleware.insert(0, record_params)

    @server.tool()
    async def ask(ctx: Context) -> str:
        meta = ctx.request_context.meta
        seen["handler"].append(_dump(meta))
        message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text="pick one"))
        reply = await ctx.session.create_message(messages=[message], max_tokens=5, related_request_id=ctx.request_id)
        answer = await ctx.elicit("ok?", Answer)
        return f"{reply.content.text} {answer.action}"

    return server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _calls(target: Any, seen: dict[str, list[Any]]) -> None:
    async def sampling(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        seen["sampling"].append(_dump(params))
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="a"), model="m")

    async def elicitation(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        seen["elicitation"].append(_dump(params))
        return types.ElicitResult(action="accept", content={"ok": True})

    async with Client(target, mode="legacy", sampling_callback=sampling, elicitation_callback=elicitation) as client:
        result = await client.call_tool("ask", {})
        assert not result.is_error, result


async def _scenario(transport: str) -> dict[str, list[Any]]:
    seen: dict[str, list[Any]] = {"requests": [], "handler": [], "sampling": [], "elicitation": []}
    server = _app(seen)
    with anyio.fail_after(30):
        if transport == "memory":
            await _calls(server, seen)
            return seen
        port = _free_port()
        http = uvicorn.Server(
            uvicorn.Config(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(http.serve)
            while not http.started:
                await anyio.sleep(0.02)
            try:
                await _calls(f"http://127.0.0.1:{port}/mcp", seen)
            finally:
                http.should_exit = True
    return seen


def _with_and_without(otel: Otel, transport: str) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    baseline = anyio.run(_scenario, transport)
    with contextlib.contextmanager(instrumented_session)(otel):
        shimmed = anyio.run(_scenario, transport)
    return baseline, shimmed


@pytest.fixture
def sdk_tracer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The SDK's own tracer while the suite's global provider stays set: a no-op one, or one whose sampler
    drops every span (its spans do not record, but still carry a valid context that the SDK injects)."""
    assert isinstance(trace.get_tracer_provider(), TracerProvider)  # the suite's global provider is set
    if request.param == "noop":
        monkeypatch.setattr(sdk_otel, "_tracer", trace.NoOpTracer())
        yield request.param
        return
    dropping = TracerProvider(sampler=ALWAYS_OFF)
    monkeypatch.setattr(sdk_otel, "_tracer", dropping.get_tracer("mcp-python-sdk"))
    yield request.param
    dropping.shutdown()


@pytest.mark.parametrize("sdk_tracer", ["noop", "dropping"], indirect=True)
@pytest.mark.parametrize("transport", ["memory", "http"])
def test_callbacks_see_what_they_see_without_the_shim(otel: Otel, sdk_tracer: str, transport: str) -> None:
    baseline, shimmed = _with_and_without(otel, transport)
    assert len(baseline["sampling"]) == len(baseline["elicitation"]) == 1
    if sdk_tracer == "noop":  # the SDK's tracer makes no span: nothing carries trace context
        assert "<traceparent>" not in repr(baseline)
        assert baseline["sampling"][0].get("_meta") == UNTRACED_META
    else:  # its dropped spans still have a context: the SDK injects it
        assert baseline["sampling"][0]["_meta"] == {"traceparent": "<traceparent>"}
    assert shimmed == baseline


def test_application_context_is_carried_as_without_the_shim(otel: Otel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A no-op SDK tracer under the application's own current span: the SDK injects that span, shim or not."""
    monkeypatch.setattr(sdk_otel, "_tracer", trace.NoOpTracer())
    tracer = otel.tracer_provider.get_tracer("app")

    def run() -> dict[str, list[Any]]:
        with tracer.start_as_current_span("app"):
            return anyio.run(_scenario, "memory")

    baseline = run()
    assert baseline["requests"][-1][1]["_meta"]["traceparent"] == "<traceparent>"
    with contextlib.contextmanager(instrumented_session)(otel):
        assert run() == baseline
