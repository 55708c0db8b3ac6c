"""The proxy's measuring code (proxy/jsonrpc.py ``Tracker``, the recorder behind it) fed the logical-call fixtures
as raw JSON-RPC: the captured mcp 2.3 exchanges and the specifications' own task examples (2026-07-28 tasks
extension, 2025-11-25 tasks), which no installed SDK produces. What each message counts as, checked against the
measuring functions themselves, and the absolute figures the docs show."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mcp_token_otel.config import Config, config_from_dict
from mcp_token_otel.core.estimators import get_estimator
from mcp_token_otel.core.measure import Policy, measure_request, measure_result
from mcp_token_otel.proxy.jsonrpc import C2S, S2C, ProxyStats, Tracker
from mcp_token_otel.recorder import TokenRecorder
from mcp_token_otel.recorder.legs import A_LEG, A_LEGS, A_LINK_TYPE
from tests.helpers.replay import load
from tests.helpers.support import ROOT, Scrape, make_config, scrape

SECOND = 1_000_000_000
TOKENS, RESPONSES, WASTED = "mcp_token_tokens_total", "mcp_token_responses_total", "mcp_token_wasted_tokens_total"
LEGS, LOGICAL = "mcp_token_operation_duration_seconds_count", "mcp_token_logical_call_duration_seconds_count"


class Replayed:
    """A fixture fed to the proxy's trackers: the recorder's /metrics and the proxy's spans."""

    def __init__(self, recorder: TokenRecorder, exporter: InMemorySpanExporter, stats: ProxyStats) -> None:
        self.metrics: Scrape = scrape(recorder)
        self.spans: list[ReadableSpan] = list(exporter.get_finished_spans())
        self.stats = stats
        self.recorder = recorder

    def value(self, name: str, **labels: str) -> float:
        return self.metrics.value(name, side="proxy", **labels)


def proxy_replay(name: str, config: Config | None = None, per_exchange: bool = False) -> Replayed:
    """Feed fixture ``name`` to the proxy's trackers, one message a second. ``per_exchange``: a tracker per request
    and its answer, as the HTTP proxy has on 2026-07-28 (no session: each POST is its own), the conversation named
    by a header; else one tracker for the whole stream, as the stdio proxy has."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    recorder = TokenRecorder(config or make_config(), provider)
    stats = ProxyStats()
    origin = {"headers": {"x-conversation-id": "c1"}}
    stream = Tracker(recorder, stats, session_key=None if per_exchange else "stream", transport="pipe",
                     origin=origin)
    trackers: dict[Any, Tracker] = {}
    now = SECOND
    for entry in load(name)["messages"]:
        direction, message = entry["direction"], entry["message"]
        now += SECOND
        tracker = stream
        if per_exchange and isinstance(message, dict) and "id" in message:
            if "method" in message:  # a request opens its exchange
                tracker = trackers[(direction, message["id"])] = Tracker(recorder, stats, session_key=None,
                                                                         transport="tcp", origin=origin)
            else:  # its answer comes back on it
                tracker = trackers.pop((S2C if direction == C2S else C2S, message["id"]), stream)
        tracker.observe(direction, json.dumps(message).encode(), now)
    for tracker in [stream, *trackers.values()]:
        tracker.close(now + SECOND)
    return Replayed(recorder, exporter, stats)


def keyed(estimator: str = "chars/4") -> Config:
    """The conversation named by a header: a budget key where 2026-07-28 HTTP has no session."""
    return config_from_dict({"estimator": estimator, "budget": {"key": ["session", "header:x-conversation-id"]}})


def policy(estimator: str = "chars/4") -> Policy:
    return Policy(estimator=get_estimator(estimator), estimator_name=estimator)


def messages(name: str) -> list[dict[str, Any]]:
    return [entry["message"] for entry in load(name)["messages"]]


def answers(name: str, request_id: Any) -> dict[str, Any]:
    (found,) = [m for m in messages(name) if m.get("id") == request_id and "method" not in m]
    return found


def legs_of(name: str, tool: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(request, answer) of every leg of the tools/call of ``tool`` (a retry names the tool again)."""
    out = []
    for m in messages(name):
        if m.get("method") == "tools/call" and m["params"].get("name") == tool:
            out.append((m, answers(name, m["id"])))
    return out


