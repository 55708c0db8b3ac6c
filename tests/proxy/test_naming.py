"""The server's name on a proxy's series and spans: ``--name`` when given; else the name the server gives itself
(``serverInfo.name``, normalized), and the command line's name until it does."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from mcp_token_otel.proxy.stdio import default_name

from .conftest import TEST_SERVER, Receiver, free_port, proxy_env, sample, scrape, stdio_proxy_args, wait_for


@pytest.mark.parametrize(("command", "name"), [
    (["npx", "-y", "@modelcontextprotocol/server-everything@2025.1.1", "stdio"], "server-everything"),
    (["npx", "-y", "@modelcontextprotocol/server-filesystem", "/tmp"], "server-filesystem"),
    (["uvx", "mcp-server-time@0.6", "--local-timezone", "UTC"], "mcp-server-time"),
    (["uv", "run", "--with", "httpx", "weather.py"], "weather"),
    (["uvx", "--from", "git+https://example.com/x", "fetch-server"], "fetch-server"),
    (["/usr/bin/python3", "-m", "mcp_server_git.cli", "--repository", "."], "mcp_server_git"),
    (["node", "/opt/servers/server-memory/dist/index.js"], "server-memory"),
    (["node", "build/weather.js"], "weather"),
    (["docker", "run", "-i", "--rm", "-e", "TOKEN", "-v", "/a:/b", "ghcr.io/github/github-mcp-server:v1"],
     "github-mcp-server"),
    (["docker", "run", "-i", "--rm", "--env=A=1", "mcp/time"], "time"),
    (["/home/me/bin/my-server", "--port", "1"], "my-server"),
    (["./fs-server.py"], "fs-server"),
    ([], "server"),
    (["npx"], "npx"),
])
def test_default_name(command: list[str], name: str) -> None:
    assert default_name(command) == name


def _scrape(port: int) -> str:
    try:
        return scrape(port)
    except OSError:
        return ""


def _run(name: str | None, receiver: Receiver) -> tuple[str, dict[str, Any]]:
    """A session through the stdio proxy (``--name name`` if given): its /metrics and the tools/call span."""
    port = free_port()
    params = StdioServerParameters(command=sys.executable,
                                   args=stdio_proxy_args([sys.executable, str(TEST_SERVER)], name=name,
                                                         metrics_port=port),
                                   env=proxy_env(receiver.port))
    scraped: dict[str, str] = {}

    def answered() -> str | None:
        text = _scrape(port)
        responses = sample(text, "mcp_token_proxy_messages_total", direction="server_to_client", kind="response")
        return text if responses >= 3 else None

    async def session() -> None:
        with anyio.fail_after(60):
            async with Client(params, mode="legacy") as client:
                await client.list_tools()
                await client.call_tool("big", {"n": 400})
                scraped["text"] = await anyio.to_thread.run_sync(wait_for, answered, 30.0, "proxy metrics")

    anyio.run(session)

    def span() -> dict[str, Any] | None:
        return next((attrs for _, s, attrs in receiver.spans() if s.name == "tools/call big"), None)

    return scraped["text"], wait_for(span, what="tools/call span")


def test_unnamed_proxy_takes_the_servers_own_name(receiver: Receiver) -> None:
    """No --name: every series, the proxy's own counts included, carries the serverInfo name, not the command's
    ("python"); the spans carry it as mcp_token.server.name."""
    text, attrs = _run(None, receiver)
    assert sample(text, "mcp_token_tokens_total", side="proxy", server="stdio-test", tool="big",
                  direction="output") > 0
    assert sample(text, "mcp_token_proxy_messages_total", server="stdio-test", kind="response") >= 3
    assert sample(text, "mcp_token_tool_definitions_tokens", server="stdio-test") > 0
    servers = {line.split('server="', 1)[1].split('"', 1)[0] for line in text.splitlines()
               if line.startswith("mcp_token_") and 'server="' in line}
    assert servers == {"stdio-test"}, [line for line in text.splitlines() if "stdio_server" in line]
    assert attrs["mcp_token.server.name"] == "stdio-test"
    assert attrs["server.address"] == "stdio_server"  # the command line's name


def test_name_given_wins(receiver: Receiver) -> None:
    text, attrs = _run("billing", receiver)
    assert sample(text, "mcp_token_tokens_total", side="proxy", server="billing", tool="big", direction="output") > 0
    assert sample(text, "mcp_token_tokens_total", side="proxy", server="stdio-test") == 0
    assert sample(text, "mcp_token_proxy_messages_total", server="billing", kind="response") >= 3
    assert attrs["mcp_token.server.name"] == "billing"


@pytest.mark.slow
def test_profile_observed_finds_an_unnamed_proxys_calls(receiver: Receiver) -> None:
    """``profile --observed`` on the /metrics of a proxy started without --name finds its server's calls with no
    --server: both name the server by what it says it is."""
    port = free_port()
    server = [sys.executable, str(TEST_SERVER)]
    params = StdioServerParameters(command=sys.executable, args=stdio_proxy_args(server, metrics_port=port),
                                   env=proxy_env(receiver.port))
    report: dict[str, Any] = {}

    def profile() -> None:
        done = subprocess.run([sys.executable, "-m", "mcp_token_otel", "profile", "--json", "--observed",
                               f"http://127.0.0.1:{port}/metrics", "--stdio", "--", *server],
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        report.update(json.loads(done.stdout))

    def answered() -> str | None:
        text = _scrape(port)
        return text if sample(text, "mcp_token_responses_total", side="proxy", tool="big") >= 3 else None

    async def session() -> None:
        with anyio.fail_after(120):
            async with Client(params, mode="legacy") as client:
                await client.list_tools()
                for _ in range(3):
                    await client.call_tool("big", {"n": 40_000})
                await anyio.to_thread.run_sync(wait_for, answered, 30.0, "proxy metrics")
                await anyio.to_thread.run_sync(profile)  # while the proxy (and its /metrics) runs

    anyio.run(session)
    big = next(tool for tool in report["tools"] if tool["name"] == "big")
    assert big["observed"]["calls"] == 3, big
    assert big["observed"]["p95"] >= 10_000 and big["observed"]["risk"] == "critical", big
