"""The HTTP relay against hostile clients: ambiguous framing, over-long headers, pipelined requests, heads and
bodies dribbled byte by byte. Every refusal is an HTTP answer the client can read (not a reset).

The relay runs in this process with short deadlines and a measuring side that only counts, in front of a real
ASGI server. No assertion is on time: each scenario is bounded by a hang guard.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from mcp_token_otel.proxy import http as relay_module

from .test_http import _serve
from .test_http_relay import _echo_app, _exchange, _with_relay


async def _closed(reader: asyncio.StreamReader) -> bool:
    """True when the proxy closed the connection without answering (EOF or reset)."""
    try:
        return await reader.read(1024) == b""
    except ConnectionResetError:
        return True


def _answers(data: bytes) -> list[tuple[bytes, bytes]]:
    """(status line, body) of each response in ``data`` (by Content-Length or chunked), in order."""
    out = []
    while data:
        head, _, data = data.partition(b"\r\n\r\n")
        status, *lines = head.split(b"\r\n")
        fields = {n.strip().lower(): v.strip() for n, _, v in (line.partition(b":") for line in lines)}
        if b"content-length" in fields:
            size = int(fields[b"content-length"])
            body, data = data[:size], data[size:]
        else:
            assert fields[b"transfer-encoding"] == b"chunked"
            body = b""
            while True:
                line, _, data = data.partition(b"\r\n")
                size = int(line, 16)
                body, data = body + data[:size], data[size + 2:]
                if not size:
                    break
        out.append((status, body))
    return out


def _run(work: Any, **options: Any) -> Any:
    with _serve(_echo_app) as upstream_port:
        return asyncio.run(_with_relay(upstream_port, work, **options))


def test_content_length_with_transfer_encoding_is_refused() -> None:
    async def work(port: int) -> list[bytes]:
        return [await _exchange(port, request) for request in (
            b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"POST /mcp HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc",
            b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        )]

    for answer in _run(work):
        assert answer.startswith(b"HTTP/1.1 400 ") and b"connection: close" in answer.lower()


def test_over_long_headers_are_answered_431_not_reset() -> None:
    async def work(port: int) -> list[bytes]:
        long_value = b"GET /mcp HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (relay_module.MAX_HEAD * 3) + b"\r\n\r\n"
        many = b"GET /mcp HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(300)) + b"\r\n"
        return [await _exchange(port, long_value), await _exchange(port, many),
                await _exchange(port, b"POST /mcp HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")]

    too_long, too_many, fine = _run(work)
    assert too_long.startswith(b"HTTP/1.1 431 ") and too_many.startswith(b"HTTP/1.1 431 ")
    assert fine.startswith(b"HTTP/1.1 200 ")  # still serving


def test_pipelined_and_keep_alive_requests_are_answered_in_order() -> None:
    """Requests sent back to back on one connection before any answer come back in their order, each whole;
    a malformed one at the end is refused after the good ones are answered."""
    sizes = [1, 22, 0, 333, 4_000]

    async def work(port: int) -> tuple[list[tuple[bytes, bytes]], bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        batch = b"".join(
            b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % n + b"b" * n if n
            else b"GET /mcp HTTP/1.1\r\nHost: x\r\n\r\n" for n in sizes)
        writer.write(batch + b"POST /mcp HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab")
        writer.write(b"cde\r\n0\r\n\r\nGET /mcp HTTP/1.1\r\nBad Header\r\n\r\n")
        await writer.drain()
        data = await reader.read()  # the proxy closes after refusing the last one
        writer.close()
        last = data[data.rindex(b"HTTP/1.1 "):]
        return _answers(data[:-len(last)] if last.startswith(b"HTTP/1.1 400") else data), last

    answers, last = _run(work)
    assert [status for status, _ in answers] == [b"HTTP/1.1 200 OK"] * (len(sizes) + 1)
    assert [json.loads(body)["size"] for _, body in answers] == [*sizes, 5]
    assert len({json.loads(body)["peer"] for _, body in answers}) == 1  # one kept-alive upstream connection
    assert last.startswith(b"HTTP/1.1 400 ")


def test_a_head_dribbled_byte_by_byte_is_cut_at_the_head_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_module, "HEADER_TIMEOUT", 0.3)

    async def work(port: int) -> tuple[bool, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        cut = False
        for byte in b"POST /mcp HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"z" * 10_000:
            if reader.at_eof():
                cut = True
                break
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except ConnectionError:
                cut = True
                break
            await asyncio.sleep(0.01)  # still sending: the deadline is for the whole head
        cut = cut or await _closed(reader)
        writer.close()
        return cut, await _exchange(port, b"GET /mcp HTTP/1.1\r\nConnection: close\r\n\r\n")

    cut, after = _run(work)
    assert cut and after.startswith(b"HTTP/1.1 200 ")


def test_a_body_dribbled_byte_by_byte_is_cut_at_the_body_deadline() -> None:
    async def work(port: int) -> tuple[bool, bool, bytes]:
        out = []
        for head in (b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n",  # read whole
                     b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n",  # streamed upstream
                     b"POST /mcp HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head)
            cut = False
            for _ in range(10_000):
                if reader.at_eof():
                    cut = True
                    break
                try:
                    writer.write(b"1\r\nx\r\n" if b"chunked" in head else b"x")
                    await writer.drain()
                except ConnectionError:
                    cut = True
                    break
                await asyncio.sleep(0.01)
            out.append(cut or await _closed(reader))
            writer.close()
        return out[0], out[1] and out[2], await _exchange(port, b"GET /mcp HTTP/1.1\r\nConnection: close\r\n\r\n")

    whole, streamed, after = _run(work, body_timeout=0.3)
    assert whole and streamed and after.startswith(b"HTTP/1.1 200 ")


async def _sized_app(scope: Any, receive: Any, send: Any) -> None:
    """Answers with a length (uvicorn drops the body of a HEAD answer and keeps its length), 204 on /none."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    if scope["path"] == "/none":
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b'{"peer": %d}' % scope["client"][1]
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