# ---------------------------------------------------------------------------------------------- multi round-trip


@pytest.mark.parametrize("name", ["elicit_once.http", "elicit_once.stdio"])
@pytest.mark.parametrize("per_exchange", [False, True], ids=["stream", "per-exchange"])
def test_a_confirmed_call_counts_each_part_once_under_its_own_direction(name: str, per_exchange: bool) -> None:
    run = proxy_replay(name, keyed(), per_exchange)
    (first, question), (retry, final) = legs_of(name, "delete_report")
    p = policy()
    answered = {k: retry["params"][k] for k in ("inputResponses", "requestState")}
    expected = {
        "input": measure_request("tools/call", first["params"], p).total_tokens,  # the first leg's, once
        "input_required": measure_result("tools/call", question["result"], tool_name="delete_report",
                                         policy=p).total_tokens,
        "input_response": measure_request("", answered, p).total_tokens,  # the answers, not the name again
        "output": measure_result("tools/call", final["result"], tool_name="delete_report", policy=p).total_tokens,
    }
    for direction, tokens in expected.items():
        assert run.value(TOKENS, tool="delete_report", direction=direction) == tokens, direction
    assert run.value(TOKENS, tool="delete_report") == sum(expected.values())  # nothing else, nothing twice
    assert run.metrics.pick(RESPONSES, side="proxy", tool="delete_report", risk_tier="medium")[0][1] == 1
    assert run.value(RESPONSES, tool="delete_report") == 1
    assert run.value(WASTED, tool="delete_report", kind="repeated") == 0
    assert run.value(LEGS, tool="delete_report") == 2
    assert run.value(LOGICAL, tool="delete_report") == 1
    if name == "elicit_once.http":  # the figures the docs show for chars/4
        assert expected == {"input": 9, "input_required": 186, "input_response": 118, "output": 2037}


def test_the_logical_duration_is_the_wire_time_from_the_first_request_to_the_final_answer() -> None:
    run = proxy_replay("elicit_once.http", keyed())
    # One message a second: each leg lasts a second on the wire, the call three (request, question, retry, result).
    assert run.value("mcp_token_operation_duration_seconds_sum", tool="delete_report") == pytest.approx(2.0)
    assert run.value("mcp_token_logical_call_duration_seconds_sum", tool="delete_report") == pytest.approx(3.0)


@pytest.mark.parametrize("per_exchange", [False, True], ids=["stream", "per-exchange"])
def test_three_confirmed_calls_two_real_repeats(per_exchange: bool) -> None:
    run = proxy_replay("elicit_three.http", keyed(), per_exchange)
    finals = [answer for request, answer in legs_of("elicit_three.http", "delete_report")
              if "inputResponses" in request["params"]]
    outputs = [measure_result("tools/call", a["result"], tool_name="delete_report", policy=policy()).total_tokens
               for a in finals]
    assert len(outputs) == 3
    assert run.value(RESPONSES, tool="delete_report") == 3
    assert run.value(TOKENS, tool="delete_report", direction="output") == sum(outputs)
    assert run.value(WASTED, tool="delete_report", kind="repeated") == outputs[1] + outputs[2] == 4074
    assert run.value(LEGS, tool="delete_report") == 6
    assert run.value(LOGICAL, tool="delete_report") == 3


