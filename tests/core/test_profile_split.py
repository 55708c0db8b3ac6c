"""A tool definition's tokens split into description, schema and the rest (names and framing): one rule in the
core, shown per tool by ``profile`` (table, Markdown, JSON) and reported by the recorder for every tools/list."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from mcp_token_otel.catalog import DEFINITION_PARTS
from mcp_token_otel.core.contract import build_lock, profile_server
from mcp_token_otel.core.estimation import estimate_tokens
from mcp_token_otel.core.labels import NameLimiter
from mcp_token_otel.core.profiles import (
    DefinitionParts,
    definition_parts,
    profile_tool_definition,
    sum_parts,
    tool_definition_tokens,
)
from mcp_token_otel.recorder.context_costs import tool_list
from tests.helpers.support import ROOT

EXAMPLE = ROOT / "examples" / "tools_list_response.json"
FIXTURE = ROOT / "tests" / "fixtures" / "filesystem_server.py"
PARTS = ("description", "schema", "names")


def example_tools() -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = json.loads(EXAMPLE.read_text())["result"]["tools"]
    return tools


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mcp_token_otel.cli", *args], capture_output=True, text=True,
                          timeout=120, check=False, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})


def fixture_server() -> list[str]:
    return ["--stdio", "--", sys.executable, str(FIXTURE)]


def test_the_part_names_are_the_gauges_part_labels() -> None:
    assert tuple(DefinitionParts.__dataclass_fields__) == PARTS
    assert set(PARTS) == set(DEFINITION_PARTS)


@pytest.mark.parametrize("tool", example_tools(), ids=lambda t: t["name"])
def test_the_split_adds_up_to_the_definition_for_every_example_tool(tool: dict[str, Any]) -> None:
    parts = definition_parts(tool)
    assert parts.total == tool_definition_tokens(tool)
    assert parts.description == estimate_tokens(json.dumps(tool["description"])) > 0
    assert parts.schema > parts.description and parts.names > 0
    assert profile_tool_definition(tool).definition_parts == parts
    capped = profile_tool_definition(tool, egress_max_bytes=4096)  # bounded by the cap: the split is kept
    assert capped.limit_source == "egress" and capped.definition_parts == parts


def test_parts_estimated_apart_are_capped_so_they_never_exceed_the_whole() -> None:
    def flat(text: str) -> int:  # any text costs 40 tokens: the description alone equals the whole
        return 40

    tool = {"name": "t", "description": "d" * 50, "inputSchema": {"type": "object"}}
    parts = definition_parts(tool, flat)
    assert parts == DefinitionParts(description=40, schema=0, names=0)
    assert parts.total == tool_definition_tokens(tool, flat) == 40
    bare = definition_parts({"name": "only_a_name"})
    assert (bare.description, bare.schema) == (0, 0) and bare.names == bare.total > 0


def test_the_recorder_reports_the_same_split_as_the_profile() -> None:
    tools = example_tools()
    listed = tool_list({"tools": tools}, estimate_tokens, NameLimiter(100, "_other"))
    assert listed is not None
    expected = sum_parts(definition_parts(t) for t in tools)
    assert listed.parts == {part: getattr(expected, part) for part in DEFINITION_PARTS}
    assert listed.total == expected.total == sum(listed.parts.values())


def test_profile_json_table_and_markdown_show_the_split_of_every_tool() -> None:
    tools = {t["name"]: t for t in example_tools()}
    out = cli("profile", "--json", str(EXAMPLE))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    for tool in data["tools"]:
        expected = definition_parts(tools[tool["name"]])
        assert tool["definition_parts"] == {part: getattr(expected, part) for part in PARTS}
        assert sum(tool["definition_parts"].values()) == tool["definition_tokens"]
    server = data["tool_definition_parts"]
    assert list(server) == list(PARTS) and sum(server.values()) == data["tool_definition_tokens"]
    assert server == {part: sum(t["definition_parts"][part] for t in data["tools"]) for part in PARTS}

    table = cli("profile", str(EXAMPLE)).stdout.splitlines()
    assert table[1].split()[:5] == ["tool", "definition", *PARTS]
    row = next(line.split() for line in table if line.split()[:1] == ["list_files"])
    split = definition_parts(tools["list_files"])
    assert row[1:5] == [str(split.total), str(split.description), str(split.schema), str(split.names)]
    total = next(line for line in table if line.startswith("server total: "))
    assert (f"(tools {data['tool_definition_tokens']}: description {server['description']}, "
            f"schema {server['schema']}, names {server['names']})") in total

    markdown = cli("profile", "--markdown", str(EXAMPLE)).stdout
    assert "| tool | definition tokens | description | schema | names | risk |" in markdown
    assert (f"| `list_files` | {split.total} | {split.description} | {split.schema} | {split.names} | "
            "critical |") in markdown


@pytest.mark.slow  # a live server over stdio, in a subprocess
def test_the_split_adds_up_for_every_tool_of_the_filesystem_shaped_server() -> None:
    out = cli("profile", "--json", *fixture_server())
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert {t["name"] for t in data["tools"]} >= {"read_file", "search", "list_allowed_directories"}
    for tool in data["tools"]:
        parts = tool["definition_parts"]
        assert list(parts) == list(PARTS) and min(parts.values()) >= 0
        assert sum(parts.values()) == tool["definition_tokens"], tool["name"]
        assert parts["description"] > 0 and parts["schema"] > 0
    assert sum(data["tool_definition_parts"].values()) == data["tool_definition_tokens"]


def test_the_lockfile_does_not_store_the_split() -> None:
    lock = build_lock(profile_server(example_tools(), server_name="x"))
    assert "definition_parts" not in json.dumps(lock)
    assert all(set(entry) >= {"definition_tokens"} for entry in lock["tools"].values())
