"""One conversation, one count, one alert, wherever its calls land: 20 calls of about 4 KB against a 15,000-token
window, sent round-robin to N replicas of an instrumented server or N HTTP proxies that share a real Redis
(``MCP_TOKEN_OTEL_BUDGET_STORE``), the transitions summed over the replicas' /metrics.

With the default memory store each replica counts its own share of the conversation. Measured with this very
set-up (about 1,500 tokens a call, the default estimator), the sums read:

    replicas                     1      2      3
    warning transitions          1      2      2
    exhausted transitions        1      2      0
    sum(mcp_token_sessions)      1      2      3

(two replicas each cross both thresholds late, on their own half; of three, two cross the warning late and none is
ever exhausted: the page never comes). The same for the HTTP proxy. With the Redis store they read 1, 1 and 1 for
every N, the hard limit refuses on every replica once the conversation is exhausted, and the sessions gauge and the
utilization histogram count the conversation once, on the replica that owns it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.helpers.redis_server import RedisServer
from tests.proxy.conftest import wait_for

from .conftest import (
    CALLS,
    budgeted,
    clients,
    deployment,
    round_robin,
    run_conversation,
    running,
    server_replicas,
    shared_budget,
    total,
    transitions,
    wait_measured,
)

KINDS = ["server", "proxy"]


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_one_warning_and_one_exhausted_whatever_the_replicas(kind: str, replicas: int, tmp_path: Path,
                                                             redis_server: RedisServer, prefix: str,
                                                             propagating_client: None) -> None:
    with deployment(kind, replicas, tmp_path, redis_server, prefix) as (deployed, side):
        results = run_conversation(deployed, "conversation-42")
        wait_measured(deployed, side, CALLS)
        assert not any(r.is_error for r in results)
        assert transitions(deployed, side) == (1, 1)
        # Each replica answered its share and counted what it saw; the total is the conversation's.
        per_replica = [r.metrics().value("mcp_token_operation_duration_seconds_count", side=side,
                                         method="tools/call") for r in deployed]
        assert per_replica == [len(range(i, CALLS, replicas)) for i in range(replicas)]
        # Redis holds the conversation's exact total: every budgeted exchange of every replica, once (the calls
        # and the tools/list each client sends before its first call).
        budget = shared_budget(redis_server, prefix, side, "conversation-42")
        assert budget.state == "exhausted"
        assert (budget.tokens, budget.calls) == budgeted(deployed, side)
        # The sessions gauge: the conversation is live on every replica, counted on one (its owner).
        assert total(deployed, "mcp_token_sessions", side=side) == 1
        assert total(deployed, "mcp_token_sessions", side=side, state="exhausted") == 1


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_the_hard_limit_refuses_on_every_replica(kind: str, tmp_path: Path, redis_server: RedisServer,
                                                 prefix: str, propagating_client: None) -> None:
    """``guard.session_hard_limit`` in enforce mode reads the shared total: once the conversation is exhausted,
    its next call is refused whichever replica it reaches, including those that never saw it cross."""
    side = "server" if kind == "server" else "proxy"
    guard = {"MCP_TOKEN_OTEL_GUARD_MODE": "enforce", "MCP_TOKEN_OTEL_GUARD_SESSION_HARD_LIMIT": "true",
             "MCP_TOKEN_OTEL_GUARD_SIDES": side}

    async def main(deployed: Any) -> tuple[list[Any], list[Any]]:
        with anyio.fail_after(60):
            async with clients(deployed) as targets:
                results = await round_robin(targets, "conversation-42", CALLS)
                after = [(await round_robin([target], "conversation-42", 1))[0] for target in targets]
                return results, after

    with deployment(kind, 3, tmp_path, redis_server, prefix, **guard) as (deployed, _):
        results, after = anyio.run(main, deployed)
        wait_measured(deployed, side, CALLS + len(deployed))
        assert transitions(deployed, side) == (1, 1)
        refused = [r.is_error for r in results]
        first = refused.index(True)
        assert 0 < first < CALLS - len(deployed)  # the conversation ran out part-way
        assert refused == [False] * first + [True] * (CALLS - first)  # from the call after the crossing on
        assert all(r.is_error for r in after)  # the next call to every replica
        per_replica = [r.metrics().value("mcp_token_guard_actions_total", side=side, policy="session_limit",
                                         action="refused", enforced="true") for r in deployed]
        assert sum(per_replica) == CALLS - first + len(deployed) and min(per_replica) >= 2


@pytest.mark.slow
def test_sessions_and_utilization_count_the_conversation_once(tmp_path: Path, redis_server: RedisServer,
                                                               prefix: str, propagating_client: None) -> None:
    """Live on three replicas, the conversation is in the sessions gauge of one (its owner); once it is idle on
    all of them past ``budget.idle_timeout`` it leaves the gauge and its utilization is observed once, by the owner.
    Every key it left in Redis expires (its budget's, its repeated-call digests')."""
    short = {"MCP_TOKEN_OTEL_BUDGET_IDLE_TIMEOUT": "4", "MCP_TOKEN_OTEL_METRICS_REPEAT_WINDOW": "4"}
    with deployment("server", 3, tmp_path, redis_server, prefix, **short) as (deployed, side):
        run_conversation(deployed, "conversation-idle", calls=6)
        wait_measured(deployed, side, 6)
        gauges = [r.metrics().value("mcp_token_sessions", side=side) for r in deployed]
        assert sorted(gauges) == [0, 0, 1]
        owner = gauges.index(1)
        client = redis_server.client()
        keys = client.keys(f"{prefix}*")
        assert keys and all(client.pttl(key) > 0 for key in keys)  # every key expires
        wait_for(lambda: total(deployed, "mcp_token_sessions", side=side) == 0, timeout=30,
                 what="the idle conversation leaves the gauge")
        # A process reports the budgets it let go of at its next message: one call outside the conversation each.
        async def unbudgeted() -> None:
            async with clients(deployed) as targets:
                for target in targets:
                    await target.call_tool("fetch", {"n": 10})

        anyio.run(unbudgeted)
        wait_measured(deployed, side, 6 + len(deployed))
        ends = [r.metrics().value("mcp_token_session_utilization_ratio_count", side=side) for r in deployed]
        assert ends == [1 if i == owner else 0 for i in range(len(deployed))]
        wait_for(lambda: not client.keys(f"{prefix}*"), timeout=30, what="the conversation's keys expire")


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_the_rate_limit_is_one_window_for_every_replica(kind: str, tmp_path: Path, redis_server: RedisServer,
                                                        prefix: str, propagating_client: None) -> None:
    """``guard.calls_per_minute: 5`` over three replicas: the conversation's sixth call is refused wherever it lands
    (with the memory store each replica would let 5 a minute through: 15 for the conversation)."""
    side = "server" if kind == "server" else "proxy"
    guard = {"MCP_TOKEN_OTEL_GUARD_MODE": "enforce", "MCP_TOKEN_OTEL_GUARD_RATE_LIMIT": "true",
             "MCP_TOKEN_OTEL_GUARD_CALLS_PER_MINUTE": "5", "MCP_TOKEN_OTEL_GUARD_SIDES": side}
    with deployment(kind, 3, tmp_path, redis_server, prefix, **guard) as (deployed, _):
        results = run_conversation(deployed, "conversation-rate", calls=9, n=100)
        wait_measured(deployed, side, 9)
        assert [r.is_error for r in results] == [False] * 5 + [True] * 4
        per_replica = [r.metrics().value("mcp_token_guard_actions_total", side=side, policy="rate_limit",
                                         action="refused", enforced="true") for r in deployed]
        assert per_replica == [1, 1, 2]  # calls 6 to 9 landed on replicas 2, 0, 1 and 2 (call i on i % 3)
        assert total(deployed, "mcp_token_budget_store_errors_total") == 0


@pytest.mark.slow
def test_repeats_and_tool_list_churn_are_seen_across_replicas(tmp_path: Path, redis_server: RedisServer,
                                                               prefix: str, propagating_client: None) -> None:
    """The same call on another replica is a repeat, a tools/list that differs from the one another replica served
    the conversation is prompt-cache churn (with the memory store neither replica would see either)."""
    replicas = server_replicas(2, tmp_path, redis_server, prefix)
    replicas[1].argv.append("--extra-tool")  # its tools/list differs from replica 0's
    with running(replicas) as deployed:
        # Each client lists the tools before its first call, in the conversation: replica 0, then replica 1.
        run_conversation(deployed, "conversation-repeat", calls=2, n=100)
        wait_measured(deployed, "server", 2)
        first, second = (r.metrics() for r in deployed)
        assert first.value("mcp_token_wasted_tokens_total", kind="repeated") == 0
        assert second.value("mcp_token_wasted_tokens_total", kind="repeated") > 0
        assert first.value("mcp_token_prompt_cache_invalidations_total") == 0
        assert second.value("mcp_token_prompt_cache_invalidations_total") == 1
