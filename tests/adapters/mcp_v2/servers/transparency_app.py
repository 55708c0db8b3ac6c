"""One scenario of the transparency tests (mcp 2.x), in its own process because the global tracer provider
can be set only once: prints, as JSON, what the application's code received and which spans were made.

argv: provider (none | global | private | both), shim (on | off), transport (auto | legacy | http).
"""

from __future__ import annotations

import json
import socket
import sys
import warnings
from collections.abc import Mapping
from typing import Any

import anyio
import uvicorn
from mcp import Client, types
from mcp.server.mcpserver import Context, MCPServer
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

warnings.simplefilter("ignore")  # sampling and roots are deprecated on the 2026 protocol
provider, shim, transport = sys.argv[1:4]

exporters = {"global": InMemorySpanExporter(), "private": InMemorySpanExporter()}
private: TracerProvider | None = None
if provider in ("global", "both"):
    global_provider = TracerProvider()
    global_provider.add_span_processor(SimpleSpanProcessor(exporters["global"]))
    trace.set_tracer_provider(global_provider)
if provider in ("private", "both"):
    private = TracerProvider()
    private.add_span_processor(SimpleSpanProcessor(exporters["private"]))
reader = InMemoryMetricReader()
recorder = None
if shim == "on":
    from mcp_token_otel.config import config_from_dict
    from mcp_token_otel.instrumentation import instrument

    recorder = instrument(
        config_from_dict({"estimator": "chars/4"}),
        tracer_provider=private,
        meter_provider=MeterProvider(metric_readers=[reader]),
    )

TRACE_KEYS = ("traceparent", "tracestate", "baggage")


def normal(value: Any) -> Any:
    """A request's params with trace-context values replaced by their key's name (they differ each run)."""
    if isinstance(value, Mapping):
        return {k: (f"<{k}>" if k in TRACE_KEYS else normal(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [normal(v) for v in value]
    return value


seen: dict[str, list[Any]] = {"requests": [], "handler": [], "sampling": [], "elicitation": []}
server = MCPServer("transparency")


async def record_params(ctx: Any, call_next: Any) -> Any:
    """First middleware: the raw params of every request as the server received them."""
    if ctx.request_id is not None:
        seen["requests"].append([ctx.method, normal(ctx.params)])
    return await call_next(ctx)


server._lowlevel_server.middleware.insert(0, record_params)


@server.tool()
async def greet(name: str, ctx: Context) -> str:
    meta = ctx.request_context.meta
    if meta is not None and not isinstance(meta, Mapping):
        meta = meta.model_dump(by_alias=True, exclude_none=True)
    seen["handler"].append(normal(meta))
    return f"hello {name}"


class Answer(BaseModel):
    ok: bool


@server.tool()
async def ask(ctx: Context) -> str:
    message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text="pick one " * 50))
    reply = await ctx.session.create_message(messages=[message], max_tokens=5, related_request_id=ctx.request_id)
    answer = await ctx.elicit("ok?", Answer)
    return f"{reply.content.text} {answer.action}"


async def sampling(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    seen["sampling"].append(normal(params.model_dump(by_alias=True, mode="json", exclude_none=True)))
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text="picked " * 40), model="m"
    )


async def elicitation(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    seen["elicitation"].append(normal(params.model_dump(by_alias=True, mode="json", exclude_none=True)))
    return types.ElicitResult(action="accept", content={"ok": True})


async def script(client: Client, back_channel: bool) -> None:
    await client.list_tools()
    results = [
        await client.call_tool("greet", {"name": "a"}),
        await client.call_tool("greet", {"name": "b"}, meta={"example.com/trace": "abc-123"}),
    ]
    if back_channel:  # server->client requests: not on the 2026 protocol
        results.append(await client.call_tool("ask", {}))
    assert not any(r.is_error for r in results), results


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def main() -> None:
    callbacks = {"sampling_callback": sampling, "elicitation_callback": elicitation}
    with anyio.fail_after(30):
        if transport in ("auto", "legacy"):
            async with Client(server, mode=transport, **callbacks) as client:
                await script(client, transport == "legacy")
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
                async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy", **callbacks) as client:
                    await script(client, True)
            finally:
                http.should_exit = True


anyio.run(main)


def span_rows(exporter: InMemorySpanExporter) -> list[dict[str, Any]]:
    return [
        {
            "name": s.name,
            "kind": s.kind.name,
            "scope": s.instrumentation_scope.name if s.instrumentation_scope else None,
            "trace": f"{s.context.trace_id:032x}",
            "span": f"{s.context.span_id:016x}",
            "parent": f"{s.parent.span_id:016x}" if s.parent else None,
            "attributes": dict(s.attributes or {}),
        }
        for s in exporter.get_finished_spans()
    ]


points: list[dict[str, Any]] = []  # the token histogram (responses; requests with metrics.input_histograms)
sums: list[dict[str, Any]] = []  # the token counter (every message)
if recorder is not None:
    recorder.flush()
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == "mcp_token.message.tokens":
                    points += [{**dict(p.attributes), "count": p.count} for p in metric.data.data_points]
                if metric.name == "mcp_token.tokens":
                    sums += [{**dict(p.attributes), "value": p.value} for p in metric.data.data_points]
report = {"seen": seen, "spans": {k: span_rows(v) for k, v in exporters.items()}, "points": points, "sums": sums}
print(json.dumps(report))
