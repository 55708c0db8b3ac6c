"""The logical-call correlation (core/logical_calls.py) against real captured exchanges and the specifications'
examples (tests/fixtures/logical_calls/), then its edges: windows, bounds, concurrency, privacy."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mcp_token_otel.core.logical_calls import (
    CALL,
    FINAL,
    INPUT_REQUIRED,
    MAX_SAME,
    PLAIN,
    RETRY,
    TASK,
    TASK_CREATED,
    TASK_RESULT,
    TASK_STATUS,
    LogicalCall,
    LogicalCalls,
    arguments_digest,
    call_target,
    digest,
    is_retry,
    result_type,
)
from tests.helpers.replay import load, names, replay

CAPTURED = names("*.http") + names("*.stdio")
BOTH = ("http", "stdio")


def one_call(run: Any, method: str = "tools/call") -> LogicalCall:
    calls = [c for c in run.calls() if c.method == method]
    assert len(calls) == 1, calls
    return calls[0]


def test_the_fixtures_are_there() -> None:
    # Every scenario captured over both transports, plus the raw header mismatch and the spec examples.
    scenarios = {n.rsplit(".", 1)[0] for n in CAPTURED}
    assert scenarios >= {"elicit_once", "elicit_three", "two_rounds", "sampling", "declined", "prompt", "resource",
                         "no_state", "state_only", "plain_repeats", "task"}
    for scenario in scenarios - {"header_mismatch", "task_v1"}:  # HTTP only, mcp 1.x stdio only
        assert f"{scenario}.stdio" in CAPTURED and f"{scenario}.http" in CAPTURED
    assert "task_v1.stdio" in CAPTURED
    assert {"mrtr_spec.spec", "tasks_spec.spec", "tasks_failed_spec.spec", "tasks_notification_spec.spec",
            "tasks_2025_11_25_spec.spec"} <= set(names("*.spec"))


@pytest.mark.parametrize("name", CAPTURED)
def test_every_captured_request_is_answered_once_and_every_call_ends(name: str) -> None:
    run = replay(load(name))
    for call in run.calls():
        assert call.ended, call
        assert not call.partial, call  # every retry found its first leg
        finals = [o for o in run.outcomes() if o.final and o.call is call]
        assert len(finals) == 1, (call, finals)


@pytest.mark.parametrize("transport", BOTH)
def test_one_elicitation_confirmed_call_is_one_logical_call(transport: str) -> None:
    clock = [100.0]
    run = replay(load(f"elicit_once.{transport}"), clock=clock)
    call = one_call(run)
    assert (call.target, call.legs, call.questions, call.key) == ("delete_report", 2, 1, "conversation=1")
    first, retry = run.legs("tools/call")
    assert (first.role, first.index, retry.role, retry.index) == (CALL, 0, RETRY, 1)
    assert first.call is retry.call is call
    asked, final = run.outcomes(INPUT_REQUIRED, FINAL)[0], run.outcomes(FINAL)[0]
    # The questions and the sealed state, apart from the call's output; the answers the retry carries.
    assert set(asked.question or {}) == {"inputRequests", "requestState"}
    assert asked.question["requestState"].startswith("v1.")  # type: ignore[index]
    assert set(retry.answers or {}) == {"inputResponses", "requestState"}
    assert retry.answers["requestState"] == asked.question["requestState"]  # type: ignore[index]
    # The final result is the report, once; the duration runs from the first leg's request (4 messages later).
    assert final.call is call and final.result["content"][0]["text"].startswith("Deleted.")
    assert final.duration == pytest.approx(3.0)
    assert [o.kind for o in run.outcomes() if o.call is call] == [INPUT_REQUIRED, FINAL]
    # The other requests of the session are plain.
    assert {leg.method for leg in run.legs() if leg.role == PLAIN} == {"server/discover", "tools/list"}


@pytest.mark.parametrize("transport", BOTH)
def test_three_calls_in_a_row_are_three_logical_calls_each_retry_with_its_own(transport: str) -> None:
    run = replay(load(f"elicit_three.{transport}"))
    calls = [c for c in run.calls() if c.method == "tools/call"]
    assert len(calls) == 3 and len({c.id for c in calls}) == 3
    assert all(c.legs == 2 and c.questions == 1 and not c.partial for c in calls)
    legs = run.legs("tools/call")
    assert [leg.role for leg in legs] == [CALL, RETRY] * 3
    assert [leg.call for leg in legs] == [calls[0], calls[0], calls[1], calls[1], calls[2], calls[2]]
    assert [o.call for o in run.outcomes(FINAL)] == calls  # one final answer each, nothing else is final


@pytest.mark.parametrize("transport", BOTH)
def test_two_rounds_are_one_call_of_three_legs(transport: str) -> None:
    run = replay(load(f"two_rounds.{transport}"))
    call = one_call(run)
    assert (call.target, call.legs, call.questions) == ("greet_twice", 3, 2)
    assert [leg.index for leg in run.legs("tools/call")] == [0, 1, 2]
    assert [o.kind for o in run.outcomes() if o.call is call] == [INPUT_REQUIRED, INPUT_REQUIRED, FINAL]


@pytest.mark.parametrize("transport", BOTH)
@pytest.mark.parametrize(("scenario", "method", "target", "asks"), [
    ("sampling", "tools/call", "summarize", "sampling/createMessage"),
    ("prompt", "prompts/get", "briefing", "elicitation/create"),
    ("resource", "resources/read", "notes://alpha", "elicitation/create"),
])
def test_every_multi_round_trip_method(transport: str, scenario: str, method: str, target: str, asks: str) -> None:
    run = replay(load(f"{scenario}.{transport}"))
    call = one_call(run, method)
    assert (call.target, call.legs, call.questions) == (target, 2, 1)
    asked = run.outcomes(INPUT_REQUIRED)[0]
    assert [q["method"] for q in asked.question["inputRequests"].values()] == [asks]  # type: ignore[index]
    assert run.outcomes(FINAL)[0].call is call


@pytest.mark.parametrize("transport", BOTH)
def test_a_declined_question_ends_the_call_with_its_tool_error(transport: str) -> None:
    run = replay(load(f"declined.{transport}"))
    call = one_call(run)
    final = [o for o in run.outcomes(FINAL) if o.call is call]
    assert len(final) == 1 and final[0].result["isError"] is True


@pytest.mark.parametrize("transport", BOTH)
def test_a_retry_without_state_joins_by_tool_arguments_and_key(transport: str) -> None:
    run = replay(load(f"no_state.{transport}"))
    call = one_call(run)
    asked = run.outcomes(INPUT_REQUIRED)[0]
    assert set(asked.question or {}) == {"inputRequests"}
    retry = run.legs("tools/call")[1]
    assert retry.role == RETRY and retry.call is call and set(retry.answers or {}) == {"inputResponses"}
    assert not call.partial and call.legs == 2


@pytest.mark.parametrize("transport", BOTH)
def test_a_state_only_round(transport: str) -> None:
    run = replay(load(f"state_only.{transport}"))
    call = one_call(run)
    assert set(run.outcomes(INPUT_REQUIRED)[0].question or {}) == {"requestState"}
    assert set(run.legs("tools/call")[1].answers or {}) == {"requestState"}
    assert call.legs == 2 and run.outcomes(FINAL)[0].call is call


@pytest.mark.parametrize("transport", BOTH)
def test_plain_repeats_are_separate_one_leg_calls(transport: str) -> None:
    run = replay(load(f"plain_repeats.{transport}"))
    calls = [c for c in run.calls() if c.method == "tools/call"]
    assert len(calls) == 3 and all(c.legs == 1 and c.questions == 0 for c in calls)
    assert [leg.role for leg in run.legs("tools/call")] == [CALL] * 3


def test_a_request_whose_headers_disagree_is_still_a_call_that_ends_in_its_error() -> None:
    fixture = load("header_mismatch.http")
    request = fixture["messages"][0]
    assert request["http"]["headers"]["mcp-name"] != request["message"]["params"]["name"]
    run = replay(fixture)
    final = run.outcomes(FINAL)[0]
    assert final.error["code"] == -32020 and final.call is one_call(run)


# ---------------------------------------------------------------------------------------------- tasks


@pytest.mark.parametrize("transport", BOTH)
def test_a_task_result_is_attributed_to_the_call_that_created_it(transport: str) -> None:
    run = replay(load(f"task.{transport}"))
    call = one_call(run)
    assert call.target == "slow_report" and call.task
    kinds = [o.kind for o in run.outcomes() if o.call is call]
    assert kinds == [TASK_CREATED, TASK_STATUS, TASK_STATUS, TASK_RESULT]
    polls = run.legs("tasks/get")
    assert [leg.role for leg in polls] == [TASK] * 3 and all(leg.call is call for leg in polls)
    done = run.outcomes(TASK_RESULT)[0]
    # The tool's own result, unwrapped; the task fields around it are bookkeeping.
    assert done.result["content"][0]["text"] == "y" * 4000 and done.status == "completed"
    assert done.envelope is not None and "result" not in done.envelope and done.envelope["status"] == "completed"
    assert done.duration is not None


def test_the_extensions_example_flow() -> None:
    run = replay(load("tasks_spec.spec"))
    call = one_call(run)
    assert call.target == "hello_world"
    kinds = [o.kind for o in run.outcomes() if o.call is call]
    assert kinds == [TASK_CREATED, TASK_STATUS, TASK_STATUS, TASK_STATUS, TASK_STATUS, TASK_STATUS, TASK_RESULT]
    # A task asking for input: the questions of its status, the answers of tasks/update.
    asking = [o for o in run.outcomes(TASK_STATUS) if o.status == "input_required"]
    assert len(asking) == 2 and all(set(o.question or {}) == {"inputRequests"} for o in asking)
    update = run.legs("tasks/update")[0]
    assert update.call is call and set(update.answers or {}) == {"inputResponses"}
    assert run.outcomes(TASK_RESULT)[0].result["content"][0]["text"] == "Hello, Luca!"
    assert len([o for o in run.outcomes() if o.final]) == 1


def test_a_failed_task_delivers_its_error() -> None:
    run = replay(load("tasks_failed_spec.spec"))
    done = run.outcomes(TASK_RESULT)
    assert len(done) == 1 and done[0].error == {"code": -32603, "message": "API rate limit exceeded"}
    assert done[0].result is None and done[0].call is one_call(run) and done[0].status == "failed"


def test_a_result_notified_then_polled_is_the_calls_result_once() -> None:
    run = replay(load("tasks_notification_spec.spec"))
    call = one_call(run)
    kinds = [o.kind for o in run.outcomes() if o.call is call]
    assert kinds == [TASK_CREATED, TASK_RESULT, TASK_STATUS]
    notified = run.steps[2]
    assert notified.message["method"] == "notifications/tasks" and notified.outcome is not None
    assert notified.outcome.kind == TASK_RESULT and notified.outcome.result["content"][0]["type"] == "text"


def test_tasks_of_2025_11_25_deliver_through_tasks_result() -> None:
    run = replay(load("tasks_2025_11_25_spec.spec"))
    call = one_call(run)
    kinds = [o.kind for o in run.outcomes() if o.call is call]
    # tasks/get reports "completed" without the result: still a status; tasks/result delivers.
    assert kinds == [TASK_CREATED, TASK_STATUS, TASK_STATUS, TASK_RESULT]
    done = run.outcomes(TASK_RESULT)[0]
    assert done.result["content"][0]["text"].startswith("Current weather") and done.envelope is None


def test_a_real_2025_11_25_task_from_mcp_1x() -> None:
    run = replay(load("task_v1.stdio"))
    call = one_call(run)
    assert call.target == "report" and call.task
    kinds = [o.kind for o in run.outcomes() if o.call is call]
    assert kinds[0] == TASK_CREATED and kinds[-1] == TASK_RESULT and set(kinds[1:-1]) == {TASK_STATUS}
    # The status notification reports "completed" without the result: tasks/result delivers it.
    notified = [s.outcome for s in run.steps if s.message.get("method") == "notifications/tasks/status"]
    assert notified and all(o is not None and o.kind == TASK_STATUS and o.call is call for o in notified)
    done = run.outcomes(TASK_RESULT)[0]
    assert done.result["content"][0]["text"] == "z" * 4000 and done.envelope is None
    assert [leg.role for leg in run.legs() if leg.method.startswith("tasks/")] == [TASK] * len(
        [leg for leg in run.legs() if leg.method.startswith("tasks/")])


def test_task_messages_for_an_unknown_task_belong_to_no_call() -> None:
    tracker = LogicalCalls()
    leg = tracker.request("tasks/get", {"taskId": "nobody"})
    outcome = tracker.result(leg, {"resultType": "complete", "taskId": "nobody", "status": "completed",
                                   "result": {"content": []}})
    assert (leg.role, leg.call, outcome.kind, outcome.call) == (TASK, None, TASK_STATUS, None)
    assert tracker.notification("notifications/tasks", {"taskId": "nobody", "status": "completed"}).call is None
    assert tracker.notification("notifications/progress", {"progress": 1}) is None
    listed = tracker.request("tasks/list", {})
    assert listed.role == TASK and tracker.result(listed, {"tasks": []}).kind == TASK_STATUS


def test_a_second_delivery_of_a_task_result_is_only_a_status() -> None:
    fixture = load("tasks_2025_11_25_spec.spec")
    tracker = LogicalCalls()
    run = replay(fixture, tracker)
    task_id = fixture["messages"][-2]["message"]["params"]["taskId"]
    again = tracker.request("tasks/result", {"taskId": task_id})
    assert again.call is one_call(run) and again.call.ended
    assert tracker.result(again, {"content": []}).kind == TASK_STATUS
    assert tracker.error(again, {"code": -32602}).kind == TASK_STATUS


def test_a_task_error_from_tasks_result_ends_its_call() -> None:
    tracker = LogicalCalls()
    leg = tracker.request("tools/call", {"name": "t", "arguments": {}})
    assert tracker.result(leg, {"task": {"taskId": "a", "status": "working", "ttl": None}}).kind == TASK_CREATED
    poll = tracker.request("tasks/get", {"taskId": "a"})
    assert tracker.error(poll, {"code": -32603}).kind == TASK_STATUS  # a poll's own error: the task goes on
    fetch = tracker.request("tasks/result", {"taskId": "a"})
    done = tracker.error(fetch, {"code": -32603, "message": "boom"})
    assert done.kind == TASK_RESULT and done.final and done.error["code"] == -32603 and leg.call is done.call


def test_a_cancelled_task_ends_its_call_without_a_result() -> None:
    tracker = LogicalCalls()
    leg = tracker.request("tools/call", {"name": "t", "arguments": {}})
    tracker.result(leg, {"resultType": "task", "taskId": "a", "status": "working", "ttlMs": 1000})
    cancel = tracker.request("tasks/cancel", {"taskId": "a"})
    assert tracker.result(cancel, {"resultType": "complete"}).kind == TASK_STATUS
    poll = tracker.request("tasks/get", {"taskId": "a"})
    done = tracker.result(poll, {"resultType": "complete", "taskId": "a", "status": "cancelled"})
    assert done.kind == TASK_RESULT and done.status == "cancelled" and done.result is None and done.error is None


# ---------------------------------------------------------------------------------------------- the spec's MRTR


def test_the_specifications_multi_round_trip_example() -> None:
    run = replay(load("mrtr_spec.spec"))
    call = one_call(run)
    assert (call.target, call.legs, call.questions) == ("get_weather", 2, 1)
    asked = run.outcomes(INPUT_REQUIRED)[0]
    assert set(asked.question["inputRequests"]) == {"github_login", "capital_of_france"}  # type: ignore[index]
    assert run.legs("tools/call")[1].answers["requestState"] == "AEAD-protected blob"  # type: ignore[index]


# ---------------------------------------------------------------------------------------------- edges


def ask(tracker: LogicalCalls, tool: str = "t", args: Any = None, key: str | None = "k", state: str | None = "s1",
        now: float = 0.0) -> Any:
    """A call's first leg answered input_required (with ``state``, or none)."""
    leg = tracker.request("tools/call", {"name": tool, "arguments": args or {"a": 1}}, key, now=now)
    result: dict[str, Any] = {"resultType": "input_required", "inputRequests": {"q": {"method": "elicitation/create"}}}
    if state is not None:
        result["requestState"] = state
    tracker.result(leg, result, now=now)
    return leg


