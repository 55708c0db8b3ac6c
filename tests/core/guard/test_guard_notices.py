"""What the guards' notices tell a model is true: the limit inputs a tool declares (the static profile's rule),
what the call passed when the tool's definition was never seen, the session's tool calls (not its messages), a
note that starts a paragraph of its own, and the session's tokens with the result added (as the budget holds
them). In the pure engine, then through the recorder."""

from __future__ import annotations

import re
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind

from mcp_token_otel.core.bounds import limit_inputs
from mcp_token_otel.core.budget import SessionBudget
from mcp_token_otel.core.guard import ALLOW, GuardEngine, GuardSettings
from mcp_token_otel.core.measure import Policy, measure_result
from mcp_token_otel.recorder import TokenRecorder
from tests.conftest import chars4
from tests.helpers.calls import exchange
from tests.helpers.support import make_config

C4 = Policy(estimator=chars4, estimator_name="chars/4")
# The filesystem server's read_text_file: a path, and head/tail (first or last N lines).
READ_TEXT_FILE = {"name": "read_text_file", "inputSchema": {"type": "object", "required": ["path"], "properties": {
    "path": {"type": "string"}, "head": {"type": "number"}, "tail": {"type": "number"}}}}


def text_result(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}]}


def lines(n: int) -> str:
    return "".join(f"line {i:04d} of a file\n" for i in range(n))  # 5 tokens a line (chars/4)


def capped(**settings: Any) -> GuardEngine:
    return GuardEngine(GuardSettings(mode="enforce", **settings), C4)


def notice_of(outcome: Any) -> str:
    text = outcome.result["content"][-1]["text"]
    assert isinstance(text, str)
    return text


def test_head_and_tail_are_limit_inputs_as_the_profile_says() -> None:
    assert [i.name for i in limit_inputs(READ_TEXT_FILE)] == ["head", "tail"]
    e = capped(max_response_tokens=50)
    e.learn_tools({"tools": [READ_TEXT_FILE]})
    notice = notice_of(e.on_result("tools/call", text_result(lines(100)), tool="read_text_file",
                                   arguments={"path": "/data/big.log"}))
    assert "declares no pagination" not in notice
    assert notice.endswith(" Call read_text_file with a smaller head or tail to get a response that fits.]")


def test_an_unlisted_tool_is_described_by_its_arguments_only() -> None:
    e = capped(max_response_tokens=50)  # no tools/list seen: the tool's inputs are unknown
    bare = notice_of(e.on_result("tools/call", text_result(lines(100)), tool="read_text_file",
                                 arguments={"path": "/data/big.log"}))
    assert bare.endswith(" No limit argument was passed to read_text_file: ask for a narrower request to see "
                         "the rest.]")
    passed = notice_of(e.on_result("tools/call", text_result(lines(100)), tool="read_text_file",
                                   arguments={"path": "/data/big.log", "tail": 500}))
    assert passed.endswith(" Call read_text_file with a smaller tail to get a response that fits.]")


def test_appended_notes_start_a_paragraph_of_their_own() -> None:
    e = capped(max_response_tokens=50, session_warning_note=True)
    budget = SessionBudget(200_000)
    budget.record(160_000)
    # A text cut at a word (no newline at its end), then the notice and the note: joined as a client that
    # concatenates text blocks would, neither runs on from the line before it.
    words = " ".join(f"word{i}" for i in range(400))
    outcome = e.on_result("tools/call", text_result(words), tool="t", budget=budget)
    *kept, notice, note = (b["text"] for b in outcome.result["content"])
    assert not kept[-1].endswith("\n")
    joined = "".join([*kept, notice, note])
    assert f"{kept[-1]}\n\n[mcp-token-otel: response truncated" in joined
    assert f"{notice}\n\n[mcp-token-otel: this session has used " in joined


def test_refusal_counts_tool_calls_not_messages() -> None:
    e = capped(session_hard_limit=True)
    budget = SessionBudget(10_000)
    budget.record(50)  # initialize
    budget.record(60)  # its result
    for _ in range(2):  # two tool calls: each a request and a result in the budget
        assert e.on_request("tools/call", {"name": "t"}, session_id="s", budget=budget) is ALLOW
        budget.record(40)
        budget.record(4_500)
    assert budget.state == "exhausted" and budget.calls == 6
    refused = e.on_request("tools/call", {"name": "t"}, session_id="s", budget=budget)
    assert refused.result is not None
    assert refused.result["content"][0]["text"] == (
        "Token budget spent: this session has used 9,190 of its 10,000-token context window (92%) in 2 calls. "
        "The call to t was not made. Start a new session to continue.")
    assert refused.actions[0].numbers["calls"] == 2
    # Without a session to count by, no count is claimed.
    anonymous = capped(session_hard_limit=True).on_request("tools/call", {"name": "t"}, budget=budget)
    assert anonymous.result is not None and " calls" not in anonymous.result["content"][0]["text"]
    e.end_session("s")
    assert e.calls("s") == 0


