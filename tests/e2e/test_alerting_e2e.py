"""End to end: a workload -> /metrics -> real Prometheus (shipped rules) -> real Alertmanager (shipped
routing) -> a webhook receiver in this test.

Two workloads: the demo (every alert it can raise, then their resolution), and an instrumented server over
streamable HTTP called with protocol 2026-07-28, which has no sessions: the conversation's budget is keyed by
the client's ``gen_ai.conversation.id`` baggage entry, and its exhaustion pages.

The shipped files are used as they are, except what a test must change: ports, the receivers' URLs,
and every duration divided by ``SCALE`` (windows, ``for``, ``keep_firing_for``, Alertmanager's group
timings) so the alerts fire and resolve in about two minutes instead of hours.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.support import free_port, require_binary

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/rules/mcp-token-otel.rules.yml"
PROMETHEUS_YML = ROOT / "deploy/prometheus/prometheus.yml"
ALERTMANAGER_YML = ROOT / "deploy/alertmanager/alertmanager.yml"
ALERTING = Path(__file__).resolve().parent / "alerting"
SCALE = 30  # 10m -> 20s, 1h -> 2m, 6h -> 12m
_DURATION = re.compile(r"(\d+)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def scaled(duration: str) -> str:
    """'10m' -> '20s' (never below 1s); compound durations ('1h30m') are scaled part by part."""
    seconds = sum(int(n) * _UNIT[u] for n, u in _DURATION.findall(duration))
    return f"{max(1, round(seconds / SCALE))}s" if seconds else duration


def scaled_rules() -> dict[str, Any]:
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            rule["expr"] = re.sub(r"\[([0-9smhd]+)\]", lambda m: f"[{scaled(m.group(1))}]", rule["expr"])
            for key in ("for", "keep_firing_for"):
                if key in rule:
                    rule[key] = scaled(rule[key])
    return rules


class Webhook:
    """Collects Alertmanager webhook notifications: (receiver path, alert) pairs."""

    def __init__(self) -> None:
        self.notifications: list[tuple[str, dict[str, Any]]] = []
        received = self.notifications

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                received.extend((self.path, alert) for alert in body["alerts"])
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def find(self, status: str, **labels: str) -> list[tuple[str, dict[str, Any]]]:
        return [(path, a) for path, a in list(self.notifications)
                if a["status"] == status and all(a["labels"].get(k) == v for k, v in labels.items())]

    def first(self, status: str, **labels: str) -> tuple[str, dict[str, Any]] | None:
        return next(iter(self.find(status, **labels)), None)


def wait_for(what: str, check: Callable[[], Any], timeout: float, procs: list[subprocess.Popen]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        for proc in procs:
            assert proc.poll() is None, f"{proc.args!r} exited early while waiting for {what}"
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        return True
    return False


def query(prometheus: str, expr: str) -> float | None:
    """The value of a one-series instant query, None when it has no result."""
    url = f"{prometheus}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=10) as response:
        result = json.loads(response.read())["data"]["result"]
    assert len(result) <= 1, result
    return float(result[0]["value"][1]) if result else None


def alertmanager_config(webhook: Webhook) -> dict[str, Any]:
    """The shipped routing, every receiver on the webhook, group timings of a second."""
    config = yaml.safe_load(ALERTMANAGER_YML.read_text())
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"http://127.0.0.1:{webhook.port}/{receiver['name']}"
    route = config["route"]
    route.update(group_wait="1s", group_interval="2s", repeat_interval="1h")
    for sub in route.get("routes", []):
        for key in ("group_wait", "group_interval"):
            if key in sub:
                sub[key] = route[key]
    return config


@contextlib.contextmanager
def running_stack(tmp_path: Path, workload: Callable[[int], list[str]]) -> Iterator[dict[str, Any]]:
    """Alertmanager, Prometheus and the workload (its command for the /metrics port it must serve)."""
    prometheus = require_binary("prometheus")
    alertmanager = require_binary("prometheus-alertmanager", "alertmanager")
    webhook = Webhook()
    ports = {name: free_port() for name in ("metrics", "prometheus", "alertmanager")}

    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(alertmanager_config(webhook)))

    prom_config = yaml.safe_load(PROMETHEUS_YML.read_text())
    prom_config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    prom_config["rule_files"] = [str(tmp_path / "rules.yml")]
    am_target = f"127.0.0.1:{ports['alertmanager']}"
    prom_config["alerting"]["alertmanagers"] = [{"static_configs": [{"targets": [am_target]}]}]
    for job in prom_config["scrape_configs"]:
        job["scrape_interval"] = "1s"
        job["static_configs"] = [{"targets": [f"127.0.0.1:{ports['metrics']}"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom_config))
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(scaled_rules()))

    procs: list[subprocess.Popen] = []
    logs = {name: open(tmp_path / f"{name}.log", "wb") for name in ("alertmanager", "prometheus", "workload")}  # noqa: SIM115
    try:
        procs.append(subprocess.Popen(
            [alertmanager, f"--config.file={tmp_path / 'alertmanager.yml'}", f"--storage.path={tmp_path / 'am'}",
             f"--web.listen-address=127.0.0.1:{ports['alertmanager']}", "--cluster.listen-address="],
            stdout=logs["alertmanager"], stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen(
            [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{ports['prometheus']}", "--enable-feature=exemplar-storage"],
            stdout=logs["prometheus"], stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen(workload(ports["metrics"]), stdout=logs["workload"], stderr=subprocess.STDOUT))
        am_url = f"http://127.0.0.1:{ports['alertmanager']}"
        prom_url = f"http://127.0.0.1:{ports['prometheus']}"
        wait_for("alertmanager ready", lambda: http_ok(f"{am_url}/-/ready"), 60, procs)
        wait_for("prometheus ready", lambda: http_ok(f"{prom_url}/-/ready"), 60, procs)
        yield {"webhook": webhook, "procs": procs, "workload": procs[-1], "prometheus": prom_url, "logs": tmp_path}
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT if proc is procs[-1] else signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs.values():
            log.close()
        webhook.server.shutdown()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    def demo(metrics_port: int) -> list[str]:
        return [sys.executable, "-m", "mcp_token_otel.cli", "demo", "--metrics-port", str(metrics_port),
                "--duration", "0", "--quiet", "--rate", "15"]

    with running_stack(tmp_path, demo) as running:
        yield running


EXPECTED = [
    # (alert labels that must arrive, the receiver its severity routes to)
    ({"alertname": "McpTokenToolResponseTierBreach", "severity": "critical", "tool": "export_table"}, "/pager"),
    ({"alertname": "McpTokenToolResponseTierBreach", "severity": "warning", "tool": "read_file"}, "/ticket"),
    ({"alertname": "McpTokenSessionExhausted", "severity": "critical"}, "/pager"),
    ({"alertname": "McpTokenSustainedHighUsage", "severity": "critical", "scope": "tool"}, "/pager"),
    ({"alertname": "McpTokenSustainedHighUsage", "severity": "critical", "scope": "service"}, "/pager"),
    # The demo's guards: its agents run into the session hard limit, and search_docs returns poisoned pages.
    ({"alertname": "McpTokenGuardRefusals", "severity": "warning", "policy": "session_limit"}, "/ticket"),
    ({"alertname": "McpTokenPaddingDetected", "severity": "warning", "tool": "search_docs"}, "/ticket"),
]


def test_alerts_fire_through_alertmanager_and_resolve(stack: dict[str, Any]) -> None:
    webhook: Webhook = stack["webhook"]
    procs: list[subprocess.Popen] = stack["procs"]
    for labels, receiver in EXPECTED:
        path, alert = wait_for(f"firing {labels}", functools.partial(webhook.first, "firing", **labels), 180, procs)
        assert path == receiver, (labels, path)
        annotations = alert["annotations"]
        assert annotations["summary"].endswith("."), annotations
        assert annotations["description"] and "{{" not in annotations["description"], annotations
        anchor = alert["labels"]["alertname"].lower()
        assert annotations["runbook_url"].endswith(f"docs/runbook.md#{anchor}"), annotations
        assert alert["labels"]["job"] == "mcp-token-otel"
    # The warning tier breach of export_table is inhibited by its critical one (same alert, job and tool).
    assert not webhook.find("firing", alertname="McpTokenToolResponseTierBreach", severity="warning",
                            tool="export_table")
    # No session id ever reaches an alert.
    assert all("session_id" not in a["labels"] for _, a in webhook.notifications)

    # Traffic stops: the alerts resolve (after keep_firing_for) and Alertmanager says so.
    stack["workload"].send_signal(signal.SIGINT)
    stack["workload"].wait(timeout=30)
    running = [p for p in procs if p is not stack["workload"]]
    for labels, _ in EXPECTED:
        wait_for(f"resolved {labels}", functools.partial(webhook.find, "resolved", **labels), 240, running)


def test_session_exhaustion_pages_on_2026_streamable_http(tmp_path: Path) -> None:
    """Protocol 2026-07-28 has no Mcp-Session-Id: the server keys the budget by the conversation's baggage entry,
    20 calls of about 4 KB exhaust its 15,000-token window, and McpTokenSessionExhausted pages."""
    http_port = free_port()

    def server(metrics_port: int) -> list[str]:
        return [sys.executable, str(ALERTING / "server_2026.py"), str(http_port), str(metrics_port)]

    with running_stack(tmp_path, server) as stack:
        webhook: Webhook = stack["webhook"]
        procs: list[subprocess.Popen] = stack["procs"]
        wait_for("the MCP server", lambda: port_open(http_port), 60, procs)
        # Scraped before the conversation starts: an exhaustion older than the target's first scrape cannot page.
        wait_for("a first scrape", lambda: query(stack["prometheus"], 'up{job="mcp-token-otel"} == 1'), 60, procs)
        client = subprocess.run(
            [sys.executable, str(ALERTING / "client_2026.py"), f"http://127.0.0.1:{http_port}/mcp",
             "conversation-2026-e2e", "20"], capture_output=True, text=True, timeout=120, check=False)
        assert client.returncode == 0, client.stderr
        assert client.stdout.strip() == "protocol 2026-07-28; answered 20 of 20", client.stdout

        exhaustion = functools.partial(webhook.first, "firing", alertname="McpTokenSessionExhausted", side="server")
        path, alert = wait_for("the exhaustion page", exhaustion, 180, procs)
        assert path == "/pager"
        assert alert["labels"]["job"] == "mcp-token-otel" and alert["labels"]["severity"] == "critical"
        assert alert["annotations"]["runbook_url"].endswith("docs/runbook.md#mcptokensessionexhausted")
        # One conversation, one budget: it exhausted once, and none of its tokens went unbudgeted.
        prometheus = stack["prometheus"]
        server_side = 'side="server", server="alerting-2026"'
        exhausted = f'sum(mcp_token_session_transitions_total{{{server_side}, state="exhausted"}})'
        assert query(prometheus, exhausted) == 1
        assert query(prometheus, f"sum(mcp_token_unbudgeted_tokens_total{{{server_side}}})") == 0
        output = f'sum(mcp_token_tokens_total{{{server_side}, method="tools/call", direction="output"}})'
        assert (query(prometheus, output) or 0) > 15_000
