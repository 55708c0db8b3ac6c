"""A call holds its request's span attributes and sets them together with the answer's, in one set_attributes
call; what no answer consumed is set when the call closes, so nothing is lost."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from mcp_token_otel.config import config_from_dict
from mcp_token_otel.core.measure import measure_request, measure_result
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


def _counted(span: Any, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every set_attributes / set_attribute call into ``span``, in order."""
    calls: list[dict[str, Any]] = []
    set_attributes, set_attribute = span.set_attributes, span.set_attribute

    def many(attributes: Any) -> None:
        calls.append(dict(attributes))
        set_attributes(attributes)

    def one(key: str, value: Any) -> None:
        calls.append({key: value})
        set_attribute(key, value)

    monkeypatch.setattr(span, "set_attributes", many)
    monkeypatch.setattr(span, "set_attribute", one)
    return calls


def test_request_attributes_are_held_then_set_with_the_answers_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    rec, tracer, _ = _setup()
    params = {"name": "fetch", "arguments": {"q": "x" * 50}}
    span = tracer.start_span("tools/call fetch", kind=SpanKind.SERVER)
    calls = _counted(span, monkeypatch)
    call = rec.begin("server", "tools/call", params, "s")
    call.open(span, attributes={A_TRANSPORT: "pipe"})
    assert call.held[A_INPUT_TOKENS] > 0 and call.held[A_TRANSPORT] == "pipe"
    assert A_INPUT_TOKENS not in span.attributes and calls == []  # held, not set yet
    call.result(RESULT)
    assert not call.held  # consumed
    call.close()
    span.end()
    assert len(calls) == 1  # one call into the span, request and answer together
    attributes = dict(span.attributes)
    assert calls[0].items() <= attributes.items()
    assert attributes[A_INPUT_TOKENS] == measure_request("tools/call", params, rec.policy).total_tokens
    assert attributes[A_OUTPUT_TOKENS] == measure_result("tools/call", RESULT, policy=rec.policy).total_tokens
    assert attributes[A_ESTIMATOR] == "chars/4" and attributes[A_TRANSPORT] == "pipe"


def test_the_session_totals_and_budget_events_come_with_the_answer() -> None:
    # Redesign: a request's tokens and its answer's go to the budget together when the call ends, so a window so
    # small that the request alone fills it shows no session state at the request: the totals, the state and the
    # budget events are on the span with the answer.
    rec, tracer, exporter = _setup(context_window=40)
    params = {"name": "fetch", "arguments": {"q": "x" * 200}}
    span = tracer.start_span("tools/call fetch", kind=SpanKind.SERVER)
    call = rec.begin("server", "tools/call", params, "s")
    call.open(span)
    assert A_SESSION_STATE not in call.held and A_SESSION_TOKENS not in call.held
    assert not span.events and rec.sessions["server"].get("s") is None
    call.result(RESULT)
    call.close()
    span.end()
    (finished,) = exporter.get_finished_spans()
    request = measure_request("tools/call", params, rec.policy).total_tokens
    answer = measure_result("tools/call", RESULT, policy=rec.policy).total_tokens
    assert finished.attributes[A_SESSION_TOKENS] == request + answer == rec.sessions["server"].get("s").tokens
    assert finished.attributes[A_SESSION_STATE] == "exhausted"
    assert [e.name for e in finished.events] == [EVENT_BUDGET, EVENT_BUDGET]  # warning, then exhausted


def test_what_no_answer_consumed_is_set_at_close() -> None:
    rec, tracer, _ = _setup()
    span = tracer.start_span("notifications/progress", kind=SpanKind.SERVER)
    call = rec.begin("server", "notifications/progress", {"progress": 1}, None, budgeted=False)
    call.open(span)
    held = dict(call.held)
    assert held[A_INPUT_TOKENS] > 0 and A_INPUT_TOKENS not in span.attributes
    call.close()  # what the adapters do at the end of every exchange
    span.end()
    assert span.attributes[A_INPUT_TOKENS] == held[A_INPUT_TOKENS]


def test_an_unanswered_request_still_counts_and_ends_on_its_span() -> None:
    rec, tracer, _ = _setup()
    params = {"name": "fetch", "arguments": {"q": "x" * 50}}
    span = tracer.start_span("tools/call fetch", kind=SpanKind.SERVER)
    call = rec.begin("server", "tools/call", params, "s")
    call.open(span)
    call.close()  # no answer came (the stream broke)
    span.end()
    request = measure_request("tools/call", params, rec.policy).total_tokens
    assert span.attributes[A_INPUT_TOKENS] == request
    assert rec.sessions["server"].get("s").tokens == request


def test_an_older_servers_answer_to_the_discover_probe_is_no_error() -> None:
    """An mcp 2.x client probes with server/discover; a server of an earlier protocol answers "method not found"
    and the client falls back to initialize: version negotiation, counted as a call but never as an error."""
    from tests.helpers.calls import exchange
    from tests.helpers.support import scrape

    rec = TokenRecorder(config_from_dict({}), TracerProvider())
    try:
        exchange(rec, "client", "server/discover", {}, "c1", error={"code": -32601, "message": "Method not found"})
        exchange(rec, "client", "tools/call", {"name": "t"}, "c1", error={"code": -32602, "message": "bad"})
        found = scrape(rec)
    finally:
        rec.close()
    assert found.value("mcp_token_call_errors_total", method="server/discover") == 0
    assert found.value("mcp_token_call_errors_total", method="tools/call") == 1  # other errors still count
    assert found.value("mcp_token_responses_total", method="server/discover") == 1
