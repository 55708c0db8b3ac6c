"""The Redis store under concurrency: many threads, several processes, 1 to 3 replicas of one conversation.
Totals are exact and each transition is claimed once, whoever sends the message that crosses it."""

from __future__ import annotations

import multiprocessing
import threading
from collections import Counter
from typing import Any

import pytest

from mcp_token_otel.store import KeyHasher
from tests.helpers.redis_server import RedisServer

from .workers import replica, tokens_of


def _expected(conversations: int, messages: int) -> dict[str, int]:
    return {f"conv-{c}": sum(tokens_of(c, m) for m in range(messages)) for c in range(conversations)}


def _totals(server: RedisServer, prefix: str, conversations: int) -> dict[str, int]:
    """Each conversation's total as Redis holds it."""
    client, hasher = server.client(), KeyHasher(prefix)
    return {f"conv-{c}": int(client.hget(f"{prefix}{{{hasher('server', f'conv-{c}')}}}:b", "tokens"))
            for c in range(conversations)}


def test_many_threads_exact_totals_and_transitions_once(redis_server: RedisServer, budget_for: Any,
                                                        open_redis: Any) -> None:
    conversations, messages, threads = 40, 24, 8
    claimed: Counter[str] = Counter()
    lock = threading.Lock()
    store = open_redis(budget_for(redis_server, context_window=400, store_timeout=5.0))
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            for m in range(rank, messages, threads):
                for c in range(conversations):
                    answer = store.add("server", f"conv-{c}", tokens_of(c, m))
                    with lock:
                        claimed.update(f"conv-{c}:{s}" for s in answer.transitions)
        except BaseException as exc:  # reported below: a thread's failure must fail the test
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(rank,)) for rank in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert not errors and not any(w.is_alive() for w in workers)
    totals = _totals(redis_server, store._prefix, conversations)
    assert totals == _expected(conversations, messages)
    assert min(totals.values()) >= 0.9 * 400  # every conversation crossed both thresholds
    assert claimed == Counter({f"conv-{c}:{s}": 1 for c in range(conversations) for s in ("warning", "exhausted")})
    assert len(store.sessions("server")) == conversations  # one replica: it owns them all


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_replicas_round_robin_claim_each_transition_once(redis_server: RedisServer, budget_for: Any,
                                                         open_redis: Any, replicas: int) -> None:
    """Separate store instances in one process, message m of every conversation sent by replica m % n."""
    conversations, messages = 30, 12
    claimed: Counter[str] = Counter()
    budget = budget_for(redis_server, context_window=250)
    stores = [open_redis(budget) for _ in range(replicas)]
    for m in range(messages):
        for c in range(conversations):
            answer = stores[m % replicas].add("server", f"conv-{c}", tokens_of(c, m))
            claimed.update(f"conv-{c}:{s}" for s in answer.transitions)
    assert _totals(redis_server, budget.store_prefix, conversations) == _expected(conversations, messages)
    assert claimed == Counter({f"conv-{c}:{s}": 1 for c in range(conversations) for s in ("warning", "exhausted")})
    owners = [{key for key, _ in store.sessions("server")} for store in stores]
    assert sum(map(len, owners)) == conversations and len(set().union(*owners)) == conversations


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_replicas_in_processes_claim_each_transition_once(redis_server: RedisServer, budget_for: Any,
                                                          replicas: int) -> None:
    conversations, messages, window = 50, 12, 250
    prefix = budget_for(redis_server).store_prefix
    context = multiprocessing.get_context("spawn")
    with context.Pool(replicas) as pool:
        results = pool.starmap(replica, [(redis_server.url, prefix, rank, replicas, conversations, messages, window)
                                         for rank in range(replicas)], chunksize=1)
    claimed: Counter[str] = Counter()
    for result in results:
        assert result["errors"] == []
        claimed.update(result["claimed"])
    assert claimed == Counter({f"conv-{c}:{s}": 1 for c in range(conversations) for s in ("warning", "exhausted")})
    owned = [set(result["owned"]) for result in results]
    assert sum(len(o) for o in owned) == conversations and set().union(*owned) == {
        f"conv-{c}" for c in range(conversations)}  # each conversation owned by exactly one replica
    totals = _totals(redis_server, prefix, conversations)
    assert totals == _expected(conversations, messages)
    assert min(totals.values()) >= 0.9 * window  # every conversation crossed both thresholds
    assert all(set(r["sources"]) == {"shared"} for r in results)


def test_a_forked_child_is_another_replica(redis_server: RedisServer, budget_for: Any, open_redis: Any) -> None:
    from .workers import forked_child

    store = open_redis(budget_for(redis_server))
    assert store.add("server", "conv", 10).owner
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=forked_child, args=(store, queue))
    child.start()
    result = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert result["instance"] != store.instance  # its own id: it does not take the parent's budgets for its own
    assert (result["tokens"], result["owner"], result["source"], result["sessions"]) == (15, False, "shared", [])
    assert store.add("server", "conv", 1).tokens == 16 and dict(store.sessions("server")) == {"conv": "ok"}
