"""Fault injection: no fault inside the shim changes what the application sees, on any transport.

The same script of calls runs uninstrumented (the baseline) and instrumented with one fault injected;
results and errors must be identical. The script covers text, isError results, a JSON-RPC error raised
by a tool (``MCPError`` with its code and data), unknown tools, invalid arguments, a missing resource,
image, embedded and linked resources, ``_meta``, ``structuredContent`` and a 1 MB result. Faults:
the estimator, a span processor, the exporters built by the project's own ``configure_otel``, the
meter, the metrics aggregate raising, a listener that raises, a slow aggregate, the budget registry and
prometheus-client's multiprocess storage raising. Transports:
in-memory (direct "auto" and JSON-RPC "legacy"), a stdio subprocess and streamable HTTP. A blocked metrics path,
alike on both majors: tests/adapters/scenarios/test_faults.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import uvicorn
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

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
from tests.helpers.support import ROOT, scrape

from .conftest import Otel, free_port, make_config

SERVER_SCRIPT = Path(__file__).parent / "servers" / "fault_server.py"
_spec = importlib.util.spec_from_file_location("fault_server", SERVER_SCRIPT)
assert _spec is not None and _spec.loader is not None
fault_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fault_server)

SCRIPT: list[tuple[str, dict[str, Any]]] = [
    ("text", {"n": 10}), ("boom", {}), ("rpc_error", {}), ("image", {}), ("resources", {}), ("meta", {}),
    ("structured", {"n": 20}), ("large", {}), ("nope", {}), ("text", {"n": "not a number"}), ("text", {"n": 500}),
]
FAULTS = ["estimator", "span_processor", "exporter", "meter", "aggregate", "listener", "slow_aggregate", "budget",
          "prometheus"]
TRANSPORTS = ["memory-auto", "memory-legacy", pytest.param("stdio", marks=pytest.mark.slow), "http"]


async def run_script(client: Client) -> list[Any]:
    """Every call's outcome: the result as data, or the MCPError's code, message and data."""
    out: list[Any] = []
    for name, args in SCRIPT:
        try:
            out.append(("result", name, (await client.call_tool(name, args)).model_dump()))
        except MCPError as exc:
            out.append(("mcp_error", name, exc.code, exc.message, exc.data))
    try:
        out.append(("resource", (await client.read_resource("res://missing")).model_dump()))
    except MCPError as exc:
        out.append(("mcp_error", "res://missing", exc.code, exc.message, exc.data))
    out.append(("resource", (await client.read_resource("res://ok")).model_dump()))
    out.append(("tools", sorted(t.name for t in (await client.list_tools()).tools)))
    return out


async def _serve_http(tg: Any, port: int) -> uvicorn.Server:
    app = fault_server.make_server().streamable_http_app()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    tg.start_soon(server.serve)
    with anyio.fail_after(10):
        while not server.started:
            await anyio.sleep(0.02)
    return server


def session(transport: str, server_fault: str | None = None) -> tuple[list[Any], dict[str, int]]:
    """Run SCRIPT over ``transport``; the outcomes and (stdio) the server process's fault counts."""

    async def main() -> tuple[list[Any], dict[str, int]]:
        with anyio.fail_after(60):
            if transport.startswith("memory-"):
                async with Client(fault_server.make_server(), mode=transport.split("-")[1]) as client:
                    return await run_script(client), {}
            if transport == "stdio":
                env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
                if server_fault:
                    env["MCP_TOKEN_TEST_FAULT"] = server_fault
                params = StdioServerParameters(command=sys.executable, args=[str(SERVER_SCRIPT)], env=env)
                async with Client(stdio_client(params), mode="legacy") as client:
                    outcomes = await run_script(client)
                    report = await client.call_tool("_fault_report", {})
                    return outcomes, json.loads(report.content[0].text)
            port = free_port()
            async with anyio.create_task_group() as tg:
                server = await _serve_http(tg, port)
                try:
                    async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy") as client:
                        return await run_script(client), {}
                finally:
                    server.should_exit = True
        raise AssertionError("unreachable")

    return anyio.run(main)