def retry(tracker: LogicalCalls, tool: str = "t", args: Any = None, key: str | None = "k", state: str | None = "s1",
          now: float = 1.0) -> Any:
    params: dict[str, Any] = {"name": tool, "arguments": args or {"a": 1},
                              "inputResponses": {"q": {"action": "accept"}}}
    if state is not None:
        params["requestState"] = state
    return tracker.request("tools/call", params, key, now=now)


def test_interleaved_calls_with_states_each_find_their_own() -> None:
    tracker = LogicalCalls()
    a, b = ask(tracker, state="sa"), ask(tracker, state="sb")
    assert a.call is not b.call
    assert retry(tracker, state="sb").call is b.call
    assert retry(tracker, state="sa").call is a.call


def test_interleaved_identical_calls_without_state_are_joined_oldest_first() -> None:
    tracker = LogicalCalls()
    a, b = ask(tracker, state=None), ask(tracker, state=None)
    assert retry(tracker, state=None).call is a.call
    assert retry(tracker, state=None).call is b.call
    third = retry(tracker, state=None)  # nothing left to join
    assert third.call.partial and third.role == RETRY and third.index == 1


def test_without_state_the_budget_key_tool_and_arguments_must_match() -> None:
    tracker = LogicalCalls()
    a = ask(tracker, state=None, args={"x": 1, "y": [1, 2]})
    assert retry(tracker, state=None, key="other").call.partial
    assert retry(tracker, state=None, tool="u", args={"x": 1, "y": [1, 2]}).call.partial
    assert retry(tracker, state=None, args={"x": 2, "y": [1, 2]}).call.partial
    assert retry(tracker, state=None, args={"y": [1, 2], "x": 1}).call is a.call  # key order does not matter


