"""Governance advice ranked by impact, on the pure core: an action's short report is advisory, enough observed
calls rate a tool whose schema declares no bound, and the same advice for several tools is one line."""

from __future__ import annotations

from typing import Any

from mcp_token_otel.core.contract import profile_server
from mcp_token_otel.core.observed import ENOUGH_CALLS, Observed, ToolView, merge, view_advice
from mcp_token_otel.core.profiles import advice_priority, aggregate_profiles, profile_tool_definition

CONTENT = {"type": "object", "properties": {"content": {"type": "string"}}, "required": ["content"]}
PATH = {"type": "string"}


def tool(name: str, *, read_only: bool | None, output: Any = CONTENT, inputs: dict[str, Any] | None = None,
         required: tuple[str, ...] = ("path",)) -> dict[str, Any]:
    """A tool shaped like the npm filesystem server's: a path in, {"content": string} out."""
    out: dict[str, Any] = {"name": name, "description": f"{name} a path.",
                           "inputSchema": {"type": "object", "properties": inputs or {"path": PATH},
                                           "required": list(required)}}
    if output is not None:
        out["outputSchema"] = output
    if read_only is not None:
        out["annotations"] = {"readOnlyHint": read_only}
    return out


#: The npm filesystem server in small: readers, actions, and a reader with head/tail that bound nothing.
SERVER = [
    tool("read_text_file", read_only=True, inputs={"path": PATH, "head": {"type": "number"},
                                                    "tail": {"type": "number"}}),
    tool("list_directory", read_only=True),
    tool("create_directory", read_only=False),
    tool("move_file", read_only=False, inputs={"source": PATH, "destination": PATH}, required=("source",)),
    tool("get_file_info", read_only=True),
]


def observed(p95: int, risk: str, calls: int) -> Observed:
    return Observed(calls=calls, p50=p95, p95=p95, max=p95, max_exact=False, mean=p95, risk=risk)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- priorities


def test_an_actions_short_report_is_advisory_and_a_reader_stays_critical() -> None:
    reader, action = (profile_tool_definition(tool("t", read_only=flag)) for flag in (True, False))
    # the contract tier is what the schema allows, for both: nothing bounds "content"
    assert reader.risk == action.risk == "critical" and reader.reason == action.reason
    assert advice_priority(reader) == "critical"
    assert action.reports_action and advice_priority(action) == "advisory"
    # observed, an action is as large as its results were
    assert advice_priority(action, "critical", "high") == "high"
    assert advice_priority(profile_tool_definition(tool("t", read_only=None))) == "critical"  # no hint: a reader


def test_an_action_that_returns_rows_or_nothing_declared_is_not_a_report() -> None:
    rows = {"type": "object", "properties": {"rows": {"type": "array", "items": {"type": "object"}}}}
    returns_rows = profile_tool_definition(tool("execute", read_only=False, output=rows))
    assert not returns_rows.reports_action and advice_priority(returns_rows) == "critical"
    undeclared = profile_tool_definition(tool("commit", read_only=False, output=None))
    assert undeclared.bounded is None and not undeclared.reports_action and advice_priority(undeclared) == "high"
    bounded = {"type": "object", "properties": {"status": {"type": "string", "enum": ["ok", "failed"]}}}
    assert advice_priority(profile_tool_definition(tool("touch", read_only=False, output=bounded))) == "advisory"


# --------------------------------------------------------------------------- ranking and grouping


def test_the_server_advice_is_one_line_per_change_ranked_by_priority() -> None:
    profile = profile_server(SERVER, server_name="fs")
    advice = profile.aggregate.advice
    lines = [(a.priority, a.tools) for a in advice]
    assert lines == [
        ("critical", ("read_text_file", "list_directory", "get_file_info")),  # the same missing maxLength
        ("critical", ("read_text_file",)),  # its head and tail
        ("advisory", ("create_directory", "move_file")),
    ]
    assert advice[0].text.startswith("Tools 'read_text_file', 'list_directory' and 'get_file_info': string field "
                                     '"content" has no maxLength: declare a maxLength')
    assert advice[1].text.startswith("Tool 'read_text_file': give the \"head\" and \"tail\" inputs a maximum")
    assert advice[2].text.startswith("Tools 'create_directory' and 'move_file': string field")
    assert profile.aggregate.recommendations == tuple(a.text for a in advice)
    # each tool keeps its own recommendations, one per cause
    assert len(profile.tools[0].recommendations) == 2 and len(profile.tools[2].recommendations) == 1


def test_advice_that_names_a_figure_is_not_merged() -> None:
    wide = {"type": "object", "properties": {f"f{i}": {"type": "integer"} for i in range(16)}}
    a, b = (profile_tool_definition(tool(n, read_only=True, output=wide)) for n in ("a", "b"))
    texts = aggregate_profiles([a, b]).recommendations
    assert texts == (*a.recommendations, *b.recommendations) and len(texts) == 2  # "16 fields per item" each


# --------------------------------------------------------------------------- observations


def test_enough_calls_rate_a_tool_whose_schema_declares_no_bound() -> None:
    profile = profile_server(SERVER, server_name="fs")
    info = profile.tools[4]
    assert info.bounded is False and info.risk == "critical"
    assert ToolView("get_file_info", info, observed(60, "low", ENOUGH_CALLS)).effective_risk == "low"
    assert ToolView("get_file_info", info, observed(60, "low", ENOUGH_CALLS - 1)).effective_risk == "critical"
    big = observed(30_000, "critical", ENOUGH_CALLS * 5)
    assert ToolView("get_file_info", info, big).effective_risk == "critical"
    unknown = profile_tool_definition(tool("stat", read_only=True, output=None))
    assert ToolView("stat", unknown, observed(60, "low", ENOUGH_CALLS)).effective_risk == "low"
    # a declared bound is held to: the worse of the two, however many calls
    bounded = profile_tool_definition(tool("small", read_only=True, output={
        "type": "object", "properties": {"content": {"type": "string", "maxLength": 20_000}}}))
    assert bounded.risk == "high"
    assert ToolView("small", bounded, observed(60, "low", 500)).effective_risk == "high"
    assert ToolView("small", bounded, observed(9_000, "critical", 500)).effective_risk == "critical"


def test_observed_advice_puts_the_tools_that_matter_first() -> None:
    profile = profile_server(SERVER, server_name="fs")
    views = merge(profile, {
        "get_file_info": observed(60, "low", 40),          # many small results: advisory now
        "list_directory": observed(90, "low", 3),           # too few calls to say: still critical
        "read_text_file": observed(150_000, "critical", 4),  # the largest observed: first
        "create_directory": observed(20, "low", 2),
    })
    advice = view_advice(views)
    assert [(a.priority, a.tools) for a in advice] == [
        ("critical", ("read_text_file", "list_directory")),
        ("critical", ("read_text_file",)),
        ("advisory", ("get_file_info", "create_directory", "move_file")),  # the same change, now advisory for all
    ]
    edit = merge(profile, {"move_file": observed(9_000, "critical", 2)})  # an action observed large counts, first
    first = view_advice(edit)[0]
    assert (first.priority, first.tools) == ("critical", ("move_file", "read_text_file", "list_directory",
                                                          "get_file_info"))
