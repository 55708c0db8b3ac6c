"""The Redis store when Redis fails: killed mid-run and restarted, slow past the deadline, scripts flushed, never
there, refusing the password. No exception reaches the caller; every operation answered locally is counted;
one warning per outage, one info line when it is back; counting resumes in Redis."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mcp_token_otel.store import KeyHasher
from tests.helpers.redis_server import RedisServer
from tests.helpers.support import free_port

STORE_LOG = "mcp_token_otel.store"


def _wait_for(condition: Callable[[], bool], what: str, limit: float = 15.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {limit} s: {what}")
        time.sleep(0.05)


def _total(server: RedisServer, prefix: str, key: str, side: str = "server") -> int:
    value = server.client().hget(f"{prefix}{{{KeyHasher(prefix)(side, key)}}}:b", "tokens")
    return int(value) if value is not None else 0


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == STORE_LOG and r.levelno == level]


def test_killed_and_restarted_redis(own_redis: RedisServer, budget_for: Any, open_redis: Any,
                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=STORE_LOG)
    errors: list[str] = []
    budget = budget_for(own_redis)  # window 1000: warning at 750
    store = open_redis(budget, on_error=errors.append, backoff=0.2)
    assert store.add("server", "conv", 100).source == "shared"
    own_redis.kill()
    outage = [store.add("server", "conv", 50) for _ in range(20)]  # 100 + 1000 tokens
    assert {a.source for a in outage} == {"local"}
    assert [a.tokens for a in outage] == [100 + 50 * (i + 1) for i in range(20)]  # the last total, plus its own
    assert [a.transitions for a in outage if a.transitions] == [("warning",), ("exhausted",)]
    # Each local answer counted, tried or backing off (the store's own thread may count its probes too).
    assert [e for e in errors if e != "probe"] == ["add"] * 20
    assert store.peek("server", "conv").source == "local"
    assert store.rate("server", "conv", 60.0, 5) == 1  # the local window
    assert [e for e in errors if e != "probe"][-2:] == ["peek", "rate"]
    warnings = _records(caplog, logging.WARNING)
    assert len(warnings) == 1 and "unreachable" in warnings[0] and own_redis.url.split("/0")[0] in warnings[0]
    own_redis.start()  # the same port, no data: a restarted cache
    _wait_for(lambda: store.add("server", "conv", 1).source == "shared", "counting resumes in Redis")
    assert len(_records(caplog, logging.WARNING)) == 1
    assert len(_records(caplog, logging.INFO)) == 1 and "answers again" in _records(caplog, logging.INFO)[0]
    # What was counted during the outage went to Redis with the first add that reached it; nothing twice.
    store.flush()
    sent = sum(1 for e in errors if e == "add")
    assert _total(own_redis, budget.store_prefix, "conv") == 1000 + (sent - 20) + 1
    again = store.add("server", "conv", 1)
    assert (again.source, again.state, again.transitions) == ("shared", "exhausted", ())  # reported once already


def test_outage_tokens_reach_redis_without_traffic(own_redis: RedisServer, budget_for: Any,
                                                   open_redis: Any) -> None:
    budget = budget_for(own_redis)
    store = open_redis(budget, backoff=0.2)
    store.add("server", "quiet", 10)
    own_redis.kill()
    assert store.add("server", "quiet", 30).source == "local"
    own_redis.start()
    # No more messages: the store's own thread finds Redis back and sends what it counted.
    _wait_for(lambda: _total(own_redis, budget.store_prefix, "quiet") == 30, "the outage's tokens reach Redis")


def test_outage_tokens_that_cross_a_threshold_report_it_with_the_next_add(own_redis: RedisServer, budget_for: Any,
                                                                         open_redis: Any) -> None:
    """Tokens one replica counted while it could not reach Redis, sent later by its own thread, push the shared total
    past both thresholds: the claims are that replica's, reported once, with its next add; no other replica's."""
    budget = budget_for(own_redis)  # window 1000: warning at 750, exhausted at 900
    a = open_redis(budget, backoff=0.2)
    b = open_redis(budget)
    a.add("server", "conv", 100)
    a.health.failed("add", ConnectionError("as when its network to Redis fails"))  # a alone is cut off
    alone = a.add("server", "conv", 300)
    assert (alone.source, alone.tokens, alone.transitions) == ("local", 400, ())  # below the warning, as a knows
    assert b.add("server", "conv", 600).transitions == ()  # 700 in Redis: below the warning too
    _wait_for(lambda: _total(own_redis, budget.store_prefix, "conv") == 1000, "a's thread sends its outage tokens")
    assert b.add("server", "conv", 1).transitions == ()  # claimed by a's tokens, not b's
    after = a.add("server", "conv", 1)
    assert (after.source, after.tokens, after.transitions) == ("shared", 1002, ("warning", "exhausted"))
    assert a.add("server", "conv", 1).transitions == ()


def test_slow_redis_gives_up_at_the_deadline(own_redis: RedisServer, budget_for: Any, open_redis: Any,
                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=STORE_LOG)
    errors: list[str] = []
    budget = budget_for(own_redis, store_timeout=0.05)
    store = open_redis(budget, on_error=errors.append, backoff=0.2)
    assert store.add("server", "conv", 10).source == "shared"
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    probe = own_redis.client(socket_timeout=0.2, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    probe.ping()  # connected before Redis sleeps
    sleeper = threading.Thread(target=lambda: own_redis.client().execute_command("DEBUG", "SLEEP", "1.5"))
    sleeper.start()
    _wait_for(lambda: _busy(probe), "Redis is asleep")
    slow = store.add("server", "conv", 20)
    assert sleeper.is_alive()  # the add gave up while Redis was still asleep
    assert slow.source == "local" and slow.tokens == 30 and [e for e in errors if e != "probe"] == ["add"]
    assert "TimeoutError" in _records(caplog, logging.WARNING)[0]
    sleeper.join(timeout=15)
    _wait_for(lambda: store.add("server", "conv", 5).source == "shared", "counting resumes")
    # The timed-out add ran once Redis woke (it was sent): it is not sent again. Adds made during the back-off
    # were not sent at all: they went with the first add that reached Redis.
    assert _total(own_redis, budget.store_prefix, "conv") == 10 + 20 + 5 * sum(1 for e in errors if e == "add")


def _busy(probe: Any) -> bool:
    """Whether the server is asleep (a PING within 0.2 s fails)."""
    try:
        probe.ping()
    except Exception:
        return True
    return False


def test_restart_reloads_the_scripts(redis_server: RedisServer, budget_for: Any, open_redis: Any) -> None:
    errors: list[str] = []
    ends: list[Any] = []
    store = open_redis(budget_for(redis_server, idle_timeout=0.5), on_error=errors.append,
                       on_end=lambda *e: ends.append(e))
    store.add("server", "conv", 10)
    store.add("server", "conv", 10)
    redis_server.client().script_flush()  # as after a restart: EVALSHA answers NOSCRIPT
    assert store.add("server", "conv", 10).source == "shared"
    assert store.peek("server", "other").source == "shared"
    assert store.rate("server", "conv", 60.0, 5) == 1
    redis_server.client().script_flush()
    # The store's own pass reads an idle budget's final figures in a pipeline: it loads the scripts too.
    _wait_for(lambda: store.expire() is None and bool(ends), "the idle budget's end")
    assert [(key, end.tokens, end.why) for _, key, end in ends] == [("conv", 30, "idle")] and errors == []


def test_redis_never_there(tmp_path: Path, budget_for: Any, open_redis: Any,
                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=STORE_LOG)
    errors: list[str] = []

    class Nowhere:  # a port nothing listens on
        url = f"redis://127.0.0.1:{free_port()}/0"

    store = open_redis(budget_for(Nowhere), on_error=errors.append)
    answers = [store.add("server", "conv", 400) for _ in range(3)]
    assert [(a.source, a.tokens, a.owner) for a in answers] == [("local", 400, False), ("local", 800, False),
                                                                ("local", 1200, False)]
    assert [a.transitions for a in answers] == [(), ("warning",), ("exhausted",)]
    assert store.peek("server", "conv").state == "exhausted"
    assert [e for e in errors if e != "probe"] == ["add", "add", "add", "peek"]
    assert len(_records(caplog, logging.WARNING)) == 1
    store.end("server", "conv")  # no exception either


def test_password_from_its_own_key_and_a_wrong_one(tmp_path: Path, budget_for: Any, open_redis: Any,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    server = RedisServer(tmp_path, password="s3cret-redis-pw")
    server.start()
    try:
        good = open_redis(budget_for(server, store_password="s3cret-redis-pw"))
        assert good.add("server", "conv", 10).source == "shared"
        errors: list[str] = []
        bad = open_redis(budget_for(server, store_password="wrong-password-value"), on_error=errors.append)
        assert bad.add("server", "conv", 10).source == "local" and [e for e in errors if e != "probe"] == ["add"]
        text = caplog.text
        assert "wrong-password-value" not in text and "s3cret-redis-pw" not in text
        in_url = server.url.replace("redis://", "redis://:s3cret-redis-pw@")
        assert open_redis(budget_for(server) if False else _with_store(budget_for(server), in_url)).add(
            "server", "conv", 1).tokens == 11
    finally:
        server.stop()


def _with_store(budget: Any, url: str) -> Any:
    import dataclasses

    return dataclasses.replace(budget, store=url)


def test_callbacks_that_raise_do_not_reach_the_caller(own_redis: RedisServer, budget_for: Any,
                                                      open_redis: Any) -> None:
    def boom(*args: Any) -> None:
        raise RuntimeError("a callback's own fault")

    store = open_redis(budget_for(own_redis), on_error=boom, on_end=boom)
    assert store.add("server", "conv", 800).transitions == ("warning",)
    store.end("server", "conv")
    own_redis.kill()
    assert store.add("server", "conv", 10).source == "local"
    assert store.peek("server", "other").source == "local"
    store.end("server", "conv")


def test_a_full_pool_is_busy_not_an_outage_for_every_user_of_the_store() -> None:
    """The budget and spill stores share one Health: a pool with no free connection answers that operation
    locally and counts it, but leaves the store up (no back-off, no outage warning) whoever hit it."""
    import redis

    from mcp_token_otel.store.local import Health
    from mcp_token_otel.store.redis_store import _pool_full

    errors: list[str] = []
    health = Health("redis://cache", 30.0, errors.append, _pool_full)
    health.failed("spill_put", redis.exceptions.ConnectionError("Too many connections"))
    assert health.up and health.try_store() and errors == ["spill_put"]
    health.failed("add", redis.exceptions.ConnectionError("Connection refused"))
    assert not health.up and not health.try_store() and errors == ["spill_put", "add"]
