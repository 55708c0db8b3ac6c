"""mcp 1.x: fault injection never changes results; uninstrument() restores the SDK; instrument() is idempotent.
A blocked metrics path, alike on both majors: tests/adapters/scenarios/test_faults.py."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import mcp.client.stdio as client_stdio
import mcp.server.fastmcp.server as fastmcp_server
import mcp.server.stdio as server_stdio
import pytest
import uvicorn
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import StreamableHTTPTransport
from mcp.server.fastmcp import FastMCP
from mcp.server.session import ServerSession
from mcp.server.sse import SseServerTransport
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.shared.exceptions import McpError
from mcp.shared.memory import create_connected_server_and_client_session
from mcp.shared.session import BaseSession, RequestResponder
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from pydantic import AnyUrl

from mcp_token_otel.core.measure import Policy
from mcp_token_otel.emitters.prometheus_multiprocess import SharedFilesAggregate
from mcp_token_otel.instrumentation import instrument, uninstrument
from tests.helpers.faults import (
    BrokenMeterProvider,
    RaisingExporter,
    RaisingListener,
    RaisingProcessor,
    SlowAggregate,
    break_aggregate,
    break_budgets,
    break_prometheus,
    otel_pipeline_with_failing_exporters,
    raising_estimator,
    shared_files_mode,
)
from tests.helpers.support import ROOT, assert_client_call_recorded_once, scrape

from .conftest import Otel, free_port, make_config, streamable_http_client

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
















FAULT_SERVER = Path(__file__).parent / "servers" / "fault_server.py"
_spec = importlib.util.spec_from_file_location("fault_server_v1", FAULT_SERVER)
assert _spec is not None and _spec.loader is not None
fault_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fault_server)

SCRIPT: list[tuple[str, dict[str, Any]]] = [
    ("text", {"n": 10}), ("boom", {}), ("image", {}), ("resources", {}), ("meta", {}), ("structured", {"n": 20}),
    ("large", {}), ("nope", {}), ("text", {"n": "not a number"}), ("text", {"n": 500}),
]
FAULTS = ["estimator", "span_processor", "exporter", "meter", "aggregate", "listener", "slow_aggregate", "budget",
          "prometheus"]


async def run_script(session: ClientSession) -> list[Any]:
    """Every request's outcome: the result as data, or the McpError's code, message and data."""
    out: list[Any] = []

    async def attempt(label: str, call: Any) -> None:
        try:
            out.append(("result", label, (await call).model_dump()))
        except McpError as exc:
            out.append(("mcp_error", label, exc.error.code, exc.error.message, exc.error.data))

    for name, args in SCRIPT:
        await attempt(name, session.call_tool(name, args))
    await attempt("res://missing", session.read_resource(AnyUrl("res://missing")))
    await attempt("res://ok", session.read_resource(AnyUrl("res://ok")))
    await attempt("prompt missing", session.get_prompt("nope", {}))
    await attempt("prompt bad args", session.get_prompt("greet", {}))
    unknown = types.PingRequest.model_construct(method="no/such/method", params=None)  # skips the Literal check
    await attempt("unknown method", session.send_request(types.ClientRequest(unknown), types.EmptyResult))
    out.append(("tools", sorted(t.name for t in (await session.list_tools()).tools)))
    return out


def fault_session(transport: str, server_fault: str | None = None) -> tuple[list[Any], dict[str, int]]:
    """Run SCRIPT over ``transport`` (memory, stdio, http); the outcomes and the stdio server's fault counts."""

    async def main() -> tuple[list[Any], dict[str, int]]:
        with anyio.fail_after(60):
            if transport == "memory":
                async with create_connected_server_and_client_session(fault_server.make_server()) as session:
                    return await run_script(session), {}
            if transport == "stdio":
                env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
                if server_fault:
                    env["MCP_TOKEN_TEST_FAULT"] = server_fault
                params = StdioServerParameters(command=sys.executable, args=[str(FAULT_SERVER)], env=env)
                async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                    await session.initialize()
                    outcomes = await run_script(session)
                    report = await session.call_tool("_fault_report", {})
                    return outcomes, json.loads(report.content[0].text)  # type: ignore[union-attr]
            port = free_port()
            app = fault_server.make_server().streamable_http_app()
            async with anyio.create_task_group() as tg:
                server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
                tg.start_soon(server.serve)
                while not server.started:
                    await anyio.sleep(0.02)
                try:
                    async with (
                        streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write, _),
                        ClientSession(read, write) as session,
                    ):
                        await session.initialize()
                        return await run_script(session), {}
                finally:
                    server.should_exit = True
        raise AssertionError("unreachable")

    return anyio.run(main)


_BASELINES: dict[str, list[Any]] = {}
_HEALTHY: dict[str, Counter[str]] = {}


