from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_token_otel import SessionBudget, SessionRegistry
from mcp_token_otel.core.budget import BUDGET_STATES


def test_defaults_and_transitions_once() -> None:
    b = SessionBudget()
    assert b.context_window == 200_000
    assert b.record(149_999).transitions == ()
    up = b.record(1)  # 150,000 = 75 %
    assert (up.state, up.transitions, up.utilization) == ("warning", ("warning",), 0.75)
    assert b.record(29_999).transitions == ()
    up = b.record(1)  # 180,000 = 90 %
    assert (up.state, up.transitions) == ("exhausted", ("exhausted",))
    assert b.record(50_000).transitions == ()
    assert b.calls == 5 and b.tokens == 230_000 and b.utilization == pytest.approx(1.15)


def test_one_call_can_cross_both_thresholds() -> None:
    up = SessionBudget(100).record(95)
    assert up.transitions == ("warning", "exhausted") and up.state == "exhausted"


def test_negative_tokens_are_ignored() -> None:
    b = SessionBudget(100)
    b.record(-50)
    assert b.tokens == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"context_window": 0}, "budget.context_window"),
     ({"warning_ratio": 0.9, "exhaustion_ratio": 0.9}, "budget.warning_ratio: expected less than"),
     ({"exhaustion_ratio": 1.5}, "budget.exhaustion_ratio: expected a number in"),
     ({"warning_ratio": 0}, "budget.warning_ratio")],
)
def test_invalid_budget_names_key(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SessionBudget(**kwargs)


@given(st.lists(st.integers(0, 50_000), max_size=60), st.integers(1, 10**6))
def test_every_transition_is_reported_exactly_once_and_in_order(calls: list[int], window: int) -> None:
    b = SessionBudget(window)
    seen: list[str] = []
    total = 0
    for tokens in calls:
        up = b.record(tokens)
        total += tokens
        seen.extend(up.transitions)
        assert up.tokens == total
        # the state always matches the thresholds, and never moves backwards
        expected = "exhausted" if total >= 0.9 * window else "warning" if total >= 0.75 * window else "ok"
        assert up.state == expected
    assert seen == list(BUDGET_STATES[1 : BUDGET_STATES.index(b.state) + 1])


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_registry_bounds_count_and_idle_time() -> None:
    clock = FakeClock()
    ended: list[tuple[str, str, int]] = []
    reg = SessionRegistry(1000, max_sessions=3, idle_timeout=10, clock=clock,
                          on_end=lambda sid, b, why: ended.append((sid, why, b.tokens)))
    for sid in "abc":
        reg.record(sid, 100)
    reg.record("a", 700)  # a becomes most recent; state warning (800/1000)
    assert reg.states() == {"ok": 2, "warning": 1, "exhausted": 0}
    reg.record("d", 1)  # evicts the least recently used: b
    assert ended == [("b", "evicted", 100)] and len(reg) == 3 and "b" not in reg
    clock.now = 5
    reg.record("a", 0)
    clock.now = 11
    reg.record("a", 1)  # c and d were last seen at t=0: idle for 11 s > 10 s
    assert {e[0] for e in ended[1:]} == {"c", "d"} and all(e[1] == "idle" for e in ended[1:])
    assert reg.end("a") is not None and ended[-1] == ("a", "ended", 801)
    assert reg.end("a") is None and len(reg) == 0


def test_registry_memory_is_constant_per_session() -> None:
    reg = SessionRegistry(max_sessions=5)
    for i in range(10_000):
        reg.record(f"s{i % 3}", 10)
    assert len(reg) == 3
    assert reg.get("s0") is not None and reg.get("s0").calls == 3334  # type: ignore[union-attr]


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(0, 400), st.booleans()), max_size=80))
def test_state_counts_always_match_the_live_sessions(ops: list[tuple[str, int, bool]]) -> None:
    clock = FakeClock()
    reg = SessionRegistry(1000, max_sessions=4, idle_timeout=30, clock=clock)
    for sid, tokens, end in ops:
        clock.now += 7
        reg.end(sid) if end else reg.record(sid, tokens)
        live = [reg.get(s) for s in "abcdef" if s in reg]
        expected = {state: sum(1 for b in live if b is not None and b.state == state) for state in BUDGET_STATES}
        assert reg.states() == expected
