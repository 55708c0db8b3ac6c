"""What bounds a result, and what check makes of a bound that goes: the pure rules one at a time, then the
commands as a user runs them against tests/fixtures/filesystem_server.py (shaped like the npm filesystem
server) over stdio."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mcp_token_otel.core.bounds import limit_inputs, limit_kind
from mcp_token_otel.core.client_limits import client_limit_warnings
from mcp_token_otel.core.contract import LockError, build_lock, lock_text, profile_server, validate_lock
from mcp_token_otel.core.lock_diff import diff_locks, server_mismatch
from mcp_token_otel.core.profiles import profile_tool_definition
from tests.helpers.support import ROOT

FIXTURE = ROOT / "tests" / "fixtures" / "filesystem_server.py"
PREVIOUS_LOCK = ROOT / "tests" / "fixtures" / "filesystem.previous.lock.json"


def tool(output: dict[str, Any] | None, inputs: dict[str, Any] | None = None, required: tuple[str, ...] = (),
         name: str = "t") -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "inputSchema": {"type": "object", "properties": inputs or {},
                                                          "required": list(required)}}
    if output is not None:
        out["outputSchema"] = {"type": "object", "properties": output}
    return out


CONTENT = {"content": {"type": "string"}}
LINES = {"head": {"type": "number"}, "tail": {"type": "number"}}


# --------------------------------------------------------------------------- the pure rules


def test_a_single_content_string_is_unbounded_with_its_reason() -> None:
    p = profile_tool_definition(tool(CONTENT, {"path": {"type": "string"}, **LINES}, ("path",), "read_file"))
    assert (p.bounded, p.max_tokens, p.risk, p.limit_source) == (False, None, "critical", "none")
    assert p.reason == ('unbounded: string field "content" has no maxLength; "head" and "tail" have no maximum '
                        "and no default")
    assert len(p.recommendations) == 2 and len(set(p.recommendations)) == 2  # one per cause
    plain = profile_tool_definition(tool(CONTENT))
    assert plain.reason == 'unbounded: string field "content" has no maxLength; no limit parameter'


@pytest.mark.parametrize("name", ["text", "body", "data", "html", "markdown", "stdout", "fileContent", "raw_text"])
def test_content_like_names_are_unbounded_anywhere(name: str) -> None:
    beside = {name: {"type": "string"}, "id": {"type": "string"}}
    assert profile_tool_definition(tool(beside)).bounded is False
    nested = {"page": {"type": "object", "properties": beside}, "n": {"type": "integer"}}
    p = profile_tool_definition(tool(nested))
    assert p.bounded is False and f'"page.{name}"' in p.reason


@pytest.mark.parametrize("bound", [{"maxLength": 2000}, {"enum": ["a", "b"]}, {"format": "date-time"}])
def test_a_bounded_string_is_bounded(bound: dict[str, Any]) -> None:
    p = profile_tool_definition(tool({"content": {"type": "string", **bound}}))
    assert p.bounded is True and p.max_tokens is not None and p.risk == "low"
    if "maxLength" in bound:
        assert p.reason == 'bounded: "content" maxLength 2,000' and p.max_tokens > 2000 / 4


def test_short_values_are_not_content() -> None:
    short = {k: {"type": "string"} for k in ("id", "name", "created_at", "status", "email", "path")}
    p = profile_tool_definition(tool(short))
    assert (p.bounded, p.limit_source, p.reason) == (True, "single object", "bounded: one object of short values")
    assert profile_tool_definition(tool({"updated_at": {"type": "string"}})).bounded is True  # a lone date is short
    assert profile_tool_definition(tool({"summary": {"type": "string"}})).bounded is False  # a lone string is content


def test_an_array_without_a_bound_is_unbounded_at_any_depth() -> None:
    nested = {"repo": {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}}}}}
    p = profile_tool_definition(tool(nested))
    assert p.bounded is False and p.reason == 'unbounded: array "repo.tags" has no maxItems'
    nested["repo"]["properties"]["tags"]["maxItems"] = 10
    assert profile_tool_definition(tool(nested)).bounded is True


def test_a_limit_input_bounds_only_with_a_maximum_the_caller_cannot_leave_out() -> None:
    rows = {"rows": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"}}}}}

    def profile(limit: dict[str, Any], required: tuple[str, ...] = ()) -> Any:
        return profile_tool_definition(tool(rows, {"limit": {"type": "integer", **limit}}, required))

    assert profile({"maximum": 50, "default": 10}).bounded is True
    assert profile({"maximum": 50}, ("limit",)).bounded is True
    bounded = profile({"maximum": 50, "default": 10})
    assert (bounded.limit, bounded.limit_source) == (50, "input limit")
    assert bounded.reason == 'bounded: "rows" limited by input "limit" (maximum 50)'
    optional = profile({"maximum": 50})
    assert optional.bounded is False and optional.reason.endswith('"limit" is optional without a default')
    uncapped = profile({"default": 10})
    assert uncapped.bounded is False and uncapped.reason.endswith('"limit" has no maximum')
    assert profile({"exclusiveMaximum": 51, "default": 10}).limit == 50


def test_head_and_tail_bound_a_text_when_they_must_be_passed() -> None:
    head = {"head": {"type": "integer", "maximum": 1000, "default": 200}}
    p = profile_tool_definition(tool(CONTENT, head))
    assert p.bounded is True and p.limit_source == "input head" and p.max_tokens is not None
    assert p.reason == 'bounded: "content" limited by input "head" (maximum 1,000)'


def test_a_character_cap_input_bounds_the_whole_result() -> None:
    fetch = tool(None, {"url": {"type": "string"}, "max_length": {"type": "integer", "default": 5000,
                                                                   "maximum": 35_000}}, ("url",))
    p = profile_tool_definition(fetch)  # even without an outputSchema
    assert p.bounded is True and p.max_tokens == 10_000 + 50 and p.limit_source == "input max_length"
    assert limit_kind("max_length") == "chars" and limit_kind("perPage") == "items" and limit_kind("q") is None
    assert [i.name for i in limit_inputs(fetch)] == ["max_length"]


def test_unknown_is_shown_as_unknown_and_an_egress_cap_bounds_anything() -> None:
    p = profile_tool_definition(tool(None))
    assert (p.bounded, p.max_tokens, p.risk, p.reason) == (None, None, "high", "unknown: no outputSchema")
    capped = profile_tool_definition(tool(CONTENT), egress_max_bytes=35_000)
    assert (capped.bounded, capped.max_tokens, capped.reason) == (True, 10_000, "bounded: egress cap of 35,000 bytes")


def test_refs_and_unions_are_followed() -> None:
    schema = {"name": "t", "outputSchema": {"type": "object", "$defs": {"Doc": {"type": "object", "properties": {
        "body": {"type": "string"}}}}, "properties": {"doc": {"anyOf": [{"$ref": "#/$defs/Doc"}, {"type": "null"}]},
                                                       "id": {"type": "string"}}}}
    p = profile_tool_definition(schema)
    assert p.bounded is False and '"doc.body"' in p.reason


def test_client_limit_warnings() -> None:
    tools = [{"name": "a" * 65, "description": "d"}, {"name": "b" * 129}, {"name": "c", "description": "x" * 4097}]
    found = [(w.subject[:1], w.rule, w.limit) for w in client_limit_warnings(tools)]
    assert found == [("a", "tool name length", 64), ("b", "tool name length", 128), ("c", "description length", 4096)]
    many = [{"name": f"t{i}"} for i in range(41)]
    assert [(w.rule, w.limit) for w in client_limit_warnings(many, "s")] == [("tool count", 40)]
    assert [w.limit for w in client_limit_warnings([*many, *many, *many, *many], "s")] == [128]
    assert client_limit_warnings(many[:40]) == []


# --------------------------------------------------------------------------- check rules


def lock_of(tools: list[dict[str, Any]], name: str = "s", version: str = "1.0.0") -> dict[str, Any]:
    return validate_lock(json.loads(lock_text(build_lock(profile_server(tools, server_name=name,
                                                                        server_version=version)))))


SEARCH = tool({"hits": {"type": "array", "items": {"type": "object", "properties": {
    "id": {"type": "string"}, "snippet": {"type": "string", "maxLength": 200}}}}},
    {"q": {"type": "string"}, "limit": {"type": "integer", "maximum": 50, "default": 10}}, ("q",), "search")


def changes(old: dict[str, Any], new: dict[str, Any]) -> set[tuple[str, str]]:
    return {(d.cls, d.change) for d in diff_locks(lock_of([old]), lock_of([new]))
            if "definition tokens" not in d.change}


def edited(edit: Any) -> dict[str, Any]:
    out = copy.deepcopy(SEARCH)
    edit(out)
    return out


def test_a_limit_maximum_removed_or_raised_is_risky() -> None:
    removed = edited(lambda t: t["inputSchema"]["properties"]["limit"].pop("maximum"))
    assert changes(SEARCH, removed) >= {("RISKY", "limit maximum removed"), ("RISKY", "became unbounded")}
    raised = edited(lambda t: t["inputSchema"]["properties"]["limit"].update(maximum=500))
    assert ("RISKY", "limit maximum raised") in changes(SEARCH, raised)
    assert ("SAFE", "limit maximum lowered") in changes(raised, SEARCH)


def test_a_removed_limit_input_is_risky_as_well_as_breaking() -> None:
    removed = edited(lambda t: t["inputSchema"]["properties"].pop("limit"))
    found = diff_locks(lock_of([SEARCH]), lock_of([removed]))
    assert [(d.cls, d.change, d.detail) for d in found if d.change in ("input removed", "limit input removed")] == [
        ("BREAKING", "input removed", "'limit' (integer)"),
        ("RISKY", "limit input removed", "'limit': the result is no longer bounded by it")]
    assert ("RISKY", "became unbounded") in changes(SEARCH, removed)  # what it bounded says so too
    # a limit input that bounded nothing (no maximum) removed: an API break, no context risk
    unbounding = edited(lambda t: t["inputSchema"]["properties"]["limit"].pop("maximum"))
    assert {c for c in changes(unbounding, removed) if c[0] != "SAFE"} == {("BREAKING", "input removed")}
    # any other input removed: BREAKING only
    assert {c for c in changes(SEARCH, edited(lambda t: t["inputSchema"]["properties"].pop("q"))) if c[0] != "SAFE"} \
        == {("BREAKING", "input removed")}


def test_a_limit_made_optional_without_a_default_is_risky() -> None:
    required = edited(lambda t: (t["inputSchema"]["properties"]["limit"].pop("default"),
                                 t["inputSchema"]["required"].append("limit")))
    no_default = edited(lambda t: t["inputSchema"]["properties"]["limit"].pop("default"))
    assert ("RISKY", "limit optional without a default") in changes(required, no_default)
    assert ("RISKY", "limit optional without a default") in changes(SEARCH, no_default)
    assert changes(required, SEARCH) == {("SAFE", "input made optional")}  # a default still bounds it


def test_a_string_output_that_lost_its_maxlength_is_risky() -> None:
    lost = edited(lambda t: t["outputSchema"]["properties"]["hits"]["items"]["properties"]["snippet"].pop(
        "maxLength"))
    found = diff_locks(lock_of([SEARCH]), lock_of([lost]))
    assert [(d.cls, d.change, d.detail) for d in found if d.change == "output lost its maxLength"] == [
        ("RISKY", "output lost its maxLength", "'hits[].snippet': maxLength 200 removed")]


def test_a_server_version_going_backwards_is_risky() -> None:
    def version_change(old: str, new: str) -> list[tuple[str, str]]:
        return [(d.cls, d.change) for d in diff_locks(lock_of([SEARCH], version=old), lock_of([SEARCH], version=new))]

    assert version_change("2.0.0", "1.9.9") == [("RISKY", "version went backwards")]
    assert version_change("v1.10.0", "1.9.0") == [("RISKY", "version went backwards")]
    assert version_change("1.9.0", "1.10.0") == [("SAFE", "version changed")]
    assert version_change("2026.8.31", "2026.8.31-beta") == [("SAFE", "version changed")]


def test_a_lock_of_another_server_is_named_as_such() -> None:
    assert server_mismatch(lock_of([SEARCH], name="github"), "filesystem") == (
        "lockfile is for server 'github', this is server 'filesystem'")
    assert server_mismatch(lock_of([SEARCH], name="github"), "github") is None
    assert server_mismatch(lock_of([SEARCH], name=""), "filesystem") is None


def test_a_lock_written_by_the_previous_version_loads_and_compares() -> None:
    old = validate_lock(json.loads(PREVIOUS_LOCK.read_text()))
    assert "reason" not in old["tools"]["read_file"] and old["tools"]["read_file"]["bounded"] is True
    bad = copy.deepcopy(old)
    bad["tools"]["read_file"]["bounded"] = "yes"
    with pytest.raises(LockError, match="bounded: expected true, false or null"):
        validate_lock(bad)


# --------------------------------------------------------------------------- the commands, over stdio


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mcp_token_otel.cli", *args], capture_output=True, text=True,
                          timeout=120, check=False, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})


def fixture(*extra: str) -> list[str]:
    return ["--stdio", "--", sys.executable, str(FIXTURE), *extra]


@pytest.mark.slow  # a live server over stdio, in a subprocess
def test_profile_of_the_filesystem_shaped_server() -> None:
    out = cli("profile", "--json", *fixture())
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    tools = {t["name"]: t for t in data["tools"]}
    read, search, dirs = tools["read_file"], tools["search"], tools["list_allowed_directories"]
    assert (read["bounded"], read["max_tokens"], read["risk"]) == (False, None, "critical")
    assert read["reason"] == ('unbounded: string field "content" has no maxLength; "head" and "tail" have no '
                              "maximum and no default")
    assert (search["bounded"], search["limit"], search["limit_source"]) == (True, 50, "input limit")
    assert search["reason"].startswith('bounded: "matches" limited by input "limit" (maximum 50)')
    assert (dirs["bounded"], dirs["max_tokens"], dirs["risk"], dirs["reason"]) == (
        None, None, "high", "unknown: no outputSchema")
    assert data["unbounded_tool_names"] == ["read_file"] and data["unknown_tool_names"] == ["list_allowed_directories"]
    assert data["overall_risk"] == "critical" and data["warnings"] == []
    table = cli("profile", *fixture()).stdout.splitlines()
    row = next(line for line in table if line.split()[:1] == ["read_file"])
    assert row.split()[5:8] == ["critical", "no", "unbounded"] and 'string field "content"' in row
    assert next(line for line in table if line.split()[:1] == ["list_allowed_directories"]).split()[5:8] == [
        "high", "unknown", "unknown"]


@pytest.mark.slow  # a live server over stdio, in a subprocess
def test_check_flags_the_removed_maximum(tmp_path: Path) -> None:
    lock = tmp_path / "fs.lock.json"
    assert cli("lock", "-o", str(lock), *fixture()).returncode == 0
    assert cli("check", "--lock", str(lock), *fixture()).returncode == 0
    nxt = cli("check", "--lock", str(lock), "--fail-on", "risky", *fixture("next"))
    assert nxt.returncode == 1, nxt.stderr
    rows = [line.split() for line in nxt.stdout.splitlines()[1:-1]]
    assert ["RISKY", "tool", "search", "limit", "maximum", "removed", "'limit':", "maximum", "50", "removed"] in rows
    assert ["RISKY", "tool", "search", "became", "unbounded"] in [r[:5] for r in rows]
    assert nxt.stdout.splitlines()[-1].endswith("FAIL (--fail-on risky)")
    # RISKY, not BREAKING: the default --fail-on breaking passes.
    assert cli("check", "--lock", str(lock), *fixture("next")).returncode == 0
    report = json.loads(cli("check", "--lock", str(lock), "--json", *fixture("next")).stdout)
    assert {"class": "RISKY", "kind": "tool", "subject": "search", "change": "limit maximum removed",
            "detail": "'limit': maximum 50 removed"} in report["differences"]


@pytest.mark.slow  # a live server over stdio, in a subprocess
def test_check_against_a_lock_of_another_server_is_one_error_line(tmp_path: Path) -> None:
    data = json.loads(PREVIOUS_LOCK.read_text())
    data["server"]["name"] = "github"
    lock = tmp_path / "other.lock.json"
    lock.write_text(json.dumps(data))
    out = cli("check", "--lock", str(lock), *fixture())
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [
        f"error: lockfile is for server 'github', this is server 'filesystem-fixture' (lockfile {lock})"]


@pytest.mark.slow  # a live server over stdio, in a subprocess
def test_check_with_the_previous_versions_lock_and_full_names(tmp_path: Path) -> None:
    # The previous version rated read_file "low, bounded": this one says what changed in the rating.
    out = cli("check", "--lock", str(PREVIOUS_LOCK), "--fail-on", "risky", *fixture())
    assert out.returncode == 1, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()[1:-1]]
    assert ["RISKY", "tool", "read_file", "became", "unbounded"] in [r[:5] for r in rows]
    # Names are printed whole, however long.
    listing = {"serverInfo": {"name": "filesystem-fixture"}, "tools": [
        {"name": "list_allowed_directories_with_a_name_longer_than_the_old_column", "inputSchema": {}}]}
    path = tmp_path / "listing.json"
    path.write_text(json.dumps(listing))
    shown = cli("check", "--lock", str(PREVIOUS_LOCK), str(path)).stdout
    assert " list_allowed_directories_with_a_name_longer_than_the_old_column " in shown


def test_lint_in_profile_and_check(tmp_path: Path) -> None:
    listing = {"serverInfo": {"name": "wide"}, "tools": [{"name": f"tool_{i}"} for i in range(41)]
               + [{"name": "x" * 70, "description": "y" * 5000}]}
    path = tmp_path / "wide.json"
    path.write_text(json.dumps(listing))
    table = cli("profile", str(path)).stdout
    assert "warning: wide: 42 tools, over 40" in table
    assert f"warning: {'x' * 70}: tool name is 70 characters, over 64" in table
    assert "description is 5,000 characters, over 4,096" in table
    rules = [w["rule"] for w in json.loads(cli("profile", "--json", str(path)).stdout)["warnings"]]
    assert rules == ["tool name length", "description length", "tool count"]
    lock = tmp_path / "wide.lock.json"
    assert cli("lock", "-o", str(lock), str(path)).returncode == 0
    check = cli("check", "--lock", str(lock), str(path))
    assert check.returncode == 0 and "warning: wide: 42 tools, over 40" in check.stdout
    assert check.stdout.splitlines()[-1] == "no differences: the server matches the lock"


@pytest.mark.slow  # a live server over stdio, in a subprocess
def test_rule_compact_and_its_hidden_alias(tmp_path: Path) -> None:
    helps = cli("profile", "--help").stdout + cli("lock", "--help").stdout
    assert "compact" in helps and "seed" not in helps
    path = tmp_path / "users.json"
    path.write_text(json.dumps({"tools": [tool({"users": {"type": "array", "maxItems": 50, "items": {
        "type": "object", "properties": {k: {"type": "string"} for k in ("id", "name", "email", "address")}}}},
        name="users")]}))
    compact = json.loads(cli("profile", "--json", "--rule", "compact", str(path)).stdout)
    seed = json.loads(cli("profile", "--json", "--rule", "seed", str(path)).stdout)
    assert compact == seed and compact["rule"] == "compact" and compact["tools"][0]["max_tokens"] == 1450
    bad = cli("profile", "--rule", "nope", str(path))
    assert bad.returncode == 2 and "choose from default, compact" in bad.stderr
    lock = json.loads(cli("lock", "-o", "-", "--rule", "compact", str(path)).stdout)
    lock["rule"] = "seed"  # a lockfile that still says seed is read as compact
    lock_path = tmp_path / "seed.lock.json"
    lock_path.write_text(json.dumps(lock))
    assert cli("check", "--lock", str(lock_path), str(path)).returncode == 0
