"""``proxy --print-client-config``: the mcpServers entry a stdio MCP client needs to launch a server through the
proxy; launched exactly as printed, the server answers and /metrics shows its calls."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from .conftest import TEST_SERVER, free_port, proxy_argv, proxy_env, sample, scrape, wait_for


def _print(*options: str, command: list[str]) -> tuple[dict[str, Any], str]:
    done = subprocess.run(proxy_argv("--print-client-config", *options, "--", *command), capture_output=True,
                          text=True, env=proxy_env(), timeout=60, check=True)
    return json.loads(done.stdout), done.stderr


def test_the_entry_names_the_server_and_a_metrics_port() -> None:
    port = free_port()
    config, note = _print("--metrics-port", str(port), "--inject-trace-context",
                          command=["npx", "-y", "@modelcontextprotocol/server-filesystem", "/data"])
    (name, entry), = config["mcpServers"].items()
    assert name == "server-filesystem"
    assert entry["command"] == sys.executable and entry["env"] == {}
    assert entry["args"][:3] == ["-m", "mcp_token_otel", "proxy"]
    assert entry["args"][entry["args"].index("--") + 1:] == ["npx", "-y", "@modelcontextprotocol/server-filesystem",
                                                             "/data"]
    assert ["--metrics-port", str(port)] == entry["args"][entry["args"].index("--metrics-port"):][:2]
    assert "--inject-trace-context" in entry["args"]
    assert f"http://127.0.0.1:{port}/metrics" in note


def test_http_mode_is_refused_in_one_line() -> None:
    done = subprocess.run(proxy_argv("--print-client-config", "--listen", "127.0.0.1:1", "--upstream",
                                     "http://127.0.0.1:2/mcp"), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "for stdio servers" in done.stderr and len(done.stderr.splitlines()) == 1


@pytest.mark.slow
def test_a_client_launching_the_entry_is_measured(tmp_path: Any) -> None:
    config_file = tmp_path / "mcp-token-otel.yaml"
    config_file.write_text("estimator: chars/4\n")
    config, _ = _print("--name", "fixture", "--config", str(config_file),
                       command=[sys.executable, str(TEST_SERVER)])
    entry = config["mcpServers"]["fixture"]
    assert entry["env"] == {"MCP_TOKEN_OTEL_CONFIG": str(config_file)}
    port = int(entry["args"][entry["args"].index("--metrics-port") + 1])
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=entry["env"],
                                   cwd=str(tmp_path))  # as a client would: its own directory, the entry's env

    async def call() -> str:
        with anyio.fail_after(60):
            async with Client(params, mode="legacy") as client:
                result = await client.call_tool("big", {"n": 4000})

                def measured() -> str | None:
                    try:
                        text = scrape(port)
                    except OSError:
                        return None
                    return text if sample(text, "mcp_token_tokens_total", server="fixture", tool="big",
                                          direction="output") > 0 else None

                text = await anyio.to_thread.run_sync(lambda: wait_for(measured, what="the call measured"))
                assert not result.is_error
                return text

    text = anyio.run(call)
    assert sample(text, "mcp_token_tokens_total", side="proxy", server="fixture", tool="big",
                  direction="output") >= 1000  # 4000 characters at chars/4: the config file was read
