"""The Redis budget store against a real redis-server: totals, transitions, one round trip per call, repeats,
tools/list churn, owners, idle ends, key prefixes and hashed keys."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from mcp_token_otel.store import BudgetEnd, open_store, stable_digest
from mcp_token_otel.store.redis_store import RedisStore
from tests.helpers.redis_server import RedisServer

Ends = list[tuple[str, str, BudgetEnd]]


def _wait_for(condition: Callable[[], bool], what: str, limit: float = 15.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {limit} s: {what}")
        time.sleep(0.05)


def test_open_store_names_the_redis_store(redis_server: RedisServer, budget_for: Any) -> None:
    store = open_store(budget_for(redis_server))
    try:
        assert isinstance(store, RedisStore) and store.shared
        answer = store.add("server", "c", 10)
        assert (answer.tokens, answer.state, answer.source, answer.owner) == (10, "ok", "shared", True)
    finally:
        store.close()


def test_transitions_are_claimed_once_and_attributed(redis_server: RedisServer, budget_for: Any,
                                                     open_redis: Any) -> None:
    store = open_redis(budget_for(redis_server))  # window 1000: warning at 750, exhausted at 900
    other = open_redis(budget_for(redis_server))
    first = store.add("server", "conv", 200)
    assert (first.source, first.owner, first.transitions) == ("shared", True, ())
    answer = other.add("server", "conv", 600)  # 800: the add that crosses the warning claims it
    assert answer.transitions == ("warning",) and not answer.owner
    assert (answer.tokens, answer.state, answer.calls) == (800, "warning", 2)
    assert store.add("server", "conv", 10).transitions == ()  # claimed already, by the other replica
    jump = store.add("server", "conv", 500)
    assert jump.transitions == ("exhausted",) and (jump.tokens, jump.state) == (1310, "exhausted")
    assert other.add("server", "conv", 1).transitions == ()
    both = store.add("server", "fresh", 5000)  # ok -> exhausted in one message: both states, in order
    assert both.transitions == ("warning", "exhausted") and both.utilization == 5.0


def test_a_call_costs_one_round_trip(redis_server: RedisServer, budget_for: Any, open_redis: Any) -> None:
    store = open_redis(budget_for(redis_server, context_window=1_000_000))
    store.add("server", "conv", 1)  # warmed up: scripts loaded
    before = redis_server.evalsha_calls()
    for _ in range(20):  # a call's request and answer tokens, added together when it ends
        assert store.add("server", "conv", 10, call_digest=stable_digest("t", "{}")).source == "shared"
    assert redis_server.evalsha_calls() - before == 20
    assert store.peek("server", "conv").tokens == 1 + 20 * 10


def test_peek_reads_and_keeps_exhausted(redis_server: RedisServer, budget_for: Any, open_redis: Any) -> None:
    a = open_redis(budget_for(redis_server))
    b = open_redis(budget_for(redis_server))
    assert a.peek("server", "unknown").tokens == 0 and a.peek("server", "unknown").state == "ok"
    assert not redis_server.client().keys(f"{a._prefix}*")  # a peek creates nothing
    a.add("server", "conv", 100)
    a.add("server", "conv", 700)
    seen = b.peek("server", "conv")  # a replica that never added to it reads the shared figures
    assert (seen.tokens, seen.state, seen.calls, seen.source, seen.transitions) == (800, "warning", 2, "shared", ())
    b.add("server", "conv", 200)  # exhausted, by another replica
    assert a.peek("server", "conv").state == "exhausted"
    before = redis_server.evalsha_calls()
    assert a.peek("server", "conv").state == "exhausted"  # known: no round trip
    assert redis_server.evalsha_calls() == before


def test_repeats_and_tools_churn_across_replicas(redis_server: RedisServer, budget_for: Any,
                                                 open_redis: Any) -> None:
    a = open_redis(budget_for(redis_server), repeat_window=60.0)
    b = open_redis(budget_for(redis_server), repeat_window=60.0)
    call = stable_digest("search", '{"q":"x"}')
    assert not a.add("server", "conv", 5, call_digest=call).repeat
    assert b.add("server", "conv", 5, call_digest=call).repeat  # the same call, on another replica
    assert not b.add("server", "conv", 5, call_digest=stable_digest("search", '{"q":"y"}')).repeat
    assert not a.add("server", "other", 5, call_digest=call).repeat  # another conversation
    tools_1, tools_2 = stable_digest("tools", "v1"), stable_digest("tools", "v2")
    assert not a.add("server", "conv", 50, tools_digest=tools_1).tools_changed  # the first list
    assert not b.add("server", "conv", 50, tools_digest=tools_1).tools_changed  # the same list
    assert b.add("server", "conv", 50, tools_digest=tools_2).tools_changed
    assert a.add("server", "conv", 50, tools_digest=tools_1).tools_changed  # and back, seen by the other


def test_repeat_window_counts_from_the_last_call(redis_server: RedisServer, budget_for: Any,
                                                 open_redis: Any) -> None:
    store = open_redis(budget_for(redis_server), repeat_window=0.3)
    call = stable_digest("t", "{}")
    assert not store.add("server", "conv", 1, call_digest=call).repeat
    key = next(k for k in redis_server.client().keys(f"{store._prefix}*") if b":r:" in k)
    _wait_for(lambda: not redis_server.client().exists(key), "the digest expires after the window")
    assert not store.add("server", "conv", 1, call_digest=call).repeat
    off = open_redis(budget_for(redis_server), repeat_window=0.0)  # 0: no check
    assert not off.add("server", "c2", 1, call_digest=call).repeat
    assert not off.add("server", "c2", 1, call_digest=call).repeat


def test_one_owner_counts_the_session_and_reports_its_end(redis_server: RedisServer, budget_for: Any,
                                                          open_redis: Any) -> None:
    ends: Ends = []
    replicas = [open_redis(budget_for(redis_server, idle_timeout=2.0), on_end=lambda *e: ends.append(e))
                for _ in range(3)]
    for i in range(30):
        replicas[i % 3].add("server", f"conv-{i % 10}", 10)
    owned = [dict(r.sessions("server")) for r in replicas]
    assert sum(len(o) for o in owned) == 10  # each conversation counted by one replica
    assert set().union(*owned) == {f"conv-{i}" for i in range(10)}
    assert sum(r.states("server")["ok"] for r in replicas) == 10
    # Idle everywhere: each owner reports its conversations' ends once, with the totals of all replicas.
    _wait_for(lambda: all(r.expire() is None and not r._tables["server"] for r in replicas),
              "every replica lets go of its idle budgets")
    owner_ends = {key: end for _, key, end in ends if end.owner}
    assert len([e for e in ends if e[2].owner]) == 10
    assert {end.tokens for end in owner_ends.values()} == {30}
    assert all(end.why == "idle" and end.source == "shared" for end in owner_ends.values())
    assert len(ends) == 30  # the others let go too, without counting


def test_an_owner_keeps_a_budget_other_replicas_still_use(redis_server: RedisServer, budget_for: Any,
                                                          open_redis: Any) -> None:
    ends: Ends = []
    a = open_redis(budget_for(redis_server, idle_timeout=1.5), on_end=lambda *e: ends.append(e))
    b = open_redis(budget_for(redis_server, idle_timeout=1.5))
    a.add("server", "conv", 10)
    started = time.monotonic()
    while time.monotonic() - started < 2.0:  # a sees nothing for longer than the idle timeout; b keeps it busy
        last = b.add("server", "conv", 1)
        a.expire()
        time.sleep(0.1)
    assert not ends
    assert dict(a.sessions("server")) == {"conv": "ok"}
    _wait_for(lambda: a.expire() is None and bool(ends), "the end once b stops too")
    assert [(e[1], e[2].tokens, e[2].owner, e[2].source) for e in ends] == [("conv", last.tokens, True, "shared")]


def test_idle_budgets_start_afresh_and_their_keys_expire(redis_server: RedisServer, budget_for: Any,
                                                         open_redis: Any) -> None:
    budget = budget_for(redis_server, idle_timeout=0.5)
    a = open_redis(budget)
    assert a.add("server", "conv", 800).transitions == ("warning",)
    client = redis_server.client()
    keys = client.keys(f"{budget.store_prefix}*")
    assert len(keys) == 1 and 0 < client.pttl(keys[0]) <= 1000  # idle timeout plus its grace
    _wait_for(lambda: not client.exists(keys[0]), "the budget's key expires")
    b = open_redis(budget)
    again = b.add("server", "conv", 800)
    assert (again.tokens, again.transitions, again.owner) == (800, ("warning",), True)
    # Idle past the timeout but its key not yet gone: the next add starts afresh too.
    _wait_for(lambda: client.pttl(keys[0]) < 450, "the budget is idle past its timeout")
    fresh = a.add("server", "conv", 10)
    assert (fresh.tokens, fresh.state, fresh.owner) == (10, "ok", True)
    assert client.hget(keys[0], "tokens") == b"10"


def test_end_reports_once_and_hands_ownership_on(redis_server: RedisServer, budget_for: Any,
                                                 open_redis: Any) -> None:
    ends: Ends = []
    a = open_redis(budget_for(redis_server), on_end=lambda *e: ends.append(e))
    b = open_redis(budget_for(redis_server))
    a.add("server", "conv", 10)
    b.add("server", "conv", 20)
    a.add("server", "conv", 5)
    a.end("server", "conv")
    assert ends == [("server", "conv", BudgetEnd(35, 0.035, "ok", "ended", True, "shared"))]
    assert a.sessions("server") == [] and b.sessions("server") == []
    assert b.add("server", "conv", 1).owner  # the next replica to add counts it from now on
    assert dict(b.sessions("server")) == {"conv": "ok"}


def test_prefixes_keep_deployments_apart(redis_server: RedisServer, budget_for: Any, open_redis: Any) -> None:
    one = open_redis(budget_for(redis_server, store_prefix="deploy-one:"))
    two = open_redis(budget_for(redis_server, store_prefix="deploy-two:"))
    one.add("server", "conv", 100)
    two.add("server", "conv", 7)
    assert one.peek("server", "conv").tokens == 100 and two.peek("server", "conv").tokens == 7
    keys = redis_server.client().keys("deploy-*")
    assert keys and all(k.startswith((b"deploy-one:{", b"deploy-two:{")) for k in keys)
    assert {k.split(b"{")[0] for k in keys} == {b"deploy-one:", b"deploy-two:"}


def test_keys_are_stored_hashed(redis_server: RedisServer, budget_for: Any, open_redis: Any) -> None:
    conversation, principal = "conversation-4f1d2c", "alice@example.com"
    budget = budget_for(redis_server, store_key_secret="a-deployment-secret")
    store = open_redis(budget)
    store.add("server", conversation, 10, call_digest=stable_digest("t", "{}"), tools_digest=b"d" * 16)
    store.add("client", principal, 10)
    store.rate("server", conversation, 60.0, 10)
    client = redis_server.client()
    stored = b" ".join(client.keys(f"{budget.store_prefix}*"))
    for key in client.keys(f"{budget.store_prefix}*"):
        if client.type(key) == b"hash":
            stored += b" ".join(v for kv in client.hgetall(key).items() for v in kv)
    assert stored.count(b"{") == 4  # budget + repeat digest + rate window, and the principal's budget
    for plain in (conversation, principal, "conversation", "alice"):
        assert plain.encode() not in stored
    # The same key and secret give the same stored name on every replica; another secret another one.
    same = open_redis(budget)
    assert same.peek("server", conversation).tokens == 10
    other = open_redis(budget_for(redis_server, store_prefix=budget.store_prefix, store_key_secret="another"))
    assert other.peek("server", conversation).tokens == 0


def test_shared_rate_window(redis_server: RedisServer, budget_for: Any, open_redis: Any) -> None:
    a = open_redis(budget_for(redis_server))
    b = open_redis(budget_for(redis_server))
    counts = [(a if i % 2 else b).rate("server", "s", 60.0, 3) for i in range(5)]
    assert counts == [1, 2, 3, 4, 4]  # over the limit: counted, not logged (enforce mode)
    observe = [a.rate("server", "o", 60.0, 2, record_over=True) for _ in range(4)]
    assert observe == [1, 2, 3, 3]  # logged, but the window keeps the newest `limit` events
    assert a.rate("client", "s", 60.0, 3) == 1  # another side, another window
    # The guards' own side (the recorder's rate limit keys its windows "guard", per side and conversation).
    errors: list[str] = []
    guard = open_redis(budget_for(redis_server), on_error=errors.append)
    assert [guard.rate("guard", "server:conv", 60.0, 2) for _ in range(3)] == [1, 2, 3] and errors == []
    assert b.rate("server", "short", 0.2, 5) == 1
    assert b.rate("server", "short", 0.2, 5) == 2
    client = redis_server.client()
    window = f"{b._prefix}{{{b._hash('server', 'short')}}}:q"
    assert client.zcard(window) == 2
    _wait_for(lambda: not client.exists(window), "the window's events age out (its key expires with them)")
    assert b.rate("server", "short", 0.2, 5) == 1


@pytest.mark.parametrize("tokens", [-5, 2.7])
def test_odd_token_counts(redis_server: RedisServer, budget_for: Any, open_redis: Any, tokens: Any) -> None:
    store = open_redis(budget_for(redis_server))
    assert store.add("server", "conv", tokens).tokens == max(0, int(tokens))


def test_a_budget_let_go_while_its_tokens_wait_still_sends_them(redis_server: RedisServer, budget_for: Any,
                                                                open_redis: Any, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """An idle budget whose flush and idle check fail in one round trip is let go here, and the tokens it had
    not sent yet still reach Redis once it answers (they are not dropped with the budget)."""
    import redis

    budget = budget_for(redis_server, idle_timeout=0.5)
    ends: Ends = []
    store = open_redis(budget, backoff=0.05, on_end=lambda *e: ends.append(e))
    store.add("server", "conv", 100)
    client = redis_server.client()
    (key,) = client.keys(f"{budget.store_prefix}*")
    pipeline, failed = store._redis.pipeline, []

    def failing_once(*args: Any, **kwargs: Any) -> Any:
        pipe = pipeline(*args, **kwargs)
        if not failed:
            failed.append(True)
            pipe.execute = lambda **_: (_ for _ in ()).throw(redis.exceptions.ConnectionError("down"))
        return pipe

    monkeypatch.setattr(store._redis, "pipeline", failing_once)
    with store._lock:  # 50 tokens counted during an outage, and idle for long
        entry = store._tables["server"]["conv"]
        entry.unsent, entry.last_seen = [50], entry.last_seen - 10
        store._pending["server", "conv"] = entry
    store.expire()
    assert failed and [e[1] for e in ends] == ["conv"]  # let go here: its idle check did not answer
    _wait_for(lambda: store.expire() is None and client.hget(key, "tokens") == b"150", "the 50 tokens in Redis")
