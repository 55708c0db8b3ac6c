"""Fixtures for the shim tests: one global tracer provider per session, fresh metrics per test.

The SDK's own spans (server side, JSONRPCDispatcher) use the GLOBAL tracer provider, which can be set
only once per process, so it is set here once and its in-memory exporter is cleared around each test.
"""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mcp_token_otel.config import Config, config_from_dict

IS_MCP_V2 = importlib.util.find_spec("mcp.shared.dispatcher") is not None
if not IS_MCP_V2:
    collect_ignore_glob = ["test_v2_*.py"]

EXPORTER = InMemorySpanExporter()


def _global_tracer_provider() -> TracerProvider:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    return provider


TRACER_PROVIDER = _global_tracer_provider()


def make_config(**overrides: Any) -> Config:
    """A transparent estimator (chars/4) so token counts are predictable. Metric points are deferred as
    by default: reading the metrics (a collection) drains the queue first."""
    return config_from_dict({"estimator": "chars/4", **overrides})


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


@pytest.fixture
def otel() -> Iterator[Otel]:
    EXPORTER.clear()
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Otel(EXPORTER, reader, TRACER_PROVIDER, meter_provider)
    EXPORTER.clear()
    meter_provider.shutdown()


@pytest.fixture
def instrumented(otel: Otel) -> Iterator[Any]:
    """instrument() with chars/4 and the test providers; uninstrument() afterwards."""
    from mcp_token_otel.instrument import instrument, uninstrument

    recorder = instrument(
        make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider
    )
    yield recorder
    uninstrument()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
