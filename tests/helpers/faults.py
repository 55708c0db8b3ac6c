"""Fault-injection doubles shared by the SDK suites: every one raises where the real part would work."""

from __future__ import annotations

import threading
import time
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


class BrokenRegistry:
    """A budget SessionRegistry whose every method raises (install with ``break_budgets``)."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"budget registry fault in {name}")

        return fail

    def __len__(self) -> int:
        raise RuntimeError("budget registry fault in __len__")


def break_budgets(recorder: Any) -> None:
    for side in list(recorder.sessions):
        recorder.sessions[side] = BrokenRegistry()


#: The aggregate's recording methods: everything the call path writes metrics through.
AGGREGATE_WRITES = ("add", "add_message", "add_duration", "observe", "set", "replace", "touch")


def break_aggregate(recorder: Any, methods: Sequence[str] = AGGREGATE_WRITES) -> None:
    """Make these recording methods of ``recorder.aggregate`` (the one store every emitter reads) raise; by
    default all of them."""

    def broken(name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"metrics fault in aggregate.{name}")

        return fail

    for name in methods:
        setattr(recorder.aggregate, name, broken(name))


class RaisingListener:
    """A ``recorder.listeners`` observer of finished calls that raises; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, call: Any, measurement: Any) -> None:
        self.calls += 1
        raise RuntimeError("listener fault")


class SlowAggregate:
    """Slow every recording method of ``recorder.aggregate`` down by a few milliseconds (storage on a contended
    lock or a slow disk); the real method still runs. ``calls``: how many recordings were slowed."""

    def __init__(self, recorder: Any, seconds: float = 0.003) -> None:
        self.seconds = seconds
        self.calls = 0
        aggregate = recorder.aggregate
        for name in AGGREGATE_WRITES:
            setattr(aggregate, name, self._slowed(getattr(aggregate, name)))

    def _slowed(self, method: Any) -> Any:
        def slow(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            time.sleep(self.seconds)
            return method(*args, **kwargs)

        return slow


def shared_files_mode(monkeypatch: Any, directory: Any) -> None:
    """prometheus-client's multiprocess files as the recorder's storage, as ``PROMETHEUS_MULTIPROC_DIR`` set
    at start selects (prometheus-client picks its value class at import: set here too). Before the recorder
    is built."""
    from prometheus_client import values

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue())


def break_prometheus(monkeypatch: Any) -> None:
    """Make every write of prometheus-client's values raise (the multiprocess files of
    :func:`shared_files_mode`, which the call path writes); after the recorder is built."""
    from prometheus_client import values

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("prometheus-client fault")

    for method in ("inc", "set", "set_exemplar"):
        monkeypatch.setattr(values.ValueClass, method, fail)


class BlockingMeterProvider(MeterProvider):
    """A real MeterProvider whose histograms' first ``record`` blocks until ``release`` is set (at most ``limit``
    s), then records. ``blocked_the_call`` tells whether it had to give up waiting: true when the MCP call could
    not finish while the point was stuck, i.e. the point was recorded on the call's own path."""

    def __init__(self, limit: float = 5.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.release = threading.Event()
        self.entered = threading.Event()
        self.limit = limit
        self.blocked_the_call = False

    def get_meter(self, *args: Any, **kwargs: Any) -> Any:
        return _BlockingMeter(super().get_meter(*args, **kwargs), self)


class _BlockingMeter:
    def __init__(self, meter: Any, provider: BlockingMeterProvider) -> None:
        self._meter = meter
        self._provider = provider

    def create_histogram(self, *args: Any, **kwargs: Any) -> Any:
        return _BlockingHistogram(self._meter.create_histogram(*args, **kwargs), self._provider)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._meter, name)


class _BlockingHistogram:
    def __init__(self, histogram: Any, provider: BlockingMeterProvider) -> None:
        self._histogram = histogram
        self._provider = provider

    def record(self, *args: Any, **kwargs: Any) -> None:
        provider = self._provider
        if not provider.entered.is_set():
            provider.entered.set()
            provider.blocked_the_call = not provider.release.wait(provider.limit)
        self._histogram.record(*args, **kwargs)


def otel_pipeline_with_failing_exporters(monkeypatch: Any) -> tuple[Any, Any, RaisingExporter, Any]:
    """The project's own ``configure_otel`` building its pipeline (BatchSpanProcessor + OTLP-style span
    exporter, PeriodicExportingMetricReader + metric exporter) with exporters that raise; the providers are
    captured instead of replacing the process-wide ones. Returns (tracer_provider, meter_provider,
    span_exporter, metric_exporter)."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    from mcp_token_otel.emitters import otel_setup

    class RaisingMetricExporter(MetricExporter):
        def __init__(self) -> None:
            super().__init__()
            self.attempts = 0

        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
            self.attempts += 1
            raise RuntimeError("metric exporter fault")

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            pass

    span_exporter, metric_exporter = RaisingExporter(), RaisingMetricExporter()
    captured: dict[str, Any] = {}
    monkeypatch.setattr(otel_setup, "span_exporter", lambda: span_exporter)
    monkeypatch.setattr(otel_setup, "metric_exporter", lambda: metric_exporter)
    monkeypatch.setattr(otel_setup, "_tracing_unconfigured", lambda: True)
    monkeypatch.setattr(otel_setup, "_metrics_unconfigured", lambda: True)
    monkeypatch.setattr(trace, "set_tracer_provider", lambda p: captured.__setitem__("tracer", p))
    monkeypatch.setattr(metrics, "set_meter_provider", lambda p: captured.__setitem__("meter", p))
    monkeypatch.setattr(otel_setup.atexit, "register", lambda *a, **k: None)  # the test shuts them down
    assert otel_setup.configure_otel(shutdown_timeout=1.0)
    return captured["tracer"], captured["meter"], span_exporter, metric_exporter
