"""The streamable-HTTP :class:`~.transport.Transport`: a lean HTTP/1.1 relay on raw asyncio streams.

Each client connection is served by one coroutine: it reads a request head (parsed by llhttp, see
http1.py; strict limits: 64 KiB, 100 header lines, one deadline for the whole head and another for the whole
body against slow senders), forwards it to the upstream's origin at the same path and query on a kept-alive
upstream connection from a small pool, relays the request body (by ``Content-Length`` or chunked) and the
response (by ``Content-Length``, chunked, or until the upstream closes) as the bytes arrive, then takes the
client's next request (keep-alive; pipelined requests are answered in order). Every header but the
hop-by-hop ones goes through untouched, ``Host`` and ``Origin`` included: a server's DNS-rebinding
protection sees what the client sent (rewriting Host would let a rebinding page through a protecting
server). ``Mcp-Session-Id``, ``WWW-Authenticate``, 401s and the OAuth ``/.well-known/...`` paths pass like
anything else.

Backpressure: a write waits (``drain``) while the peer's socket is full, and the other side is read no faster.
A client that goes away mid-stream closes the upstream connection; an upstream that dies mid-stream ends the
client's response unfinished (and the connection), as it would look directly. TCP_NODELAY on both sides.

Measuring: POST bodies (client to server) and JSON or SSE response bodies (server to client) are handed to
the measuring side chunk by chunk just before they are forwarded (never blocking). Sessions are keyed by
``Mcp-Session-Id``; a request without one (``initialize``, stateless servers) is its own exchange.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import ssl
import sys
import urllib.parse
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

from ..core.redact import redact_url
from ..semconv import A_SERVER_NAME
from .exchange import Exchange
from .http1 import CHUNK, END, ERROR, HEAD, MAX_HEAD, Head, Http1Parser, HttpError, Wire, hook, refuse
from .inject import Injector
from .telemetry import StartupError, check_port_free

logger = logging.getLogger("mcp_token_otel.proxy")

MAX_SESSIONS = 10_000
#: Open client connections at most (``HttpProxy(max_connections=...)``); beyond, new ones are answered 503 and
#: closed. No one client address may hold more than PEER_SHARE of them (``peer_share``), so that one client's
#: slow or stuck connections cannot lock the others out.
MAX_CONNECTIONS = 1024
PEER_SHARE = 0.5
#: Paths the proxy answers itself, never forwarded: readiness (the upstream answered once) and liveness.
READY_PATH, LIVE_PATH = b"/readyz", b"/livez"
CONNECT_TIMEOUT = 10.0
MAX_IDLE_UPSTREAM = 64

#: Seconds a client has to send a whole request head once it started one; an idle keep-alive connection
#: is closed after KEEPALIVE_IDLE seconds without a new request.
HEADER_TIMEOUT = 10.0
KEEPALIVE_IDLE = 75.0
#: Seconds a client has to send a whole request body (``HttpProxy(body_timeout=...)``).
BODY_TIMEOUT = 60.0


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise StartupError(f"--listen: expected HOST:PORT (e.g. 127.0.0.1:8080), got {value!r}")
    return (host.strip("[]") or "127.0.0.1"), int(port)


class HttpProxy:
    """The HTTP transport: bytes arrive and leave on TCP connections; a message is a body or an SSE event."""

    network = "tcp"

    def __init__(self, upstream: str, host: str, port: int, *, name: str | None = None,
                 inject: bool = False, body_timeout: float = BODY_TIMEOUT, max_connections: int = MAX_CONNECTIONS,
                 peer_share: float = PEER_SHARE) -> None:
        try:
            url = urllib.parse.urlsplit(upstream)
            upstream_port = url.port  # ValueError when out of range or not a number
        except ValueError:
            url, upstream_port = urllib.parse.urlsplit(""), None
        if url.scheme not in ("http", "https") or not url.hostname:
            raise StartupError(f"--upstream: expected an http:// or https:// URL, got {redact_url(upstream)!r}")
        self.upstream = redact_url(upstream)  # what messages show: never its credentials
        self.url = url
        self.upstream_host = url.hostname
        self.upstream_port = upstream_port or (443 if url.scheme == "https" else 80)
        self.host, self.port = host, port
        #: The server's name as the user gave it (``--name``); else spans and metrics carry the name the server
        #: gives itself.
        self.name: str | None = name
        self.inject = inject
        self.body_timeout = body_timeout
        self.max_connections = max_connections
        #: At most this many connections from one client address (at least one).
        self.per_peer = max(1, int(max_connections * peer_share))

    def check(self) -> None:
        """The listening port is free. The upstream need not be up: until it answers, requests get 502 and
        ``/readyz`` 503 (a sidecar may start before its server)."""
        check_port_free(self.host, self.port, "the proxy")

    def client_url(self) -> str:
        """The URL clients use: this listener, at the upstream's path (requests are forwarded path and all)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{self.url.path or '/'}"

    def run(self, telemetry: Any) -> int:
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
        # Always said: with port 0 this line is the only way to learn the port; the path is the upstream's.
        print(f"mcp-token-otel proxy: listening on {self.client_url()} (upstream {self.upstream})",
              file=sys.stderr, flush=True)
        relay = Relay(self, telemetry)

        async def main() -> None:
            loop = asyncio.get_running_loop()
            stop = asyncio.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            attach = getattr(telemetry.measurer, "attach_loop", None)
            if attach is not None:  # measuring in its own process: hand records over from this loop
                attach(loop)
            server = await asyncio.start_server(relay.serve, sock=sock, limit=MAX_HEAD)
            try:
                await stop.wait()
            finally:
                server.close()
                await relay.shutdown(2.0)  # open streams get 2 s
                relay.close_sessions()
                relay.upstream.close()
                detach = getattr(telemetry.measurer, "detach_loop", None)
                if detach is not None:
                    detach()
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)

        asyncio.run(main())
        return 0


