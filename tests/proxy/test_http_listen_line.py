"""The HTTP proxy says, in one stderr line at start, the URL its clients use; with ``--listen HOST:0`` that line
is how the port is found. A real proxy subprocess in front of a real MCP server, called at the URL it printed."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
from typing import Any

import anyio
from mcp import Client

from .conftest import proxy_argv, proxy_env
from .test_http import _dump, _own_server, _serve

LISTENING = re.compile(r"^mcp-token-otel proxy: listening on (http://127\.0\.0\.1:(\d+)/mcp) \(upstream (\S+)\)$")


def _lines(stream: Any) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.rstrip("\n")) for line in stream], daemon=True).start()
    return lines


def test_the_http_proxy_prints_the_url_clients_use() -> None:
    async def call(url: str) -> Any:
        with anyio.fail_after(60):
            async with Client(url, mode="legacy") as client:
                return _dump(await client.call_tool("big", {"n": 12}))

    with _serve(_own_server().streamable_http_app()) as upstream_port:
        upstream = f"http://127.0.0.1:{upstream_port}/mcp"
        proc = subprocess.Popen(proxy_argv("--listen", "127.0.0.1:0", "--upstream", upstream),
                                env={**os.environ, **proxy_env()}, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stderr is not None
            first = _lines(proc.stderr).get(timeout=60)  # bounded: the proxy is up or has failed by then
            found = LISTENING.match(first)
            assert found, first
            url, port, said_upstream = found.groups()
            assert int(port) > 0 and said_upstream == upstream
            assert anyio.run(call, url) == anyio.run(call, upstream)  # the printed URL is the one that works
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
    assert proc.returncode == 0