def test_two_questions_are_two_input_required_legs_of_one_call() -> None:
    run = proxy_replay("two_rounds.http", keyed())
    legs = legs_of("two_rounds.http", "greet_twice")
    assert len(legs) == 3
    asked = sum(measure_result("tools/call", a["result"], tool_name="greet_twice", policy=policy()).total_tokens
                for _, a in legs[:2])
    assert run.value(TOKENS, tool="greet_twice", direction="input_required") == asked
    assert run.value(RESPONSES, tool="greet_twice") == 1
    assert (run.value(LEGS, tool="greet_twice"), run.value(LOGICAL, tool="greet_twice")) == (3, 1)
    spans = sorted((s for s in run.spans if (s.attributes or {}).get("gen_ai.tool.name") == "greet_twice"),
                   key=leg_number)
    assert [leg_number(s) for s in spans] == [1, 2, 3]
    assert spans[2].attributes[A_LEGS] == 3  # type: ignore[index]
    for later in spans[1:]:  # every retry links to the first leg, not to the one before it
        (link,) = later.links
        assert link.context.span_id == spans[0].context.span_id
        assert link.attributes == {A_LINK_TYPE: "retry_of"}


def test_the_specifications_multi_round_trip_example() -> None:
    run = proxy_replay("mrtr_spec.spec")
    assert run.value(RESPONSES, tool="get_weather") == 1
    assert run.value(TOKENS, tool="get_weather", direction="input_required") > 0
    assert run.value(TOKENS, tool="get_weather", direction="input_response") > 0
    assert (run.value(LEGS, tool="get_weather"), run.value(LOGICAL, tool="get_weather")) == (2, 1)


# ---------------------------------------------------------------------------------------------- tasks


def leg_number(span: ReadableSpan) -> int:
    return int((span.attributes or {}).get(A_LEG, 0))  # type: ignore[arg-type]


def _inlined(name: str) -> tuple[dict[str, Any], Any]:
    """The completed task state a tasks/get answer or a notification carries, and its inlined result."""
    for m in messages(name):
        state = m.get("result") if "result" in m else m.get("params")
        if isinstance(state, dict) and state.get("status") in ("completed", "failed") and (
                "result" in state or "error" in state):
            return state, state.get("result") or state.get("error")
    raise AssertionError(f"{name}: no completed task")


def test_the_tasks_extensions_example_flow_is_one_call_of_its_tool() -> None:
    run = proxy_replay("tasks_spec.spec")
    _, result = _inlined("tasks_spec.spec")
    output = measure_result("tools/call", result, tool_name="hello_world", policy=policy()).total_tokens
    assert run.value(RESPONSES) == run.value(RESPONSES, tool="hello_world", risk_tier="low") == 1
    assert run.value(TOKENS, method="tools/call", tool="hello_world", direction="output") == output
    for method in ("tasks/get", "tasks/update"):  # polls, questions asked through the task, their answers
        assert run.value(TOKENS, method=method, direction="output") == 0, method
        assert run.value(TOKENS, method=method, direction="task") > 0, method
    assert run.value(LEGS, method="tasks/get") == 5 and run.value(LEGS, method="tasks/update") == 1
    assert run.value(LOGICAL) == run.value(LOGICAL, tool="hello_world") == 1
    # Task bookkeeping never enters the model's context: the budget holds the arguments and the result only.
    (final,) = [s for s in run.spans if (s.attributes or {}).get("mcp_token.output_tokens") == output]
    inputs = run.value(TOKENS, tool="hello_world", direction="input")
    assert final.attributes["mcp_token.session.tokens"] == inputs + output  # type: ignore[index]
    # Every task message links to the call that created the task.
    (call,) = [s for s in run.spans if s.name == "tools/call hello_world"]
    tasks = [s for s in run.spans if s.name.startswith("tasks/")]
    assert len(tasks) == 6
    for span in tasks:
        (link,) = span.links
        assert link.context.span_id == call.context.span_id
        assert link.attributes == {A_LINK_TYPE: "task_of"}


