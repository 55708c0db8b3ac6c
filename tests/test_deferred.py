"""Deferred metric recording: off the call path, bounded, faults counted, complete at every collection."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from mcp_token_otel.config import config_from_dict
from mcp_token_otel.emitters.deferred import DeferredSink
from mcp_token_otel.emitters.sink import BaseSink, CallInfo
from mcp_token_otel.recorder import TokenRecorder


class Recording(BaseSink):
    """A sink that records calls and the trace id current during each."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], int]] = []
        self.fail = fail

    def _note(self, name: str, *args: Any) -> None:
        if self.fail:
            raise RuntimeError("sink down")
        self.calls.append((name, args, trace.get_current_span().get_span_context().trace_id))

    def record_message(self, *args: Any) -> None:
        self._note("record_message", *args)

    def record_transition(self, *args: Any) -> None:
        self._note("record_transition", *args)

    def record_session_end(self, *args: Any) -> None:
        self._note("record_session_end", *args)

    def record_error(self, *args: Any) -> None:
        self._note("record_error", *args)


def test_calls_are_queued_then_replayed_in_order_only_breaches_with_their_trace_context() -> None:
    from mcp_token_otel.core.measure import measure_result

    inner = Recording()
    sink = DeferredSink(inner, interval=3600, slice_size=2)  # the thread will not run during the test
    small = measure_result("tools/call", {"content": [{"type": "text", "text": "ok"}]})
    large = measure_result("tools/call", {"content": [{"type": "text", "text": "word " * 20_000}]})
    assert small.risk_tier == "low" and large.risk_tier == "critical"
    try:
        tracer = TracerProvider().get_tracer("t")
        with tracer.start_as_current_span("call") as span:
            sink.record_transition("server", "warning", "")
            sink.record_message("server", "tools/call", "t", "output", small, "")
            sink.record_message("server", "tools/call", "t", "output", large, "")
            sink.record_session_end("server", 0.5, "", CallInfo())
            trace_id = span.get_span_context().trace_id
        sink.record_error("estimate", "")
        assert inner.calls == []  # nothing ran inline
        sink.flush()  # in slices of two: everything still replays, in order
        assert [c[0] for c in inner.calls] == [
            "record_transition",
            "record_message",
            "record_message",
            "record_session_end",
            "record_error",
        ]
        # Exemplars only where they help: the breach's message keeps the trace, the rest replay without.
        assert [c[2] for c in inner.calls] == [0, 0, trace_id, 0, 0]
    finally:
        sink.close()


def test_queue_is_bounded_and_drops_are_counted() -> None:
    inner = Recording()
    sink = DeferredSink(inner, interval=3600, max_pending=3)
    try:
        for _ in range(5):
            sink.record_transition("client", "exhausted", "")
        assert sink.dropped == 2
        sink.flush()
        assert len(inner.calls) == 3
    finally:
        sink.close()


def test_a_failing_sink_is_reported_and_never_raises() -> None:
    errors: list[str] = []
    sink = DeferredSink(Recording(fail=True), interval=3600, on_error=errors.append)
    sink.record_transition("server", "warning", "")
    sink.record_session_end("server", 0.5, "", CallInfo())
    sink.close()  # flushes
    sink.close()  # idempotent
    assert errors == ["metrics", "metrics"]


def test_the_background_thread_drains_without_help() -> None:
    inner = Recording()
    sink = DeferredSink(inner, interval=0.01)
    try:
        sink.record_transition("server", "warning", "")
        for _ in range(500):  # bounded: up to 5 s
            if inner.calls:
                break
            sink._stop.wait(0.01)
        assert inner.calls and inner.calls[0][0] == "record_transition"
    finally:
        sink.close()


@pytest.mark.parametrize("defer", [True, False])
def test_real_sdk_collection_includes_queued_points_and_their_exemplars(defer: bool) -> None:
    """Deferred or inline (the default), a breach's points keep its trace as an exemplar and other points
    carry none (the SDK's trace-based filter would offer every point recorded inside a sampled span)."""
    reader = InMemoryMetricReader()
    config = config_from_dict({"estimator": "chars/4", "metrics": {"defer_otel": defer}})
    recorder = TokenRecorder(config, TracerProvider(), MeterProvider(metric_readers=[reader]))
    try:
        tracer = TracerProvider().get_tracer("t")
        with tracer.start_as_current_span("tools/call big") as span:
            recorder.record_output(span, "server", "tools/call", "big",
                                   result={"content": [{"type": "text", "text": "x" * 40_000}]}, session_id="s")
            trace_id = span.get_span_context().trace_id
        with tracer.start_as_current_span("tools/call small") as span:
            recorder.record_output(span, "server", "tools/call", "small", started=0.0,
                                   result={"content": [{"type": "text", "text": "ok"}]}, session_id="s")
        # No explicit flush: collecting runs the drain callback before reading the histograms.
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
    # A zero-length slice replays one call per slice, with a pause between slices: the flush still ends, with
    # every call replayed once and in order.
    inner = Recording()
    sink = DeferredSink(inner, interval=3600, slice_seconds=0.0, pause=0.0001)
    try:
        for i in range(50):
            sink.record_error(f"stage{i}", "")
        sink.flush()
        assert [c[1][0] for c in inner.calls] == [f"stage{i}" for i in range(50)]
    finally:
        sink.close()


def test_a_flush_ends_while_producers_keep_adding() -> None:
    import threading

    inner = Recording()
    sink = DeferredSink(inner, interval=3600, slice_seconds=0.0, pause=0.0001)
    stop = threading.Event()
    produced = [0]

    def produce() -> None:
        for i in range(20_000):  # bounded even if the flush hung
            if stop.is_set():
                return
            sink.record_error(f"p{i}", "")
            produced[0] += 1

    for i in range(100):
        sink.record_error(f"q{i}", "")
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        sink.flush()  # replays what was queued when it began (at least the 100), then returns
        replayed = [c[1][0] for c in inner.calls]
        assert replayed[:100] == [f"q{i}" for i in range(100)]
    finally:
        stop.set()
        producer.join(timeout=10)
        sink.close()
    # close() replayed the rest: every call was replayed exactly once, in order, or counted as dropped.
    produced_numbers = [int(c[1][0][1:]) for c in inner.calls if c[1][0].startswith("p")]
    assert produced_numbers == sorted(set(produced_numbers))
    assert len(produced_numbers) + sink.dropped == produced[0]
