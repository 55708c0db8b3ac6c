"""The Sessions dashboard fills from a real Prometheus scraping ``mcp-token-otel serve``: stdio proxies start
and stop continuously (each a whole session: calls, budget transitions, a guard refusal, the session's end),
Prometheus (the Debian binary) scrapes serve's one fixed address with the shipped rules, and every panel query
of dashboards/mcp-token-sessions.json returns data, for "All" and for one server, as tests/e2e/test_dashboards.py
checks the demo's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.support import ROOT, free_port, require_binary

from ..test_dashboards import RULES, Live, _api, _expand, _get, _has_data, _run_target, _wait, all_targets, dashboards
from .conftest import Serve, child_env, value

RAW = ROOT / "tests" / "proxy" / "servers" / "raw_child.py"
NAMES = ("files", "search")
SCRAPE_SECONDS = 40


def one_session(state_home: Path, name: str, guarded: bool) -> None:
    """A client's whole session through a proxy: initialize, calls that take the 3,000-token window past its
    warning and exhaustion ratios (the last call refused when guarded), then EOF."""
    env = child_env(XDG_STATE_HOME=str(state_home), MCP_TOKEN_OTEL_BUDGET_CONTEXT_WINDOW="3000")
    if guarded:
        env.update(MCP_TOKEN_OTEL_GUARD_MODE="enforce", MCP_TOKEN_OTEL_GUARD_SESSION_HARD_LIMIT="true")
    messages = [{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}}]
    messages += [{"jsonrpc": "2.0", "id": i, "method": "tools/call",
                  "params": {"name": "read", "arguments": {"text": "z" * 3600}}} for i in range(1, 5)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcp_token_otel", "proxy", "--name", name, "--", sys.executable, str(RAW),
         "responder"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        for message in messages:  # as a client does: each call once the one before is answered
            proc.stdin.write(json.dumps(message).encode() + b"\n")
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline())["id"] == message["id"]  # answered, or refused on the way
        proc.stdin.close()
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_every_sessions_panel_fills_from_prometheus_scraping_serve(tmp_path: Path) -> None:
    prometheus_bin = require_binary("prometheus")
    state_home = tmp_path / "state"
    serve = Serve(state_home / "mcp-token-otel" / "metrics")
    stop = threading.Event()
    failures: list[BaseException] = []

    def workload(worker: int) -> None:
        n = 0
        while not stop.is_set():
            try:
                one_session(state_home, NAMES[worker], guarded=n % 2 == 0)
            except BaseException as exc:  # reported by the test
                failures.append(exc)
                return
            n += 1

    workers = [threading.Thread(target=workload, args=(i,), daemon=True) for i in range(len(NAMES))]
    for thread in workers:
        thread.start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        instance = f"127.0.0.1:{serve.port}"
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "mcp-token-otel", "static_configs": [{"targets": [instance]}]}],
        }))
        with (tmp_path / "prometheus.log").open("w") as log:
            procs.append(subprocess.Popen(
                [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path))
        base = f"http://127.0.0.1:{port}"
        _wait("Prometheus to be ready", lambda: _get(f"{base}/-/ready", 2), 60, procs)
        _wait("a session end scraped",
              lambda: _api(base, "/api/v1/query", query="mcp_token_session_utilization_ratio_count")["result"],
              90, procs)
        started = time.monotonic()
        _wait("data and a firing session alert", lambda: time.monotonic() - started >= SCRAPE_SECONDS and _api(
            base, "/api/v1/query", query='ALERTS{alertname=~"McpTokenSession.*", alertstate="firing"}')["result"],
            SCRAPE_SECONDS + 60, procs)
        assert not failures, failures
        up = _api(base, "/api/v1/query", query=f'up{{instance="{instance}"}}')["result"]
        assert up and up[0]["value"][1] == "1"

        live = Live(base, serve.url, instance)
        dash = dashboards()["mcp-token-sessions.json"]
        all_values = {"job": ".+", "instance": ".+", "server": ".+", "side": ".+"}
        concrete = {"job": "mcp-token-otel", "instance": re.escape(instance).replace("\\", "\\\\"),
                    "server": NAMES[0], "side": "proxy"}
        ran, empty = 0, []
        for panel, target in all_targets(dash):
            for values in (all_values, concrete):
                expr = _expand(target["expr"], values)
                ran += 1
                if not _has_data(_run_target(live, target, expr)):
                    empty.append(f"{panel['title']}: {expr}")
        print(f"\n{ran} Sessions panel queries ran against Prometheus scraping serve; {ran - len(empty)} returned data")
        assert ran >= 30
        assert not empty, "panels without data:\n" + "\n".join(empty)
        scrape = serve.scrape()
        for name in NAMES:  # the session-end figures of proxies long gone, in the scrape
            assert value(scrape, "mcp_token_session_utilization_ratio_count", side="proxy", server=name) >= 3
            assert value(scrape, "mcp_token_guard_actions_total", side="proxy", server=name, policy="session_limit",
                         action="refused", enforced="true") >= 1
    finally:
        stop.set()
        for thread in workers:
            thread.join(180)
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(15)
        serve.stop()
