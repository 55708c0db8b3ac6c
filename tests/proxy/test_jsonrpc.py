"""In-process: framing (lines, SSE, bodies; chunks split anywhere), pairing in both directions, the bounded queue."""

from __future__ import annotations

import json
import threading
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from mcp_token_otel.proxy.jsonrpc import BODY, C2S, LINES, S2C, SSE, MessageStream, ProxyStats, Tracker
from mcp_token_otel.proxy.measure_queue import MeasureQueue
from mcp_token_otel.recorder import SIDES, TokenRecorder
from tests.helpers.support import make_config


def _tracker() -> tuple[Tracker, InMemorySpanExporter, TokenRecorder]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    recorder = TokenRecorder(make_config(), provider)
    tracker = Tracker(recorder, ProxyStats(), session_key="k", transport="pipe", attributes={"server.address": "t"})
    return tracker, exporter, recorder


def _feed(stream: MessageStream, data: bytes, step: int) -> list[bytes]:
    out: list[bytes] = []
    for i in range(0, len(data), step):
        out += stream.feed(data[i:i + step])
    return out + stream.finish()


def test_framing_survives_any_chunking() -> None:
    tracker, _, _ = _tracker()
    lines = b'{"a": 1}\r\n\n{"b": "x\\ny"}\n{"c": 3}'  # CRLF, a blank line, a last line without newline
    sse = b'id: 1\nevent: message\ndata: {"a": 1}\n\n: comment\ndata: {"b":\ndata: 2}\r\n\r\ndata: {"c": 3}\n\n'
    for step in (1, 2, 3, 7, 1000):
        assert _feed(MessageStream(tracker, C2S, LINES), lines, step) == [b'{"a": 1}', b'{"b": "x\\ny"}', b'{"c": 3}']
        assert _feed(MessageStream(tracker, S2C, SSE), sse, step) == [b'{"a": 1}', b'{"b":\n2}', b'{"c": 3}']
        assert _feed(MessageStream(tracker, S2C, BODY), lines, step) == [lines]


def test_lost_chunk_resynchronises_on_the_next_message() -> None:
    tracker, _, _ = _tracker()
    stream = MessageStream(tracker, C2S, LINES)
    assert stream.feed(b'{"a": 1}\n{"b"') == [b'{"a": 1}']
    stream.lost = True  # the relay dropped the chunk that followed
    assert stream.feed(b'tail of b}\n{"c": 3}\n') == [b'{"c": 3}']


def test_oversize_message_is_skipped_and_counted() -> None:
    tracker, _, _ = _tracker()
    stream = MessageStream(tracker, C2S, LINES, max_message=10)
    assert stream.feed(b'{"long": "xxxxxxxx') == []
    assert stream.feed(b'xxxx"}\n{"ok":1}\n') == [b'{"ok":1}']
    assert tracker.stats.oversize == 1


def test_pairing_both_directions_batches_and_strays() -> None:
    assert "proxy" in SIDES
    tracker, exporter, recorder = _tracker()
    now = 1_000_000_000
    msgs = [
        (C2S, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "big", "arguments": {}}}),
        (S2C, {"jsonrpc": "2.0", "id": 1, "method": "sampling/createMessage", "params": {"messages": []}}),  # same id
        (C2S, {"jsonrpc": "2.0", "id": 1, "result": {"role": "assistant", "content": {"type": "text", "text": "s"}}}),
        (S2C, {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "x" * 4000}]}}),
        (C2S, [{"jsonrpc": "2.0", "id": "1", "method": "ping"}, {"jsonrpc": "2.0", "method": "notifications/x"}]),
        (S2C, [{"jsonrpc": "2.0", "id": "1", "error": {"code": -32601, "message": "nope"}}]),
        (S2C, {"jsonrpc": "2.0", "id": 99, "result": {}}),
        (C2S, "not json"),
    ]
    for i, (direction, message) in enumerate(msgs):
        raw = message.encode() if isinstance(message, str) else json.dumps(message).encode()
        tracker.observe(direction, raw, now + i * 1000)
    tracker.close(now + 10_000)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    big = spans["tools/call big"]
    assert big.kind is SpanKind.CLIENT and big.attributes["mcp_token.output_tokens"] >= 1000
    assert big.start_time == now and big.end_time == now + 3000  # the times the bytes passed, not measuring time
    sampling = spans["sampling/createMessage"]
    assert sampling.kind is SpanKind.SERVER and sampling.attributes["mcp_token.output_tokens"] > 0
    assert spans["ping"].attributes["error.type"] == "-32601"
    counts = {k: v for k, v in tracker.stats.messages.items() if v}
    assert counts == {(C2S, "request"): 2, (C2S, "response"): 1, (C2S, "notification"): 1, (C2S, "invalid"): 1,
                      (S2C, "request"): 1, (S2C, "response"): 2, (S2C, "unmatched"): 1}
    assert sum(recorder.states()["proxy"].values()) == 0  # the session ended with the tracker


def test_unanswered_requests_end_with_the_session() -> None:
    tracker, exporter, _ = _tracker()
    tracker.observe(C2S, b'{"jsonrpc": "2.0", "id": 5, "method": "tools/list"}', 1)
    tracker.close(2)
    (span,) = exporter.get_finished_spans()
    assert span.attributes["error.type"] == "connection_closed" and span.end_time == 2


class _Stream:
    lost = False


def test_queue_is_bounded_never_blocks_and_counts_overflow() -> None:
    gate = threading.Event()
    handled: list[bytes] = []

    def handle(_stream: Any, chunk: bytes, _now: int) -> None:
        gate.wait(10)  # a slow measurer
        handled.append(chunk)

    queue = MeasureQueue(handle, max_bytes=1000, max_items=100)
    stream = _Stream()
    results = [queue.put(stream, b"x" * 100) for _ in range(30)]  # returns at once even though nothing drains
    assert results.count(False) >= 19 and queue.dropped_chunks == results.count(False)
    assert queue.dropped_bytes == 100 * queue.dropped_chunks and stream.lost
    ran: list[int] = []
    queue.control(ran.append)  # control items are always accepted, even when full
    gate.set()
    assert queue.drain(10)
    assert len(handled) == results.count(True) and len(ran) == 1
    queue.close()


def test_a_failing_measurement_does_not_stop_the_worker() -> None:
    errors: list[int] = []

    def handle(_stream: Any, chunk: bytes, _now: int) -> None:
        if chunk == b"bad":
            raise ValueError("boom")

    queue = MeasureQueue(handle, on_error=lambda: errors.append(1))
    for chunk in (b"bad", b"good"):
        queue.put(_Stream(), chunk)
    assert queue.drain(10) and errors == [1]
    queue.close()
