"""Sessions past ``budget.max_sessions`` are evicted least recently used, one at a time, and each eviction is
counted (``record_session_evicted``): no session's bookkeeping is dropped silently, none all at once."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from mcp_token_otel.config import config_from_dict
from mcp_token_otel.core.measure import Measurement
from mcp_token_otel.emitters.prometheus_metrics import PrometheusMetrics
from mcp_token_otel.emitters.sink import BaseSink, CallInfo
from mcp_token_otel.recorder import TokenRecorder

TEXT = {"content": [{"type": "text", "text": "hello " * 50}]}


class Calls(BaseSink):
    def __init__(self) -> None:
        self.evicted: list[tuple[str, str]] = []
        self.ended: list[tuple[str, str]] = []
        self.messages: list[tuple[str, str, str, str]] = []

    def record_session_evicted(self, side: str, server: str) -> None:
        self.evicted.append((side, server))

    def record_session_end(self, side: str, utilization: float, server: str, call: CallInfo) -> None:
        self.ended.append((side, server))

    def record_message(
        self, side: str, method: str, tool: str | None, direction: str, measurement: Measurement, server: str
    ) -> None:
        self.messages.append((side, method, direction, server))


def make(max_sessions: int) -> tuple[TokenRecorder, Calls, PrometheusMetrics]:
    config = config_from_dict({"estimator": "chars/4", "budget": {"max_sessions": max_sessions}})
    recorder = TokenRecorder(config, TracerProvider(), MeterProvider())
    calls, prom = Calls(), PrometheusMetrics(states=recorder.session_states)
    recorder.add_sink(calls, inline=True)
    recorder.add_sink(prom, inline=True)
    return recorder, calls, prom


def call(recorder: TokenRecorder, session: str, server: str) -> None:
    recorder.record_output(None, "server", "tools/call", "t", result=TEXT, session_id=session, server=server)


def evicted_total(prom: PrometheusMetrics, server: str) -> float | None:
    return prom.registry.get_sample_value("mcp_token_sessions_evicted_total", {"side": "server", "server": server})


def test_sessions_past_the_bound_are_evicted_least_recently_used_and_counted() -> None:
    recorder, calls, prom = make(max_sessions=3)
    for i in range(3):
        call(recorder, f"s{i}", f"srv{i}")
    call(recorder, "s0", "srv0")  # s0 is now the most recently used: s1 goes first
    call(recorder, "s3", "srv3")
    call(recorder, "s4", "srv4")
    assert calls.evicted == [("server", "srv1"), ("server", "srv2")]
    assert calls.ended == calls.evicted  # an evicted session's end (its utilization) is still recorded
    assert evicted_total(prom, "srv1") == 1 and evicted_total(prom, "srv2") == 1
    assert evicted_total(prom, "srv0") is None
    live = {server: sum(counts.values()) for (_, server), counts in recorder.session_states().items()}
    assert live["srv0"] == live["srv3"] == live["srv4"] == 1  # the survivors keep their server label
    assert live.get("srv1", 0) == live.get("srv2", 0) == 0
    assert recorder.error_counts == {}


def test_session_metadata_without_a_budget_is_bounded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder, calls, prom = make(max_sessions=3)

    def budget_fault(session_id: str, tokens: int) -> Any:
        raise RuntimeError("budget registry down")

    # Sessions the registry never holds (it fails): only their metadata is kept, bounded by the same limit.
    monkeypatch.setattr(recorder.sessions["server"], "record", budget_fault)
    for i in range(3):
        call(recorder, f"o{i}", f"srv{i}")
    call(recorder, "o0", "srv0")
    for i in range(3, 6):
        call(recorder, f"o{i}", f"srv{i}")
    assert calls.evicted == [("server", "srv1"), ("server", "srv2"), ("server", "srv0")]
    assert [evicted_total(prom, f"srv{i}") for i in range(6)] == [1, 1, 1, None, None, None]
    assert calls.ended == []  # no budget, so no utilization to observe: only the eviction is news
    assert recorder.error_counts == {"budget": 7}  # every failed budget update is a counted fault


def test_an_evicted_initialize_still_records_its_held_request() -> None:
    recorder, calls, _ = make(max_sessions=1)
    # A client's initialize waits for its result to name the server; its session is evicted first.
    recorder.record_input(None, "client", "initialize", {"protocolVersion": "2025-06-18"}, "c1")
    assert ("client", "initialize", "input", "") not in calls.messages
    recorder.record_input(None, "client", "initialize", {"protocolVersion": "2025-06-18"}, "c2")
    assert ("client", "initialize", "input", "_unknown") in calls.messages  # recorded when c1 went, not lost
    assert calls.evicted == [("client", "_unknown")]