_BASELINES: dict[str, list[Any]] = {}


def baseline(transport: str) -> list[Any]:
    if transport not in _BASELINES:
        _BASELINES[transport] = session(transport)[0]
        errors = [o for o in _BASELINES[transport] if o[0] == "mcp_error"]
        # the script really produces JSON-RPC errors: a shim that swallowed one would differ from this
        assert {o[1] for o in errors} >= {"rpc_error", "res://missing"}
        assert ("mcp_error", "rpc_error", -32042, "custom failure", {"retry": False}) in errors
    return _BASELINES[transport]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("fault", FAULTS)
def test_faults_do_not_change_results(otel: Otel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                      transport: str, fault: str) -> None:
    expected = baseline(transport)
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
        got, server_errors = session(transport, server_fault=fault)
    finally:
        uninstrument()
    assert got == expected
    errors = recorder.error_counts
    own_spans = transport == "memory-auto"  # the shim's own client spans, from the test's tracer provider
    if transport == "stdio":  # the server side ran in the subprocess, with the same fault
        stage = {"estimator": "estimate", "span_processor": "span", "meter": "metrics", "aggregate": "metrics",
                 "listener": "metrics", "budget": "budget", "prometheus": "metrics"}.get(fault)
        if stage:
            assert server_errors.get(stage, 0) > 0, server_errors
        else:
            assert not server_errors
    if fault == "estimator":
        assert errors["estimate"] >= len(SCRIPT)
    elif fault == "span_processor":
        # Over JSON-RPC the calls are measured on the SDK's own spans (the global provider): the faulty private
        # provider serves only the spans the shim opens itself (in process, where the SDK opens none).
        assert errors["span"] > 0 if own_spans else "span" not in errors
    elif fault == "exporter":
        tracer_provider.force_flush()
        meter_provider.force_flush()
        span_exporter, metric_exporter = pipeline[2], pipeline[3]
        assert metric_exporter.attempts > 0  # it really ran and failed...
        assert (span_exporter.attempts > 0) == own_spans
        assert "span" not in errors  # ...and the calls never saw it
        tracer_provider.shutdown()
        meter_provider.shutdown()
    elif fault in ("meter", "aggregate", "prometheus"):
        assert errors["metrics"] > 0
    elif fault == "listener":
        assert listener.calls > 0 and errors["metrics"] == listener.calls  # each raise counted, none escaped
    elif fault == "slow_aggregate":
        assert slow is not None and slow.calls > 0 and not errors
    elif fault == "budget":
        # stdio and HTTP clients and every server have a session to budget; in-process "auto" clients too
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
    expected = baseline("memory-auto")  # in process: the shim's own client spans use this provider
    recorder = instrument(make_config(), tracer_provider=tracer_provider, meter_provider=otel.meter_provider)
    try:
        got, _ = session("memory-auto")
    finally:
        uninstrument()
    assert got == expected and exporter.attempts >= len(SCRIPT)
    assert recorder is not None and "span" not in recorder.error_counts


@pytest.mark.parametrize("transport", ["memory-auto", "memory-legacy"])
def test_a_failing_result_conversion_never_breaks_the_call(
    otel: Otel, transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Converting the handler's result for measurement is inside the never-break boundary (server side)."""
    import mcp_token_otel.recorder.call as call_module  # every result is converted for measurement there

    expected = baseline(transport)
    recorder = instrument(make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    assert recorder is not None

    def broken(model: Any) -> Any:
        raise RuntimeError("cannot convert")

    monkeypatch.setattr(call_module, "wire_dict", broken)
    try:
        got, _ = session(transport)
    finally:
        uninstrument()
    assert got == expected
    assert recorder.error_counts["estimate"] > 0  # the conversion really failed, and was contained
