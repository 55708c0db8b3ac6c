"""Helpers for the proxy tests: the proxy runs as a subprocess (as a client would start it); its spans go to an
OTLP/HTTP receiver in the test, its metrics are scraped from its /metrics."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.emitters.test_otlp import Receiver
from tests.helpers.support import ROOT, free_port

__all__ = ["Receiver", "free_port"]

TEST_SERVER = ROOT / "tests" / "adapters" / "mcp_v2" / "servers" / "stdio_server.py"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    yield r
    r.server.shutdown()
    r.server.server_close()


def proxy_env(otlp_port: int | None = None, **extra: str) -> dict[str, str]:
    """The proxy's environment: this checkout first on PYTHONPATH, chars/4 estimates, OTLP to the receiver."""
    env = {
        "PYTHONPATH": str(ROOT),
        # stdio proxies write into a host store: the tests' own, not the developer's (~/.local/state)
        "XDG_STATE_HOME": os.path.join(tempfile.gettempdir(), f"mcp-token-otel-tests-{os.getuid()}"),
        "MCP_TOKEN_OTEL_ESTIMATOR": "chars/4",
        "OTEL_METRIC_EXPORT_INTERVAL": "3600000",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    if otlp_port is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{otlp_port}"
        env["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
    env.update(extra)
    return env


def proxy_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "mcp_token_otel.cli", "proxy", *args]


def stdio_proxy_args(command: Sequence[str], *, name: str | None = None, metrics_port: int | None = None) -> list[str]:
    """Arguments after the interpreter for StdioServerParameters(command=sys.executable, args=...)."""
    args = ["-m", "mcp_token_otel.cli", "proxy"]
    if name:
        args += ["--name", name]
    if metrics_port is not None:
        args += ["--metrics-port", str(metrics_port)]
    return [*args, "--", *command]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def sample(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def wait_for(predicate, timeout: float = 20.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    """Poll ``predicate`` (bounded); its first truthy value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def listening(port: int) -> bool:
    """Whether something accepts connections on the loopback ``port``."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


@contextlib.contextmanager
def running_http_proxy(upstream: str, *options: str, env: dict[str, str], timeout: float = 20.0,
                       expect_clean_exit: bool = True) -> Iterator[tuple[str, int]]:
    """(the proxy's base URL, its metrics port) while an HTTP proxy subprocess runs in front of ``upstream``;
    stopped with SIGTERM afterwards (killed if it does not stop), its exit status checked when asked. Its stderr
    goes to a file (a pipe nobody reads could fill and stall the proxy) and is shown when it fails."""
    port, metrics_port = free_port(), free_port()
    argv = proxy_argv("--listen", f"127.0.0.1:{port}", "--upstream", upstream, "--metrics-port", str(metrics_port),
                      *options)
    with tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(argv, env=env, stderr=stderr, text=True)

        def said() -> str:
            stderr.seek(0)
            return stderr.read()

        try:
            wait_for(lambda: listening(port) or proc.poll() is not None, timeout, "the proxy listening")
            assert proc.poll() is None, said()
            yield f"http://127.0.0.1:{port}", metrics_port
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=timeout)
        if expect_clean_exit:
            assert proc.returncode == 0, said()

def node_path_env() -> dict[str, str]:
    from tests.helpers.support import node_env

    env = node_env()
    return {"PATH": env["PATH"], "HOME": os.environ.get("HOME", "/tmp")}


def everything() -> str:
    from tests.helpers.support import npm_peer

    return npm_peer("mcp-server-everything")


__all__ += ["TEST_SERVER", "Path", "everything", "node_path_env", "proxy_argv", "proxy_env", "sample", "scrape",
            "stdio_proxy_args", "wait_for"]
