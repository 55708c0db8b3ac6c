"""Fault injection: estimator, span processor, exporter and meter faults never break an MCP call."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from mcp_token_otel.core.measure import Policy
from mcp_token_otel.instrumentation import instrument, uninstrument

from ..faults import BrokenMeterProvider, BrokenSink, RaisingExporter, RaisingProcessor, raising_estimator
from .conftest import Otel, make_config

N = 20


def make_server() -> MCPServer:
    server = MCPServer("faults")

    @server.tool()
    def text(n: int) -> str:
        return "abc " * n

    @server.tool()
    def boom() -> str:
        raise ValueError("tool failed")

    return server


def calls(mode: str) -> list[dict[str, Any]]:
    async def main() -> list[dict[str, Any]]:
        out = []
        with anyio.fail_after(30):
            async with Client(make_server(), mode=mode) as client:
                for i in range(N):
                    result = await client.call_tool("boom" if i % 7 == 6 else "text", {"n": i * 10})
                    out.append(result.model_dump())
        return out

    return anyio.run(main)








@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize("fault", ["estimator", "span_processor", "exporter", "meter", "sink"])
def test_faults_do_not_change_results(otel: Otel, mode: str, fault: str) -> None:
    expected = calls(mode)  # uninstrumented baseline
    tracer_provider: Any = otel.tracer_provider
    meter_provider: Any = otel.meter_provider
    exporter = RaisingExporter()
    if fault == "span_processor":
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(RaisingProcessor())
    elif fault == "exporter":
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif fault == "meter":
        meter_provider = BrokenMeterProvider()
    recorder = instrument(make_config(), tracer_provider=tracer_provider, meter_provider=meter_provider)
    assert recorder is not None
    if fault == "estimator":
        recorder.policy = Policy(estimator=raising_estimator, estimator_name="broken")
    elif fault == "sink":
        recorder.add_sink(BrokenSink())
    try:
        got = calls(mode)
    finally:
        uninstrument()
    assert got == expected
    errors = {
        p.attributes["mcp_token.stage"]: p.value
        for p in otel.metrics().get("mcp_token.instrumentation.errors", [])
    }
    if fault == "estimator":
        # client and server both measure input and output of every call
        assert recorder.error_counts["estimate"] >= 4 * N
        assert errors["estimate"] >= 4 * N
    elif fault == "span_processor":
        assert recorder.error_counts["span"] >= N  # our CLIENT span could not start
    elif fault == "exporter":
        assert exporter.attempts >= N  # every span really went to the failing exporter...
        assert not recorder.error_counts  # ...and the SDK's span processor absorbed its faults
    elif fault == "meter":
        assert recorder.error_counts["metrics"] >= 2 * N  # visible in-process: the meter itself is broken
    elif fault == "sink":
        assert errors["metrics"] >= 2 * N  # the healthy OTel sink counts the broken sink's faults


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_failing_result_conversion_never_breaks_the_call(
    otel: Otel, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Converting the handler's result for measurement is inside the never-break boundary (server side)."""
    import mcp_token_otel.adapters.mcp_v2 as v2

    expected = calls(mode)
    recorder = instrument(make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    assert recorder is not None

    def broken(model: Any) -> Any:
        raise RuntimeError("cannot convert")

    monkeypatch.setattr(v2, "wire_dict", broken)
    try:
        got = calls(mode)
    finally:
        uninstrument()
    assert got == expected
    assert recorder.error_counts["estimate"] >= N - N // 7  # every successful server-side result
