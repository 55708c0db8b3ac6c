"""``profile`` advice by impact against the real npm filesystem server (``@modelcontextprotocol/server-filesystem``,
installed by scripts/npm-peers): statically, one line per change with its actions advisory; then behind the real
stdio proxy, after real calls, the tools observed small over enough calls drop out of the top of the report."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from mcp_token_otel.core.observed import ENOUGH_CALLS
from tests.helpers.support import free_port, node_env, npm_peer
from tests.proxy.conftest import proxy_env, sample, stdio_proxy_args, wait_for

from .test_governance_live import cli

pytestmark = pytest.mark.slow  # a node server, the proxy and the CLI in subprocesses

NAME = "secure-filesystem-server"  # what the server calls itself: the label profile --observed reads
ACTIONS = {"write_file", "edit_file", "create_directory", "move_file"}


def _profile(root: Path, *options: str) -> dict[str, Any]:
    out = cli("profile", "--json", *options, "--stdio", "--", npm_peer("mcp-server-filesystem"), str(root))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_static_advice_is_a_few_lines_with_the_actions_advisory(tmp_path: Path) -> None:
    data = _profile(tmp_path)
    tools = {t["name"]: t for t in data["tools"]}
    assert len(tools) == 14 and data["server"]["name"] == NAME
    # The contract is unchanged: every tool declares {"content": string} with no bound.
    assert {t["risk"] for t in tools.values()} == {"critical"}
    assert {name for name, t in tools.items() if t["priority"] == "advisory"} == ACTIONS
    assert all(t["priority"] == "critical" for name, t in tools.items() if name not in ACTIONS)
    advice = data["advice"]
    per_tool = sum(len(t["recommendations"]) for t in tools.values())
    assert per_tool == 18 and len(advice) <= 6, advice  # one line per change, not one per tool and cause
    assert [a["priority"] for a in advice] == sorted((a["priority"] for a in advice),
                                                     key=["critical", "high", "medium", "advisory"].index)
    assert set(advice[-1]["tools"]) == ACTIONS and advice[-1]["priority"] == "advisory"
    assert {tool for a in advice for tool in a["tools"]} == set(tools)  # nothing dropped
    assert data["recommendations"] == [a["recommendation"] for a in advice]


def _metrics(port: int) -> str:
    """The proxy's /metrics, or "" while its measuring process is not serving yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def test_tools_observed_small_over_enough_calls_leave_the_top(tmp_path: Path) -> None:
    root = tmp_path / "files"
    root.mkdir()
    big = root / "big.txt"
    sources = sorted(Path(__file__).resolve().parents[1].rglob("test_*.py"))  # this suite's own test modules
    big.write_text("".join(p.read_text() for p in sources)[:200_000])
    (root / "small.txt").write_text("hello\n")
    port = free_port()
    params = StdioServerParameters(
        command=sys.executable,
        args=stdio_proxy_args([npm_peer("mcp-server-filesystem"), str(root)], name=NAME, metrics_port=port),
        env={**proxy_env(), "PATH": node_env()["PATH"]},
    )

    async def run() -> dict[str, Any]:
        with anyio.fail_after(300):
            async with Client(params, mode="legacy") as client:
                for _ in range(ENOUGH_CALLS):
                    await client.call_tool("get_file_info", {"path": str(root / "small.txt")})
                    await client.call_tool("list_allowed_directories", {})
                for _ in range(3):
                    await client.call_tool("read_text_file", {"path": str(big)})
                await client.call_tool("create_directory", {"path": str(root / "made")})
                calls = ENOUGH_CALLS * 2 + 4
                await anyio.to_thread.run_sync(lambda: wait_for(
                    lambda: sample(_metrics(port), "mcp_token_message_tokens_count", method="tools/call",
                                   direction="output") >= calls, timeout=30, what="every call measured"))
                # the proxy is still up: its /metrics is what profile reads
                return await anyio.to_thread.run_sync(
                    lambda: _profile(root, "--observed", f"http://127.0.0.1:{port}/metrics"))

    data = anyio.run(run)
    tools = {t["name"]: t for t in data["tools"]}
    for name in ("get_file_info", "list_allowed_directories"):  # many small results: low, their advice advisory
        tool = tools[name]
        assert tool["observed"]["calls"] == ENOUGH_CALLS and tool["observed"]["risk"] == "low", tool
        assert tool["risk"] == "critical" and tool["effective_risk"] == "low" and tool["priority"] == "advisory"
    read = tools["read_text_file"]
    assert read["observed"]["risk"] == "critical" and read["priority"] == "critical"
    assert tools["read_file"]["observed"] is None and tools["read_file"]["priority"] == "critical"  # never called
    assert tools["create_directory"]["priority"] == "advisory"
    first = data["advice"][0]
    assert first["priority"] == "critical" and first["tools"][0] == "read_text_file"  # the largest seen leads
    assert not {"get_file_info", "list_allowed_directories"} & {
        tool for a in data["advice"] if a["priority"] == "critical" for tool in a["tools"]}
