"""The real OTLP/HTTP exporters against a tiny receiver on 127.0.0.1, configure_otel(), endpoint down."""

from __future__ import annotations

import gzip
import http.server
import importlib.util
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import anyio
import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from mcp_token_otel.recorder import TokenRecorder
from tests.helpers.support import free_port, make_config

IS_MCP_V2 = importlib.util.find_spec("mcp.shared.dispatcher") is not None


class Receiver:
    """Collects OTLP/HTTP POST bodies by path."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[bytes]] = {}
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.bodies.setdefault(self.path, []).append(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def spans(self) -> list[tuple[str, Any, dict[str, Any]]]:
        """(service.name, span, attributes) for every span received."""
        out = []
        for body in self.bodies.get("/v1/traces", []):
            request = ExportTraceServiceRequest.FromString(body)
            for rs in request.resource_spans:
                service = _attrs(rs.resource.attributes).get("service.name")
                for ss in rs.scope_spans:
                    out.extend((service, span, _attrs(span.attributes)) for span in ss.spans)
        return out

    def metrics(self) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for body in self.bodies.get("/v1/metrics", []):
            request = ExportMetricsServiceRequest.FromString(body)
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        data = getattr(metric, metric.WhichOneof("data"))
                        out.setdefault(metric.name, []).extend(data.data_points)
        return out


def _attrs(kvs: Any) -> dict[str, Any]:
    out = {}
    for kv in kvs:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None
    return out


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    yield r
    r.server.shutdown()
    r.server.server_close()


def _recorder_call(recorder: TokenRecorder, n: int) -> None:
    from opentelemetry.trace import SpanKind

    params = {"name": "big", "arguments": {"n": n}}
    span = recorder.start_span("tools/call big", SpanKind.CLIENT, {"mcp.method.name": "tools/call"})
    call = recorder.begin("client", "tools/call", params, "sess")
    call.open(span)
    call.result({"content": [{"type": "text", "text": "x" * n}]})
    call.close()
    recorder.end_span(span)


def test_otlp_http_export(receiver: Receiver) -> None:
    base = f"http://127.0.0.1:{receiver.port}"
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/traces")))
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=f"{base}/v1/metrics"), export_interval_millis=3_600_000
    )
    meter_provider = MeterProvider(metric_readers=[reader])
    recorder = TokenRecorder(make_config(), tracer_provider, meter_provider)
    _recorder_call(recorder, 40_000)
    recorder.end_session("client", "sess")
    tracer_provider.shutdown()
    meter_provider.shutdown()
    ((_, span, attrs),) = receiver.spans()
    assert span.name == "tools/call big"
    assert attrs["mcp_token.output_tokens"] >= 10_000  # 40,000 chars at chars/4, plus framing
    assert attrs["mcp_token.risk_tier"] == "critical"
    assert [e.name for e in span.events] == ["mcp_token.risk"]
    metrics = receiver.metrics()
    assert {
        "mcp_token.message.tokens",
        "mcp_token.overhead.tokens",
        "mcp_token.responses",
        "mcp_token.session.utilization",
    } <= set(metrics)
    tokens = metrics["mcp_token.message.tokens"]
    assert sum(p.count for p in tokens) == 1  # the response (a request's tokens: the counter alone)
    assert list(tokens[0].explicit_bounds)[:3] == [64.0, 256.0, 1024.0]
    for points in metrics.values():
        for p in points:
            assert "sess" not in {str(v) for v in _attrs(p.attributes).values()}


CONFIGURE_SCRIPT = r"""
import json, sys
import anyio
from opentelemetry import metrics, trace
preconfigured = sys.argv[1] == "preconfigured"
if preconfigured:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    tp, mp = TracerProvider(), MeterProvider()
    trace.set_tracer_provider(tp)
    metrics.set_meter_provider(mp)
from mcp_token_otel.config import config_from_dict
from mcp_token_otel.instrumentation import instrument
from mcp_token_otel.emitters.otel_setup import configure_otel
configured = configure_otel()
same = (trace.get_tracer_provider() is tp and metrics.get_meter_provider() is mp) if preconfigured else None
instrument(config_from_dict({"estimator": "chars/4"}))
from mcp import Client
from mcp.server.mcpserver import MCPServer
server = MCPServer("otlp")
@server.tool()
def big(n: int) -> str:
    return "x" * n
async def main():
    async with Client(server, mode="legacy") as client:
        await client.call_tool("big", {"n": 400})
anyio.run(main)
trace.get_tracer_provider().shutdown()
metrics.get_meter_provider().shutdown()
print(json.dumps({"configured": configured, "same": same}))
"""


def _run_configure(port: int, arg: str) -> dict[str, Any]:
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "shim-test",
        "OTEL_METRIC_EXPORT_INTERVAL": "3600000",
    }
    done = subprocess.run(
        [sys.executable, "-c", CONFIGURE_SCRIPT, arg], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not IS_MCP_V2, reason="uses mcp 2.x Client(server)")
@pytest.mark.slow
def test_configure_otel_honours_env(receiver: Receiver) -> None:
    out = _run_configure(receiver.port, "fresh")
    assert out["configured"] is True
    spans = receiver.spans()
    names = {(service, span.name) for service, span, _ in spans}
    assert ("shim-test", "tools/call big") in names
    # The client span is the SDK's own (JSON-RPC), enriched: its name is kept.
    client = [a for _, s, a in spans if s.name == "MCP send tools/call big" and s.kind == s.SPAN_KIND_CLIENT]
    assert client and client[0]["mcp_token.output_tokens"] >= 100  # 400 chars at chars/4, plus framing
    assert "mcp_token.message.tokens" in receiver.metrics()


@pytest.mark.skipif(not IS_MCP_V2, reason="uses mcp 2.x Client(server)")
@pytest.mark.slow
def test_configure_otel_leaves_preconfigured_alone(receiver: Receiver) -> None:
    out = _run_configure(receiver.port, "preconfigured")
    assert out == {"configured": False, "same": True}
    assert receiver.bodies == {}


class Recording(SpanExporter):
    """Wraps the real exporter and remembers what it was asked to export and what it answered."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.exported = 0
        self.results: list[SpanExportResult] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exported += len(spans)
        result = self.inner.export(spans)
        self.results.append(result)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()


@pytest.mark.skipif(not IS_MCP_V2, reason="uses mcp 2.x Client(server)")
def test_endpoint_down_calls_still_succeed() -> None:
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    from mcp_token_otel.instrumentation import instrument, uninstrument

    closed = free_port()  # nothing listens here: connection refused
    exporter = Recording(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{closed}/v1/traces", timeout=1))
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=3_600_000))
    instrument(make_config(), tracer_provider=tracer_provider, meter_provider=MeterProvider())
    server = MCPServer("down")

    @server.tool()
    def echo(text: str) -> str:
        return text

    async def main() -> list[str]:
        async with Client(server, mode="auto") as client:
            return [(await client.call_tool("echo", {"text": str(i)})).content[0].text for i in range(20)]

    try:
        assert anyio.run(main) == [str(i) for i in range(20)]
    finally:
        uninstrument()
    assert exporter.exported == 0  # nothing exported on the call path: the spans wait in the batch queue
    tracer_provider.force_flush(timeout_millis=10_000)
    assert exporter.exported >= 20
    assert SpanExportResult.FAILURE in exporter.results
    tracer_provider.shutdown()