class Relay:
    """Serves client connections: relay, then measure off the path."""

    def __init__(self, proxy: HttpProxy, telemetry: Any) -> None:
        self.proxy = proxy
        self.telemetry = telemetry
        self.upstream = Upstream(proxy.url)
        self.sessions: OrderedDict[str, Any] = OrderedDict()
        #: The protocol version each session's tracker was last told (``MCP-Protocol-Version``).
        self.versions: dict[str | None, str] = {}
        self.connections: set[asyncio.Task[Any]] = set()
        self.peers: Counter[str] = Counter()  # open connections by client address
        #: The upstream answered once (``/readyz``).
        self.ready = False
        self.idle: set[asyncio.Task[Any] | None] = set()
        self.injector = Injector(telemetry.measurer) if proxy.inject else None
        #: Guards on (guard.py): a request body that may be refused is guarded whole before it goes upstream.
        self.guard = getattr(telemetry.measurer, "guarded", False) is True
        self._attrs: dict[str, Any] = {"server.address": proxy.upstream_host, "server.port": proxy.upstream_port}
        if proxy.name:
            self._attrs[A_SERVER_NAME] = proxy.name

    # ------------------------------------------------------------------ sessions

    def tracker(self, session_id: str | None, origin: Callable[[], dict[str, Any]]) -> Any:
        """The session's tracker (by ``Mcp-Session-Id``); without one, the exchange's own. ``origin()``: what a
        budget key may read from the request that opens it (see transport.http_origin)."""
        measurer = self.telemetry.measurer
        if session_id is None:  # its own exchange: closed when the response ends
            return measurer.tracker(session_key=None, transport=HttpProxy.network, attributes=self._attrs,
                                    origin=origin())
        tracker = self.sessions.get(session_id)
        if tracker is None:
            tracker = measurer.tracker(session_key=session_id, session_id=session_id, transport=HttpProxy.network,
                                       attributes=self._attrs, origin=origin())
            self.sessions[session_id] = tracker
            if len(self.sessions) > MAX_SESSIONS:  # sessions never DELETEd: the oldest goes
                gone, oldest = self.sessions.popitem(last=False)
                self.versions.pop(gone, None)
                measurer.close_tracker(oldest)
        else:
            self.sessions.move_to_end(session_id)
        return tracker

    def adopt(self, session_id: str, tracker: Any) -> bool:
        """The tracker of the exchange whose response created this session (``initialize``) becomes the
        session's: the initialize counts toward it and the session ends once. False: the id is taken."""
        if session_id in self.sessions:
            return False
        self.sessions[session_id] = tracker
        if len(self.sessions) > MAX_SESSIONS:
            gone, oldest = self.sessions.popitem(last=False)
            self.versions.pop(gone, None)
            self.telemetry.measurer.close_tracker(oldest)
        return True

    def end_session(self, session_id: str) -> None:
        tracker = self.sessions.pop(session_id, None)
        self.versions.pop(session_id, None)
        if tracker is not None:
            self.telemetry.measurer.close_tracker(tracker)

    def close_sessions(self) -> None:
        for session_id in list(self.sessions):
            self.end_session(session_id)

    async def shutdown(self, grace: float) -> None:
        for task in list(self.idle):  # idle keep-alive connections close now; exchanges get the grace period
            if task is not None:
                task.cancel()
        if self.connections:
            await asyncio.wait(set(self.connections), timeout=grace)
        for task in list(self.connections):
            task.cancel()
        if self.connections:
            await asyncio.wait(set(self.connections), timeout=1.0)

    # ------------------------------------------------------------------ a client connection

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peername = writer.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) else ""
        if len(self.connections) >= self.proxy.max_connections or self.peers[peer] >= self.proxy.per_peer:
            busy = b"mcp-token-otel proxy: too many connections\n"
            await refuse(writer, HttpError(503, "Service Unavailable"), busy)
            await _linger(reader, writer)
            writer.close()
            return
        self.connections.add(task)
        self.peers[peer] += 1
        try:
            await self._connection(Wire(reader, Http1Parser(), writer.transport, hook(writer)), writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, OSError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:  # a bug here must not take the proxy down
            logger.exception("mcp-token-otel proxy: connection failed")
        finally:
            self.connections.discard(task)
            self.peers[peer] -= 1
            if not self.peers[peer]:
                del self.peers[peer]
            writer.close()

    async def _connection(self, wire: Wire, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        transport = wire.transport
        task = asyncio.current_task()
        parser = wire.parser
        idle = IdleDeadline(loop, transport)
        timeout = HEADER_TIMEOUT
        try:
            while True:
                # An idle keep-alive connection waits for the first bytes of its next request (one timer per
                # connection, re-armed lazily), then a started head must be complete in HEADER_TIMEOUT.
                timer = None
                while parser.events and parser.events[0][0] == END:
                    parser.events.popleft()  # the end of a request without a body
                try:
                    if not parser.events and not parser.in_head:
                        idle.start(timeout)
                        self.idle.add(task)  # between requests: a shutdown need not wait for it
                        try:
                            data = await wire.reader.read(CHUNK)
                        finally:
                            self.idle.discard(task)
                            idle.stop()
                        if not data:
                            return
                        parser.feed(data)
                    if parser.events:  # the whole head came at once: no deadline to watch
                        kind, head = parser.events.popleft()
                    else:
                        timer = loop.call_later(HEADER_TIMEOUT, transport.abort)
                        kind, head = await wire.next()
                except (TimeoutError, ConnectionError):
                    return  # too slow (aborted) or gone: closed without an answer
                finally:
                    if timer is not None:
                        timer.cancel()
                if not await self._request(wire, writer, kind, head):
                    return
                timeout = KEEPALIVE_IDLE
        finally:
            idle.close()

    async def _request(self, wire: Wire, writer: asyncio.StreamWriter, kind: int, head: Any) -> bool:
        """Answer one request (or refuse what is not one); True when the connection takes another."""
        if kind == ERROR:
            await refuse(writer, head)
            await _linger(wire.reader, writer)
            return False
        if kind != HEAD:
            return False  # closed (too slow: aborted, or gone) without an answer
        keep = head.version == b"HTTP/1.1" and head.keep_alive
        if head.target.split(b"?", 1)[0] in (READY_PATH, LIVE_PATH) and head.method in (b"GET", b"HEAD"):
            return await self._health(head, writer, keep)
        return await Exchange(self, wire, writer, head, keep).run()


    async def _health(self, head: Head, writer: asyncio.StreamWriter, keep: bool) -> bool:
        """``/livez``: 200 while the proxy serves. ``/readyz``: 200 once the upstream answered (a request, or
        this probe's connection to it), else 503. Answered here, never forwarded."""
        if head.target.startswith(READY_PATH) and not self.ready:
            with contextlib.suppress(OSError, TimeoutError):
                await self.upstream.probe()
                self.ready = True
        ok = self.ready or head.target.startswith(LIVE_PATH)
        body = b"ok\n" if ok else b"upstream not answering yet\n"
        writer.write((b"HTTP/1.1 200 OK" if ok else b"HTTP/1.1 503 Service Unavailable")
                     + b"\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n" % len(body)
                     + (b"" if keep else b"connection: close\r\n") + b"\r\n"
                     + (b"" if head.method == b"HEAD" else body))
        await writer.drain()
        return keep and head.length in (None, 0) and not head.chunked


class Upstream:
    """Where requests go, and a pool of kept-alive connections to it."""

    def __init__(self, url: urllib.parse.SplitResult) -> None:
        self.host = url.hostname or ""
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if url.scheme == "https" else None
        self.idle: list[Conn] = []

    async def connect(self) -> Conn:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, ssl=self.ssl, limit=MAX_HEAD,
                                    server_hostname=self.host if self.ssl else None),
            CONNECT_TIMEOUT)
        nodelay(writer)
        return Conn(reader, writer)

    async def probe(self) -> None:
        """Connect once, and go: the upstream is there (raises OSError or TimeoutError when not)."""
        _, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), 2.0)
        writer.close()

    def take(self) -> Conn | None:
        while self.idle:
            conn = self.idle.pop()
            reader, writer = conn.reader, conn.writer
            # Bytes waiting on an idle connection: the upstream is not speaking HTTP we can follow; not reused.
            if reader.at_eof() or writer.is_closing() or reader._buffer:  # type: ignore[attr-defined]
                writer.close()
                continue
            return conn
        return None

    def give_back(self, conn: Conn) -> None:
        if len(self.idle) < MAX_IDLE_UPSTREAM and not conn.writer.is_closing():
            parser = conn.wire.parser if conn.wire is not None else None
            if parser is not None and (not parser.complete or parser.events or parser.failed):
                conn.wire = None  # not left between two responses (a HEAD's, a 204's): the next one gets a new one
            self.idle.append(conn)
        else:
            conn.writer.close()

    def close(self) -> None:
        for conn in self.idle:
            conn.writer.close()
        self.idle.clear()