def test_warning_note_states_the_budget_after_this_result() -> None:
    e = capped(session_warning_note=True)
    budget = SessionBudget(100_000)
    budget.record(75_000)  # 75%: warning
    assert e.on_request("tools/call", {"name": "t"}, session_id="s", budget=budget) is ALLOW
    outcome = e.on_result("tools/call", text_result(lines(800)), tool="t", budget=budget, session_id="s")
    budget.record(outcome.context_tokens or 0)  # what the recorder adds: the result as delivered
    note = notice_of(outcome)
    assert budget.tokens > 79_000
    assert note == (
        f"\n\n[mcp-token-otel: this session has used {budget.tokens:,} of its 100,000-token context window "
        f"({round(100 * budget.utilization)}%) in 1 call. Prefer narrow requests, and start a new session before it "
        "runs out.]")
    assert outcome.context_tokens == measure_result("tools/call", outcome.result, policy=C4).total_tokens
    assert outcome.actions[-1].numbers["session_tokens"] == budget.tokens


def test_a_note_written_upstream_is_not_written_again() -> None:
    budget = SessionBudget(1_000)
    budget.record(800)
    server, client = capped(session_warning_note=True), capped(session_warning_note=True)
    noted = server.on_result("tools/call", text_result("done"), tool="t", budget=budget).result
    again = client.on_result("tools/call", noted, tool="t", budget=budget)
    assert again.result is noted and again.actions[0].enforced is False


def test_notices_through_the_recorder() -> None:
    """A server side with the guards on: the tools/list result teaches the tool's inputs, a cut names them,
    the warning note states the session's budget as the recorder holds it, the refusal counts tool calls."""
    config = make_config(budget={"context_window": 800},
                         guard={"mode": "enforce", "max_response_tokens": 500, "session_warning_note": True,
                                "session_hard_limit": True})
    meters = MeterProvider()
    rec = TokenRecorder(config, TracerProvider(), meters)
    try:
        def call(method: str, params: Any, result: Any, tool: str | None = None) -> Any:
            span = rec.start_span(method, SpanKind.SERVER)
            delivered, _ = exchange(rec, "server", method, params, "s1", result=result, span=span, guard=True)
            rec.end_span(span)
            return delivered

        call("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}}, {"capabilities": {}})
        call("tools/list", {}, {"tools": [READ_TEXT_FILE]})
        params = {"name": "read_text_file", "arguments": {"path": "/data/big.log"}}
        call("tools/call", params, text_result(lines(1000)), "read_text_file")
        budget = rec.sessions["server"].get("s1")
        assert budget is not None and budget.state == "warning"
        second = call("tools/call", params, text_result(lines(1000)), "read_text_file")
        cut, note = second["content"][-2]["text"], second["content"][-1]["text"]
        assert cut.startswith("\n\n[mcp-token-otel: response truncated to the limit of 500 tokens.")
        assert cut.endswith(" Call read_text_file with a smaller head or tail to get a response that fits.]")
        # The note was written before the budget added this result, and states it with the result added.
        found = re.fullmatch(r"\n\n\[mcp-token-otel: this session has used ([\d,]+) of its 800-token context "
                             r"window \((\d+)%\)( in (\d+) calls?)?\. Prefer narrow requests, and start a new "
                             r"session before it runs out\.\]", note)
        assert found is not None, note
        assert int(found[1].replace(",", "")) == budget.tokens and int(found[2]) == round(100 * budget.utilization)
        assert found[4] is None or int(found[4]) == 2  # tool calls, never the session's exchanges (4 by now)
        # Redesign: a request and its answer go to the budget together, once per exchange: 4 records, not 8.
        assert budget.calls == 4 and budget.state == "exhausted"
        refused = call("tools/call", params, text_result("never"), "read_text_file")
        assert refused["isError"] is True
        text = refused["content"][0]["text"]
        assert re.fullmatch(r"Token budget spent: this session has used [\d,]+ of its 800-token context window "
                            r"\(\d+%\) in 2 calls\. The call to read_text_file was not made\. Start a new session "
                            r"to continue\.", text), text
    finally:
        rec.close()
        meters.shutdown()


def test_a_cut_counts_the_data_tokens_of_a_result_that_repeats_its_text() -> None:
    """The filesystem server's {"content": text} copy of a whole-file read is overhead: the cap's notice says how
    much of the data (the text, once) it shows, not of the doubled message."""
    config = make_config(guard={"mode": "enforce", "max_response_tokens": 500})
    rec = TokenRecorder(config, TracerProvider(), MeterProvider())
    text = "line of a large file\n" * 2000
    result = {"content": [{"type": "text", "text": text}], "structuredContent": {"content": text}}
    try:
        delivered, _ = exchange(rec, "server", "tools/call", {"name": "read_text_file", "arguments": {}}, "s1",
                                result=result, guard=True)
    finally:
        rec.close()
    data = measure_result("tools/call", {"content": [{"type": "text", "text": text}]}, policy=rec.policy).data_tokens
    notice = delivered["content"][-1]["text"]
    assert f"of {data:,}." in notice and "Showing tokens 1-" in notice
