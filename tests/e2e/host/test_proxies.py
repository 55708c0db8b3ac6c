"""Real stdio proxies (the proxy, its measuring process and an MCP server, as a client starts them) reporting
into one ``mcp-token-otel serve``: fifteen of them from three client configurations printed by
``--print-client-config``, launched from another directory; proxies killed with SIGKILL; and the one line a
proxy prints when nothing will read its figures."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.helpers.support import ROOT

from .conftest import Scrape, Serve, child_env, children_of, files, gone, has, value, wait_for

SERVER = "tests/adapters/mcp_v2/servers/stdio_server.py"  # relative: --print-client-config makes it absolute
RAW = ROOT / "tests" / "proxy" / "servers" / "raw_child.py"
NAMES = ("alpha", "bravo", "charlie", "delta", "echo")
CLIENTS = ("desktop", "ide", "agent")
NOTE = "nothing reads this proxy's metrics"


def print_entries(client: str, state_home: Path) -> dict[str, Any]:
    """One client's configuration: five servers, each entry printed by --print-client-config from the checkout
    (a relative server path, the interpreter named bare and found on PATH)."""
    venv_bin = os.path.dirname(sys.executable)
    env = child_env(XDG_STATE_HOME=str(state_home), PATH=f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
                    OTEL_SERVICE_NAME=f"{client}-proxies")
    servers: dict[str, Any] = {}
    for name in NAMES:
        done = subprocess.run([sys.executable, "-m", "mcp_token_otel", "proxy", "--print-client-config", "--name",
                               name, "--", os.path.basename(sys.executable), SERVER],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, check=True)
        servers.update(json.loads(done.stdout)["mcpServers"])
        assert "mcp-token-otel serve" in done.stderr and str(state_home) in done.stderr
    return servers


async def session(entry: dict[str, Any], cwd: Path, calls: list[int], gate: anyio.Event | None = None) -> None:
    """What a client does: launch the entry as printed (its own directory, a PATH without the venv), call, leave."""
    params = StdioServerParameters(command=entry["command"], args=entry["args"],
                                   env={**entry["env"], "PATH": "/usr/bin:/bin"}, cwd=str(cwd))
    async with Client(params, mode="legacy") as client:
        for n in calls:
            result = await client.call_tool("big", {"n": n})
            assert not result.is_error
        if gate is not None:
            await gate.wait()


def monotonic(before: Scrape, after: Scrape) -> None:
    for key, old in before.items():
        if key[0].endswith(("_total", "_bucket", "_count", "_sum")):
            assert key in after and after[key] >= old, (key, old, after.get(key))


@pytest.mark.slow
def test_fifteen_proxies_from_three_printed_configs_show_in_one_scrape(tmp_path: Path) -> None:
    state_home = tmp_path / "state"
    store = state_home / "mcp-token-otel" / "metrics"
    serve = Serve(store)
    elsewhere = tmp_path / "client-cwd"
    elsewhere.mkdir()
    try:
        configs = {client: print_entries(client, state_home) for client in CLIENTS}
        for servers in configs.values():
            for entry in servers.values():
                assert entry["command"] == sys.executable and "--metrics-port" not in entry["args"]
                server_cmd = entry["args"][entry["args"].index("--") + 1:]
                assert server_cmd == [sys.executable, str(ROOT / SERVER)]  # bare name and relative path resolved
                assert entry["env"]["XDG_STATE_HOME"] == str(state_home)
                assert entry["env"]["MCP_TOKEN_OTEL_ESTIMATOR"] == "chars/4"
                assert entry["env"]["OTEL_SERVICE_NAME"].endswith("-proxies")
        history: list[Scrape] = []

        async def run_all() -> None:
            # The first client's five sessions stay open until released, one by one, with a scrape after each.
            gates = [anyio.Event() for _ in NAMES]
            async with anyio.create_task_group() as group:
                for name, gate in zip(NAMES, gates, strict=True):
                    group.start_soon(session, configs["desktop"][name], elsewhere, [800, 1600], gate)

                def all_measured() -> Scrape | None:
                    scrape = serve.scrape()
                    done = all(value(scrape, "mcp_token_responses_total", server=n, tool="big") == 2 for n in NAMES)
                    return scrape if done else None

                history.append(await anyio.to_thread.run_sync(
                    lambda: wait_for(all_measured, 120, "the first client's calls measured")))
                for name, gate in zip(NAMES, gates, strict=True):
                    gate.set()

                    def ended(name: str = name) -> Scrape | None:
                        scrape = serve.scrape()
                        return scrape if value(scrape, "mcp_token_session_utilization_ratio_count",
                                               server=name) == 1 else None

                    history.append(await anyio.to_thread.run_sync(lambda: wait_for(ended, 60, "a session end")))
            with anyio.fail_after(300):
                async with anyio.create_task_group() as group:  # the other two clients, all at once
                    for client in CLIENTS[1:]:
                        for name in NAMES:
                            group.start_soon(session, configs[client][name], elsewhere, [400, 1200, 2000])

        anyio.run(run_all)
        for before, after in itertools.pairwise(history):
            monotonic(before, after)
        scrape = serve.scrape()  # one scrape of one fixed address
        monotonic(history[-1], scrape)
        for name in NAMES:
            ends = {"side": "proxy", "server": name}
            assert value(scrape, "mcp_token_session_utilization_ratio_count", **ends) == 3, name
            assert value(scrape, "mcp_token_session_duration_seconds_count", **ends) == 3, name
            assert value(scrape, "mcp_token_session_utilization_ratio_bucket", le="+Inf", **ends) == 3
            assert value(scrape, "mcp_token_responses_total", tool="big", **ends) == 2 + 3 + 3
            # chars/4 of the texts (800 + 1600 once, 400 + 1200 + 2000 twice), at most twice over (the SDK
            # repeats a text as structuredContent), plus framing
            text = (800 + 1600 + 2 * 3600) / 4
            tokens = value(scrape, "mcp_token_tokens_total", tool="big", direction="output", **ends)
            assert text <= tokens <= 2 * text + 8 * 60, (name, tokens)
            assert value(scrape, "mcp_token_proxy_messages_total", server=name, direction="client_to_server",
                         kind="request") >= 8
            assert has(scrape, "mcp_token_sessions", side="proxy", server=name, state="ok")
        assert value(scrape, "mcp_token_sessions") == 0  # no proxy runs now
        # Every proxy moved its files into the archive as it ended: nothing grows per lifetime.
        assert files(store) == ["counter_archive.db", "gauge_livesum_archive.db", "gauge_max_archive.db",
                                "histogram_archive.db", "serve.lock"], files(store)
        assert os.listdir(elsewhere) == []  # launched from there, it wrote nothing there
    finally:
        serve.stop()


def raw_proxy(store_home: Path, name: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "mcp_token_otel", "proxy", "--name", name, *extra, "--", sys.executable, str(RAW),
         "responder"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env or child_env(XDG_STATE_HOME=str(store_home)))


def call(proc: subprocess.Popen[bytes], ident: int, size: int = 400) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    request = {"jsonrpc": "2.0", "id": ident, "method": "tools/call",
               "params": {"name": "big", "arguments": {"text": "y" * size}}}
    proc.stdin.write(json.dumps(request).encode() + b"\n")
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline())["id"] == ident


@pytest.mark.slow
@pytest.mark.parametrize("victims", ["relay", "relay and measuring process"])
def test_a_proxy_killed_with_sigkill_keeps_what_it_measured(tmp_path: Path, victims: str) -> None:
    """SIGKILL of the proxy (as a client force-quitting does): its measuring process reads the pipe to its end,
    records the session's end and moves its files into the archive. SIGKILL of both processes: what was
    measured stays (it is in the files the moment it is recorded); the session end is lost; serve compacts the
    files. Nothing is counted twice."""
    state_home = tmp_path / "state"
    store = state_home / "mcp-token-otel" / "metrics"
    serve = Serve(store)
    proc = raw_proxy(state_home, "killed")
    try:
        for ident in range(1, 6):
            call(proc, ident)
        wait_for(lambda: value(serve.scrape(), "mcp_token_responses_total", server="killed") == 5, 60,
                 "the five calls measured")
        measuring = children_of(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        if victims != "relay":
            for pid in measuring:
                os.kill(pid, signal.SIGKILL)
        proc.wait(30)
        for pid in measuring:
            wait_for(lambda p=pid: gone(p), 60, "the measuring process to end")

        def settled() -> Scrape | None:
            scrape = serve.scrape()
            return scrape if not any("-" in name and "archive" not in name for name in files(store)) else None

        scrape = wait_for(settled, 60, "the killed proxy's files compacted")
        assert value(scrape, "mcp_token_responses_total", server="killed") == 5
        assert value(scrape, "mcp_token_proxy_messages_total", server="killed", kind="response") == 5
        ends = value(scrape, "mcp_token_session_utilization_ratio_count", server="killed")
        assert ends == (1 if victims == "relay" else 0)
        again = serve.scrape()
        assert value(again, "mcp_token_responses_total", server="killed") == 5
    finally:
        if proc.poll() is None:
            proc.kill()
        serve.stop()


@pytest.mark.slow
def test_what_a_sigkill_loses_is_the_last_moments(tmp_path: Path) -> None:
    """Calls answered every few milliseconds, then SIGKILL right after the last answer. Lost: what the relay had not yet
    handed to the measuring process (it gathers chunks for 50 ms) and, when that process is killed too, what
    it had not yet read. Printed: how many calls, answered how long before the kill."""
    state_home = tmp_path / "state"
    store = state_home / "mcp-token-otel" / "metrics"
    serve = Serve(store)
    report = []
    try:
        for round_, victims in enumerate(["relay", "both", "relay", "both"]):
            name = f"burst{round_}"
            proc = raw_proxy(state_home, name)
            call(proc, 0)
            wait_for(lambda n=name: value(serve.scrape(), "mcp_token_responses_total", server=n) == 1, 60,
                     "the measuring process up")
            measuring = children_of(proc.pid)
            answered = []
            for ident in range(1, 41):
                if ident > 1:
                    time.sleep(0.005)
                call(proc, ident)
                answered.append(time.monotonic())
            killed = time.monotonic()
            for pid in (proc.pid, *(measuring if victims == "both" else ())):
                os.kill(pid, signal.SIGKILL)
            proc.wait(30)
            for pid in measuring:  # killed, or ending on its own after compacting its files (relay only)
                wait_for(lambda p=pid: gone(p), 60, "the measuring process to end")
            recorded = int(value(serve.scrape(), "mcp_token_responses_total", server=name)) - 1
            assert 0 <= recorded <= 40  # never more than was answered
            lost = 40 - recorded
            window = (killed - answered[recorded]) * 1000 if lost else 0.0
            report.append(f"{victims}: {lost} of 40 lost, answered in the last {window:.0f} ms")
        print("\nSIGKILL right after the last of 40 calls 5 ms apart:\n  " + "\n  ".join(report))
        serve.scrape()
        assert not [n for n in files(store) if "-" in n]  # every killed proxy's files compacted
    finally:
        serve.stop()


def _stderr_of(state_home: Path, *extra: str, env_extra: dict[str, str] | None = None) -> str:
    env = child_env(XDG_STATE_HOME=str(state_home), **(env_extra or {}))
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t", "arguments": {}}}
    done = subprocess.run([sys.executable, "-m", "mcp_token_otel", "proxy", "--name", "quiet", *extra, "--",
                           sys.executable, str(RAW), "responder"],
                          input=json.dumps(request).encode() + b"\n", capture_output=True, env=env, timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout)["id"] == 1, done.stderr
    return done.stderr.decode()


def test_a_proxy_with_nowhere_to_report_says_so_once(tmp_path: Path) -> None:
    state_home = tmp_path / "state"
    store = state_home / "mcp-token-otel" / "metrics"
    alone = _stderr_of(state_home)
    assert alone.count(NOTE) == 1 and len(alone.splitlines()) == 1, alone
    assert str(store) in alone and "mcp-token-otel serve" in alone and "--metrics-port" in alone
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in alone
    assert NOTE not in _stderr_of(state_home, env_extra={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert NOTE not in _stderr_of(state_home, "--metrics-port", "0")
    serve = Serve(store)
    try:
        assert _stderr_of(state_home) == ""
    finally:
        serve.stop()
    # What the lonely proxies measured waited in the store, and a serve started later shows it.
    later = Serve(store)
    try:
        scrape = later.scrape()
        assert value(scrape, "mcp_token_session_utilization_ratio_count", server="quiet") == 3
    finally:
        later.stop()


def test_a_store_that_cannot_be_used_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the directory should be")
    err = _stderr_of(blocker)
    assert len(err.splitlines()) == 1 and "warning: cannot keep metrics in" in err and "go nowhere" in err, err


def test_a_second_serve_names_the_first(tmp_path: Path) -> None:
    store = tmp_path / "metrics"
    first = Serve(store)
    try:
        done = subprocess.run([sys.executable, "-m", "mcp_token_otel", "serve", "--port", "0", "--state-dir",
                               str(store)], capture_output=True, text=True, env=child_env(), timeout=60)
        assert done.returncode == 2 and "served already" in done.stderr and first.url in done.stderr, done.stderr
        assert len(done.stderr.splitlines()) == 1
    finally:
        first.stop()
