"""Run a slow metrics sink off the MCP call path.

The OpenTelemetry SDK spends 12-30 µs per recorded point (attribute cleaning and hashing, exemplar
reservoirs) while the rest of the shim costs a few µs per message. ``DeferredSink`` queues each call and
a daemon thread replays them every ``interval`` seconds. Only a breach (a high or critical response)
carries the caller's context, so its trace-based exemplar still finds its span; other points replay
without one (an exemplar offer per point costs more than it helps).

The replay runs in slices of at most ``slice_size`` calls and ``slice_seconds`` (0.5 ms, about a dozen
queued calls), each followed by a real sleep of ``pause`` seconds (1 ms). ``time.sleep(0)`` releases the
GIL, but the replaying thread usually takes it back before a waiting thread has woken, so MCP calls used to
wait out whole 64-call slices (about 3 ms; p99 4.5x the baseline's); a 0.1 ms sleep is often still too short
for the waiting thread to be scheduled on a busy machine. The sleeps last only while the flush is on schedule:
past half an interval, slices follow each other with ``sleep(0)`` between them, so the replay keeps up.
Order and count are kept, and a flush replays what was queued when it began, so it always ends. The queue
is bounded: past ``max_pending`` calls, new ones are dropped and counted, so a stalled sink can never grow
memory without limit.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import context as otel_context

from ..core.measure import Measurement
from ..core.risk import BREACH_TIERS
from .sink import CallInfo, MetricsSink

#: A queued call: the wrapped sink's bound method, its arguments, and the context to replay it in (or None).
_Call = tuple[Callable[..., None], tuple[Any, ...], Any]


class DeferredSink:
    """A :class:`MetricsSink` that replays every call on ``sink`` from a background thread."""

    def __init__(
        self,
        sink: MetricsSink,
        *,
        interval: float = 0.5,
        max_pending: int = 100_000,
        on_error: Callable[[str], None] | None = None,
        slice_size: int = 64,
        slice_seconds: float = 0.0005,
        pause: float = 0.001,
    ) -> None:
        self._sink = sink
        self._interval = interval
        self._max_pending = max_pending
        self._on_error = on_error
        self._slice = max(1, slice_size)
        self._slice_seconds = slice_seconds
        self._pause = max(0.0, pause)
        self._pending: deque[_Call] = deque()
        self._drain_lock = threading.Lock()
        self._enqueue_lock = threading.Lock()
        self._stop = threading.Event()
        self.dropped = 0
        try:
            set_deferred = getattr(sink, "set_deferred", None)
            if callable(set_deferred):  # lets the sink drain this queue when its metrics are collected
                set_deferred(self)
        except Exception:  # a user sink that fails at everything still gets its calls (and faults) counted
            if on_error is not None:
                on_error("metrics")
        self._thread = threading.Thread(target=self._run, name="mcp-token-otel-metrics", daemon=True)
        self._thread.start()
        atexit.register(self.stop)  # before the SDK's own exit-time shutdown (atexit runs LIFO)

    def _enqueue(self, method: Callable[..., None], args: tuple[Any, ...], context: Any = None) -> None:
        item = (method, args, context)
        with self._enqueue_lock:  # the bound and the drop count stay exact with many producers
            if len(self._pending) >= self._max_pending:
                self.dropped += 1
                return
            self._pending.append(item)

    def record_message(
        self, side: str, method: str, tool: str | None, direction: str, measurement: Measurement, server: str
    ) -> None:
        # Only a breach keeps the caller's context: its exemplar then finds its span.
        context = otel_context.get_current() if measurement.risk_tier in BREACH_TIERS else None
        self._enqueue(self._sink.record_message, (side, method, tool, direction, measurement, server), context)

    def record_call(self, side: str, method: str, tool: str | None, server: str, call: CallInfo) -> None:
        self._enqueue(self._sink.record_call, (side, method, tool, server, call))

    def record_transition(self, side: str, state: str, server: str) -> None:
        self._enqueue(self._sink.record_transition, (side, state, server))

    def record_session_end(self, side: str, utilization: float, server: str, call: CallInfo) -> None:
        self._enqueue(self._sink.record_session_end, (side, utilization, server, call))

    def record_session_evicted(self, side: str, server: str) -> None:
        self._enqueue(self._sink.record_session_evicted, (side, server))

    def record_unbudgeted(self, side: str, server: str, tokens: int) -> None:
        self._enqueue(self._sink.record_unbudgeted, (side, server, tokens))

    def record_error(self, stage: str, server: str) -> None:
        self._enqueue(self._sink.record_error, (stage, server))

    def record_tool_definitions(self, server: str, total: int, per_tool: Mapping[str, int]) -> None:
        self._enqueue(self._sink.record_tool_definitions, (server, total, per_tool))

    def record_tool_profiles(self, server: str, parts: Mapping[str, int], static_max: Mapping[str, int]) -> None:
        self._enqueue(self._sink.record_tool_profiles, (server, parts, static_max))

    def record_prompt_cache_invalidation(self, side: str, server: str, resent_tokens: int) -> None:
        self._enqueue(self._sink.record_prompt_cache_invalidation, (side, server, resent_tokens))

    def record_wasted(self, side: str, server: str, tool: str | None, kind: str, tokens: int) -> None:
        self._enqueue(self._sink.record_wasted, (side, server, tool, kind, tokens))

    def record_guard_action(
        self, side: str, server: str, policy: str, action: str, enforced: bool, tool: str | None
    ) -> None:
        self._enqueue(self._sink.record_guard_action, (side, server, policy, action, enforced, tool))

    def record_cost(self, side: str, server: str, tool: str | None, usd: float) -> None:
        self._enqueue(self._sink.record_cost, (side, server, tool, usd))

    def flush(self) -> None:
        """Replay everything queued so far (the thread does this every interval)."""
        self._drain(self._pause)

    def _drain(self, pause: float) -> None:
        clock = time.perf_counter
        pending = self._pending
        with self._drain_lock:
            # What is queued now, not what producers add meanwhile: a flush always ends.
            remaining = len(pending)
            # Pauses only while on schedule: past half an interval, slices follow each other (yielding the GIL
            # without sleeping) so the replay always keeps up with the calls.
            relaxed_until = clock() + self._interval / 2
            while remaining > 0:
                now = clock()
                deadline = now + self._slice_seconds
                for _ in range(min(self._slice, remaining)):
                    remaining -= 1
                    self._replay(*pending.popleft())
                    if clock() >= deadline:
                        break
                if remaining > 0:
                    # hand the GIL to the MCP calls waiting on it between slices
                    time.sleep(pause if now < relaxed_until else 0)

    def _replay(self, method: Callable[..., None], args: tuple[Any, ...], ctx: Any) -> None:
        token = otel_context.attach(ctx) if ctx is not None else None
        try:
            method(*args)
        except Exception:
            # A failing record_error is not reported again: it would queue another call that fails the same way.
            if self._on_error is not None and method.__name__ != "record_error":
                self._on_error("metrics")
        finally:
            if token is not None:
                otel_context.detach(token)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.flush()

    def stop(self) -> None:
        """Stop the thread and replay what is left; idempotent. At exit only this: the sink stays readable
        for the SDK's final export."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._drain(0.0)  # shutdown: the GIL is yielded between slices, without sleeping
        atexit.unregister(self.stop)

    def close(self) -> None:
        """The recorder is done: stop, then close the sink it feeds."""
        self.stop()
        close = getattr(self._sink, "close", None)
        if callable(close):
            close()
