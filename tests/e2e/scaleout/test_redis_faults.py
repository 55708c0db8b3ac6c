"""Redis fails under a running deployment: SIGKILLed mid-conversation and restarted (no persistence: its keys are
gone), or slow past ``budget.store_timeout``. No call fails or waits past the deadline, each replica counts what it
could not share (``mcp_token_budget_store_errors_total``) and logs the outage once, and counting resumes in Redis:
the conversation's later transitions are claimed there, once."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.helpers.redis_server import RedisServer
from tests.proxy.conftest import wait_for

from .conftest import budgeted, clients, deployment, round_robin, shared_budget, total, transitions, wait_measured

CONVERSATION = "conversation-outage"


def _measured(deployed: Any, side: str, calls: int) -> tuple[float, float]:
    wait_measured(deployed, side, calls)
    return budgeted(deployed, side)


@pytest.mark.slow
def test_redis_killed_and_restarted_mid_conversation(tmp_path: Path, own_redis: RedisServer, prefix: str,
                                                     propagating_client: None) -> None:
    """Two replicas. Four calls counted in Redis (about 6,500 tokens of 15,000), Redis killed, four calls while it
    is down (each replica's own estimate stays below the warning), Redis restarted empty, eight more calls: the
    outage's tokens reach Redis once it answers, and the warning and the exhaustion are claimed there, once."""
    before, outage, after = 4, 4, 8

    async def main(deployed: Any, side: str) -> list[Any]:
        with anyio.fail_after(90):
            async with clients(deployed) as targets:
                results = await round_robin(targets, CONVERSATION, before)
                killed = await anyio.to_thread.run_sync(_measured, deployed, side, before)
                own_redis.kill()
                results += await round_robin(targets, CONVERSATION, outage, start=before)
                down = await anyio.to_thread.run_sync(_measured, deployed, side, before + outage)
                own_redis.start()  # the same port, no data: a restarted cache

                def resent() -> bool:  # each replica's thread sends what it counted meanwhile, once Redis answers
                    return shared_budget(own_redis, prefix, side, CONVERSATION).tokens == down[0] - killed[0]

                await anyio.to_thread.run_sync(lambda: wait_for(resent, timeout=30, what="the outage's tokens"))
                results += await round_robin(targets, CONVERSATION, after, start=before + outage)
                total_after = await anyio.to_thread.run_sync(_measured, deployed, side, before + outage + after)
                budget = shared_budget(own_redis, prefix, side, CONVERSATION)
                # Redis holds everything since the kill (what it held before died with it), nothing twice.
                assert budget.tokens == total_after[0] - killed[0]
                assert budget.state == "exhausted"
                return results

    with deployment("server", 2, tmp_path, own_redis, prefix) as (deployed, side):
        results = anyio.run(main, deployed, side)
        assert len(results) == before + outage + after and not any(r.is_error for r in results)
        assert transitions(deployed, side) == (1, 1)
        adds = [r.metrics().value("mcp_token_budget_store_errors_total", op="add") for r in deployed]
        assert min(adds) >= outage // 2  # each replica counted the adds it answered on its own
        assert sum(r.metrics().value("mcp_token_sessions", side=side) for r in deployed) == 1
    for replica in deployed:  # one warning per outage, per replica
        assert replica.output().count("unreachable") == 1, replica.output()


@pytest.mark.slow
def test_slow_redis_never_holds_a_call_past_the_deadline(tmp_path: Path, own_redis: RedisServer, prefix: str,
                                                         propagating_client: None) -> None:
    """Redis asleep (DEBUG SLEEP, 6 s) under a 50 ms deadline: the calls made meanwhile are answered while it
    sleeps, each counted as a store error; once it wakes, counting resumes there. A timed-out add was sent and may
    have been applied when Redis woke: it is never sent again, so Redis holds what was measured, less at most the
    one add per replica that timed out."""
    with deployment("server", 2, tmp_path, own_redis, prefix, MCP_TOKEN_OTEL_BUDGET_STORE_TIMEOUT="0.05") as (
            deployed, side):

        async def main() -> list[Any]:
            with anyio.fail_after(60):
                async with clients(deployed) as targets:
                    results = await round_robin(targets, CONVERSATION, 2)
                    probe = _probe(own_redis)
                    sleeper = threading.Thread(
                        target=lambda: own_redis.client().execute_command("DEBUG", "SLEEP", "6"))
                    sleeper.start()
                    await anyio.to_thread.run_sync(lambda: wait_for(lambda: _asleep(probe), timeout=10,
                                                                    what="Redis asleep"))
                    results += await round_robin(targets, CONVERSATION, 4, start=2)
                    answered_while_asleep = sleeper.is_alive()
                    await anyio.to_thread.run_sync(sleeper.join, 30)
                    assert answered_while_asleep, "the calls waited for Redis to wake"
                    return results

        results = anyio.run(main)
        assert not any(r.is_error for r in results)
        wait_measured(deployed, side, 6)
        assert total(deployed, "mcp_token_budget_store_errors_total", op="add") >= 4
        tokens, _ = budgeted(deployed, side)
        per_call = total(deployed, "mcp_token_tokens_total", side=side, method="tools/call") / 6
        wait_for(lambda: shared_budget(own_redis, prefix, side, CONVERSATION).tokens >= tokens - 2 * per_call,
                 timeout=30, what="counting resumes in Redis")
        assert shared_budget(own_redis, prefix, side, CONVERSATION).tokens <= tokens


def _probe(redis: RedisServer) -> Any:
    """A client that gives up on a PING after 0.2 s, never retries, and is connected before Redis sleeps."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    probe = redis.client(socket_timeout=0.2, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    probe.ping()
    return probe


def _asleep(probe: Any) -> bool:
    """Whether the server is asleep (a PING within 0.2 s fails)."""
    try:
        probe.ping()
    except Exception:
        return True
    return False
