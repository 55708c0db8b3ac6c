"""Fault-injection doubles shared by the SDK suites: every one raises where the real part would work."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


def raising_estimator(_text: str) -> int:
    raise RuntimeError("estimator fault")


class RaisingProcessor(SpanProcessor):
    def on_start(self, span: Any, parent_context: Any = None) -> None:
        raise RuntimeError("processor on_start fault")

    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("processor on_end fault")


class RaisingExporter(SpanExporter):
    """Counts its attempts, so a test can show the exporter really ran before its fault was absorbed."""

    def __init__(self) -> None:
        self.attempts = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.attempts += 1
        raise RuntimeError("exporter fault")


class BrokenSink:
    """A MetricsSink whose every method raises."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any) -> None:
            raise RuntimeError(f"sink fault in {name}")

        return fail


class BrokenInstrument:
    def record(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("meter fault")

    add = record


class BrokenMeter:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: BrokenInstrument()


class BrokenMeterProvider(MeterProvider):
    def get_meter(self, *args: Any, **kwargs: Any) -> Any:
        return BrokenMeter()
