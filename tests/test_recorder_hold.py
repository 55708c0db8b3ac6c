"""record_input(hold=...) / record_output(held=...): the request's span attributes set with the response's, in
one set_attributes call, and nothing lost when no response comes."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from mcp_token_otel.config import config_from_dict
from mcp_token_otel.recorder import TokenRecorder
from mcp_token_otel.semconv import (
    A_ESTIMATOR,
    A_INPUT_TOKENS,
    A_OUTPUT_TOKENS,
    A_SESSION_STATE,
    A_SESSION_TOKENS,
    A_TRANSPORT,
    EVENT_BUDGET,
)

RESULT = {"content": [{"type": "text", "text": "word " * 400}]}


def _setup(context_window: int = 200_000) -> tuple[TokenRecorder, Any, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = config_from_dict({"estimator": "chars/4", "budget": {"context_window": context_window},
                               "metrics": {"defer_otel": False}})
    return TokenRecorder(config, provider, MeterProvider()), provider.get_tracer("t"), exporter


def _call(rec: TokenRecorder, tracer: Any, hold: bool) -> dict[str, Any]:
    span = tracer.start_span("tools/call fetch", kind=SpanKind.SERVER)
    held: dict[str, Any] | None = {} if hold else None
    rec.record_input(span, "server", "tools/call", {"name": "fetch", "arguments": {"q": "x" * 50}}, "s",
                     attributes={A_TRANSPORT: "pipe"}, hold=held)
    if held is not None:
        assert held[A_INPUT_TOKENS] > 0 and held[A_TRANSPORT] == "pipe"
        assert A_INPUT_TOKENS not in span.attributes  # held, not set yet
    rec.record_output(span, "server", "tools/call", "fetch", result=RESULT, session_id="s", duration_s=0.01,
                      held=held)
    assert not held  # consumed
    span.end()
    return dict(span.attributes)


def test_held_attributes_end_on_the_span_as_if_set_at_once() -> None:
    rec, tracer, _ = _setup()
    direct = _call(rec, tracer, hold=False)
    rec2, tracer2, _ = _setup()
    held = _call(rec2, tracer2, hold=True)
    assert held == direct
    assert held[A_INPUT_TOKENS] > 0 and held[A_OUTPUT_TOKENS] > 0 and held[A_ESTIMATOR] == "chars/4"


def test_the_response_session_totals_win_over_the_request_ones_and_events_are_not_held() -> None:
    # A window so small that the request itself enters a state: its session attributes are held, the
    # response's newer totals replace them, and the request's budget event is on the span already.
    rec, tracer, exporter = _setup(context_window=40)
    span = tracer.start_span("tools/call fetch", kind=SpanKind.SERVER)
    held: dict[str, Any] = {}
    rec.record_input(span, "server", "tools/call", {"name": "fetch", "arguments": {"q": "x" * 200}}, "s", hold=held)
    assert held[A_SESSION_STATE] == "exhausted"
    assert [e.name for e in span.events] == [EVENT_BUDGET, EVENT_BUDGET]
    request_tokens = held[A_SESSION_TOKENS]
    rec.record_output(span, "server", "tools/call", "fetch", result=RESULT, session_id="s", held=held)
    span.end()
    (finished,) = exporter.get_finished_spans()
    assert finished.attributes[A_SESSION_TOKENS] > request_tokens


def test_what_no_response_consumed_is_still_held_for_the_adapter() -> None:
    rec, tracer, _ = _setup()
    span = tracer.start_span("notifications/progress", kind=SpanKind.SERVER)
    held: dict[str, Any] = {}
    rec.record_input(span, "server", "notifications/progress", {"progress": 1}, None, hold=held)
    assert held[A_INPUT_TOKENS] > 0
    rec.set_attributes(span, held)  # what the mcp 2.x middleware does in its finally
    span.end()
    assert span.attributes[A_INPUT_TOKENS] == held[A_INPUT_TOKENS]
