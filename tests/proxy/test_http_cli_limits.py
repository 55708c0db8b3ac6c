"""The HTTP proxy's connection limits and body deadline, set from the command line."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from mcp_token_otel.cli.main import main
from tests.helpers.support import free_port

from .conftest import proxy_argv, proxy_env


class _Ok(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer()

    def do_GET(self) -> None:
        self._answer()

    def _answer(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/mcp"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--max-connections", "0", "argument --max-connections: expected a whole number, 1 or more, got '0'"),
    ("--peer-share", "1.5", "argument --peer-share: expected a fraction above 0 and at most 1, got '1.5'"),
    ("--peer-share", "0", "argument --peer-share: expected a fraction above 0 and at most 1, got '0'"),
    ("--body-timeout", "0", "argument --body-timeout: expected a number of seconds above 0, got '0'"),
    ("--body-timeout", "soon", "argument --body-timeout: expected a number of seconds, 0 or more, got 'soon'"),
])
def test_bad_limits_name_the_flag(flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["proxy", "--listen", "127.0.0.1:1", "--upstream", "http://127.0.0.1:1/mcp", flag, value])
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_limits_are_for_the_http_proxy_only() -> None:
    done = subprocess.run(proxy_argv("--max-connections", "4", "--body-timeout", "5", "--", "true"),
                          capture_output=True, text=True, timeout=60, env={**os.environ, **proxy_env()})
    assert done.returncode == 2
    assert "--max-connections, --body-timeout: for the HTTP proxy (--listen/--upstream)" in done.stderr


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(20)
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _wait_ready(port: int, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(200):  # bounded: 20 s
        assert proc.poll() is None, "the proxy exited"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if _read_all(sock).startswith(b"HTTP/1.1 200 "):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("the proxy never became live")


def test_the_flags_reach_the_proxy(upstream: str) -> None:
    """--max-connections 2 --peer-share 0.5: one slot per address, so a second connection from the same address
    is refused while the first dribbles its body; --body-timeout 0.5 then cuts the first."""
    port = free_port()
    proc = subprocess.Popen(proxy_argv("--listen", f"127.0.0.1:{port}", "--upstream", upstream,
                                       "--max-connections", "2", "--peer-share", "0.5", "--body-timeout", "0.5"),
                            env={**os.environ, **proxy_env()}, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(port, proc)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as slow:
            slow.sendall(b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
            time.sleep(0.1)  # the proxy takes the slow connection in first (no timing is asserted)
            with socket.create_connection(("127.0.0.1", port), timeout=5) as second:
                second.sendall(b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
                assert _read_all(second).startswith(b"HTTP/1.1 503 ")
            cut = _read_all(slow)  # the body deadline passes: the connection is answered or closed, never held
        assert cut == b"" or cut.startswith(b"HTTP/1.1 4")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as after:
            after.sendall(b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
            assert _read_all(after).startswith(b"HTTP/1.1 200 ")
    finally:
        proc.terminate()
        proc.wait(timeout=20)
