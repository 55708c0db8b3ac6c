"""Lock and check rules, one edit at a time, on real tool definitions listed by server-everything.

Each test takes the definitions the live server sent, edits a copy in one way, and asserts the exact set of
differences ``diff_locks`` reports (class, subject, change). Definition-token changes within the allowed
percentage are SAFE noise of most edits; they are left out of the exact sets except where they are the rule.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mcp_token_otel.core.contract import LockError, build_lock, lock_text, profile_server, validate_lock
from mcp_token_otel.core.lock_diff import CheckLimits, diff_locks, failing
from mcp_token_otel.core.schemas import input_fields, output_fields, schema_type
from tests.helpers.support import node_env, npm_peer

Lists = dict[str, Any]


@pytest.fixture(scope="module")
def everything() -> Lists:
    from mcp_token_otel.adapters.discovery import Target, discover

    found = discover(Target(command=(npm_peer("mcp-server-everything"), "stdio"), env=node_env()), timeout=60)
    return {
        "tools": list(found.tools),
        "resources": list(found.resources),
        "resource_templates": list(found.resource_templates),
        "prompts": list(found.prompts),
        "server_name": found.server_name,
        "server_version": found.server_version,
    }


def lock_of(lists: Lists) -> dict[str, Any]:
    profile = profile_server(
        lists["tools"], lists["resources"], lists["resource_templates"], lists["prompts"],
        server_name=lists["server_name"], server_version=lists["server_version"],
    )
    # Through the text and back, as check reads a lockfile.
    return validate_lock(json.loads(lock_text(build_lock(profile))))


def tool(lists: Lists, name: str) -> dict[str, Any]:
    return next(t for t in lists["tools"] if t["name"] == name)


def changes(old: Lists, new: Lists, limits: CheckLimits | None = None, *, tokens: bool = False) -> set[tuple[str, ...]]:
    found = diff_locks(lock_of(old), lock_of(new), limits or CheckLimits(max_token_increase_pct=1000))
    return {
        (d.cls, d.subject, d.change)
        for d in found
        if tokens or d.change not in ("definition tokens changed",)
    }


def edited(lists: Lists, edit: Callable[[Lists], None]) -> Lists:
    out = copy.deepcopy(lists)
    edit(out)
    return out


def with_readings(max_items: int | None, fields: int = 2) -> Callable[[Lists], None]:
    """get-structured-content gains an array of readings (a collection), bounded by maxItems or not."""

    def edit(lists: Lists) -> None:
        schema = tool(lists, "get-structured-content")["outputSchema"]
        items = {"type": "object", "properties": {f"reading_{i}": {"type": "number"} for i in range(fields)}}
        readings: dict[str, Any] = {"type": "array", "items": items}
        if max_items is not None:
            readings["maxItems"] = max_items
        schema["properties"]["readings"] = readings

    return edit


def test_the_same_definitions_have_no_differences(everything: Lists) -> None:
    assert diff_locks(lock_of(everything), lock_of(copy.deepcopy(everything))) == []


# --------------------------------------------------------------------------- BREAKING


def test_tool_removed_is_breaking(everything: Lists) -> None:
    new = edited(everything, lambda x: x["tools"].remove(tool(x, "echo")))
    assert changes(everything, new) == {("BREAKING", "echo", "tool removed")}


def test_required_input_added_is_breaking(everything: Lists) -> None:
    def edit(x: Lists) -> None:
        schema = tool(x, "get-sum")["inputSchema"]
        schema["properties"]["c"] = {"type": "number", "description": "Third number"}
        schema["required"].append("c")

    assert changes(everything, edited(everything, edit)) == {("BREAKING", "get-sum", "required input added")}


def test_input_made_required_is_breaking(everything: Lists) -> None:
    base = edited(everything, lambda x: tool(x, "get-sum")["inputSchema"]["required"].remove("b"))
    assert changes(base, everything) == {("BREAKING", "get-sum", "input made required")}
    assert changes(everything, base) == {("SAFE", "get-sum", "input made optional")}


def test_input_removed_is_breaking(everything: Lists) -> None:
    def edit(x: Lists) -> None:
        schema = tool(x, "get-sum")["inputSchema"]
        del schema["properties"]["b"]
        schema["required"].remove("b")

    assert changes(everything, edited(everything, edit)) == {("BREAKING", "get-sum", "input removed")}


def test_input_retyped_is_breaking(everything: Lists) -> None:
    new = edited(everything, lambda x: tool(x, "get-sum")["inputSchema"]["properties"]["a"].update(type="string"))
    assert changes(everything, new) == {("BREAKING", "get-sum", "input retyped")}


def test_output_field_removed_is_breaking(everything: Lists) -> None:
    def edit(x: Lists) -> None:
        schema = tool(x, "get-structured-content")["outputSchema"]
        del schema["properties"]["humidity"]
        schema["required"].remove("humidity")

    assert changes(everything, edited(everything, edit)) == {
        ("BREAKING", "get-structured-content", "output field removed")}


def test_output_field_retyped_is_breaking(everything: Lists) -> None:
    new = edited(everything, lambda x: tool(x, "get-structured-content")["outputSchema"]["properties"][
        "temperature"].update(type="string"))
    assert changes(everything, new) == {("BREAKING", "get-structured-content", "output field retyped")}


def test_resource_and_prompt_removed_are_breaking(everything: Lists) -> None:
    def edit(x: Lists) -> None:
        x["resources"].pop(0)
        x["prompts"] = [p for p in x["prompts"] if p["name"] != "args-prompt"]

    uri = everything["resources"][0]["uri"]
    assert changes(everything, edited(everything, edit)) == {
        ("BREAKING", uri, "resource removed"), ("BREAKING", "args-prompt", "prompt removed")}


# --------------------------------------------------------------------------- RISKY


def test_risk_tier_up_is_risky(everything: Lists) -> None:
    # Same limit, wider items: the worst case crosses from medium into high.
    old = edited(everything, with_readings(100, fields=2))
    new = edited(everything, with_readings(100, fields=6))
    found = changes(old, new)
    assert ("RISKY", "get-structured-content", "risk tier up") in found
    assert found - {("RISKY", "get-structured-content", "risk tier up")} == {
        ("SAFE", "get-structured-content", "output field added")}
    assert changes(new, old) == {("SAFE", "get-structured-content", "risk tier down"),
                                 ("BREAKING", "get-structured-content", "output field removed")}


def test_became_unbounded_is_risky(everything: Lists) -> None:
    found = changes(everything, edited(everything, with_readings(None)))
    assert found == {
        ("RISKY", "get-structured-content", "became unbounded"),
        ("RISKY", "get-structured-content", "risk tier up"),
        ("SAFE", "get-structured-content", "output field added"),
    }
    back = changes(edited(everything, with_readings(None)), everything)
    assert ("SAFE", "get-structured-content", "became bounded") in back


def test_uninformative_output_schema_is_as_risky_as_none(everything: Lists) -> None:
    # Issue 9: replacing a real outputSchema by {"type": "object"} must not look safe.
    new = edited(everything, lambda x: tool(x, "get-structured-content").update(outputSchema={"type": "object"}))
    found = changes(everything, new)
    assert {("RISKY", "get-structured-content", "became unbounded"),
            ("RISKY", "get-structured-content", "risk tier up")} <= found


def test_limit_raised_and_removed_are_risky_lowered_is_safe(everything: Lists) -> None:
    small, large = edited(everything, with_readings(10)), edited(everything, with_readings(20))
    assert changes(small, large) == {("RISKY", "get-structured-content", "limit raised")}
    assert changes(large, small) == {("SAFE", "get-structured-content", "limit lowered")}
    removed = changes(small, edited(everything, with_readings(None)))
    assert {("RISKY", "get-structured-content", "limit removed"),
            ("RISKY", "get-structured-content", "became unbounded")} <= removed


def test_definition_tokens_up_beyond_the_percentage_is_risky(everything: Lists) -> None:
    new = edited(everything, lambda x: tool(x, "get-sum").update(
        description="Returns the sum of two numbers. " * 6))
    limits = CheckLimits(max_token_increase_pct=10)
    found = changes(everything, new, limits, tokens=True)
    assert ("RISKY", "get-sum", "definition tokens up") in found
    assert ("SAFE", "get-sum", "description changed") in found
    # The same edit under a looser limit is only SAFE.
    loose = changes(everything, new, CheckLimits(max_token_increase_pct=500), tokens=True)
    assert all(cls == "SAFE" for cls, _, _ in loose)


def test_server_total_over_the_budget_is_risky(everything: Lists) -> None:
    total = lock_of(everything)["totals"]["definition_tokens"]
    over = diff_locks(lock_of(everything), lock_of(everything), CheckLimits(token_budget=total - 1))
    assert [(d.cls, d.change) for d in over] == [("RISKY", "over the token budget")]
    assert diff_locks(lock_of(everything), lock_of(everything), CheckLimits(token_budget=total)) == []


def test_new_tool_over_the_limits_is_risky(everything: Lists) -> None:
    def edit(x: Lists) -> None:
        x["tools"].append({**copy.deepcopy(tool(x, "echo")), "name": "echo-all"})

    assert changes(everything, edited(everything, edit)) >= {("RISKY", "echo-all", "tool added over the limits")}


# --------------------------------------------------------------------------- SAFE


def test_new_tool_under_the_limits_is_safe(everything: Lists) -> None:
    def edit(x: Lists) -> None:
        x["tools"].append({**copy.deepcopy(tool(x, "get-structured-content")), "name": "get-forecast"})

    assert changes(everything, edited(everything, edit)) == {("SAFE", "get-forecast", "tool added")}


def test_new_optional_input_is_safe(everything: Lists) -> None:
    new = edited(everything, lambda x: tool(x, "get-sum")["inputSchema"]["properties"].update(
        precision={"type": "integer", "description": "Decimal places"}))
    assert changes(everything, new) == {("SAFE", "get-sum", "optional input added")}


def test_description_changed_is_safe(everything: Lists) -> None:
    new = edited(everything, lambda x: tool(x, "get-sum").update(description="Adds two numbers"))
    assert changes(everything, new) == {("SAFE", "get-sum", "description changed")}


def test_server_version_change_is_safe(everything: Lists) -> None:
    new = edited(everything, lambda x: x.update(server_version="9.9.9"))
    found = diff_locks(lock_of(everything), lock_of(new))
    assert [(d.cls, d.kind, d.change, d.detail) for d in found] == [
        ("SAFE", "server", "version changed", f"{everything['server_version']} -> 9.9.9")]


def test_other_definition_change_is_safe_and_named(everything: Lists) -> None:
    new = edited(everything, lambda x: tool(x, "get-sum").update(title="Sum"))
    assert changes(everything, new) == {("SAFE", "get-sum", "definition changed")}


# --------------------------------------------------------------------------- order, fail-on, lockfile


def test_breaking_first_and_fail_on_floors(everything: Lists) -> None:
    def edit(x: Lists) -> None:
        x["tools"].remove(tool(x, "echo"))
        tool(x, "get-sum").update(description="Adds two numbers")
        with_readings(None)(x)

    found = diff_locks(lock_of(everything), lock_of(edited(everything, edit)), CheckLimits(1000))
    classes = [d.cls for d in found]
    assert classes == sorted(classes, key=("BREAKING", "RISKY", "SAFE").index)
    assert {d.cls for d in failing(found, "breaking")} == {"BREAKING"}
    assert {d.cls for d in failing(found, "risky")} == {"BREAKING", "RISKY"}


def test_lockfile_is_sorted_versioned_and_complete(everything: Lists) -> None:
    text = lock_text(build_lock(profile_server(everything["tools"], everything["resources"],
                                               everything["resource_templates"], everything["prompts"],
                                               server_name="everything")))
    data = json.loads(text)
    assert text == json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    assert data["lock_version"] == 1 and data["estimator"] == "default"
    entry = data["tools"]["get-structured-content"]
    assert entry["hash"].startswith("sha256:") and len(entry["hash"]) == 71
    assert entry["risk"] == "low" and entry["bounded"] and entry["limit_source"] == "single object"
    assert entry["fields"] == ["conditions", "humidity", "temperature"] and entry["estimator"] == "default"
    assert data["totals"]["tools"] == len(everything["tools"])
    assert data["totals"]["definition_tokens"] > data["totals"]["tool_definition_tokens"] > 0
    assert set(data["resources"]) == {r["uri"] for r in everything["resources"]}


def test_validate_lock_names_what_is_wrong() -> None:
    with pytest.raises(LockError, match="lock_version 2 is not supported"):
        validate_lock({"lock_version": 2})
    with pytest.raises(LockError, match="'tools' is missing"):
        validate_lock({"lock_version": 1})
    with pytest.raises(LockError, match="expected a JSON object"):
        validate_lock([1])


def test_schema_fields_and_types() -> None:
    assert schema_type({"type": ["string", "null"]}) == "null|string"
    assert schema_type({"anyOf": [{"type": "integer"}, {"type": "null"}]}) == "integer|null"
    assert schema_type({"type": "array", "items": {"type": "string"}}) == "array<string>"
    assert schema_type({}) == "any" and schema_type("x") == "any"
    definition = {
        "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}},
                        "required": ["q"]},
        "outputSchema": {"type": "object", "$defs": {"Hit": {"type": "object", "properties": {
            "title": {"type": "string"}}}}, "properties": {
            "hits": {"type": "array", "items": {"$ref": "#/$defs/Hit"}}, "owner": {"$ref": "#/$defs/Hit"}}},
    }
    assert input_fields(definition) == {"q": {"type": "string", "required": True},
                                        "n": {"type": "integer", "required": False}}
    assert output_fields(definition) == {"hits": "array<ref:#/$defs/Hit>", "hits[].title": "string",
                                         "owner": "object", "owner.title": "string"}


def _corruptions(lock: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every lock with one value (at any depth) replaced by a value of the wrong shape."""
    if isinstance(lock, dict):
        for key, value in lock.items():
            for bad in (None, [[]], "x", True, {"k": [1]}):
                out = copy.deepcopy(lock)
                out[key] = bad
                yield (*path, key), out
            for sub_path, sub in _corruptions(value, (*path, key)):
                out = copy.deepcopy(lock)
                out[key] = sub
                yield sub_path, out


