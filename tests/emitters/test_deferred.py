"""Deferred OpenTelemetry histogram points (``metrics.defer_otel``): off the call path, bounded, faults counted,
complete at every collection."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from mcp_token_otel.catalog import BY_NAME, BY_OTEL_NAME, Family
from mcp_token_otel.config import config_from_dict
from mcp_token_otel.emitters.deferred import DeferredPoints
from mcp_token_otel.emitters.otel_metrics import NO_SPAN
from mcp_token_otel.recorder import TokenRecorder
from mcp_token_otel.semconv import MCP_SERVER_OPERATION_DURATION
from tests.helpers.calls import exchange

TOKENS = BY_NAME["mcp_token_message_tokens"]
UTILIZATION = BY_NAME["mcp_token_session_utilization_ratio"]
DURATION = BY_OTEL_NAME[MCP_SERVER_OPERATION_DURATION]


class Recording:
    """Stands in for the OpenTelemetry points (OtelPoints' interface): records each point replayed into it, with
    the trace id its exemplar would see (the context given, else the current one)."""

    def __init__(self, fail: bool = False) -> None:
        self.points: list[tuple[str, float, dict[str, Any], int]] = []
        self.fail = fail

    def attributes(self, family: Family, labels: tuple[Any, ...]) -> dict[str, Any]:
        return {"labels": labels}

    def record_attributes(self, family: Family, value: float, attributes: dict[str, Any], context: Any) -> None:
        if self.fail:
            raise RuntimeError("meter down")
        span = trace.get_current_span(context)
        self.points.append((family.key, value, attributes, span.get_span_context().trace_id))


def test_points_are_queued_then_replayed_in_order_only_breaches_with_their_trace_context() -> None:
    inner = Recording()
    points = DeferredPoints(inner, interval=3600, slice_size=2)  # type: ignore[arg-type]  # no thread run here
    try:
        tracer = TracerProvider().get_tracer("t")
        with tracer.start_as_current_span("call") as span:
            points.record(DURATION, ("server", "srv"), 0.2, NO_SPAN)
            points.record(TOKENS, ("server", "srv", "tools/call", "t", "output"), 3, NO_SPAN)
            points.record(TOKENS, ("server", "srv", "tools/call", "t", "output"), 20_000)  # a breach: its context
            points.record(UTILIZATION, ("server", "srv"), 0.5, NO_SPAN)
            trace_id = span.get_span_context().trace_id
        points.record(TOKENS, ("client", "srv", "tools/call", "t", "output"), 7, NO_SPAN)
        assert inner.points == []  # nothing ran inline
        points.flush()  # in slices of two: everything still replays, in order
        assert [(name, value) for name, value, _, _ in inner.points] == [
            (MCP_SERVER_OPERATION_DURATION, 0.2),
            ("mcp_token_message_tokens", 3),
            ("mcp_token_message_tokens", 20_000),
            ("mcp_token_session_utilization_ratio", 0.5),
            ("mcp_token_message_tokens", 7),
        ]
        assert inner.points[-1][2] == {"labels": ("client", "srv", "tools/call", "t", "output")}
        # Exemplars only where they help: the breach keeps the trace, the rest replay without one.
        assert [p[3] for p in inner.points] == [0, 0, trace_id, 0, 0]
    finally:
        points.stop()


def test_queue_is_bounded_and_drops_are_counted() -> None:
    inner = Recording()
    points = DeferredPoints(inner, interval=3600, max_pending=3)  # type: ignore[arg-type]
    try:
        for _ in range(5):
            points.record(UTILIZATION, ("client", "srv"), 1.0, NO_SPAN)
        assert points.dropped == 2
        points.flush()
        assert len(inner.points) == 3
    finally:
        points.stop()


def test_a_failing_replay_is_reported_and_never_raises() -> None:
    errors: list[str] = []
    points = DeferredPoints(Recording(fail=True), interval=3600, on_error=errors.append)  # type: ignore[arg-type]
    points.record(UTILIZATION, ("server", "srv"), 0.5, NO_SPAN)
    points.record(TOKENS, ("server", "srv", "tools/call", "t", "output"), 3, NO_SPAN)
    points.stop()  # replays what is left
    points.stop()  # idempotent
    assert errors == ["metrics", "metrics"]


def test_the_background_thread_drains_without_help() -> None:
    inner = Recording()
    points = DeferredPoints(inner, interval=0.01)  # type: ignore[arg-type]
    try:
        points.record(UTILIZATION, ("server", "srv"), 0.5, NO_SPAN)
        for _ in range(500):  # bounded: up to 5 s
            if inner.points:
                break
            points._stop.wait(0.01)
        assert inner.points and inner.points[0][0] == "mcp_token_session_utilization_ratio"
    finally:
        points.stop()


@pytest.mark.parametrize("defer", [True, False])
def test_real_sdk_collection_includes_queued_points_and_their_exemplars(defer: bool) -> None:
    """Deferred or inline (the default), a breach's points keep its trace as an exemplar and other points
    carry none (the SDK's trace-based filter would offer every point recorded inside a sampled span)."""
    reader = InMemoryMetricReader()
    config = config_from_dict({"estimator": "chars/4", "metrics": {"defer_otel": defer}})
    recorder = TokenRecorder(config, TracerProvider(), MeterProvider(metric_readers=[reader]))
    assert (recorder.metrics.deferred is not None) == defer
    try:
        tracer = TracerProvider().get_tracer("t")
        with tracer.start_as_current_span("tools/call big") as span:
            exchange(recorder, "server", "tools/call", {"name": "big"}, "s", span=span,
                     result={"content": [{"type": "text", "text": "x" * 40_000}]})
            trace_id = span.get_span_context().trace_id
        with tracer.start_as_current_span("tools/call small") as span:
            exchange(recorder, "server", "tools/call", {"name": "small"}, "s", span=span,
                     result={"content": [{"type": "text", "text": "ok"}]})
        # No explicit flush: collecting reads the drop count (which replays the queue first) before the histograms.
        data = reader.get_metrics_data()
        assert data is not None
        points: dict[str, Any] = {m.name: m.data.data_points for rm in data.resource_metrics
                                  for sm in rm.scope_metrics for m in sm.metrics}
        by_tool = {p.attributes["gen_ai.tool.name"]: p for p in points["mcp_token.message.tokens"]}
        assert by_tool["big"].count == 1 and by_tool["big"].sum >= 10_000
        assert any(e.trace_id == trace_id for e in by_tool["big"].exemplars)  # a critical response: trace kept
        assert by_tool["small"].count == 1 and not by_tool["small"].exemplars  # a low one: no exemplar offered
        for name in ("mcp.server.operation.duration",):
            small = [p for p in points[name] if p.attributes.get("gen_ai.tool.name") == "small"]
            assert small and not any(p.exemplars for p in small), name
        assert points["mcp_token.instrumentation.dropped"][0].value == 0
    finally:
        recorder.close()


def test_time_bounded_slices_replay_everything_in_order() -> None:
    # A zero-length slice replays one point per slice, with a pause between slices: the flush still ends, with
    # every point replayed once and in order.
    inner = Recording()
    points = DeferredPoints(inner, interval=3600, slice_seconds=0.0, pause=0.0001)  # type: ignore[arg-type]
    try:
        for i in range(50):
            points.record(UTILIZATION, ("server", "srv"), float(i), NO_SPAN)
        points.flush()
        assert [p[1] for p in inner.points] == [float(i) for i in range(50)]
    finally:
        points.stop()


def test_a_flush_ends_while_producers_keep_adding() -> None:
    import threading

    inner = Recording()
    points = DeferredPoints(inner, interval=3600, slice_seconds=0.0, pause=0.0001)  # type: ignore[arg-type]
    stop = threading.Event()
    produced = [0]

    def produce() -> None:
        for i in range(20_000):  # bounded even if the flush hung
            if stop.is_set():
                return
            points.record(TOKENS, ("server", "srv", "tools/call", "p", "output"), float(i), NO_SPAN)
            produced[0] += 1

    for i in range(100):
        points.record(UTILIZATION, ("server", "srv"), float(i), NO_SPAN)
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        points.flush()  # replays what was queued when it began (at least the 100), then returns
        replayed = [(p[0], p[1]) for p in inner.points]
        assert replayed[:100] == [("mcp_token_session_utilization_ratio", float(i)) for i in range(100)]
    finally:
        stop.set()
        producer.join(timeout=10)
        points.stop()
    # stop() replayed the rest: every point was replayed exactly once, in order, or counted as dropped.
    produced_values = [p[1] for p in inner.points if p[0] == "mcp_token_message_tokens"]
    assert produced_values == sorted(set(produced_values))
    assert len(produced_values) + points.dropped == produced[0]
