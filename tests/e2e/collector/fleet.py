"""The fleet path, all real: two demo workloads export OTLP (one over HTTP, one over gRPC) -> the Collector with
the shipped config -> Prometheus scraping its exporter as prometheus.compose.yml does, with the shipped rules ->
Alertmanager with the shipped routing -> a webhook; the Collector's traces go to an OTLP trace sink.

The shipped files are used as they are except for what a test must change: every listen address becomes a free
127.0.0.1 port, the trace exporter (Tempo in the shipped config) points at the sink, the Collector's own
telemetry is off (it would listen on the fixed port 8888), and durations are divided by the direct path's
SCALE: the rules' windows and `for`, Alertmanager's group timings and the Collector's batch timeout.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.support import ROOT, free_port, require_binary

from ..test_alerting_e2e import Webhook, alertmanager_config, http_ok, scaled, scaled_rules, wait_for
from .trace_sink import TraceSink

COLLECTOR_YML = ROOT / "deploy/otel-collector/config.yaml"
PROMETHEUS_COMPOSE_YML = ROOT / "deploy/prometheus/prometheus.compose.yml"
#: The scrape job of the Collector's exporter in prometheus.compose.yml (honor_labels: true).
COLLECTOR_JOB = "otel-collector"
#: Test id -> OTEL_EXPORTER_OTLP_PROTOCOL of the demo that exports over it.
PROTOCOLS = {"http": "http/protobuf", "grpc": "grpc"}
DEMO_SERVER = "mcp-token-otel-demo"
_METRICS_URL = re.compile(r"metrics at (http://127\.0\.0\.1:\d+/metrics)")


def job(protocol: str) -> str:
    """The demo's service.name, which the exporter makes the series' `job`."""
    return f"mcp-fleet-{protocol}"


def instance(protocol: str) -> str:
    """The demo's service.instance.id, which the exporter makes the series' `instance`."""
    return f"demo-{protocol}"


@dataclass
class Fleet:
    prometheus: str  # base URL
    exporter: str  # the Collector's Prometheus exporter (/metrics)
    webhook: Webhook
    traces: TraceSink
    procs: list[subprocess.Popen] = field(default_factory=list)
    #: protocol -> the demo's own /metrics (the direct path of the same recorder), as its first line says.
    direct: dict[str, str] = field(default_factory=dict)


def collector_config(ports: dict[str, int], traces_port: int) -> dict[str, Any]:
    config = yaml.safe_load(COLLECTOR_YML.read_text())
    protocols = config["receivers"]["otlp"]["protocols"]
    protocols["grpc"]["endpoint"] = f"127.0.0.1:{ports['otlp_grpc']}"
    protocols["http"]["endpoint"] = f"127.0.0.1:{ports['otlp_http']}"
    config["exporters"]["prometheus"]["endpoint"] = f"127.0.0.1:{ports['exporter']}"
    config["exporters"]["otlp_grpc/tempo"]["endpoint"] = f"127.0.0.1:{traces_port}"
    config["extensions"]["health_check"]["endpoint"] = f"127.0.0.1:{ports['health']}"
    batch = config["processors"]["batch"]
    batch["timeout"] = scaled(batch["timeout"])
    config["service"]["telemetry"] = {"metrics": {"level": "none"}}
    return config


def prometheus_config(tmp_path: Path, ports: dict[str, int]) -> dict[str, Any]:
    """prometheus.compose.yml's Collector job alone, on the test's ports, with every interval a second."""
    config = yaml.safe_load(PROMETHEUS_COMPOSE_YML.read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(tmp_path / "rules.yml")]
    config["alerting"]["alertmanagers"] = [{"static_configs": [{"targets": [f"127.0.0.1:{ports['alertmanager']}"]}]}]
    [scrape] = [j for j in config["scrape_configs"] if j["job_name"] == COLLECTOR_JOB]
    scrape.update(scrape_interval="1s", static_configs=[{"targets": [f"127.0.0.1:{ports['exporter']}"]}])
    config["scrape_configs"] = [scrape]
    return config


def demo_command(protocol: str, ports: dict[str, int]) -> tuple[list[str], dict[str, str]]:
    """The demo exporting OTLP over ``protocol`` (its /metrics on a free port nobody scrapes)."""
    port = ports["otlp_grpc"] if protocol == "grpc" else ports["otlp_http"]
    env = {
        **os.environ,
        "MCP_TOKEN_OTEL_OTEL_CONFIGURE": "true",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": PROTOCOLS[protocol],
        "OTEL_SERVICE_NAME": job(protocol),
        "OTEL_RESOURCE_ATTRIBUTES": f"service.instance.id={instance(protocol)}",
        "OTEL_METRIC_EXPORT_INTERVAL": "1000",
    }
    command = [sys.executable, "-m", "mcp_token_otel.cli", "demo", "--metrics-port", "0", "--duration", "0",
               "--quiet", "--rate", "15"]
    return command, env


def _metrics_url(log: Path) -> str | None:
    found = _METRICS_URL.search(log.read_text())
    return found.group(1) if found else None


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextlib.contextmanager
def running_fleet(tmp_path: Path, otelcol: str) -> Iterator[Fleet]:
    prometheus = require_binary("prometheus")
    alertmanager = require_binary("prometheus-alertmanager", "alertmanager")
    ports = {name: free_port() for name in ("otlp_grpc", "otlp_http", "exporter", "health", "prometheus",
                                            "alertmanager")}
    webhook, traces = Webhook(), TraceSink()
    files = {"collector.yml": collector_config(ports, traces.port), "alertmanager.yml": alertmanager_config(webhook),
             "prometheus.yml": prometheus_config(tmp_path, ports), "rules.yml": scaled_rules()}
    for name, content in files.items():
        (tmp_path / name).write_text(yaml.safe_dump(content))
    commands = {
        "collector": ([otelcol, f"--config={tmp_path / 'collector.yml'}"], None),
        "alertmanager": ([alertmanager, f"--config.file={tmp_path / 'alertmanager.yml'}",
                          f"--storage.path={tmp_path / 'am'}", "--cluster.listen-address=",
                          f"--web.listen-address=127.0.0.1:{ports['alertmanager']}"], None),
        "prometheus": ([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                        f"--storage.tsdb.path={tmp_path / 'tsdb'}", "--enable-feature=exemplar-storage",
                        f"--web.listen-address=127.0.0.1:{ports['prometheus']}"], None),
        **{f"demo-{protocol}": demo_command(protocol, ports) for protocol in PROTOCOLS},
    }
    fleet = Fleet(f"http://127.0.0.1:{ports['prometheus']}", f"http://127.0.0.1:{ports['exporter']}/metrics",
                  webhook, traces)
    with contextlib.ExitStack() as logs:
        try:
            for name, (command, env) in commands.items():
                log = logs.enter_context((tmp_path / f"{name}.log").open("wb"))
                fleet.procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env))
                if name == "prometheus":  # the demos start once every part is up
                    wait_for("the Collector", lambda: http_ok(f"http://127.0.0.1:{ports['health']}/"), 60,
                             fleet.procs)
                    for part in ("alertmanager", "prometheus"):
                        url = f"http://127.0.0.1:{ports[part]}/-/ready"
                        wait_for(f"{part} ready", functools.partial(http_ok, url), 60, fleet.procs)
            for protocol in PROTOCOLS:
                demo_log = tmp_path / f"demo-{protocol}.log"
                found = wait_for(f"the {protocol} demo's metrics URL", functools.partial(_metrics_url, demo_log), 60,
                                 fleet.procs)
                fleet.direct[protocol] = found
            yield fleet
        finally:
            _stop(fleet.procs)
            webhook.server.shutdown()
            traces.stop()