class Conn:
    """A connection to the upstream, and the reading side of it that parses its responses (kept with it
    between requests once a response ended cleanly)."""

    __slots__ = ("reader", "wire", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.wire: Wire | None = None

    def response_wire(self) -> Wire:
        if self.wire is None:
            self.wire = Wire(self.reader, Http1Parser(response=True), self.writer.transport)
        return self.wire


class IdleDeadline:
    """The deadline of a connection's idle waits, on one timer re-armed lazily: a wait only moves the
    deadline, and the timer, when it fires early (the connection was busy, or waited again since), sets
    itself again for what is left, so a busy connection costs one timer per deadline period, not one a
    request. Past the deadline of a wait still going on, the connection is aborted."""

    __slots__ = ("at", "handle", "loop", "transport", "until")

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: asyncio.WriteTransport) -> None:
        self.loop = loop
        self.transport = transport
        self.until: float | None = None  # the deadline of the wait going on; None: not waiting
        self.handle: asyncio.TimerHandle | None = None
        self.at = 0.0  # when the timer fires

    def start(self, seconds: float) -> None:
        self.until = until = self.loop.time() + seconds
        if self.handle is not None and until < self.at:  # sooner than the timer: set anew
            self.handle.cancel()
            self.handle = None
        if self.handle is None:
            self._arm(until)

    def stop(self) -> None:
        self.until = None

    def close(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def _arm(self, when: float) -> None:
        self.at = when
        self.handle = self.loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self.handle = None
        if self.until is None:
            return  # busy: the next wait arms it again
        if self.loop.time() >= self.until:
            self.transport.abort()
        else:
            self._arm(self.until)


def nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After refusing: end our side and discard what the client still sends (bounded: 1 s, 1 MiB), so that
    closing with unread input does not reset the connection before the client read the answer."""
    with contextlib.suppress(Exception):
        writer.write_eof()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 1.0
        left = 1 << 20
        while left > 0 and loop.time() < deadline:
            data = await asyncio.wait_for(reader.read(CHUNK), deadline - loop.time())
            if not data:
                break
            left -= len(data)
