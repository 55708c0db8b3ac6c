"""The streamable-HTTP reverse proxy: a small ASGI app (served by uvicorn) with an httpx2 streaming client.

Every request goes to the upstream's origin at the same path and query (the MCP endpoint, the OAuth
``/.well-known/...`` metadata, anything else), with every header but the hop-by-hop ones. ``Host`` and
``Origin`` go unchanged too: a server's DNS-rebinding protection sees what the client sent, exactly as
without the proxy (rewriting Host would let a rebinding page through a protecting server). Status,
headers (``Mcp-Session-Id``, ``WWW-Authenticate``...) and body come back untouched, body chunks relayed as
they arrive (``aiter_raw``: no decompression, no re-framing); ASGI ``send`` waits while the client's
socket is full, and the upstream is read no faster (backpressure). A client that goes away mid-stream
cancels the upstream request.

Measuring: POST bodies (client to server) and JSON or SSE response bodies (server to client) are handed to
the measuring queue chunk by chunk just before they are forwarded. Sessions are keyed by ``Mcp-Session-Id``;
a request without one (``initialize``, stateless servers) is its own exchange.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import urllib.parse
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx2 as httpx

from .jsonrpc import A_SERVER_NAME, BODY, C2S, S2C, SSE
from .telemetry import StartupError, check_port_free

logger = logging.getLogger("mcp_token_otel.proxy")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"transfer-encoding", b"upgrade",
})
MAX_SESSIONS = 10_000
#: Request bodies up to this size are read whole before they go upstream (one write); larger ones stream.
SMALL_BODY = 4 * 1024 * 1024


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for key, value in headers:
        if key.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise StartupError(f"--listen: expected HOST:PORT (e.g. 127.0.0.1:8080), got {value!r}")
    return (host.strip("[]") or "127.0.0.1"), int(port)


class HttpProxy:
    def __init__(self, upstream: str, host: str, port: int, *, name: str | None = None) -> None:
        url = urllib.parse.urlsplit(upstream)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise StartupError(f"--upstream: expected an http:// or https:// URL, got {upstream!r}")
        self.upstream = upstream
        self.origin = f"{url.scheme}://{url.netloc}"
        self.upstream_host = url.hostname
        self.upstream_port = url.port or (443 if url.scheme == "https" else 80)
        self.host, self.port = host, port
        self.name = name or url.hostname

    def check(self) -> None:
        check_port_free(self.host, self.port, "the proxy")
        try:
            socket.create_connection((self.upstream_host, self.upstream_port), timeout=5).close()
        except OSError as exc:
            raise StartupError(f"upstream unreachable: {self.upstream} ({exc.strerror or exc})") from None

    def run(self, telemetry: Any) -> int:
        import uvicorn

        app = ProxyApp(self, telemetry)
        config = uvicorn.Config(app, host=self.host, port=self.port, log_level="warning", lifespan="off",
                                access_log=False, timeout_graceful_shutdown=2)
        server = uvicorn.Server(config)
        # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say so; set on the listener too
        # (accepted sockets inherit it). Without it Nagle and delayed ACKs add ~40 ms to small responses.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise StartupError(f"cannot listen for the proxy on {self.host}:{self.port}: {exc.strerror}") from None
        sock.listen(1024)
        self.port = sock.getsockname()[1]
        logger.info("mcp-token-otel proxy: http://%s:%d -> %s", self.host, self.port, self.upstream)

        async def main() -> None:
            timeout = httpx.Timeout(10.0, read=None, write=None, pool=None)
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=200)
            attach = getattr(telemetry.measurer, "attach_loop", None)
            if attach is not None:  # measuring in its own process: hand records over from this loop
                attach(asyncio.get_running_loop())
            async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
                app.client = client
                try:
                    await server.serve(sockets=[sock])
                finally:
                    app.close_sessions()
                    detach = getattr(telemetry.measurer, "detach_loop", None)
                    if detach is not None:
                        detach()

        # uvicorn handles SIGINT/SIGTERM while serving, then raises them again for the previous handlers: make
        # those no-ops, so a signal is a graceful stop that still flushes spans and metrics (exit status 0).
        previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            asyncio.run(main())
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 0


class ProxyApp:
    """The ASGI application: relay, then measure off the path."""

    def __init__(self, proxy: HttpProxy, telemetry: Any) -> None:
        self.proxy = proxy
        self.telemetry = telemetry
        self.client: httpx.AsyncClient | None = None
        self.sessions: OrderedDict[str, Any] = OrderedDict()
        self._urls: dict[tuple[bytes, bytes], httpx.URL] = {}
        self._attrs = {"server.address": proxy.upstream_host, "server.port": proxy.upstream_port,
                       A_SERVER_NAME: proxy.name}

    # ------------------------------------------------------------------ sessions

    def _tracker(self, session_id: str | None) -> Any:
        measurer = self.telemetry.measurer
        if session_id is None:  # its own exchange: closed when the response ends
            return measurer.tracker(session_key=None, transport="tcp", attributes=self._attrs)
        tracker = self.sessions.get(session_id)
        if tracker is None:
            tracker = measurer.tracker(session_key=session_id, session_id=session_id, transport="tcp",
                                       attributes=self._attrs)
            self.sessions[session_id] = tracker
            if len(self.sessions) > MAX_SESSIONS:  # sessions never DELETEd: the oldest goes
                _, oldest = self.sessions.popitem(last=False)
                measurer.close_tracker(oldest)
        else:
            self.sessions.move_to_end(session_id)
        return tracker

    def _end_session(self, session_id: str) -> None:
        tracker = self.sessions.pop(session_id, None)
        if tracker is not None:
            self.telemetry.measurer.close_tracker(tracker)

    def close_sessions(self) -> None:
        for session_id in list(self.sessions):
            self._end_session(session_id)

    # ------------------------------------------------------------------ ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        client = self.client
        assert client is not None
        measurer = self.telemetry.measurer
        method: str = scope["method"]
        path = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string") or b""
        url = self._urls.get((path, query))
        if url is None:  # parsed once per path and query (an MCP client uses one endpoint)
            target = path.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")
            url = httpx.URL(self.proxy.origin + target)
            if len(self._urls) < 1024:
                self._urls[(path, query)] = url
        headers: list[tuple[bytes, bytes]] = []
        session_id: str | None = None
        version: str | None = None
        for key, value in scope["headers"]:
            lower = key.lower()
            if lower in HOP_BY_HOP:
                continue
            if lower == b"mcp-session-id":
                session_id = value.decode("latin-1")
            elif lower == b"mcp-protocol-version":
                version = value.decode("latin-1")
            headers.append((key, value))
        measure = not path.startswith(b"/.well-known/")
        tracker = self._tracker(session_id) if measure else None
        if tracker is not None and version:
            measurer.set_tracker(tracker, protocol_version=version)
        up: Any = measurer.stream(tracker, C2S, BODY) if tracker and method == "POST" else None
        body_done = asyncio.Event()
        disconnected = asyncio.Event()

        async def body() -> AsyncIterator[bytes]:
            try:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        disconnected.set()
                        return
                    chunk = message.get("body", b"")
                    if chunk:
                        if up is not None:
                            measurer.put(up, chunk)
                        yield chunk
                    if not message.get("more_body", False):
                        return
            finally:
                body_done.set()

        length = _content_length(scope["headers"])
        content: Any = None
        if length is not None and length <= SMALL_BODY:  # the usual POST: whole, then sent in one go
            parts = [chunk async for chunk in body()]
            if disconnected.is_set():
                return
            content = b"".join(parts)
        elif length is not None or any(k.lower() == b"transfer-encoding" for k, _ in scope["headers"]):
            content = body()  # large or chunked: streamed to the upstream as it arrives
        else:  # GET, DELETE...: take the (empty) body message now; httpx sends no body headers
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body_done.set()
        request = client.build_request(method, url, headers=headers, content=content)
        given = {k.lower().decode("latin-1") for k, _ in headers} | {"content-length", "transfer-encoding"}
        for name in list(request.headers.keys()):  # httpx's own defaults (Accept-Encoding...) stay out
            if name not in given:
                del request.headers[name]
        response: httpx.Response | None = None
        try:
            try:
                response = await client.send(request, stream=True)
            except httpx.HTTPError as exc:
                logger.warning("mcp-token-otel proxy: upstream %s %s failed: %s", method, url, exc or type(exc))
                if not disconnected.is_set():
                    await _plain(send, 502, b"mcp-token-otel proxy: upstream unreachable\n")
                return
            new_session = response.headers.get("mcp-session-id")
            if tracker is not None and session_id is None and new_session:
                measurer.set_tracker(tracker, session_key=new_session, session_id=new_session)  # joins the session
            if up is not None:
                measurer.finish(up)
                up = None
            out_headers = [(k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP]
            await send({"type": "http.response.start", "status": response.status_code, "headers": out_headers})
            down = self._response_stream(tracker, response)
            await self._relay(response, down, send, receive, body_done, disconnected)
            if session_id is not None and (method == "DELETE" or response.status_code == 404):
                self._end_session(session_id)  # gone upstream: its budget closes
        finally:
            if up is not None:
                measurer.finish(up)
            if response is not None:
                await response.aclose()
            if tracker is not None and session_id is None:
                measurer.close_tracker(tracker)

    def _response_stream(self, tracker: Any, response: httpx.Response) -> Any:
        if tracker is None or response.status_code in (401, 403):
            return None
        encoding = response.headers.get("content-encoding", "identity").lower()
        ctype = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if encoding != "identity":
            return None  # relayed as is; compressed bodies are not measured
        if ctype == "text/event-stream":
            return self.telemetry.measurer.stream(tracker, S2C, SSE)
        if ctype == "application/json":
            return self.telemetry.measurer.stream(tracker, S2C, BODY)
        return None

    async def _relay(
        self, response: httpx.Response, down: Any, send: Send, receive: Receive,
        body_done: asyncio.Event, disconnected: asyncio.Event,
    ) -> None:
        measurer = self.telemetry.measurer
        if "content-length" in response.headers and body_done.is_set():
            # A body of known length (a JSON answer): relayed straight, no disconnect watch needed.
            length = response.headers["content-length"]
            left = int(length) if length.isdigit() else -1
            done = False
            try:
                async for chunk in response.aiter_raw():
                    if down is not None:
                        measurer.put(down, chunk)
                    left -= len(chunk)
                    done = left == 0  # the last chunk ends the response: one send less
                    await send({"type": "http.response.body", "body": chunk, "more_body": not done})
                if not done:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
            except httpx.HTTPError as exc:
                logger.warning("mcp-token-otel proxy: upstream response broken: %s", exc or type(exc))
            finally:
                if down is not None:
                    measurer.finish(down)
            return

        async def pump() -> None:
            try:
                async for chunk in response.aiter_raw():
                    if down is not None:
                        measurer.put(down, chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except httpx.HTTPError as exc:  # the upstream died mid-stream: the client's response ends unfinished
                logger.warning("mcp-token-otel proxy: upstream stream broken: %s", exc or type(exc))
            finally:
                if down is not None:
                    measurer.finish(down)

        async def watch() -> None:
            await body_done.wait()
            while not disconnected.is_set():
                if (await receive())["type"] == "http.disconnect":
                    disconnected.set()

        pumping = asyncio.ensure_future(pump())
        watching = asyncio.ensure_future(watch())
        try:
            await asyncio.wait({pumping, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pumping, watching):
                task.cancel()
            for task in (pumping, watching):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if disconnected.is_set() and not pumping.done():
            logger.info("mcp-token-otel proxy: client went away mid-stream; upstream request closed")


async def _plain(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
