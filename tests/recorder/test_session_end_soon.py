"""A session ended from a garbage-collection callback: queued, never done inside the code that allocated.

A weakref finalizer runs inside whatever code triggered the collection, holding whatever lock it held. Ending
the session there re-entered the aggregate's lock (not reentrant) and hung the process (seen
in the mcp 2.x adapter, whose per-client anchors end their session when collected).
"""

from __future__ import annotations

import threading

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from mcp_token_otel.config import config_from_dict
from mcp_token_otel.recorder import TokenRecorder
from tests.helpers.calls import exchange
from tests.helpers.support import scrape

TEXT = {"content": [{"type": "text", "text": "hello " * 50}]}


def make() -> TokenRecorder:
    recorder = TokenRecorder(config_from_dict({"estimator": "chars/4"}), TracerProvider(), MeterProvider())
    exchange(recorder, "server", "tools/call", {"name": "t"}, "s1", result=TEXT)
    return recorder


def live(recorder: TokenRecorder) -> int:
    return sum(sum(counts.values()) for counts in recorder.session_states().values())


def ended(recorder: TokenRecorder) -> int:
    """Session ends observed (utilization), read from the aggregate without a collection (which is a safe
    point itself)."""
    return sum(count for _s, _b, _sum, count in recorder.aggregate.hists("mcp_token_session_utilization_ratio"))


def test_ending_soon_under_the_aggregate_lock_returns_and_ends_at_the_next_safe_point() -> None:
    recorder = make()
    assert live(recorder) == 1
    done = threading.Event()

    def finalizer_inside_a_locked_update() -> None:
        with recorder.aggregate.lock:  # what a collection triggered inside an aggregate update holds
            recorder.end_session_soon("server", "s1")
        done.set()

    worker = threading.Thread(target=finalizer_inside_a_locked_update, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert done.is_set(), "end_session_soon blocked on a lock its caller held"
    assert ended(recorder) == 0  # not ended yet: only queued
    assert live(recorder) == 0  # a read of the session states is a safe point: ended there
    assert ended(recorder) == 1  # and observed once, as end_session does
    assert scrape(recorder).value("mcp_token_session_utilization_ratio_count", side="server") == 1


def test_the_next_message_and_close_end_what_is_queued() -> None:
    recorder = make()
    recorder.end_session_soon("server", "s1")
    call = recorder.begin("server", "tools/list", {}, "s2")
    call.open()  # the next message: a safe point
    assert not recorder.sessions["server"].sessions()  # s1 ended; s2's budget starts with its answer
    call.result({"tools": []})
    call.close()
    assert [key for key, _ in recorder.sessions["server"].sessions()] == ["s2"]
    recorder.end_session_soon("server", "s2")
    recorder.close()
    assert not recorder.sessions["server"].sessions()
    assert ended(recorder) == 2
