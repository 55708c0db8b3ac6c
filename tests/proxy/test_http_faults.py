"""The HTTP proxy under upstream faults and hostile load: a call is never sent twice, an upstream that fails
a call moves the error counters, what the upstream refused is not counted as a call, SSE priming events are
not invalid messages, the proxy starts (and recovers) while its upstream is down, one client address cannot
take every connection slot, and credentials in --upstream are never printed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx2 as httpx
import pytest

from .conftest import free_port, listening, proxy_argv, proxy_env, sample, scrape, wait_for
from .test_http import _serve, http_proxy, read_body
from .test_http_relay import _echo_app, _exchange, _with_relay

CALL = b'{"jsonrpc": "2.0", "id": %d, "method": "tools/call", "params": {"name": "t", "arguments": {}}}'
JSON = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


def _read_request(conn: socket.socket, data: bytes) -> tuple[bytes, bytes] | None:
    """(one whole request by Content-Length, what was read past it), or None at EOF."""
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        if not more:
            return None
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(rest) < length:
        more = conn.recv(65536)
        if not more:
            return None
        rest += more
    return head + b"\r\n\r\n" + rest[:length], rest[length:]


@contextlib.contextmanager
def _raw_upstream(answer: Callable[[int, bytes], tuple[bytes, bool] | None],
                  port: int = 0) -> Iterator[tuple[int, list[bytes]]]:
    """A raw HTTP/1.1 upstream in a thread: ``answer(n, request)`` for the n-th request on a connection gives
    the bytes to send back and whether to close then, or None to close without answering. Yields (port,
    requests seen)."""
    seen: list[bytes] = []
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()

    def connection(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            data, n = b"", 0
            while (got := _read_request(conn, data)) is not None:
                request, data = got
                seen.append(request)
                reply = answer(n, request)
                n += 1
                if reply is None:
                    return
                conn.sendall(reply[0])
                if reply[1]:
                    return

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                threading.Thread(target=connection, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1], seen
    finally:
        listener.close()


def _json_reply(body: bytes, status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) \
        + body


def test_a_call_the_upstream_may_have_received_is_never_sent_again() -> None:
    """The second call goes out on the pooled connection; the upstream reads it and closes without answering.
    The proxy must not send it again on a fresh connection (the tool would run twice): 502, a JSON-RPC error."""

    def answer(n: int, request: bytes) -> tuple[bytes, bool] | None:
        if n == 0:
            return _json_reply(b'{"jsonrpc": "2.0", "id": 1, "result": {}}'), False
        return None  # read the request (the tool runs), then die without answering

    with _raw_upstream(answer) as (upstream_port, seen):
        async def work(port: int) -> list[bytes]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            out = []
            for i, close in ((1, b""), (2, b"Connection: close\r\n")):
                writer.write(b"POST /mcp HTTP/1.1\r\nHost: x\r\n" + close
                             + b"Content-Length: %d\r\n\r\n" % len(CALL % i) + CALL % i)
                await writer.drain()
                out.append(await reader.readuntil(b"\r\n\r\n") if i == 1 else await reader.read())
                if i == 1:
                    await reader.readexactly(len(b'{"jsonrpc": "2.0", "id": 1, "result": {}}'))
            writer.close()
            return out

        first, second = asyncio.run(_with_relay(upstream_port, work))
    assert first.startswith(b"HTTP/1.1 200 ")
    calls = [r for r in seen if r.endswith(CALL % 2)]
    assert len(calls) == 1, f"the call went upstream {len(calls)} times"
    assert second.startswith(b"HTTP/1.1 502 ")
    body = json.loads(second.partition(b"\r\n\r\n")[2])
    assert body["id"] == 2 and body["error"]["code"] == -32000


def test_one_client_address_cannot_take_every_slot() -> None:
    """Slow bodies from 127.0.0.2 hold at most its share of the slots; 127.0.0.1 is still served."""

    async def work(port: int) -> tuple[list[bytes], bytes]:
        slow = []
        for _ in range(4):  # the whole cap, from one address
            sock = socket.socket()
            sock.bind(("127.0.0.2", 0))
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
            reader, writer = await asyncio.open_connection(sock=sock)
            writer.write(b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")  # and no more
            await writer.drain()
            slow.append((reader, writer))
        await asyncio.sleep(0.2)  # the relay took them in (a hang guard bounds the rest, no timing asserted)
        refused = [await reader.read() for reader, _ in slow[2:]]  # beyond the share: answered 503, closed
        other = await _exchange(port, b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                                      b"Connection: close\r\n\r\n{}")
        for _, writer in slow:
            writer.close()
        return refused, other

    with _serve(_echo_app) as upstream_port:
        refused, other = asyncio.run(_with_relay(upstream_port, work, max_connections=4))
    assert all(answer.startswith(b"HTTP/1.1 503 ") for answer in refused)
    assert other.startswith(b"HTTP/1.1 200 ") and b'"size": 2' in other


async def _judging_app(scope: Any, receive: Any, send: Any) -> None:
    """An upstream that refuses what an MCP server refuses (413 over 1 MB, 400 for a batch, 415 without JSON)
    and answers a call over SSE after a priming event (an id, empty data), as 2025-11-25 servers do."""
    if scope["type"] != "http":
        return
    body = await read_body(receive)
    headers = dict(scope["headers"])
    status = 413 if len(body) > 1_000_000 else 400 if body.startswith(b"[") \
        else 415 if headers.get(b"content-type") != b"application/json" else 200
    if status != 200:
        out = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "no"}}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": out})
        return
    request = json.loads(body)
    result = {"jsonrpc": "2.0", "id": request["id"], "result": {"content": [{"type": "text", "text": "done"}]}}
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "body": b"id: prime-1\ndata: \n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"event: message\nid: 2\ndata: " + json.dumps(result).encode()
                + b"\n\n"})


@pytest.mark.parametrize("guard_mode", ["off", "observe"])  # the guarded relay parses SSE events itself
def test_refused_requests_are_not_calls_and_priming_events_are_not_invalid(
    guard_mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCP_TOKEN_OTEL_GUARD_MODE", guard_mode)
    big = b'{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "t", "arguments": {"x": "%s"}}}' \
        % (b"a" * 2_000_000)
    with _serve(_judging_app) as port, http_proxy(f"http://127.0.0.1:{port}/mcp") as (base, mport), \
            httpx.Client(timeout=30) as client:
        refused = [client.post(base + "/mcp", content=big, headers=JSON),  # 413, streamed through
                   client.post(base + "/mcp", content=CALL % 7, headers=JSON | {"content-type": "text/plain"}),
                   client.post(base + "/mcp", content=b"[" + CALL % 8 + b"]", headers=JSON)]
        assert [r.status_code for r in refused] == [413, 415, 400]
        ok = client.post(base + "/mcp", content=CALL % 1, headers=JSON)
        assert ok.status_code == 200 and b'"done"' in ok.content

        def measured() -> str | None:
            text = _metrics(mport)
            return text if sample(text, "mcp_token_proxy_messages_total", kind="response") >= 1 else None

        text = wait_for(measured, what="the accepted call measured")
    if guard_mode == "off":  # a guarded tools/call is measured before it goes upstream (docs/proxy.md)
        assert sample(text, "mcp_token_proxy_messages_total", direction="client_to_server", kind="request") == 1
    assert sample(text, "mcp_token_proxy_messages_total", kind="invalid") == 0
    assert sample(text, "mcp_token_call_errors_total", side="proxy") == 0


def _metrics(port: int) -> str:
    """/metrics, or nothing while the measuring process is still starting."""
    try:
        return scrape(port)
    except OSError:
        return ""


def _errors(mport: int, error_type: str) -> float:
    return sample(_metrics(mport), "mcp_token_call_errors_total", side="proxy", error_type=error_type)


def test_starts_while_the_upstream_is_down_and_counts_the_failed_calls() -> None:
    """Down: live, not ready, a 502 with the call's JSON-RPC error, counted as upstream_unavailable. Up: the
    same proxy relays and is ready. An upstream that dies mid-answer: counted as upstream_closed."""
    dead = free_port()

    def answer(n: int, request: bytes) -> tuple[bytes, bool] | None:
        if b'"id": 3' in request:  # a streamed answer cut short: the upstream dies mid-call
            return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                    b"5\r\n: hi\n\r\n"), True
        return _json_reply(b'{"jsonrpc": "2.0", "id": 2, "result": {}}'), False

    with http_proxy(f"http://127.0.0.1:{dead}/mcp") as (base, mport), httpx.Client(timeout=30) as client:
        assert client.get(base + "/livez").status_code == 200
        assert client.get(base + "/readyz").status_code == 503
        down = client.post(base + "/mcp", content=CALL % 1, headers=JSON)
        assert down.status_code == 502
        assert down.json()["id"] == 1 and down.json()["error"]["code"] == -32000
        wait_for(lambda: _errors(mport, "upstream_unavailable") >= 1, what="the unavailable call counted")
        with _raw_upstream(answer, dead) as (_, seen):
            up = client.post(base + "/mcp", content=CALL % 2, headers=JSON)
            assert up.status_code == 200 and up.json()["id"] == 2
            assert client.get(base + "/readyz").status_code == 200
            with contextlib.suppress(httpx.HTTPError):  # the head came; the body ends where the upstream died
                client.post(base + "/mcp", content=CALL % 3, headers=JSON)
        assert not any(b"/readyz" in request or b"/livez" in request for request in seen)
        wait_for(lambda: _errors(mport, "upstream_closed") >= 1, what="the closed call counted")


def test_upstream_credentials_are_never_printed() -> None:
    secret = "s3cret-pw"
    dead = free_port()
    env = {**os.environ, **proxy_env()}
    bad = subprocess.run(proxy_argv("--listen", "127.0.0.1:0", "--upstream", f"http://u:{secret}@127.0.0.1:99999/"),
                         capture_output=True, text=True, env=env, timeout=30)
    assert bad.returncode == 2 and "--upstream" in bad.stderr and secret not in bad.stderr + bad.stdout
    port = free_port()
    proc = subprocess.Popen(proxy_argv("--listen", f"127.0.0.1:{port}", "--upstream",
                                       f"http://u:{secret}@127.0.0.1:{dead}/mcp", "--log-level", "debug"),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: listening(port) or proc.poll() is not None, what="the proxy listening")
        with httpx.Client(timeout=30) as client:
            answer = client.post(f"http://127.0.0.1:{port}/mcp?token=abc", content=CALL % 1, headers=JSON)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert answer.status_code == 502
    assert "127.0.0.1" in err  # the debug line and the failure are there, without the password
    for text in (bad.stdout, bad.stderr, out, err, answer.text):
        assert secret not in text
