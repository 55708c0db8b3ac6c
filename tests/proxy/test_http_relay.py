"""The raw HTTP/1.1 relay: keep-alive both sides, chunked and large bodies streamed, strict limits against
misbehaving clients (head deadline, head size, smuggling-prone framing, connection cap).

The limit tests run the relay in this process with small limits and a measuring side that only counts;
the others run the proxy as a subprocess in front of a real ASGI server."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
import types
import urllib.parse
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pytest

from mcp_token_otel.proxy import http as relay_module
from mcp_token_otel.proxy.http import HttpProxy, Relay

from .conftest import free_port, listening, wait_for
from .test_http import _serve, http_proxy


async def _echo_app(scope: Any, receive: Any, send: Any) -> None:
    """Answers with the body's size and digest, and the client address the server saw (to see reuse)."""
    if scope["type"] != "http":
        return
    digest, size = hashlib.sha256(), 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        digest.update(chunk)
        size += len(chunk)
        if not message.get("more_body"):
            break
    out = f'{{"size": {size}, "sha": "{digest.hexdigest()}", "peer": {scope["client"][1]}}}'.encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": out})


@pytest.fixture(scope="module")
def echo_proxy() -> Iterator[str]:
    with _serve(_echo_app) as port, http_proxy(f"http://127.0.0.1:{port}/mcp") as (base, _):
        yield base


def test_keep_alive_both_sides(echo_proxy: str) -> None:
    """Sequential requests on one client connection reuse one upstream connection."""
    with httpx.Client(timeout=10) as client:
        answers = [client.post(echo_proxy + "/mcp", content=b'{"jsonrpc": "2.0", "id": %d, "method": "ping"}' % i)
                   for i in range(20)]
    assert all(a.status_code == 200 for a in answers)
    assert len({a.json()["peer"] for a in answers}) == 1


def test_chunked_and_large_bodies_streamed(echo_proxy: str) -> None:
    blob = bytes(range(256)) * 40_000  # 10 MB: above the whole-body limit, streamed

    def pieces() -> Iterator[bytes]:
        for i in range(0, len(blob), 100_000):
            yield blob[i:i + 100_000]

    with httpx.Client(timeout=30) as client:
        chunked = client.post(echo_proxy + "/mcp", content=pieces())  # no length: Transfer-Encoding chunked
        sized = client.post(echo_proxy + "/mcp", content=blob)
    expected = {"size": len(blob), "sha": hashlib.sha256(blob).hexdigest()}
    for answer in (chunked, sized):
        assert answer.status_code == 200
        assert {k: answer.json()[k] for k in expected} == expected


class _Counting:
    """The measuring side's interface, counting only: these tests are about the relay's limits."""

    def __init__(self) -> None:
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        def call(*_args: Any, **_kwargs: Any) -> object:
            self.calls += 1
            return types.SimpleNamespace()  # a stream or tracker handle

        return call


class _Telemetry:
    measurer = _Counting()


async def _with_relay(upstream_port: int, work: Any, **options: Any) -> Any:
    proxy = HttpProxy(f"http://127.0.0.1:{upstream_port}/mcp", "127.0.0.1", 0, **options)
    relay = Relay(proxy, _Telemetry())
    server = await asyncio.start_server(relay.serve, "127.0.0.1", 0, limit=relay_module.MAX_HEAD)
    port = server.sockets[0].getsockname()[1]
    try:
        return await asyncio.wait_for(work(port), 30)  # a hang guard, not a timing assertion
    finally:
        server.close()
        await relay.shutdown(1.0)
        relay.upstream.close()


