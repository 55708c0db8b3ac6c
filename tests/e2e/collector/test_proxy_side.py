"""The proxy on the Collector path: its request and session durations, recorded in the conventions' client
instruments, reach the /metrics families through the shipped Collector config with `side="proxy"`, as on the
proxy's own /metrics, and never as a client's."""

from __future__ import annotations

import functools
import subprocess
import sys
import urllib.request
from pathlib import Path

import anyio
import pytest
import yaml
from mcp import Client, StdioServerParameters
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.support import free_port
from tests.proxy.conftest import TEST_SERVER, proxy_env, stdio_proxy_args

from ..test_alerting_e2e import http_ok, wait_for
from .fleet import collector_config
from .trace_sink import TraceSink

pytestmark = pytest.mark.slow


def _duration_sides(exporter: str) -> dict[str, set[str]]:
    """Family -> the `side` values of its `_count` samples on the Collector's exporter."""
    with urllib.request.urlopen(exporter, timeout=5) as response:
        text = response.read().decode()
    sides: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        if family.name in ("mcp_token_operation_duration_seconds", "mcp_token_session_duration_seconds"):
            for sample in family.samples:
                if sample.name.endswith("_count"):
                    sides.setdefault(family.name, set()).add(sample.labels.get("side", ""))
    return sides


def _both_families(exporter: str) -> dict[str, set[str]] | None:
    sides = _duration_sides(exporter)
    return sides if len(sides) == 2 else None


async def _calls_through_the_proxy(params: StdioServerParameters) -> None:
    with anyio.fail_after(60):
        async with Client(params, mode="legacy") as client:
            await client.list_tools()
            for _ in range(3):
                await client.call_tool("big", {"n": 500})


def test_the_proxys_durations_arrive_with_side_proxy(tmp_path: Path, otelcol: str) -> None:
    ports = {name: free_port() for name in ("otlp_grpc", "otlp_http", "exporter", "health")}
    traces = TraceSink()
    (tmp_path / "collector.yml").write_text(yaml.safe_dump(collector_config(ports, traces.port)))
    exporter = f"http://127.0.0.1:{ports['exporter']}/metrics"
    with (tmp_path / "collector.log").open("wb") as log:
        collector = subprocess.Popen([otelcol, f"--config={tmp_path / 'collector.yml'}"], stdout=log,
                                     stderr=subprocess.STDOUT)
        try:
            wait_for("the Collector", lambda: http_ok(f"http://127.0.0.1:{ports['health']}/"), 60, [collector])
            env = proxy_env(ports["otlp_http"], OTEL_METRIC_EXPORT_INTERVAL="500")
            params = StdioServerParameters(
                command=sys.executable, env=env,
                args=stdio_proxy_args([sys.executable, str(TEST_SERVER)], name="proxied"))
            # The session ends with the client: its duration is recorded then, and exported within 0.5 s.
            anyio.run(_calls_through_the_proxy, params)
            sides = wait_for("the proxy's durations through the Collector",
                             functools.partial(_both_families, exporter), 60, [collector])
        finally:
            collector.terminate()
            collector.wait(timeout=20)
            traces.stop()
    assert sides == {"mcp_token_operation_duration_seconds": {"proxy"}, "mcp_token_session_duration_seconds": {"proxy"}}
