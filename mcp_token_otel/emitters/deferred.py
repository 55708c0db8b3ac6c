"""OpenTelemetry histogram points replayed off the MCP call path (``metrics.defer_otel``).

The SDK's price of a synchronous point (attribute cleaning and hashing, exemplar reservoirs) is most of what
OpenTelemetry costs per call; with ``metrics.defer_otel`` the points are queued and a daemon thread replays them
every ``interval`` seconds. Only a point whose context was given (a breach: its exemplar must find its span)
replays in that context; the others without one.

The replay runs in slices of at most ``slice_size`` points and ``slice_seconds``, each followed by a real sleep of
``pause`` seconds: ``time.sleep(0)`` releases the GIL, but the replaying thread usually takes it back before a
waiting MCP call has woken. The sleeps last only while the flush is on schedule: past half an interval, slices
follow each other with ``sleep(0)`` between them, so the replay keeps up. Order and count are kept, and a flush
replays what was queued when it began, so it always ends. The queue is bounded: past ``max_pending`` points, new
ones are dropped and counted, so a stalled exporter can never grow memory without limit.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context

from ..catalog import Family
from .otel_metrics import NO_SPAN, OtelPoints

#: A queued point: the family, its value, its attributes and the context to replay it in (or None).
_Point = tuple[Family, float, dict[str, Any], Any]


class DeferredPoints:
    """:class:`OtelPoints` whose ``record`` queues; a background thread replays the queue."""

    def __init__(
        self,
        points: OtelPoints,
        *,
        interval: float = 0.5,
        max_pending: int = 100_000,
        on_error: Callable[[str], None] | None = None,
        slice_size: int = 64,
        slice_seconds: float = 0.0005,
        pause: float = 0.001,
    ) -> None:
        self._points = points
        self._interval = interval
        self._max_pending = max_pending
        self._on_error = on_error
        self._slice = max(1, slice_size)
        self._slice_seconds = slice_seconds
        self._pause = max(0.0, pause)
        self._pending: deque[_Point] = deque()
        self._drain_lock = threading.Lock()
        self._enqueue_lock = threading.Lock()
        self._stop = threading.Event()
        #: Points dropped because the queue was full.
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="mcp-token-otel-metrics", daemon=True)
        self._thread.start()
        atexit.register(self.stop)  # before the SDK's own exit-time shutdown (atexit runs LIFO)

    def attributes(self, family: Family, labels: tuple[Any, ...]) -> dict[str, Any]:
        return self._points.attributes(family, labels)

    def record(self, family: Family, labels: tuple[Any, ...], value: float, context: Any = None) -> None:
        self.record_attributes(family, value, self._points.attributes(family, labels), context)

    def record_attributes(self, family: Family, value: float, attributes: dict[str, Any], context: Any) -> None:
        # None asks for the caller's context (a breach's exemplar): taken now, replayed with the point.
        ctx = otel_context.get_current() if context is None else None
        with self._enqueue_lock:  # the bound and the drop count stay exact with many producers
            if len(self._pending) >= self._max_pending:
                self.dropped += 1
                return
            self._pending.append((family, value, attributes, ctx))

    def flush(self) -> None:
        """Replay everything queued so far (the thread does this every interval)."""
        self._drain(self._pause)

    def _drain(self, pause: float) -> None:
        clock = time.perf_counter
        pending = self._pending
        with self._drain_lock:
            remaining = len(pending)  # what is queued now, not what producers add meanwhile: a flush always ends
            relaxed_until = clock() + self._interval / 2
            while remaining > 0:
                now = clock()
                deadline = now + self._slice_seconds
                for _ in range(min(self._slice, remaining)):
                    remaining -= 1
                    self._replay(*pending.popleft())
                    if clock() >= deadline:
                        break
                if remaining > 0:  # hand the GIL to the MCP calls waiting on it between slices
                    time.sleep(pause if now < relaxed_until else 0)

    def _replay(self, family: Family, value: float, attributes: dict[str, Any], ctx: Any) -> None:
        token = otel_context.attach(ctx) if ctx is not None else None
        try:
            self._points.record_attributes(family, value, attributes, None if ctx is not None else NO_SPAN)
        except Exception:
            if self._on_error is not None:
                self._on_error("metrics")
        finally:
            if token is not None:
                otel_context.detach(token)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.flush()

    def stop(self) -> None:
        """Stop the thread and replay what is left; idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._drain(0.0)  # shutdown: the GIL is yielded between slices, without sleeping
        atexit.unregister(self.stop)

