"""``proxy --print-client-config``: the mcpServers entry a stdio MCP client needs to launch a server through the
proxy from anywhere; launched exactly as printed, the server answers and its calls are measured (the host
store's path, from three printed client configurations: tests/e2e/host/test_proxies.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.helpers.support import ROOT

from .conftest import TEST_SERVER, free_port, proxy_argv, proxy_env, sample, scrape, wait_for


def _print(*options: str, command: list[str]) -> tuple[dict[str, Any], str]:
    done = subprocess.run(proxy_argv("--print-client-config", *options, "--", *command), capture_output=True,
                          text=True, env=proxy_env(), timeout=60, check=True)
    return json.loads(done.stdout), done.stderr


def test_the_entry_names_the_server_and_needs_no_port(tmp_path: Any) -> None:
    config, note = _print("--inject-trace-context",
                          command=["npx", "-y", "@modelcontextprotocol/server-filesystem", "/data"])
    (name, entry), = config["mcpServers"].items()
    assert name == "server-filesystem"
    assert entry["command"] == sys.executable
    assert entry["args"][:3] == ["-m", "mcp_token_otel", "proxy"]
    server = entry["args"][entry["args"].index("--") + 1:]
    assert server[1:] == ["-y", "@modelcontextprotocol/server-filesystem", "/data"]
    assert "--metrics-port" not in entry["args"] and "--inject-trace-context" in entry["args"]
    # Every variable in force that changes what or where the proxy measures travels with the entry.
    assert entry["env"]["MCP_TOKEN_OTEL_ESTIMATOR"] == "chars/4" and entry["env"]["OTEL_BSP_SCHEDULE_DELAY"] == "100"
    assert entry["env"]["PYTHONPATH"] == str(ROOT)  # this checkout, found through PYTHONPATH
    assert "mcp-token-otel serve" in note and "9464/metrics" in note


def test_a_port_is_kept_when_asked_for() -> None:
    port = free_port()
    config, note = _print("--name", "mine", "--metrics-port", str(port), command=[sys.executable, "-c", "pass"])
    entry = config["mcpServers"]["mine"]
    assert ["--metrics-port", str(port)] == entry["args"][entry["args"].index("--metrics-port"):][:2]
    assert f"http://127.0.0.1:{port}/metrics" in note


def test_commands_and_paths_are_made_absolute(tmp_path: Any) -> None:
    (tmp_path / "server.py").write_text("")
    (tmp_path / "data").mkdir()
    (tmp_path / "cfg.yaml").write_text("estimator: chars/4\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "my-server"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    env = proxy_env(PATH=f"{bin_dir}:/usr/bin:/bin", MCP_TOKEN_OTEL_CONFIG="cfg.yaml", OTEL_SERVICE_NAME="svc")

    def printed(*command: str) -> tuple[list[str], dict[str, str], str]:
        done = subprocess.run(proxy_argv("--print-client-config", "--", *command), capture_output=True, text=True,
                              env=env, cwd=tmp_path, timeout=60, check=True)
        (entry,) = json.loads(done.stdout)["mcpServers"].values()
        return entry["args"][entry["args"].index("--") + 1:], entry["env"], done.stderr

    server, carried, _ = printed("my-server", "./data", "--flag", "plain-word")
    assert server == [str(tool), str(tmp_path / "data"), "--flag", "plain-word"]  # found on PATH; a path
    assert carried["MCP_TOKEN_OTEL_CONFIG"] == str(tmp_path / "cfg.yaml") and carried["OTEL_SERVICE_NAME"] == "svc"
    server, _, _ = printed("./server.py", "server.py")
    assert server == [str(tmp_path / "server.py"), str(tmp_path / "server.py")]
    server, _, note = printed("not-installed-anywhere", "x")
    assert server == ["not-installed-anywhere", "x"] and "not on this PATH" in note  # left to the client's PATH


def test_http_mode_is_refused_in_one_line() -> None:
    done = subprocess.run(proxy_argv("--print-client-config", "--listen", "127.0.0.1:1", "--upstream",
                                     "http://127.0.0.1:2/mcp"), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "for stdio servers" in done.stderr and len(done.stderr.splitlines()) == 1


@pytest.mark.slow
def test_a_client_launching_the_entry_is_measured(tmp_path: Any) -> None:
    config_file = tmp_path / "mcp-token-otel.yaml"
    config_file.write_text("estimator: chars/4\n")
    config, _ = _print("--name", "fixture", "--config", str(config_file), "--metrics-port", str(free_port()),
                       command=[sys.executable, str(TEST_SERVER)])
    entry = config["mcpServers"]["fixture"]
    assert entry["env"]["MCP_TOKEN_OTEL_CONFIG"] == str(config_file)
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