def test_a_hand_edited_lock_is_a_lock_error_or_diffs_cleanly() -> None:
    # Regression: "server": null (and a non-dict input field, a list for max_tokens, ...) passed validation
    # and crashed diff_locks with a traceback instead of one error line.
    tools = [{"name": "users", "description": "d", "inputSchema": {"type": "object", "properties": {
        "limit": {"type": "integer", "maximum": 5}, "q": {"type": "string"}}, "required": ["q"]},
        "outputSchema": {"type": "object", "properties": {"id": {"type": "string"}}}}]
    good = json.loads(lock_text(build_lock(profile_server(tools, [{"uri": "r", "name": "r"}], server_name="s"))))
    fresh = validate_lock(copy.deepcopy(good))
    tried = 0
    for _path, bad in _corruptions(good):
        tried += 1
        try:
            old = validate_lock(bad)
        except LockError:
            continue
        diff_locks(old, fresh)  # must not raise
        diff_locks(fresh, old)
    assert tried > 100


def test_a_name_listed_twice_cannot_be_locked() -> None:
    # Regression: the lock is keyed by name, so the second 'a' silently replaced the first (totals said 2 tools).
    tools = [{"name": "a", "description": "first"}, {"name": "a", "description": "second"}]
    with pytest.raises(LockError, match="tool 'a' is listed twice"):
        build_lock(profile_server(tools))
    with pytest.raises(LockError, match="resource 'r' is listed twice"):
        build_lock(profile_server([], [{"uri": "r", "name": "x"}, {"uri": "r", "name": "y"}]))
