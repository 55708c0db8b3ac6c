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
    """Add this replica's share of every conversation's messages (message m goes to replica m % replicas), a
    request held then its response; report the transitions it was told it claimed and the budgets it owns."""
    from mcp_token_otel.store.redis_store import RedisStore

    budget = config_from_dict({"budget": {"store": url, "store_prefix": prefix, "context_window": window,
                                          "store_timeout": 5.0}}).budget
    errors: list[str] = []
    claimed: Counter[str] = Counter()

    def sent_later(side: str, key: str, states: tuple[str, ...]) -> None:  # held requests the store sent itself
        claimed.update(f"{key}:{state}" for state in states)

    store = RedisStore(budget, on_error=errors.append, on_transition=sent_later)
    sources: Counter[str] = Counter()
    try:
        for m in range(messages):
            if m % replicas != rank:
                continue
            for c in range(conversations):
                answer = store.add("server", f"conv-{c}", tokens_of(c, m), final=m % 2 == 1)
                sources[answer.source] += 1
                for state in (*answer.transitions, *answer.held_transitions):
                    claimed[f"conv-{c}:{state}"] += 1
        store.flush()  # a request still held at the end goes now
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
