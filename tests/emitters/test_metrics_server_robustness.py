"""The standalone /metrics server against hostile HTTP: ambiguous framing, over-long headers, pipelined
requests and bodies dribbled byte by byte. Every refusal is an HTTP answer the client can read (not a reset).

No assertion is on time; waits are bounded and fail with a message.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from mcp_token_otel.emitters.metrics_server import DEFAULT_WORKERS, MetricsServer
from mcp_token_otel.emitters.request_head import MAX_REQUEST_HEAD

from .test_metrics_server import wait_for


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    registry = CollectorRegistry()
    Counter("demo_things", "things", registry=registry).inc(3)
    running = MetricsServer.start("127.0.0.1", 0, registry, request_timeout=30.0)
    yield running
    running.close()


def _read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes; a reset fails the test (the answer must be readable)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _answers(data: bytes) -> list[tuple[bytes, dict[bytes, bytes], bytes]]:
    """The responses in ``data``, each (status line, headers, body by Content-Length)."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        status, *lines = head.split(b"\r\n")
        headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(b":") for line in lines)}
        size = int(headers[b"content-length"])
        out.append((status, headers, rest[:size]))
        data = rest[size:]
    return out


def _exchange(server: MetricsServer, request: bytes) -> list[tuple[bytes, dict[bytes, bytes], bytes]]:
    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        sock.sendall(request)
        return _answers(_read_all(sock))


def test_content_length_with_transfer_encoding_is_refused(server: MetricsServer) -> None:
    for request in (
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc",
    ):
        [(status, headers, _)] = _exchange(server, request)
        assert status == b"HTTP/1.1 400 Bad Request" and headers[b"connection"] == b"close"
    wait_for(lambda: server.open_connections == 0, "every connection to be closed")


def test_an_over_long_header_is_answered_431_not_reset(server: MetricsServer) -> None:
    big = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (MAX_REQUEST_HEAD * 12) + b"\r\n\r\n"
    [(status, headers, body)] = _exchange(server, big)
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large" and body == b""
    assert headers[b"connection"] == b"close"
    many = b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 60) for i in range(400)) + b"\r\n"
    [(status, _, _)] = _exchange(server, many)
    assert status.startswith(b"HTTP/1.1 431 ")
    [(status, _, body)] = _exchange(server, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")  # still serving
    assert status == b"HTTP/1.1 200 OK" and b"demo_things_total 3.0" in body
    wait_for(lambda: server.open_connections == 0, "every connection to be closed")


def test_pipelined_requests_get_the_first_answer_whole_then_a_close(server: MetricsServer) -> None:
    """Every answer closes its connection: of two pipelined requests the first is answered in full, the
    second not at all (never half an answer or one out of order); the client sends it again."""
    two = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nHEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    [(status, headers, body)] = _exchange(server, two)
    assert status == b"HTTP/1.1 200 OK" and headers[b"connection"] == b"close"
    assert b"demo_things_total 3.0" in body


def test_a_body_dribbled_byte_by_byte_holds_no_worker(server: MetricsServer) -> None:
    """A request whose body never ends is answered at once (the body is never read) and its connection closed;
    while many such clients dribble, the workers stay free for scrapes."""
    clients = []
    try:
        for _ in range(DEFAULT_WORKERS * 2):
            sock = socket.create_connection((server.host, server.port), timeout=30)
            sock.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
            clients.append(sock)
        for sock in clients:  # answered while their bodies are still coming
            [(status, headers, _)] = _answers(_read_all(sock))
            assert status.startswith(b"HTTP/1.1 405 ") and headers[b"connection"] == b"close"
        [(status, _, body)] = _exchange(server, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == b"HTTP/1.1 200 OK" and b"demo_things_total" in body
        assert sum(t.name.startswith("mcp-token-otel-http") for t in threading.enumerate()) == 1 + DEFAULT_WORKERS
    finally:
        for sock in clients:
            sock.close()
    wait_for(lambda: server.open_connections == 0, "every connection to be closed")


def test_a_head_dribbled_byte_by_byte_is_cut_at_the_deadline() -> None:
    """The deadline is for the whole head: a client sending one byte at a time is still cut off."""
    registry = CollectorRegistry()
    server = MetricsServer.start("127.0.0.1", 0, registry, request_timeout=0.5)
    try:
        with socket.create_connection((server.host, server.port), timeout=30) as sock:
            closed = False
            for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"z" * 10_000:
                try:
                    sock.sendall(bytes([byte]))
                    threading.Event().wait(0.01)
                except OSError:  # the server hung up
                    closed = True
                    break
            if not closed:
                sock.settimeout(30)
                try:
                    closed = sock.recv(1024) == b""
                except ConnectionResetError:
                    closed = True
        assert closed
        wait_for(lambda: server.timed_out == 1, "the slow client to be cut off")
    finally:
        server.close()
