"""The memory store: the session registry's own semantics behind the store protocol."""

from __future__ import annotations

from mcp_token_otel.config import config_from_dict
from mcp_token_otel.core.budget import SessionRegistry
from mcp_token_otel.core.guard.limits import RateLimiter
from mcp_token_otel.store import BudgetEnd, BudgetStore, MemoryStore, stable_digest


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _budget(**keys: object):  # type: ignore[no-untyped-def]
    return config_from_dict({"budget": {"context_window": 1000, **keys}}).budget


def test_answers_match_the_session_registry() -> None:
    store: BudgetStore = MemoryStore(_budget())
    registry = SessionRegistry(1000)
    for tokens in [100, 300, 400, 0, -3, 50, 2000]:
        answer = store.add("server", "s", tokens)
        update = registry.record("s", tokens)
        assert (answer.tokens, answer.utilization, answer.state, answer.transitions) == (
            update.tokens, update.utilization, update.state, update.transitions)
        assert answer.source == "local" and answer.owner
    peeked = store.peek("server", "s")
    assert (peeked.tokens, peeked.state, peeked.calls, peeked.context_window) == (2850, "exhausted", 7, 1000)
    assert store.peek("client", "s").tokens == 0  # sides are apart
    assert not store.shared


def test_repeats_and_tools_changes() -> None:
    clock = Clock()
    store = MemoryStore(_budget(), repeat_window=60.0, clock=clock)
    call = stable_digest("search", "{}")
    assert not store.add("server", "s", 1, call_digest=call).repeat
    clock.now += 59
    assert store.add("server", "s", 1, call_digest=call).repeat
    clock.now += 59  # within the window of the last call
    assert store.add("server", "s", 1, call_digest=call).repeat
    clock.now += 61
    assert not store.add("server", "s", 1, call_digest=call).repeat
    assert not store.add("server", "other", 1, call_digest=call).repeat
    assert not store.add("server", "s", 1, tools_digest=b"a").tools_changed
    assert not store.add("server", "s", 1, tools_digest=b"a").tools_changed
    assert store.add("server", "s", 1, tools_digest=b"b").tools_changed
    off = MemoryStore(_budget(), repeat_window=0.0)
    assert not off.add("server", "s", 1, call_digest=call).repeat and not off.add("server", "s", 1,
                                                                                  call_digest=call).repeat


def test_ends_idle_evicted_and_the_counts() -> None:
    clock = Clock()
    ends: list[tuple[str, str, BudgetEnd]] = []
    store = MemoryStore(_budget(max_sessions=2, idle_timeout=10), clock=clock,
                        on_end=lambda *e: ends.append(e))
    store.add("server", "a", 800, tools_digest=b"x")
    store.add("server", "b", 10)
    assert store.states("server") == {"ok": 1, "warning": 1, "exhausted": 0}
    assert dict(store.sessions("server")) == {"a": "warning", "b": "ok"}
    store.add("server", "c", 10)  # a is the least recently used: evicted
    assert ends == [("server", "a", BudgetEnd(800, 0.8, "warning", "evicted"))]
    store.end("server", "b")
    assert ends[-1] == ("server", "b", BudgetEnd(10, 0.01, "ok", "ended"))
    clock.now += 11
    store.expire()
    assert ends[-1] == ("server", "c", BudgetEnd(10, 0.01, "ok", "idle"))
    assert store.sessions("server") == [] and store._digests == {}  # digests go with their budgets
    assert not store.add("server", "a", 1, tools_digest=b"y").tools_changed  # a new budget: no previous list


def test_rate_is_the_rate_limiter() -> None:
    clock = Clock()
    store = MemoryStore(_budget(), clock=clock)
    limiter = RateLimiter(3, 60.0, clock=clock)
    for step in range(8):
        clock.now += 5
        record_over = step % 3 == 0
        assert store.rate("server", "s", 60.0, 3, record_over=record_over) == limiter.hit(
            "s", record_over=record_over)[1]
    store.end("server", "s")
    assert store.rate("server", "s", 60.0, 3) == 1  # forgotten with its session