def test_a_state_retried_on_another_target_does_not_join() -> None:
    tracker = LogicalCalls()
    a = ask(tracker, state="s")
    other = tracker.request("prompts/get", {"name": "t", "requestState": "s"}, now=0.5)
    assert other.call is not a.call and other.call.partial
    assert retry(tracker, state="s").call is a.call  # the real retry still finds its call


def test_a_retry_after_the_window_starts_a_partial_call_and_the_old_one_is_abandoned() -> None:
    abandoned: list[LogicalCall] = []
    tracker = LogicalCalls(window=10.0, on_abandoned=abandoned.append)
    a = ask(tracker, now=0.0)
    late = retry(tracker, now=11.0)
    assert late.call is not a.call and late.call.partial
    assert abandoned == [a.call] and a.call.ended
    assert tracker.held == 0


def test_expire_sweeps_everything_past_its_time() -> None:
    abandoned: list[LogicalCall] = []
    tracker = LogicalCalls(window=10.0, task_window=100.0, on_abandoned=abandoned.append)
    a = ask(tracker, state="s", now=0.0)
    b = ask(tracker, state=None, now=0.0)
    task = tracker.request("tools/call", {"name": "slow"}, now=0.0)
    tracker.result(task, {"resultType": "task", "taskId": "t1", "status": "working", "ttlMs": 50_000}, now=0.0)
    assert tracker.held == 3
    assert tracker.expire(now=20.0) == 2 and {c.id for c in abandoned} == {a.call.id, b.call.id}
    assert tracker.expire(now=49.0) == 0  # the task is followed for its ttlMs
    assert tracker.expire(now=51.0) == 1 and abandoned[-1] is task.call and tracker.held == 0


