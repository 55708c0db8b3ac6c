"""Sessions past ``budget.max_sessions`` are evicted least recently used, one at a time, and each eviction is
counted (``mcp_token_sessions_evicted_total``): no session's bookkeeping is dropped silently, none all at once."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from mcp_token_otel.config import config_from_dict
from mcp_token_otel.recorder import TokenRecorder
from tests.helpers.calls import exchange
from tests.helpers.support import Scrape, scrape

TEXT = {"content": [{"type": "text", "text": "hello " * 50}]}


def make(max_sessions: int) -> TokenRecorder:
    config = config_from_dict({"estimator": "chars/4", "budget": {"max_sessions": max_sessions}})
    return TokenRecorder(config, TracerProvider(), MeterProvider())


def call(recorder: TokenRecorder, session: str, server: str) -> None:
    exchange(recorder, "server", "tools/call", {"name": "t"}, session, result=TEXT, server=server)


def evicted(found: Scrape) -> dict[str, float]:
    """Evictions per server, the servers with one or more."""
    return {labels["server"]: v for labels, v in found.pick("mcp_token_sessions_evicted_total", side="server") if v}


def ended(found: Scrape) -> dict[str, float]:
    """Sessions whose end observed their utilization, per server."""
    return {labels["server"]: v for labels, v in found.pick("mcp_token_session_utilization_ratio_count") if v}


def test_sessions_past_the_bound_are_evicted_least_recently_used_and_counted() -> None:
    recorder = make(max_sessions=3)
    for i in range(3):
        call(recorder, f"s{i}", f"srv{i}")
    call(recorder, "s0", "srv0")  # s0 is now the most recently used: s1 goes first
    assert evicted(scrape(recorder)) == {}
    call(recorder, "s3", "srv3")
    assert evicted(scrape(recorder)) == {"srv1": 1}  # one at a time
    call(recorder, "s4", "srv4")
    found = scrape(recorder)
    assert evicted(found) == {"srv1": 1, "srv2": 1}
    assert ended(found) == evicted(found)  # an evicted session's end (its utilization) is still recorded
    assert not found.has("mcp_token_sessions_evicted_total", side="server", server="srv0")
    live = {server: sum(counts.values()) for (_, server), counts in recorder.session_states().items()}
    assert live["srv0"] == live["srv3"] == live["srv4"] == 1  # the survivors keep their server label
    assert live.get("srv1", 0) == live.get("srv2", 0) == 0
    assert recorder.error_counts == {}


def test_session_metadata_without_a_budget_is_bounded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = make(max_sessions=3)

    def budget_fault(session_id: str, tokens: int) -> Any:
        raise RuntimeError("budget registry down")

    # Sessions the registry never holds (it fails): only their metadata is kept, bounded too. The metadata of a
    # session is made at its first request and its budget at its first answer, so the metadata's bound is twice the
    # budgets' (the budgets' own least-recently-used end acts first on sessions that have one).
    monkeypatch.setattr(recorder.sessions["server"], "record", budget_fault)
    for i in range(6):
        call(recorder, f"o{i}", f"srv{i}")
    call(recorder, "o0", "srv0")
    order = []
    for i in range(6, 9):
        call(recorder, f"o{i}", f"srv{i}")
        order.append(evicted(scrape(recorder)))
    assert order == [{"srv1": 1}, {"srv1": 1, "srv2": 1}, {"srv1": 1, "srv2": 1, "srv3": 1}]
    found = scrape(recorder)
    assert [found.value("mcp_token_sessions_evicted_total", server=f"srv{i}") for i in range(9)] == \
        [0, 1, 1, 1, 0, 0, 0, 0, 0]
    assert ended(found) == {}  # no budget, so no utilization to observe: only the eviction is news
    # Every failed budget update is a counted fault (one per exchange: its request and answer count together).
    assert recorder.error_counts == {"budget": 10}


def test_an_evicted_initialize_still_records_its_held_request() -> None:
    recorder = make(max_sessions=1)

    def requested(found: Scrape) -> float:
        return found.value("mcp_token_tokens_total", side="client", method="initialize", direction="input")

    # A client's initialize waits for its result to name the server; its session is evicted first.
    # (The metadata's bound is twice the budgets': the third session's evicts the first's.)
    first = recorder.begin("client", "initialize", {"protocolVersion": "2025-06-18"}, "c1")
    first.open()
    assert requested(scrape(recorder)) == 0
    second = recorder.begin("client", "initialize", {"protocolVersion": "2025-06-18"}, "c2")
    second.open()
    assert requested(scrape(recorder)) == 0
    third = recorder.begin("client", "initialize", {"protocolVersion": "2025-06-18"}, "c3")
    third.open()
    found = scrape(recorder)
    assert requested(found) > 0  # recorded when c1 went, not lost
    assert found.value("mcp_token_tokens_total", side="client", method="initialize", server="_unknown") == \
        requested(found)
    assert found.value("mcp_token_sessions_evicted_total", side="client", server="_unknown") == 1
    for pending in (first, second, third):
        pending.close()