def test_a_2025_11_25_task_delivers_through_tasks_result() -> None:
    run = proxy_replay("tasks_2025_11_25_spec.spec")
    (payload,) = [m["result"] for m in messages("tasks_2025_11_25_spec.spec") if "content" in m.get("result", {})]
    output = measure_result("tools/call", payload, tool_name="get_weather", policy=policy()).total_tokens
    assert run.value(RESPONSES) == run.value(RESPONSES, method="tools/call", tool="get_weather") == 1
    assert run.value(TOKENS, method="tools/call", tool="get_weather", direction="output") == output
    for method in ("tasks/get", "tasks/result"):
        assert run.value(TOKENS, method=method, direction="output") == 0, method
        assert run.value(TOKENS, method=method, direction="task") > 0, method
    assert run.value(LEGS, method="tasks/get") == 2 and run.value(LEGS, method="tasks/result") == 1
    assert run.value(LOGICAL, tool="get_weather") == 1


def test_a_failed_task_is_its_tools_error() -> None:
    run = proxy_replay("tasks_failed_spec.spec")
    _, error = _inlined("tasks_failed_spec.spec")
    code = str(error["code"])
    assert run.value("mcp_token_call_errors_total") == run.value(
        "mcp_token_call_errors_total", method="tools/call", tool="get_weather", error_type=code) == 1
    assert run.value(RESPONSES) == run.value(RESPONSES, tool="get_weather") == 1
    assert run.value(TOKENS, method="tasks/get", direction="output") == 0


def test_a_result_notified_then_polled_is_one_output() -> None:
    run = proxy_replay("tasks_notification_spec.spec")
    _, result = _inlined("tasks_notification_spec.spec")
    output = measure_result("tools/call", result, tool_name="get_weather", policy=policy()).total_tokens
    assert run.value(RESPONSES) == run.value(RESPONSES, tool="get_weather") == 1
    assert run.value(TOKENS, method="tools/call", tool="get_weather", direction="output") == output
    assert run.value(TOKENS, method="tasks/get", direction="output") == 0  # the poll after the notification
    assert run.value(LOGICAL, tool="get_weather") == 1


def test_a_task_notification_is_task_bookkeeping_not_input() -> None:
    run = proxy_replay("tasks_notification_spec.spec")
    assert run.value(TOKENS, method="notifications/tasks", direction="input") == 0
    assert run.value(TOKENS, method="notifications/tasks", direction="task") > 0


def test_the_completed_polls_task_state_is_task_bookkeeping() -> None:
    run = proxy_replay("tasks_spec.spec")
    p = policy()
    get = [m for m in messages("tasks_spec.spec") if m.get("method") == "tasks/get"]
    states = [answers("tasks_spec.spec", m["id"])["result"] for m in get]
    envelope = {k: v for k, v in states[-1].items() if k != "result"}
    expected = (sum(measure_request("", m["params"], p).total_tokens for m in get)
                + sum(measure_result("tasks/get", s, policy=p).total_tokens for s in states[:-1])
                + measure_result("tasks/get", envelope, policy=p).total_tokens)
    assert run.value(TOKENS, method="tasks/get", direction="task") == expected


# ---------------------------------------------------------------------------------------------- the docs' example


def docs_example() -> dict[str, int]:
    """The token figures of docs/instrumentation.md's example exchange, by direction."""
    text = (ROOT / "docs" / "instrumentation.md").read_text(encoding="utf-8")
    section = text.split("## Logical calls and legs", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| .+? \| \d \| `(\w+)`[^|]*\| ([\d,]+) \|", section, flags=re.M)
    return {direction: int(tokens.replace(",", "")) for direction, tokens in rows}


def test_the_docs_example_is_what_the_default_estimator_measures() -> None:
    run = proxy_replay("elicit_once.http", keyed("default"))
    measured = {d: int(run.value(TOKENS, tool="delete_report", direction=d))
                for d in ("input", "input_required", "input_response", "output")}
    assert docs_example() == measured
    assert run.value(RESPONSES, tool="delete_report") == 1
