"""Budget stores: where the session ledger counts each budget's tokens (``budget.store``).

``memory`` (the default) counts in this process, as the session registry always has. A Redis URL shares budgets
between every replica of a server or proxy: one conversation has one budget wherever its messages land, each
transition is claimed once for all of them, and each conversation is counted once in the sessions gauge (by its
owner). The Redis client is imported only when a Redis URL is configured (the ``redis`` extra).
"""

from __future__ import annotations

from ..config import BudgetConfig, ConfigError
from ..core.spill import MemorySpillStore, SpillStore
from .base import (
    BudgetEnd,
    BudgetStore,
    EndCallback,
    ErrorCallback,
    KeyHasher,
    SharedAnswer,
    Source,
    stable_digest,
)
from .memory import MemoryStore

__all__ = [
    "BudgetEnd",
    "BudgetStore",
    "EndCallback",
    "ErrorCallback",
    "KeyHasher",
    "MemoryStore",
    "SharedAnswer",
    "Source",
    "open_spill_store",
    "open_store",
    "stable_digest",
]


def open_store(
    budget: BudgetConfig,
    *,
    repeat_window: float = 60.0,
    on_end: EndCallback | None = None,
    on_error: ErrorCallback | None = None,
) -> BudgetStore:
    """The store ``budget.store`` names. A Redis URL without the ``redis`` package raises ConfigError naming the
    key; nothing is connected here (the first operation connects, within ``budget.store_timeout``)."""
    if budget.store == "memory":
        return MemoryStore(budget, repeat_window=repeat_window, on_end=on_end)
    try:
        from .redis_store import RedisStore
    except ImportError:
        raise ConfigError(
            "config key 'budget.store': a Redis URL needs the redis package: pip install 'mcp-token-otel[redis]'"
        ) from None
    return RedisStore(budget, repeat_window=repeat_window, on_end=on_end, on_error=on_error)


def open_spill_store(store: BudgetStore, ttl: float, max_bytes: int) -> SpillStore:
    """Where cut results are kept (``guard.spill``): beside the budgets in a shared store, so any replica serves a
    read; else in this process's memory."""
    make = getattr(store, "spill_store", None)
    if callable(make):
        spills: SpillStore = make(ttl, max_bytes)
        return spills
    return MemorySpillStore(ttl, max_bytes)
