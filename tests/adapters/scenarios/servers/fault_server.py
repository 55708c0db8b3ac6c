"""The fault-injection server of tests/adapters/scenarios/test_faults.py: every kind of result and error, built
through the installed SDK major's driver (MCPServer, FastMCP) and shared by the in-process, HTTP and stdio runs.

Run with ``sys.executable`` it serves stdio. With ``MCP_TOKEN_TEST_FAULT=<fault>`` it first calls
instrument() and injects that fault on the server side; the ``_fault_report`` tool returns the
recorder's fault counts (excluded from the comparison of results).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root, for tests.*

from mcp.types import (
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

from tests.adapters.scenarios.sdk import SDK, Driver

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
LARGE = 1_000_000

#: The recorder when this process instruments itself (stdio runs).
RECORDER: Any = None


def make_server(sdk: Driver = SDK) -> Any:
    server = sdk.server("faults")

    @server.tool()
    def text(n: int) -> str:
        return "abc " * n

    @server.tool()
    def boom() -> str:
        raise ValueError("tool failed")

    @server.tool()
    def rpc_error() -> str:
        # A JSON-RPC error under mcp 2.x; mcp 1.x's FastMCP turns it into an isError result.
        raise sdk.rpc_error(-32042, "custom failure", {"retry": False})

    @server.tool()
    def image() -> CallToolResult:
        return CallToolResult(content=[ImageContent(type="image", data=PNG, mimeType="image/png"),
                                       TextContent(type="text", text="a pixel")])

    @server.tool()
    def resources() -> CallToolResult:
        return CallToolResult(content=[
            EmbeddedResource(type="resource", resource=TextResourceContents(uri="file:///a.txt", text="hello " * 50)),
            EmbeddedResource(type="resource", resource=BlobResourceContents(uri="file:///b.bin", blob=PNG,
                                                                            mimeType="application/octet-stream")),
            ResourceLink(type="resource_link", uri="file:///c.txt", name="c.txt"),
        ])

    @server.tool()
    def meta() -> CallToolResult:
        return CallToolResult(content=[TextContent(type="text", text="with meta")],
                              _meta={"com.example/trace": "abc-123", "nested": {"k": [1, 2, 3]}})

    @server.tool()
    def large() -> str:
        return "z" * LARGE

    @server.tool()
    def structured(n: int) -> dict[str, Any]:
        return {"items": [{"id": i, "name": f"item {i}"} for i in range(n)]}

    @server.tool()
    def _fault_report() -> str:
        if RECORDER is not None:
            RECORDER.flush()  # deferred metric points (and their faults) are handled now
        return json.dumps(dict(RECORDER.error_counts) if RECORDER is not None else {})

    @server.resource("res://ok")
    def ok_resource() -> str:
        return "fine"

    @server.prompt()
    def greet(name: str) -> str:
        return f"hello {name}"

    return server


def _instrument_with_fault(fault: str) -> Any:
    import pytest
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from mcp_token_otel.config import config_from_dict
    from mcp_token_otel.core.measure import Policy
    from mcp_token_otel.emitters.prometheus_multiprocess import SharedFilesAggregate
    from mcp_token_otel.instrumentation import instrument
    from tests.helpers import faults

    global _FILES
    tracer_provider: Any = TracerProvider()
    meter_provider: Any = MeterProvider()
    patch = pytest.MonkeyPatch()  # undone when the process ends
    if fault == "span_processor":
        tracer_provider.add_span_processor(faults.RaisingProcessor())
    elif fault == "exporter":
        tracer_provider.add_span_processor(SimpleSpanProcessor(faults.RaisingExporter()))
    elif fault == "meter":
        meter_provider = faults.BrokenMeterProvider()
    elif fault == "prometheus":
        _FILES = tempfile.TemporaryDirectory(prefix="mcp-token-faults-")
        faults.shared_files_mode(patch, _FILES.name)
    prometheus = {"enabled": True, "port": 0} if fault == "prometheus" else {}
    recorder = instrument(config_from_dict({"estimator": "chars/4", "prometheus": prometheus}),
                          tracer_provider=tracer_provider, meter_provider=meter_provider)
    if fault == "estimator":
        recorder.policy = Policy(estimator=faults.raising_estimator, estimator_name="broken")
    elif fault == "aggregate":
        faults.break_aggregate(recorder)
    elif fault == "listener":
        recorder.listeners.append(faults.RaisingListener())
    elif fault == "slow_aggregate":
        faults.SlowAggregate(recorder)
    elif fault == "budget":
        faults.break_budgets(recorder)
    elif fault == "prometheus":
        assert isinstance(recorder.aggregate, SharedFilesAggregate)
        faults.break_prometheus(patch)
    return recorder


#: The multiprocess files' directory of the "prometheus" fault (removed when the process ends).
_FILES: Any = None


if __name__ == "__main__":
    if os.environ.get("MCP_TOKEN_TEST_FAULT"):
        RECORDER = _instrument_with_fault(os.environ["MCP_TOKEN_TEST_FAULT"])
    make_server().run("stdio")
