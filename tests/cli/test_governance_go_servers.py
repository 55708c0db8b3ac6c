"""profile, lock and check against the Go MCP servers (tests/peers/go: the official Go SDK and mcp-go), over stdio
and streamable HTTP, as a user runs them; and the observed profile read from the proxy in front of one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.support import ROOT, free_port
from tests.proxy.conftest import sample
from tests.proxy.test_go_servers import CONVERSATION, GO_SERVERS, converse, go_peers, proxied, responses_seen, serving

__all__ = ["go_peers"]  # the session fixture that builds the servers

pytestmark = pytest.mark.slow

SERVER_NAMES = {"gosdk": "go-sdk-peer", "mcpgo": "mcp-go-peer"}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MCP_TOKEN_OTEL_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "mcp_token_otel.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env, check=False)


@pytest.fixture(params=["stdio", "http"])
def target(request: pytest.FixtureRequest, go_peers: dict[str, str]) -> Iterator[dict[str, list[str]]]:
    """Per Go server, the arguments that name it to the CLI (last on the command line)."""
    if request.param == "stdio":
        yield {server: ["--stdio", "--", go_peers[server]] for server in GO_SERVERS}
        return
    with serving([go_peers["gosdk"]]) as gosdk, serving([go_peers["mcpgo"]]) as mcpgo:
        yield {"gosdk": ["--url", gosdk], "mcpgo": ["--url", mcpgo]}


def profile(args: list[str]) -> dict[str, Any]:
    done = cli("profile", "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_profile(target: dict[str, list[str]]) -> None:
    """Both Go servers list the same definitions: the same tokens and static profile per tool."""
    profiles = {server: profile(args) for server, args in target.items()}
    for server, out in profiles.items():
        assert out["server"] == {"name": SERVER_NAMES[server], "version": "1.0.0"}
        assert out["counts"]["tools"] == 4
    tools = [{t["name"]: t for t in out["tools"]} for out in profiles.values()]
    assert tools[0] == tools[1]
    weather = tools[0]["weather"]
    assert weather["bounded"] is True and weather["risk"] == "low" and weather["max_tokens"] > 0
    assert {name for name, tool in tools[0].items() if tool["bounded"] is None} == {"read_document", "fail", "image"}
    assert profiles["gosdk"]["definition_tokens"] == profiles["mcpgo"]["definition_tokens"] > 0


def test_lock_and_check(target: dict[str, list[str]], tmp_path: Path) -> None:
    """A lock of each server checks clean against it; the two locks differ only in the server and the tool
    hashes (mcp-go lists every tool with an empty "annotations" object, which the hash keeps); a lock edited to
    an older state is reported; a lock of the other server is refused."""
    locks = {}
    for server, args in target.items():
        lock = tmp_path / f"{server}.lock.json"
        done = cli("lock", "-o", str(lock), *args)
        assert done.returncode == 0, done.stderr
        clean = cli("check", "--lock", str(lock), *args)
        assert clean.returncode == 0 and "no differences" in clean.stdout, clean.stdout + clean.stderr
        locks[server] = json.loads(lock.read_text())
    gosdk, mcpgo = (dict(locks[s], server=None, tools={n: dict(t, hash=None) for n, t in locks[s]["tools"].items()})
                    for s in GO_SERVERS)
    assert gosdk == mcpgo
    assert all(tool["hash"] != locks["mcpgo"]["tools"][name]["hash"] for name, tool in locks["gosdk"]["tools"].items())
    older = json.loads((tmp_path / "gosdk.lock.json").read_text())
    del older["tools"]["image"]
    (tmp_path / "older.lock.json").write_text(json.dumps(older))
    changed = cli("check", "--json", "--fail-on", "risky", "--lock", str(tmp_path / "older.lock.json"),
                  *target["gosdk"])
    assert changed.returncode == 1, changed.stderr
    assert [(d["subject"], d["change"]) for d in json.loads(changed.stdout)["differences"]] == \
        [("image", "tool added over the limits")]
    other = cli("check", "--lock", str(tmp_path / "gosdk.lock.json"), *target["mcpgo"])
    assert other.returncode == 2 and "lockfile is for server 'go-sdk-peer'" in other.stderr


def test_observed_profile_from_the_proxy(go_peers: dict[str, str]) -> None:
    """profile --observed reads what the Go server's tools really returned from the stdio proxy's /metrics."""
    port = free_port()
    argv, env = proxied([go_peers["gosdk"]], "gosdk", port)
    observed: dict[str, Any] = {}
    measured = responses_seen(len(CONVERSATION) - 1)  # every request answered (one line is a notification)

    def profiled_while_running(text: str) -> bool:
        if not measured(text):
            return False
        observed.update(profile(["--observed", f"http://127.0.0.1:{port}/metrics", "--server", "gosdk",
                                 "--stdio", "--", go_peers["gosdk"]]), metrics=text)
        return True

    converse(argv, env, CONVERSATION, metrics_port=port, ready=profiled_while_running)
    tools = {t["name"]: t for t in observed["tools"]}
    read = tools["read_document"]["observed"]
    total = sample(observed["metrics"], "mcp_token_tokens_total", side="proxy", tool="read_document",
                   direction="output")
    assert read["calls"] == 2 and abs(read["mean"] - total / 2) <= 1 and read["max"] >= read["mean"]
    assert tools["weather"]["observed"]["calls"] == 1
