"""A session ended from a garbage-collection callback: queued, never done inside the code that allocated.

A weakref finalizer runs inside whatever code triggered the collection, holding whatever lock it held. Ending
the session there re-entered the Prometheus sink's aggregate lock (not reentrant) and hung the process (seen
in the mcp 2.x adapter, whose per-client anchors end their session when collected).
"""

from __future__ import annotations

import threading

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from mcp_token_otel.config import config_from_dict
from mcp_token_otel.emitters.sink import BaseSink, CallInfo
from mcp_token_otel.recorder import TokenRecorder

TEXT = {"content": [{"type": "text", "text": "hello " * 50}]}


class AggregateSink(BaseSink):
    """A built-in style sink: every update under one non-reentrant lock, as the pre-aggregating sinks do."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ended: list[float] = []

    def record_session_end(self, side: str, utilization: float, server: str, call: CallInfo) -> None:
        with self.lock:
            self.ended.append(utilization)


def make() -> tuple[TokenRecorder, AggregateSink]:
    recorder = TokenRecorder(config_from_dict({"estimator": "chars/4"}), TracerProvider(), MeterProvider())
    sink = AggregateSink()
    recorder.add_sink(sink, inline=True)
    recorder.record_output(None, "server", "tools/call", "t", result=TEXT, session_id="s1")
    return recorder, sink


def live(recorder: TokenRecorder) -> int:
    return sum(sum(counts.values()) for counts in recorder.session_states().values())


def test_ending_soon_under_the_aggregate_lock_returns_and_ends_at_the_next_safe_point() -> None:
    recorder, sink = make()
    assert live(recorder) == 1
    done = threading.Event()

    def finalizer_inside_a_locked_update() -> None:
        with sink.lock:  # what a collection triggered inside an aggregate update holds
            recorder.end_session_soon("server", "s1")
        done.set()

    worker = threading.Thread(target=finalizer_inside_a_locked_update, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert done.is_set(), "end_session_soon blocked on a lock its caller held"
    assert not sink.ended  # not ended yet: only queued
    assert live(recorder) == 0  # a read of the session states is a safe point: ended there
    assert len(sink.ended) == 1  # and observed once, as end_session does


def test_the_next_message_and_close_end_what_is_queued() -> None:
    recorder, _ = make()
    recorder.end_session_soon("server", "s1")
    recorder.record_input(None, "server", "tools/list", {}, "s2")  # the next message: a safe point
    assert [key for key, _ in recorder.sessions["server"].sessions()] == ["s2"]
    recorder.end_session_soon("server", "s2")
    recorder.close()
    assert not recorder.sessions["server"].sessions()