def test_answers_without_body_then_more_on_one_upstream_connection() -> None:
    """HEAD answers (a length, no body) and 204s between other requests on one kept-alive connection: every
    answer whole and in order, one upstream connection throughout (each answer is read from where the one
    before ended)."""
    requests = [(b"HEAD", b"/mcp"), (b"GET", b"/mcp"), (b"GET", b"/none"), (b"POST", b"/mcp"), (b"HEAD", b"/mcp"),
                (b"GET", b"/none"), (b"GET", b"/mcp")]

    async def work(port: int) -> list[tuple[bytes, bytes]]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        out = []
        for method, path in requests:
            body = b"{}" if method == b"POST" else b""
            writer.write(method + b" " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
                         + body)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            fields = {n.strip().lower(): v.strip() for n, _, v in
                      (line.partition(b":") for line in head.split(b"\r\n")[1:] if line)}
            size = 0 if method == b"HEAD" else int(fields.get(b"content-length", b"0"))
            out.append((head.split(b"\r\n", 1)[0], await reader.readexactly(size)))
        writer.close()
        return out

    with _serve(_sized_app) as upstream_port:
        answers = asyncio.run(_with_relay(upstream_port, work))
    assert [status for status, _ in answers] == [
        b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK", b"HTTP/1.1 204 No Content", b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK",
        b"HTTP/1.1 204 No Content", b"HTTP/1.1 200 OK"]
    peers = {json.loads(body)["peer"] for _, body in answers if body}
    assert len(peers) == 1 and len([body for _, body in answers if body]) == 3


async def _big_app(scope: Any, receive: Any, send: Any) -> None:
    """16 MB in 64 KB pieces: by length on /sized, else a stream (chunked)."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    piece = bytes(range(256)) * 256
    headers = [(b"content-type", b"application/octet-stream")]
    if scope["path"] == "/sized":
        headers.append((b"content-length", b"%d" % (len(piece) * 256)))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for i in range(256):
        await send({"type": "http.response.body", "body": piece, "more_body": i < 255})


def test_a_slow_reader_gets_every_byte() -> None:
    """A client reading a 16 MB answer slowly (small reads, pauses): the relay waits for it (its writes stay
    bounded by the socket's pace) and every byte arrives in order: by length, and streamed, until close or
    chunked."""
    expected = (bytes(range(256)) * 256) * 256

    async def work(port: int) -> list[bytes]:
        out = []
        for path, close in ((b"/sized", True), (b"/stream", True), (b"/stream", False)):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 16)
            writer.write(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + (b"Connection: close\r\n" if close else b"")
                         + b"\r\n")
            await writer.drain()
            data = bytearray()
            while not data.endswith(b"\r\n0\r\n\r\n"):  # a chunked stream's end (the bytes never end so)
                chunk = await reader.read(16384)
                if not chunk:
                    break
                data += chunk
                if len(data) % (1 << 20) < 16384:
                    await asyncio.sleep(0.01)  # now and then, the client stops reading
            writer.close()
            head, _, body = bytes(data).partition(b"\r\n\r\n")
            out.append(_unchunk(body) if b"transfer-encoding: chunked" in head.lower() else body)
        return out

    with _serve(_big_app) as upstream_port:
        sized, until_close, chunked = asyncio.run(_with_relay(upstream_port, work))
    assert sized == expected
    assert until_close == expected
    assert chunked == expected


def _unchunk(body: bytes) -> bytes:
    out, at = bytearray(), 0
    while True:
        end = body.index(b"\r\n", at)
        size = int(body[at:end], 16)
        if not size:
            return bytes(out)
        out += body[end + 2:end + 2 + size]
        at = end + 2 + size + 2
