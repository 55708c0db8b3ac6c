"""A span says what its session figures were decided on when budgets are shared: the store's (``shared``), or the
replica's own count while the store does not answer (``local``)."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from mcp_token_otel.config import config_from_dict
from mcp_token_otel.recorder import TokenRecorder
from tests.helpers.redis_server import RedisServer
from tests.helpers.support import free_port


def one_call(url: str, tmp_prefix: str) -> dict[str, object]:
    exporter = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(exporter))
    config = config_from_dict({"budget": {"store": url, "store_prefix": tmp_prefix, "store_timeout": 1.0},
                               "guard": {"mode": "enforce", "session_hard_limit": True}})
    rec = TokenRecorder(config, tracing)
    try:
        span = rec.start_span("tools/call t", SpanKind.SERVER)
        call = rec.begin("server", "tools/call", {"name": "t", "arguments": {}}, "conversation-1")
        call.span = span
        call.guard()
        call.open(span)
        call.result({"content": [{"type": "text", "text": "hello"}]})
        call.close()
        rec.end_span(span)
    finally:
        rec.close()
    (finished,) = exporter.get_finished_spans()
    return dict(finished.attributes or {})


def test_the_span_says_the_figures_are_the_shared_stores(redis_server: RedisServer) -> None:
    attributes = one_call(redis_server.url, "span-source:")
    assert attributes["mcp_token.budget.source"] == "shared"
    assert attributes["mcp_token.guard.budget_source"] == "shared"
    assert attributes["mcp_token.session.tokens"] > 0


def test_the_span_says_the_figures_are_local_when_the_store_does_not_answer() -> None:
    attributes = one_call(f"redis://127.0.0.1:{free_port()}/0", "span-source-down:")  # nothing listens there
    assert attributes["mcp_token.budget.source"] == "local"
    assert attributes["mcp_token.guard.budget_source"] == "local"
