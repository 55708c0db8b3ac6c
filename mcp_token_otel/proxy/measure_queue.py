"""The bounded hand-off between the relay (which forwards bytes first) and the measuring worker thread.

The relay calls :meth:`MeasureQueue.put` after it has forwarded a chunk. ``put`` never blocks and never
grows past its bounds (bytes and items): a chunk that does not fit is counted as dropped and its stream is
marked lossy, so the worker skips what it can no longer frame. Control items (end of a stream, end of a
session) always fit: they are tiny and losing one would leak a session.

With ``linger``, the worker woken by a first item waits that long before it takes what is queued: the items of
a few messages are handled in one go, one wake-up (and, measuring in another process, one pipe write) instead
of one each. Items keep the time they were put at, so what is measured is unchanged; only its lag grows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_ITEMS = 65_536


class MeasureQueue:
    """Chunks and control callbacks for one worker thread; bounded in bytes and items."""

    def __init__(
        self, handle: Callable[[Any, bytes, int], None], *, max_bytes: int = DEFAULT_MAX_BYTES,
        max_items: int = DEFAULT_MAX_ITEMS, on_error: Callable[[], None] | None = None, linger: float = 0.0,
    ) -> None:
        self._handle = handle  # (stream, chunk, monotonic-ish wall time in ns) on the worker thread
        self._on_error = on_error
        self.linger = linger
        self.max_bytes = max_bytes
        self.max_items = max_items
        self._items: deque[tuple[Any, Any, int]] = deque()
        self._bytes = 0
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # wakes the worker
        self._idle = threading.Condition(lock)  # wakes drain()
        self._closed = False
        self._busy = False
        #: Chunks (and their bytes) the worker never saw because the queue was full.
        self.dropped_chunks = 0
        self.dropped_bytes = 0
        self._thread = threading.Thread(target=self._run, name="mcp-token-otel-measure", daemon=True)
        self._thread.start()

    def put(self, stream: Any, chunk: bytes, at: int | None = None) -> bool:
        """Hand a forwarded chunk to the worker, with the time it passed (``at``, default now); False (counted,
        stream marked lossy) when full."""
        now = at or time.time_ns()
        size = len(chunk)
        with self._cond:
            if self._closed or len(self._items) >= self.max_items or self._bytes + size > self.max_bytes:
                self.dropped_chunks += 1
                self.dropped_bytes += size
                stream.lost = True
                return False
            self._items.append((stream, chunk, now))
            self._bytes += size
            self._cond.notify()
        return True

    def pending(self) -> int:
        """Items waiting (not counting the one being handled)."""
        return len(self._items)

    def control(self, action: Callable[[int], None]) -> None:
        """Run ``action(time_ns)`` on the worker after everything queued before it; always accepted."""
        now = time.time_ns()
        with self._cond:
            if self._closed:
                return
            self._items.append((None, action, now))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                woken = False
                while not self._items and not self._closed:
                    self._busy = False
                    self._idle.notify_all()
                    self._cond.wait()
                    woken = True
                if woken and self.linger:
                    self._busy = True  # drain() waits for what lingers
            if woken and self.linger:
                time.sleep(self.linger)  # not a wait on the condition: each put() would end it
            with self._cond:
                if not self._items:
                    self._busy = False
                    self._idle.notify_all()
                    return
                stream, payload, now = self._items.popleft()
                self._busy = True
                if stream is not None:
                    self._bytes -= len(payload)
            try:
                if stream is None:
                    payload(now)
                else:
                    self._handle(stream, payload, now)
            except Exception:  # a fault in measuring never stops the worker (nor the relay)
                logger.debug("mcp_token_otel proxy: measurement fault", exc_info=True)
                if self._on_error is not None:
                    self._on_error()

    def drain(self, timeout: float) -> bool:
        """Wait until everything queued so far has been handled; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._items or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Handle what is queued (up to ``timeout``), then stop the worker."""
        self.drain(timeout)
        with self._cond:
            self._closed = True
            self._items.clear()
            self._bytes = 0
            self._cond.notify_all()
        self._thread.join(timeout)
