"""Fault injection, under either SDK major: no fault inside the shim changes what the application sees, on any
transport, and a fault on the metrics path never holds up an MCP call.

The same script of calls runs uninstrumented (the baseline) and instrumented with one fault injected; results and
errors must be identical. The script (servers/fault_server.py) covers text, isError results, a tool's JSON-RPC
error (``MCPError`` with its code and data under mcp 2.x; an isError result under mcp 1.x's FastMCP), unknown tools,
invalid arguments, a missing resource, image, embedded and linked resources, ``_meta``, ``structuredContent``, a
1 MB result, prompts (missing, bad arguments) and a request of a method the SDK does not know. Faults: the
estimator, a span processor, the exporters built by the project's own ``configure_otel``, the meter, the metrics
aggregate raising, a listener that raises, a slow aggregate, the budget registry and prometheus-client's
multiprocess storage raising. Transports: in memory (each of the SDK's in-memory modes), a stdio subprocess (the
server instrumented there with the same fault) and streamable HTTP. What uninstrument() restores of mcp 1.x:
tests/adapters/mcp_v1/test_v1_lifecycle.py.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from mcp_token_otel.core.measure import Policy
from mcp_token_otel.emitters.prometheus_multiprocess import SharedFilesAggregate
from mcp_token_otel.instrumentation import instrument, uninstrument
from tests.helpers.faults import (
    BlockingMeterProvider,
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
from tests.helpers.support import ROOT, Otel, make_config, scrape

from .sdk import SDK, Driver
from .servers import fault_server

FAULT_SERVER = Path(fault_server.__file__)
SCRIPT: list[tuple[str, dict[str, Any]]] = [
    ("text", {"n": 10}), ("boom", {}), ("rpc_error", {}), ("image", {}), ("resources", {}), ("meta", {}),
    ("structured", {"n": 20}), ("large", {}), ("nope", {}), ("text", {"n": "not a number"}), ("text", {"n": 500}),
]
FAULTS = ["estimator", "span_processor", "exporter", "meter", "aggregate", "listener", "slow_aggregate", "budget",
          "prometheus"]
#: In memory in each of the SDK's modes ("memory-auto", "memory-legacy"; "memory-memory" under mcp 1.x), stdio, HTTP.
TRANSPORTS = [*(f"memory-{mode}" for mode in SDK.in_memory_modes), pytest.param("stdio", marks=pytest.mark.slow),
              "http"]
#: In memory, in the mode where the shim opens its client spans itself (with the test's tracer provider).
OWN_SPANS = next(f"memory-{mode}" for mode in SDK.in_memory_modes if SDK.own_spans(mode))


def client_mode(sdk: Driver, transport: str) -> str:
    """The client mode ``transport`` runs in (HTTP: mcp 2.x's JSON-RPC "legacy" mode, as stdio)."""
    return transport.split("-", 1)[1] if transport.startswith("memory-") else sdk.stdio_modes[0]


async def run_script(sdk: Driver, session: Any) -> list[Any]:
    """Every request's outcome: the result as data, or the JSON-RPC error's code, message and data."""
    out: list[Any] = []

    async def attempt(label: str, call: Any) -> None:
        try:
            out.append(("result", label, (await call).model_dump()))
        except sdk.error_type as exc:
            error = exc.error  # type: ignore[attr-defined]
            out.append(("mcp_error", label, error.code, error.message, error.data))

    for name, args in SCRIPT:
        await attempt(name, session.call_tool(name, args))
    await attempt("res://missing", session.read_resource("res://missing"))
    await attempt("res://ok", session.read_resource("res://ok"))
    await attempt("prompt missing", session.get_prompt("nope", {}))
    await attempt("prompt bad args", session.get_prompt("greet", {}))
    await attempt("unknown method", sdk.unknown_request(session, "no/such/method"))
    out.append(("tools", sorted(t.name for t in (await session.list_tools()).tools)))
    return out


def fault_session(sdk: Driver, transport: str, server_fault: str | None = None) -> tuple[list[Any], dict[str, int]]:
    """Run SCRIPT over ``transport``; the outcomes and (stdio) the server process's fault counts."""

    async def main() -> tuple[list[Any], dict[str, int]]:
        with anyio.fail_after(60):
            if transport.startswith("memory-"):
                async with sdk.connect(fault_server.make_server(sdk), client_mode(sdk, transport)) as session:
                    return await run_script(sdk, session), {}
            if transport == "stdio":
                env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
                if server_fault:
                    env["MCP_TOKEN_TEST_FAULT"] = server_fault
                async with sdk.stdio(env, client_mode(sdk, transport), FAULT_SERVER) as session:
                    outcomes = await run_script(sdk, session)
                    report = await session.call_tool("_fault_report", {})
                    return outcomes, json.loads(sdk.text(report))
            async with sdk.http(fault_server.make_server(sdk), "streamable-http") as session:
                return await run_script(sdk, session), {}

    return anyio.run(main)


_BASELINES: dict[str, list[Any]] = {}
_HEALTHY: dict[str, Counter[str]] = {}


def healthy_faults(otel: Otel, sdk: Driver, transport: str) -> Counter[str]:
    """Faults the shim counts on this script with nothing injected. Under mcp 1.x one is known: the adapter cannot
    add trace context to a request whose method the SDK's ClientRequest union does not know (it counts a span
    fault and sends the request unchanged). Under mcp 2.x there is none."""
    if transport not in _HEALTHY:
        recorder = instrument(make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
        try:
            fault_session(sdk, transport)
        finally:
            uninstrument()
        assert recorder is not None
        _HEALTHY[transport] = Counter(recorder.error_counts)
        assert set(_HEALTHY[transport]) <= {"span"}, _HEALTHY[transport]
        assert _HEALTHY[transport]["span"] <= (1 if sdk.major == 1 else 0), _HEALTHY[transport]
    return _HEALTHY[transport]


def baseline(sdk: Driver, transport: str) -> list[Any]:
    if transport not in _BASELINES:
        _BASELINES[transport] = outcomes = fault_session(sdk, transport)[0]
        errors = [o for o in outcomes if o[0] == "mcp_error"]
        # JSON-RPC errors really occur: a shim that swallowed one would differ from this baseline
        assert {o[1] for o in errors} >= {"res://missing", "prompt missing", "unknown method"}, errors
        if sdk.major == 2:
            assert ("mcp_error", "rpc_error", -32042, "custom failure", {"retry": False}) in errors
        else:  # FastMCP 1.x lets no McpError through a tool but the URL elicitation one
            (rpc_error,) = [o for o in outcomes if o[1] == "rpc_error"]
            assert rpc_error[0] == "result" and rpc_error[2]["isError"], rpc_error
        assert [o[0] for o in outcomes if o[1] == "res://ok"] == ["result"]
    return _BASELINES[transport]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("fault", FAULTS)
def test_faults_do_not_change_results(otel: Otel, sdk: Driver, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                      transport: str, fault: str) -> None:
    expected = baseline(sdk, transport)
    healthy = healthy_faults(otel, sdk, transport)
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
        got, server_errors = fault_session(sdk, transport, server_fault=fault)
    finally:
        uninstrument()
    assert got == expected
    errors = recorder.error_counts
    own_spans = sdk.own_spans(client_mode(sdk, transport))  # the shim's own client spans, from this tracer provider
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
        # Where the SDK opens its own spans (mcp 2.x over JSON-RPC) the calls are measured on them (the global
        # provider): the faulty private provider serves only the spans the shim opens itself.
        if own_spans:
            assert errors["span"] >= len(SCRIPT)
        else:
            assert "span" not in errors
    elif fault == "exporter":
        tracer_provider.force_flush()
        meter_provider.force_flush()
        span_exporter, metric_exporter = pipeline[2], pipeline[3]
        assert metric_exporter.attempts > 0  # it really ran and failed...
        assert (span_exporter.attempts > 0) == own_spans
        assert errors == healthy  # ...and the calls never saw it
        tracer_provider.shutdown()
        meter_provider.shutdown()
    elif fault in ("meter", "aggregate", "prometheus"):
        assert errors["metrics"] > 0
    elif fault == "listener":
        assert listener.calls > 0 and errors == healthy + Counter(metrics=listener.calls)  # each raise counted
    elif fault == "slow_aggregate":
        assert slow is not None and slow.calls > 0 and errors == healthy
    elif fault == "budget":
        # stdio and HTTP clients and every server have a session to budget; in-process clients too
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


def test_an_exporter_fault_inside_a_span_processor(otel: Otel, sdk: Driver) -> None:
    """The SDK's own processor with a failing exporter (the earlier form of the exporter case), kept."""
    exporter = RaisingExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    expected = baseline(sdk, OWN_SPANS)  # the shim's own client spans use this provider
    healthy = healthy_faults(otel, sdk, OWN_SPANS)
    recorder = instrument(make_config(), tracer_provider=tracer_provider, meter_provider=otel.meter_provider)
    try:
        got, _ = fault_session(sdk, OWN_SPANS)
    finally:
        uninstrument()
    assert got == expected and exporter.attempts >= len(SCRIPT)
    assert recorder is not None and recorder.error_counts == healthy


@pytest.mark.parametrize("transport", [f"memory-{mode}" for mode in SDK.in_memory_modes])
def test_a_failing_result_conversion_never_breaks_the_call(
    otel: Otel, sdk: Driver, transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Converting the handler's result for measurement is inside the never-break boundary (server side)."""
    import mcp_token_otel.recorder.call as call_module  # every result is converted for measurement there

    expected = baseline(sdk, transport)
    recorder = instrument(make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    assert recorder is not None

    def broken(model: Any) -> Any:
        raise RuntimeError("cannot convert")

    monkeypatch.setattr(call_module, "wire_dict", broken)
    try:
        got, _ = fault_session(sdk, transport)
    finally:
        uninstrument()
    assert got == expected
    assert recorder.error_counts["estimate"] > 0  # the conversion really failed, and was contained


def test_a_blocking_metrics_path_does_not_block_the_call(otel: Otel, sdk: Driver) -> None:
    """With ``metrics.defer_otel`` the OpenTelemetry points are recorded off the call path: a point stuck in its
    instrument (a meter on a contended lock) holds up no MCP call."""
    provider = BlockingMeterProvider(limit=5.0)
    config = make_config(metrics={"defer_otel": True})
    recorder = instrument(config, tracer_provider=otel.tracer_provider, meter_provider=provider)
    assert recorder is not None
    try:

        async def main() -> list[str]:
            async with sdk.connect(fault_server.make_server(sdk), sdk.jsonrpc_mode) as client:
                first = await client.call_tool("text", {"n": 3})
                # The replay of the first call's points is now stuck in the instrument...
                assert await anyio.to_thread.run_sync(provider.entered.wait, 5.0)
                second = await client.call_tool("text", {"n": 2})  # ...and this call goes through meanwhile
                provider.release.set()
                return [sdk.text(first), sdk.text(second)]

        assert anyio.run(main) == ["abc abc abc ", "abc abc "]
    finally:
        provider.release.set()
        uninstrument()
    assert not provider.blocked_the_call  # the second call finished while the point was still stuck
    assert not recorder.error_counts
    provider.shutdown()
