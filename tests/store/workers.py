"""What one replica does in the multi-process tests (module level, so a spawned process can import it)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from mcp_token_otel.config import config_from_dict


def tokens_of(conversation: int, message: int) -> int:
    """The tokens of one message: varied, and known to the test that sums them."""
    return (conversation * 7 + message * 13) % 50 + 1


def replica(url: str, prefix: str, rank: int, replicas: int, conversations: int, messages: int,
            window: int) -> dict[str, Any]:
    """Add this replica's share of every conversation's calls (call m goes to replica m % replicas); report the
    transitions it was told it claimed and the budgets it owns."""
    from mcp_token_otel.store.redis_store import RedisStore

    budget = config_from_dict({"budget": {"store": url, "store_prefix": prefix, "context_window": window,
                                          "store_timeout": 5.0}}).budget
    errors: list[str] = []
    claimed: Counter[str] = Counter()
    store = RedisStore(budget, on_error=errors.append)
    sources: Counter[str] = Counter()
    try:
        for m in range(messages):
            if m % replicas != rank:
                continue
            for c in range(conversations):
                answer = store.add("server", f"conv-{c}", tokens_of(c, m))
                sources[answer.source] += 1
                for state in answer.transitions:
                    claimed[f"conv-{c}:{state}"] += 1
        owned = sorted(key for key, _ in store.sessions("server"))
    finally:
        store.close()
    return {"claimed": dict(claimed), "owned": owned, "errors": errors, "sources": dict(sources)}


def forked_child(store: Any, queue: Any) -> None:
    """In a forked child: the parent's store, used as it is."""
    answer = store.add("server", "conv", 5)
    queue.put({"instance": store.instance, "tokens": answer.tokens, "owner": answer.owner,
               "source": answer.source, "sessions": store.sessions("server")})
    store.close()
