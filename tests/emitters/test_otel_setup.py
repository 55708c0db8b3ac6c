"""configure_otel and a dead collector: exit is bounded by otel.shutdown_timeout_seconds, with one warning.

Checked by outcome, not by the clock: the exit hook reports that it gave up, and the process ends (the
subprocess timeout is only a guard against a hang).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from mcp_token_otel.emitters.otel_setup import DEFAULT_SHUTDOWN_TIMEOUT, shutdown_otel

APP = textwrap.dedent(
    """
    import anyio
    from mcp import Client
    from mcp.server.mcpserver import MCPServer
    from mcp_token_otel import instrument

    instrument()  # otel.configure and the shutdown limit come from MCP_TOKEN_OTEL_* variables
    server = MCPServer("dead-collector")

    @server.tool()
    def fetch(n: int) -> str:
        return "data " * n

    async def main():
        async with Client(server, mode="legacy") as client:
            await client.call_tool("fetch", {"n": 100})

    anyio.run(main)
    print("app done", flush=True)
    """
)


@pytest.fixture
def dead_collector() -> Iterator[str]:
    """An endpoint that accepts connections into its backlog and never answers (worse than refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.slow
def test_exit_with_a_dead_collector_is_bounded(dead_collector: str, tmp_path: Any) -> None:
    app = tmp_path / "app.py"
    app.write_text(APP)
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": dead_collector, "MCP_TOKEN_OTEL_OTEL_CONFIGURE": "true",
           "MCP_TOKEN_OTEL_OTEL_SHUTDOWN_TIMEOUT_SECONDS": "0.5", "OTEL_SERVICE_NAME": "dead-collector-test"}
    out = subprocess.run([sys.executable, str(app)], env=env, capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert "app done" in out.stdout
    assert "OpenTelemetry export did not finish within 0.5s at shutdown" in out.stderr, out.stderr


class _Provider:
    def __init__(self, block: threading.Event | None = None) -> None:
        self.block = block
        self.shut = False

    def shutdown(self) -> None:
        if self.block is not None:
            self.block.wait(60)
        self.shut = True


def test_shutdown_otel_waits_for_providers_that_finish(caplog: Any) -> None:
    providers = [_Provider(), _Provider()]
    assert shutdown_otel(providers, timeout=30) is True
    assert all(p.shut for p in providers) and "did not finish" not in caplog.text


def test_shutdown_otel_gives_up_on_a_provider_that_hangs(caplog: Any) -> None:
    release = threading.Event()
    try:
        hung, quick = _Provider(release), _Provider()
        assert shutdown_otel([hung, quick], timeout=0.2) is False
        assert quick.shut and not hung.shut
        assert "did not finish within 0.2s" in caplog.text
    finally:
        release.set()


def test_shutdown_otel_absorbs_a_provider_that_raises() -> None:
    class Raising:
        def shutdown(self) -> None:
            raise RuntimeError("exporter fault at exit")

    assert shutdown_otel([Raising()], timeout=30) is True


def test_the_default_limit_matches_the_configuration_default() -> None:
    from mcp_token_otel.config import Config

    assert Config().otel.shutdown_timeout_seconds == DEFAULT_SHUTDOWN_TIMEOUT
