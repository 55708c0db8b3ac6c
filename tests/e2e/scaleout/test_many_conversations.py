"""Many conversations at once from many clients, spread over three replicas that share a real Redis: every
conversation's total in Redis is exact (the replicas' own token counters, summed, say what was sent), and each
conversation's transitions are counted once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.helpers.redis_server import RedisServer

from .conftest import budgeted, clients, deployment, round_robin, shared_budget, transitions, wait_measured

CONVERSATIONS = 12
CALLS = 6


def _size(c: int) -> int:
    """Conversation c's calls answer this many characters: some conversations stay ok, some run out."""
    return 1000 + 900 * c


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["server", "proxy"])
def test_parallel_conversations_exact_totals(kind: str, tmp_path: Path, redis_server: RedisServer, prefix: str,
                                             propagating_client: None) -> None:
    async def conversation(deployed: Any, c: int) -> None:
        async with clients(deployed) as targets:  # each conversation, its own client per replica
            results = await round_robin(targets, f"conversation-{c}", CALLS, start=c, n=_size(c))
            assert not any(r.is_error for r in results)

    async def main(deployed: Any) -> None:
        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                for c in range(CONVERSATIONS):
                    tg.start_soon(conversation, deployed, c)

    with deployment(kind, 3, tmp_path, redis_server, prefix) as (deployed, side):
        anyio.run(main, deployed)
        wait_measured(deployed, side, CONVERSATIONS * CALLS)
        budgets = [shared_budget(redis_server, prefix, side, f"conversation-{c}") for c in range(CONVERSATIONS)]
        tokens, exchanges = budgeted(deployed, side)
        assert sum(b.tokens for b in budgets) == tokens and sum(b.calls for b in budgets) == exchanges
        assert all(b.calls >= CALLS for b in budgets)
        per_call = [b.tokens / b.calls for b in budgets]
        assert per_call == sorted(per_call)  # larger answers, larger totals: each total is its own conversation's
        states = [b.state for b in budgets]
        assert "ok" in states and "exhausted" in states
        assert transitions(deployed, side) == (sum(s != "ok" for s in states), states.count("exhausted"))