def healthy_faults(otel: Otel, transport: str) -> Counter[str]:
    """Faults the shim counts on this script with nothing injected. One is known: the adapter cannot add
    trace context to a request whose method the SDK's ClientRequest union does not know (it counts a span
    fault and sends the request unchanged)."""
    if transport not in _HEALTHY:
        recorder = instrument(make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
        try:
            fault_session(transport)
        finally:
            uninstrument()
        assert recorder is not None
        _HEALTHY[transport] = Counter(recorder.error_counts)
        assert set(_HEALTHY[transport]) <= {"span"} and _HEALTHY[transport]["span"] <= 1
    return _HEALTHY[transport]


def baseline(transport: str) -> list[Any]:
    if transport not in _BASELINES:
        _BASELINES[transport] = fault_session(transport)[0]
        errors = {o[1] for o in _BASELINES[transport] if o[0] == "mcp_error"}
        # JSON-RPC errors really occur: a shim that swallowed an McpError would differ from this baseline
        assert {"unknown method", "prompt missing"} <= errors, errors
    return _BASELINES[transport]


@pytest.mark.parametrize("transport", ["memory", pytest.param("stdio", marks=pytest.mark.slow), "http"])
@pytest.mark.parametrize("fault", FAULTS)
def test_faults_do_not_change_results(otel: Otel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                      transport: str, fault: str) -> None:
    expected = baseline(transport)
    healthy = healthy_faults(otel, transport)
    tracer_provider: Any = otel.tracer_provider
    meter_provider: Any = otel.meter_provider
    pipeline: Any = None
    if fault == "span_processor":
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(RaisingProcessor())
    elif fault == "exporter":
        pipeline = otel_pipeline_with_failing_exporters(monkeypatch)
        tracer_provider, meter_provider = pipeline[0], pipeline[1]
    elif fault == "meter":
        meter_provider = BrokenMeterProvider()
    elif fault == "prometheus":
        shared_files_mode(monkeypatch, tmp_path)
    config = make_config(prometheus={"enabled": True, "port": 0} if fault == "prometheus" else {})
    recorder = instrument(config, tracer_provider=tracer_provider, meter_provider=meter_provider)
    assert recorder is not None
    slow: SlowAggregate | None = None
    listener = RaisingListener()
    if fault == "estimator":
        recorder.policy = Policy(estimator=raising_estimator, estimator_name="broken")
    elif fault == "aggregate":
        break_aggregate(recorder)
    elif fault == "listener":
        recorder.listeners.append(listener)
    elif fault == "slow_aggregate":
        slow = SlowAggregate(recorder)
    elif fault == "budget":
        break_budgets(recorder)
    elif fault == "prometheus":
        assert isinstance(recorder.aggregate, SharedFilesAggregate)  # prometheus-client's values on the call path
        break_prometheus(monkeypatch)
    try:
        got, server_errors = fault_session(transport, server_fault=fault)
    finally:
        uninstrument()
    assert got == expected
    errors = recorder.error_counts
    if transport == "stdio":
        stage = {"estimator": "estimate", "span_processor": "span", "meter": "metrics", "aggregate": "metrics",
                 "listener": "metrics", "budget": "budget", "prometheus": "metrics"}.get(fault)
        if stage:
            assert server_errors.get(stage, 0) > 0, server_errors
        else:
            assert not server_errors
    if fault == "estimator":
        assert errors["estimate"] >= len(SCRIPT)
    elif fault == "span_processor":
        assert errors["span"] >= len(SCRIPT)
    elif fault == "exporter":
        tracer_provider.force_flush()
        meter_provider.force_flush()
        assert pipeline[2].attempts > 0 and pipeline[3].attempts > 0  # the exporters ran and failed...
        assert errors == healthy  # ...and no call saw it
        tracer_provider.shutdown()
        meter_provider.shutdown()
    elif fault in ("meter", "aggregate", "prometheus"):
        assert errors["metrics"] > 0
    elif fault == "listener":
        assert listener.calls > 0 and errors == healthy + Counter(metrics=listener.calls)  # each raise counted
    elif fault == "slow_aggregate":
        assert slow is not None and slow.calls > 0 and errors == healthy
    elif fault == "budget":
        assert errors["budget"] > 0
    # Every fault counted in process is on the metrics too (with the metrics store itself broken, error_counts is
    # the one record). The broken budget registry also breaks the sessions gauges read from it at collection,
    # which fails a /metrics scrape: its counts are read through OpenTelemetry, whose instruments are read apart.
    if fault == "budget":
        counted = dict(errors)  # before the collection, which meets the broken registry again (and counts it)
        shown = {p.attributes["mcp_token.stage"]: p.value for p in otel.metrics()["mcp_token.instrumentation.errors"]}
        assert {stage: shown.get(stage) for stage in counted} == counted
    elif fault not in ("aggregate", "prometheus"):
        scraped = scrape(recorder)
        assert {stage: scraped.value("mcp_token_instrumentation_errors_total", stage=stage) for stage in errors} \
            == dict(errors)


def test_an_exporter_fault_inside_a_span_processor(otel: Otel) -> None:
    """The SDK's own processor with a failing exporter (the earlier form of the exporter case), kept."""
    exporter = RaisingExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    expected = baseline("memory")
    recorder = instrument(make_config(), tracer_provider=tracer_provider, meter_provider=otel.meter_provider)
    try:
        got, _ = fault_session("memory")
    finally:
        uninstrument()
    assert got == expected and exporter.attempts >= len(SCRIPT)
    assert recorder is not None and recorder.error_counts == healthy_faults(otel, "memory")


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