def test_a_task_without_ttl_is_followed_for_the_task_window() -> None:
    tracker = LogicalCalls(task_window=30.0)
    leg = tracker.request("tools/call", {"name": "slow"}, now=0.0)
    tracker.result(leg, {"resultType": "task", "taskId": "t1", "status": "working", "ttlMs": None}, now=0.0)
    assert tracker.request("tasks/get", {"taskId": "t1"}, now=29.0).call is leg.call
    assert tracker.request("tasks/get", {"taskId": "t1"}, now=31.0).call is None


def test_state_is_bounded_and_the_least_recent_goes_first() -> None:
    abandoned: list[LogicalCall] = []
    tracker = LogicalCalls(max_entries=8, on_abandoned=abandoned.append)
    legs = [ask(tracker, state=f"s{i}") for i in range(20)]
    assert tracker.held == 8
    assert [c.id for c in abandoned] == [leg.call.id for leg in legs[:12]]
    assert retry(tracker, state="s0").call.partial
    assert retry(tracker, state="s19").call is legs[19].call
    many = LogicalCalls(max_entries=64)
    for i in range(5000):
        ask(many, state=None, args={"i": i})
        leg = many.request("tools/call", {"name": "slow"})
        many.result(leg, {"resultType": "task", "taskId": f"task{i}", "status": "working"})
    assert many.held <= 128