async def _exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` and read until the proxy closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


def test_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_module, "HEADER_TIMEOUT", 0.3)
    with _serve(_echo_app) as upstream_port:
        async def work(port: int) -> dict[str, Any]:
            out: dict[str, Any] = {}
            # Slowloris: a head that never ends is cut at the deadline (closed without an answer).
            out["slow"] = await _exchange(port, b"POST /mcp HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n")
            out["huge"] = await _exchange(port, b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
            out["smuggle"] = await _exchange(
                port, b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n")
            out["fold"] = await _exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n")
            out["ok"] = await _exchange(
                port, b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
            # The connection cap: idle connections beyond it are answered 503 and closed.
            idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
            await asyncio.sleep(0)
            out["capped"] = await _exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            for _, writer in idle:
                writer.close()
            return out

        out = asyncio.run(_with_relay(upstream_port, work, max_connections=3, peer_share=1.0))
    assert out["slow"] == b""
    assert out["huge"].startswith(b"HTTP/1.1 431 ")
    assert out["smuggle"].startswith(b"HTTP/1.1 400 ")
    assert out["fold"].startswith(b"HTTP/1.1 400 ")
    assert out["ok"].startswith(b"HTTP/1.1 200 ") and b'"size": 2' in out["ok"]
    assert out["capped"].startswith(b"HTTP/1.1 503 ")


async def _answer(reader: asyncio.StreamReader) -> bytes:
    """One answer on a kept-alive connection: its head, then its body by length or chunked."""
    head = await reader.readuntil(b"\r\n\r\n")
    fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line)
    fields = {name.lower(): value for name, value in fields.items()}
    if b"content-length" in fields:
        return head + await reader.readexactly(int(fields[b"content-length"]))
    return head + await reader.readuntil(b"0\r\n\r\n")


def test_idle_connections_close_and_busy_ones_stay(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kept-alive connection idle past KEEPALIVE_IDLE is closed; one whose requests keep coming, each
    within that time, stays open however long it lasts in all."""
    monkeypatch.setattr(relay_module, "KEEPALIVE_IDLE", 0.5)
    with _serve(_echo_app) as upstream_port:
        async def work(port: int) -> tuple[list[bytes], bytes]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            answers = []
            for _ in range(8):  # 0.2 s apart: 1.6 s in all, three times the idle deadline
                writer.write(b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
                answers.append(await _answer(reader))
                await asyncio.sleep(0.2)
            closed = await asyncio.wait_for(reader.read(), 10)  # idle now: the proxy closes it
            writer.close()
            return answers, closed

        answers, closed = asyncio.run(_with_relay(upstream_port, work))
    assert [a.split(b"\r\n", 1)[0] for a in answers] == [b"HTTP/1.1 200 OK"] * 8
    assert closed == b""


def test_expect_continue_and_http10(echo_proxy: str) -> None:
    url = urllib.parse.urlsplit(echo_proxy)

    async def work() -> tuple[bytes, bytes, bytes]:
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        writer.write(b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        await writer.drain()
        interim = await reader.readuntil(b"\r\n\r\n")  # the client may now send its body
        writer.write(b"abcd")
        final = await reader.readuntil(b"\r\n\r\n")
        writer.close()
        old = await _exchange(url.port or 80, b"POST /mcp HTTP/1.0\r\nHost: x\r\nContent-Length: 1\r\n\r\nz")
        return interim, final, old

    interim, final, old = asyncio.run(asyncio.wait_for(work(), 30))
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert final.startswith(b"HTTP/1.1 200 ")
    assert old.startswith(b"HTTP/1.1 200 ") and b'"size": 1' in old  # HTTP/1.0: answered, then closed


def test_upstream_closing_connections_and_eof_bodies() -> None:
    """An upstream that closes every connection after answering (no Connection: close), and one that ends
    its body by closing (no length, not chunked): every request through the proxy still gets the whole answer,
    the client connection stays alive (the EOF-delimited body is re-framed chunked)."""
    port = free_port()
    script = (
        "import socket\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('127.0.0.1', {port})); s.listen()\n"
        "n = 0\n"
        "while True:\n"
        "    c, _ = s.accept()\n"
        "    data = b''\n"
        "    while b'\\r\\n\\r\\n' not in data:\n"
        "        more = c.recv(65536)\n"
        "        if not more: break\n"
        "        data += more\n"
        "    if data:\n"
        "        n += 1\n"
        "        body = b'{\"n\": %d}' % n\n"
        "        if data.startswith(b'GET /eof'):\n"
        "            c.sendall(b'HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\n\\r\\n' + body)\n"
        "        else:\n"
        "            head = b'HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\n'\n"
        "            c.sendall(head + b'content-length: %d\\r\\n\\r\\n' % len(body) + body)\n"
        "    c.close()\n"
    )
    upstream = subprocess.Popen([sys.executable, "-c", script])
    try:
        wait_for(lambda: listening(port), what="fake upstream")
        with http_proxy(f"http://127.0.0.1:{port}/mcp") as (base, _), httpx.Client(timeout=10) as client:
            answers = [client.get(base + ("/eof" if i % 2 else "/mcp")) for i in range(10)]
            assert all(a.status_code == 200 and b'"n": ' in a.content for a in answers)
            assert answers[1].headers.get("transfer-encoding") == "chunked"
            assert len({a.json()["n"] for a in answers}) == 10  # each answered by the upstream, none lost
    finally:
        upstream.kill()
        upstream.wait()
