"""Rate and depth limits: tool calls per session in a sliding window, and the depth of tools calling tools."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any

#: The ``_meta`` key (in ``params``) that carries a request's chain depth: 0 or absent for a user's own
#: call, n + 1 for a request a tool makes while serving a call at depth n (nested tools/call, sampling).
META_DEPTH_KEY = "io.github.mcp-token-otel/depth"


def chain_depth(params: Any) -> int:
    """The chain depth a request carries (0 when absent or not a non-negative integer)."""
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    depth = meta.get(META_DEPTH_KEY) if isinstance(meta, Mapping) else None
    return depth if isinstance(depth, int) and not isinstance(depth, bool) and depth > 0 else 0


#: The requests a handler sends that continue its chain (they carry its depth + 1); any other request it sends
#: (a listing, a ping) is bookkeeping, not a step deeper.
CHAINED_METHODS = frozenset({"tools/call", "sampling/createMessage", "elicitation/create"})


def deeper(method: str, params: Any, depth: int | None) -> Any:
    """``params`` of a request sent while a handler at chain ``depth`` runs: with ``depth + 1`` when ``method``
    continues the chain, else (no handler running, another method, params that are no mapping) as they are."""
    if depth is None or method not in CHAINED_METHODS or (params is not None and not isinstance(params, Mapping)):
        return params
    return with_depth(params, depth + 1)


def with_depth(params: Mapping[str, Any] | None, depth: int) -> dict[str, Any]:
    """A copy of ``params`` whose ``_meta`` carries ``depth`` (the caller's own _meta keys are kept)."""
    out = dict(params or {})
    meta = out.get("_meta")
    out["_meta"] = {**(meta if isinstance(meta, Mapping) else {}), META_DEPTH_KEY: depth}
    return out


class RateLimiter:
    """At most ``limit`` events per key in any ``window`` seconds (a sliding-window log).

    Each key keeps at most ``limit`` timestamps (a bounded deque), so a check is O(1) amortised and a
    session costs O(limit) memory; at most ``max_keys`` keys are kept, least recently used dropped first.
    """

    def __init__(
        self,
        limit: int,
        window: float = 60.0,
        *,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit < 1:
            raise ValueError(f"guard.calls_per_minute: expected a positive integer, got {limit!r}")
        self.limit = limit
        self.window = window
        self.max_keys = max_keys
        self._clock = clock
        self._log: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._log)

    def hit(self, key: str, *, record_over: bool = False, now: float | None = None) -> tuple[bool, int]:
        """Count one event for ``key``: (within the limit, events in the window including this one).

        An event over the limit is not logged unless ``record_over`` (observe mode: the call still happens)."""
        now = self._clock() if now is None else now
        with self._lock:
            log = self._log.get(key)
            if log is None:
                log = self._log[key] = deque(maxlen=self.limit)
                while len(self._log) > self.max_keys:
                    self._log.popitem(last=False)
            else:
                self._log.move_to_end(key)
            horizon = now - self.window
            while log and log[0] <= horizon:
                log.popleft()
            within = len(log) < self.limit
            count = len(log) + 1
            if within or record_over:
                log.append(now)  # a full deque drops its oldest entry: the newest `limit` are all that matter
            return within, count

    def forget(self, key: str) -> None:
        """The session ended."""
        with self._lock:
            self._log.pop(key, None)