def test_identical_calls_waiting_without_state_are_bounded_too() -> None:
    abandoned: list[LogicalCall] = []
    tracker = LogicalCalls(on_abandoned=abandoned.append)
    legs = [ask(tracker, state=None) for _ in range(MAX_SAME + 2)]
    assert [c.id for c in abandoned] == [legs[0].call.id, legs[1].call.id]
    assert retry(tracker, state=None).call is legs[2].call


def test_no_state_or_task_id_is_kept_only_their_digests() -> None:
    tracker = LogicalCalls()
    secret_state, secret_task = "v1.SEALED-user-answers-inside", "bearer-task-id-0123456789"
    ask(tracker, state=secret_state)
    ask(tracker, state=None, args={"token": "arg-secret"})
    leg = tracker.request("tools/call", {"name": "slow"})
    tracker.result(leg, {"resultType": "task", "taskId": secret_task, "status": "working"})
    tables = [tracker._by_state.entries, tracker._by_arguments.entries, tracker._tasks.entries]
    for table in tables:
        for key in table:
            assert isinstance(key, bytes) and len(key) == 16
    dump = repr(tables)
    for secret in (secret_state, secret_task, "arg-secret"):
        assert secret not in dump
    assert digest(secret_state) in tracker._by_state.entries


def test_errors_end_a_call_on_any_leg() -> None:
    tracker = LogicalCalls()
    first = tracker.request("tools/call", {"name": "t"}, now=0.0)
    outcome = tracker.error(first, {"code": -32602, "message": "bad"}, now=2.0)
    assert (outcome.kind, outcome.duration, first.call.ended) == (FINAL, 2.0, True)
    a = ask(tracker, state="s", now=0.0)
    rejected = retry(tracker, state="s", now=1.0)
    outcome = tracker.error(rejected, {"code": -32602, "message": "Invalid or expired requestState"}, now=3.0)
    assert outcome.kind == FINAL and outcome.call is a.call and outcome.duration == 3.0
    plain = tracker.request("tools/list", {})
    assert tracker.error(plain, {"code": -32601}).kind == PLAIN
    # An answer that comes after its leg was given up on still ends the call with it.
    late = tracker.request("tools/call", {"name": "t"}, now=0.0)
    assert tracker.abandon(late) is late.call
    assert tracker.error(late, {"code": -32000}, now=1.0).kind == FINAL


def test_a_raising_abandon_callback_still_hands_over_every_call() -> None:
    seen: list[int] = []

    def callback(call: LogicalCall) -> None:
        seen.append(call.id)
        raise RuntimeError("sink down")

    tracker = LogicalCalls(window=1.0, on_abandoned=callback)
    a, b = ask(tracker, state="a", now=0.0), ask(tracker, state="b", now=0.0)
    with pytest.raises(RuntimeError, match="sink down"):
        tracker.expire(now=5.0)
    assert seen == [a.call.id, b.call.id] and a.call.ended and b.call.ended and tracker.held == 0


def test_abandon_ends_an_unanswered_call_once() -> None:
    tracker = LogicalCalls()
    a = ask(tracker, state="s")
    pending = retry(tracker, state="s")
    assert tracker.abandon(pending) is a.call and a.call.ended
    assert tracker.abandon(pending) is None
    answered = tracker.request("tools/call", {"name": "t"})
    tracker.result(answered, {"content": []})
    assert tracker.abandon(answered) is None
    assert tracker.abandon(tracker.request("tools/list", {})) is None


def test_the_first_legs_span_context_is_offered_to_the_later_legs() -> None:
    tracker = LogicalCalls()
    first = ask(tracker, state="s")
    assert first.link is None
    first.call.link = ("trace", "span")
    later = retry(tracker, state="s")
    assert later.link == ("trace", "span")


def test_plain_requests_and_answers_pass_through() -> None:
    tracker = LogicalCalls()
    for method in ("tools/list", "server/discover", "sampling/createMessage", "completion/complete"):
        leg = tracker.request(method, {"x": 1}, "k")
        assert (leg.role, leg.call) == (PLAIN, None)
        assert tracker.result(leg, {"resultType": "complete"}).kind == PLAIN
    # A tools/call answered without resultType (before 2026-07-28) is final at once.
    leg = tracker.request("tools/call", {"name": "t"})
    assert tracker.result(leg, {"content": [], "isError": False}).kind == FINAL and tracker.held == 0
    # Odd params: no crash, no join.
    for params in (None, [], "x", {"name": 3, "arguments": "no"}):
        leg = tracker.request("tools/call", params)
        assert leg.role == CALL and tracker.result(leg, None).kind == FINAL


def test_arguments_that_json_cannot_hold_are_never_joined_without_state() -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    assert arguments_digest("k", "tools/call", "t", loop) is None
    tracker = LogicalCalls()
    ask(tracker, state=None, args=loop)
    assert tracker.held == 0
    assert retry(tracker, state=None, args=loop).call.partial


def test_helpers() -> None:
    assert arguments_digest({"a": 1, "b": 2}) == arguments_digest({"b": 2, "a": 1})
    assert arguments_digest({"a": 1}) != arguments_digest({"a": 2})
    assert len(digest("\ud800 lone surrogate")) == 16
    assert result_type({"resultType": "task"}) == "task" and result_type({}) is None and result_type([]) is None
    assert is_retry({"requestState": "s"}) and is_retry({"inputResponses": {}}) and not is_retry({"name": "t"})
    assert not is_retry({"requestState": None}) and not is_retry(None)
    assert call_target("resources/read", {"uri": "file:///a"}) == "file:///a"
    assert call_target("tools/call", {"name": "t"}) == "t" and call_target("tools/call", {"name": 1}) is None


@pytest.mark.parametrize(("kwargs", "word"), [({"window": 0}, "window"), ({"task_window": -1}, "window"),
                                              ({"max_entries": 0}, "max_entries")])
def test_bad_bounds_are_refused(kwargs: dict[str, Any], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        LogicalCalls(**kwargs)


def test_the_clock_is_used_when_no_time_is_given() -> None:
    now = [5.0]
    tracker = LogicalCalls(clock=lambda: now[0])
    leg = tracker.request("tools/call", {"name": "t"})
    now[0] = 7.5
    assert tracker.result(leg, {"content": []}).duration == 2.5


def test_fixtures_are_valid_json_rpc() -> None:
    # A guard on the fixtures themselves: every answer pairs with one earlier request of the other direction.
    for name in CAPTURED + names("*.spec"):
        seen: set[tuple[str, Any]] = set()
        for entry in load(name)["messages"]:
            message = entry["message"]
            assert message.get("jsonrpc") == "2.0", name
            if "method" in message and "id" in message:
                seen.add((entry["direction"], message["id"]))
            elif "method" not in message:
                other = "server_to_client" if entry["direction"] == "client_to_server" else "client_to_server"
                assert (other, message["id"]) in seen, (name, json.dumps(message)[:200])
