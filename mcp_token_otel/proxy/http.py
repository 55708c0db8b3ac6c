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
import urllib.parse
from collections import OrderedDict
from typing import Any

from .http1 import DATA, END, ERROR, HEAD, MAX_HEAD, Head, Http1Parser, HttpError
from .inject import Injector
from .jsonrpc import A_SERVER_NAME, BODY, C2S, S2C, SSE
from .telemetry import StartupError, check_port_free
from .transport import Channel

logger = logging.getLogger("mcp_token_otel.proxy")

HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"transfer-encoding", b"upgrade",
})
MAX_SESSIONS = 10_000
#: Open client connections at most; beyond, new ones are answered 503 and closed.
MAX_CONNECTIONS = 1024
#: Seconds a client has to send a whole request head once it started one; an idle keep-alive connection
#: is closed after KEEPALIVE_IDLE seconds without a new request.
HEADER_TIMEOUT = 10.0
KEEPALIVE_IDLE = 75.0
#: Seconds a client has to send a whole request body (``HttpProxy(body_timeout=...)``).
BODY_TIMEOUT = 60.0
CONNECT_TIMEOUT = 10.0
#: Request bodies up to this size are read whole and sent with the head in one write (and may be retried
#: on a fresh upstream connection when a pooled one turns out closed); larger or chunked ones stream.
SMALL_BODY = 1024 * 1024
CHUNK = 64 * 1024
MAX_IDLE_UPSTREAM = 64
#: Wire event: the peer closed the connection.
CLOSED = -1


class UpstreamBroken(Exception):
    """The upstream failed (reset, EOF, bad framing) after the response started."""


class ClientGone(Exception):
    """The client left (or was cut off at the body deadline) in the middle of its request body."""


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise StartupError(f"--listen: expected HOST:PORT (e.g. 127.0.0.1:8080), got {value!r}")
    return (host.strip("[]") or "127.0.0.1"), int(port)


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _connection_tokens(headers: list[tuple[bytes, bytes]]) -> set[bytes]:
    """Header names listed in Connection (hop-by-hop too, RFC 9110 7.6.1)."""
    out: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            out.update(t.strip().lower() for t in value.split(b","))
    return out


class Wire:
    """The reading side of one connection: bytes from the socket through the parser, events out in order."""

    __slots__ = ("parser", "reader", "transport")

    def __init__(self, reader: asyncio.StreamReader, parser: Http1Parser, transport: asyncio.WriteTransport) -> None:
        self.reader = reader
        self.parser = parser
        self.transport = transport  # aborted when a deadline passes

    async def next(self) -> tuple[int, Any]:
        """The next event (http1.HEAD, DATA, END, ERROR), or CLOSED."""
        events = self.parser.events
        while not events:
            data = await self.reader.read(CHUNK)
            if not data:
                return CLOSED, None
            self.parser.feed(data)
        return events.popleft()

    @property
    def spent(self) -> bool:
        """Nothing read past the message just ended (a connection that may be reused)."""
        return not self.parser.events and not self.parser.in_head and not self.parser.failed


class Upstream:
    """Where requests go, and a pool of kept-alive connections to it."""

    def __init__(self, url: urllib.parse.SplitResult) -> None:
        self.host = url.hostname or ""
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if url.scheme == "https" else None
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, ssl=self.ssl, limit=MAX_HEAD,
                                    server_hostname=self.host if self.ssl else None),
            CONNECT_TIMEOUT)
        _nodelay(writer)
        return reader, writer

    def take(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        while self.idle:
            reader, writer = self.idle.pop()
            if reader.at_eof() or writer.is_closing() or reader._buffer:  # type: ignore[attr-defined]
                writer.close()
                continue
            return reader, writer
        return None

    def give_back(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        if len(self.idle) < MAX_IDLE_UPSTREAM and not conn[1].is_closing():
            self.idle.append(conn)
        else:
            conn[1].close()

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


class HttpProxy:
    """The HTTP transport: bytes arrive and leave on TCP connections; a message is a body or an SSE event."""

    network = "tcp"

    def __init__(self, upstream: str, host: str, port: int, *, name: str | None = None,
                 inject: bool = False, body_timeout: float = BODY_TIMEOUT) -> None:
        try:
            url = urllib.parse.urlsplit(upstream)
            upstream_port = url.port  # ValueError when out of range or not a number
        except ValueError:
            url, upstream_port = urllib.parse.urlsplit(""), None
        if url.scheme not in ("http", "https") or not url.hostname:
            raise StartupError(f"--upstream: expected an http:// or https:// URL, got {upstream!r}")
        self.upstream = upstream
        self.url = url
        self.upstream_host = url.hostname
        self.upstream_port = upstream_port or (443 if url.scheme == "https" else 80)
        self.host, self.port = host, port
        self.name: str = name or url.hostname
        self.inject = inject
        self.body_timeout = body_timeout

    def check(self) -> None:
        check_port_free(self.host, self.port, "the proxy")
        try:
            socket.create_connection((self.upstream_host, self.upstream_port), timeout=5).close()
        except OSError as exc:
            raise StartupError(f"upstream unreachable: {self.upstream} ({exc.strerror or exc})") from None

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
        logger.info("mcp-token-otel proxy: http://%s:%d -> %s", self.host, self.port, self.upstream)
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
        self.connections: set[asyncio.Task[Any]] = set()
        self.idle: set[asyncio.Task[Any] | None] = set()
        self.injector = Injector(telemetry.measurer) if proxy.inject else None
        #: Guards on (guard.py): a request body that may be refused is guarded whole before it goes upstream.
        self.guard = getattr(telemetry.measurer, "guarded", False) is True
        self._attrs = {"server.address": proxy.upstream_host, "server.port": proxy.upstream_port,
                       A_SERVER_NAME: proxy.name}

    # ------------------------------------------------------------------ sessions

    def _tracker(self, session_id: str | None) -> Any:
        measurer = self.telemetry.measurer
        if session_id is None:  # its own exchange: closed when the response ends
            return measurer.tracker(session_key=None, transport=HttpProxy.network, attributes=self._attrs)
        tracker = self.sessions.get(session_id)
        if tracker is None:
            tracker = measurer.tracker(session_key=session_id, session_id=session_id, transport=HttpProxy.network,
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
        if len(self.connections) >= MAX_CONNECTIONS:
            busy = b"mcp-token-otel proxy: too many connections\n"
            await _refuse(writer, HttpError(503, "Service Unavailable"), busy)
            await _linger(reader, writer)
            writer.close()
            return
        self.connections.add(task)
        try:
            await self._connection(Wire(reader, Http1Parser(), writer.transport), writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, OSError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:  # a bug here must not take the proxy down
            logger.exception("mcp-token-otel proxy: connection failed")
        finally:
            self.connections.discard(task)
            writer.close()

    async def _connection(self, wire: Wire, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        transport = wire.transport
        task = asyncio.current_task()
        parser = wire.parser
        timeout = HEADER_TIMEOUT
        while True:
            # Deadlines by timer (cheaper than wait_for's task per read): an idle keep-alive connection waits for
            # the first bytes of its next request, then a started head must be complete in HEADER_TIMEOUT.
            timer = None
            while parser.events and parser.events[0][0] == END:
                parser.events.popleft()  # the end of a request without a body
            try:
                if not parser.events and not parser.in_head:
                    timer = loop.call_later(timeout, transport.abort)
                    self.idle.add(task)  # between requests: a shutdown need not wait for it
                    try:
                        data = await wire.reader.read(CHUNK)
                    finally:
                        self.idle.discard(task)
                    timer.cancel()
                    if not data:
                        return
                    parser.feed(data)
                timer = loop.call_later(HEADER_TIMEOUT, transport.abort)
                kind, head = await wire.next()
            except (TimeoutError, ConnectionError):
                return  # too slow (aborted) or gone: closed without an answer
            finally:
                if timer is not None:
                    timer.cancel()
            if kind == ERROR:
                await _refuse(writer, head)
                await _linger(wire.reader, writer)
                return
            if kind != HEAD:
                return  # closed (too slow: aborted, or gone) without an answer
            keep = head.version == b"HTTP/1.1" and head.keep_alive
            if not await self._exchange(wire, writer, head, keep):
                return
            timeout = KEEPALIVE_IDLE

    async def _body(self, wire: Wire) -> Any:
        """The request body's pieces as they arrive (chunked framing removed), within the body deadline: a
        client that dribbles its body is cut off (its connection closed) when the deadline passes."""
        timer = asyncio.get_running_loop().call_later(self.proxy.body_timeout, wire.transport.abort)
        try:
            while True:
                kind, value = await wire.next()
                if kind == DATA:
                    yield value
                elif kind == END:
                    return
                elif kind == ERROR:
                    raise value
                else:
                    raise ClientGone()
        finally:
            timer.cancel()

    async def _exchange(self, wire: Wire, writer: asyncio.StreamWriter, request: Head, keep: bool) -> bool:
        """One request and its response; True when the client connection may take another request."""
        measurer = self.telemetry.measurer
        method, target, headers, length, chunked = (request.method, request.target, request.headers,
                                                    request.length, request.chunked)
        drop = HOP_BY_HOP | _connection_tokens(headers) if any(
            n.lower() == b"connection" for n, _ in headers) else HOP_BY_HOP
        out = [method + b" " + target + b" HTTP/1.1\r\n"]
        session_id: str | None = None
        version: str | None = None
        expect = False
        for name, value in headers:
            lower = name.lower()
            if lower in drop or lower == b"content-length":  # framing is written below
                continue
            if lower == b"expect":  # answered here: the body is read before anything goes upstream
                expect = value.lower() == b"100-continue"
                if expect:
                    continue
            if lower == b"mcp-session-id":
                session_id = value.decode("latin-1")
            elif lower == b"mcp-protocol-version":
                version = value.decode("latin-1")
            out.append(name + b": " + value + b"\r\n")
        measure = not target.startswith(b"/.well-known/")
        tracker = self._tracker(session_id) if measure else None
        if tracker is not None and version:
            measurer.set_tracker(tracker, protocol_version=version)
        up: Any = measurer.stream(tracker, C2S, BODY) if tracker is not None and method == b"POST" else None
        body: bytes | None = None
        source: Any = None
        if expect and (length or chunked):
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if length is not None and length <= SMALL_BODY:  # the usual POST: whole, then sent with the head
            try:
                body = b"".join([piece async for piece in self._body(wire)])
            except (ClientGone, ConnectionError, HttpError) as exc:  # left mid-body, cut off, or malformed
                if up is not None:
                    measurer.finish(up)
                if tracker is not None and session_id is None:
                    measurer.close_tracker(tracker)
                if isinstance(exc, HttpError):
                    await _refuse(writer, exc)
                return False
            if self.injector is not None and tracker is not None and body:
                new = self.injector.rewrite_body(tracker, body)
                if new is not body:
                    body = new
                    length = len(body)
            if self.guard and up is not None and (b'"tools/call"' in body or b'"result"' in body):
                # What a guard may refuse (a tools/call) or change (the client's result to a server's request)
                # is handled before it goes upstream; other requests are measured after the response head, as
                # without guards (an initialize's span then carries the session it created).
                forward, reply = measurer.message(up, body)
                up = None  # handled
                if reply is not None:  # refused: the proxy answers, the server never sees the call
                    if tracker is not None and session_id is None:
                        measurer.close_tracker(tracker)
                    await _answer_json(writer, reply, keep)
                    return keep
                if forward is not None and forward is not body:
                    body = forward
                    length = len(body)
            out.append(b"content-length: %d\r\n" % length)
        elif length is not None or chunked:
            out.append(b"content-length: %d\r\n" % length if length is not None else b"transfer-encoding: chunked\r\n")
            source = self._body(wire)
        else:
            body = b""  # GET, DELETE...: no body (and a retry on a fresh connection is safe)
        out.append(b"\r\n")
        return await self._forward(wire, writer, request, b"".join(out), body, source, up, tracker, session_id,
                                   keep)

    async def _forward(
        self, wire: Wire, writer: asyncio.StreamWriter, request: Head, head: bytes, body: bytes | None,
        source: Any, up: Any, tracker: Any, session_id: str | None, keep: bool,
    ) -> bool:
        """Send the request upstream and relay its response; True when the client connection goes on."""
        measurer = self.telemetry.measurer
        method = request.method
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        reusable = False
        response_started = False
        try:
            try:
                conn, response, uwire = await self._send(head, body, source, request.chunked, up, measurer)
            except HttpError as exc:
                await _refuse(writer, exc)
                return False
            except ClientGone:
                return False  # nobody to answer
            except (OSError, asyncio.IncompleteReadError, TimeoutError, UpstreamBroken) as exc:
                logger.warning("mcp-token-otel proxy: upstream %s %s failed: %s", method.decode("latin-1"),
                               request.target.decode("latin-1"), exc or type(exc).__name__)
                await _refuse(writer, HttpError(502, "Bad Gateway"), b"mcp-token-otel proxy: upstream unreachable\n")
                return False
            new_session = response.get(b"mcp-session-id")
            if tracker is not None and session_id is None and new_session:
                new_id = new_session.decode("latin-1")
                measurer.set_tracker(tracker, session_key=new_id, session_id=new_id)  # joins the session
            if up is not None:  # measured after the session is known: the request's span carries it
                measurer.finish(up)
                up = None
            response_started = True
            reusable, completed = await self._respond(wire, writer, request, response, uwire, tracker, keep)
            if session_id is not None and (method == b"DELETE" or response.status == 404):
                self._end_session(session_id)  # gone upstream: its budget closes
            return completed and keep
        except (UpstreamBroken, asyncio.IncompleteReadError, HttpError, ValueError) as exc:
            logger.warning("mcp-token-otel proxy: upstream response broken: %s", exc or type(exc).__name__)
            reusable = False
            if not response_started:
                await _refuse(writer, HttpError(502, "Bad Gateway"))
            return False
        except (OSError, asyncio.CancelledError):
            reusable = False
            raise
        finally:
            if source is not None:
                await source.aclose()  # its body deadline ends with it
            if up is not None:
                measurer.finish(up)
            if conn is not None:
                if reusable:
                    self.upstream.give_back(conn)
                else:
                    conn[1].close()
            if tracker is not None and session_id is None:
                measurer.close_tracker(tracker)

    async def _respond(self, wire: Wire, writer: asyncio.StreamWriter, request: Head, response: Head,
                       uwire: Wire, tracker: Any, keep: bool) -> tuple[bool, bool]:
        """Relay the response (its head is read); (upstream connection reusable, client connection usable)."""
        status, rheaders, rlength = response.status, response.headers, response.length
        no_body = request.method == b"HEAD" or status in (204, 304)
        until_eof = not no_body and rlength is None and not response.chunked
        drop = HOP_BY_HOP | _connection_tokens(rheaders) if any(
            n.lower() == b"connection" for n, _ in rheaders) else HOP_BY_HOP
        rout = [b"HTTP/1.1 %d " % status + response.reason + b"\r\n"]
        rout += [n + b": " + v + b"\r\n" for n, v in rheaders if n.lower() not in drop]
        if not no_body and rlength is None:
            rout.append(b"transfer-encoding: chunked\r\n" if keep else b"")
        if not keep:
            rout.append(b"connection: close\r\n")
        rout.append(b"\r\n")
        rhead = b"".join(rout)
        reusable = response.keep_alive and response.version == b"HTTP/1.1"
        if no_body or rlength == 0:
            writer.write(rhead)
            await writer.drain()
            return reusable, True
        channel = self._response_channel(tracker, response)
        source = _upstream_body(uwire, until_eof)
        if channel is not None and channel.holds_body and rlength is not None:
            # Guards on: a JSON body is held whole, guarded, then sent (re-serialised: its own length).
            body = b"".join([piece async for piece in source])
            forward = channel.whole(body)
            channel.finish()
            if forward is not body:
                rhead = b"".join(line for line in rout[:-1] if not line.lower().startswith(b"content-length:")) \
                    + b"content-length: %d\r\n\r\n" % len(forward)
            writer.write(rhead + forward)
            await writer.drain()
            return reusable and uwire.spent, True
        if rlength is not None:
            await self._relay_length(writer, rhead, source, channel)
            return reusable and uwire.spent, True
        # Streams (SSE...): relayed chunk by chunk while watching the client for a disconnect.
        completed = await self._relay_stream(wire, writer, rhead, source, keep, channel)
        return completed and reusable and response.chunked and uwire.spent, completed

    async def _send(
        self, head: bytes, body: bytes | None, source: Any, chunked: bool, up: Any, measurer: Any,
    ) -> tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter], Head, Wire]:
        """Send the request upstream and read the response head (1xx answers are skipped, not relayed)."""
        pooled = self.upstream.take()
        for attempt in (0, 1):
            conn = pooled if pooled is not None and attempt == 0 else await self.upstream.connect()
            ureader, uwriter = conn
            try:
                if body is not None:
                    if up is not None and body and attempt == 0:
                        measurer.put(up, body)
                    uwriter.write(head + body if len(body) <= CHUNK else head)
                    if len(body) > CHUNK:
                        uwriter.write(body)
                else:
                    uwriter.write(head)
                    async for data in source:
                        if up is not None:
                            measurer.put(up, data)
                        uwriter.write(b"%x\r\n" % len(data) + data + b"\r\n" if chunked else data)
                        await uwriter.drain()
                    if chunked:
                        uwriter.write(b"0\r\n\r\n")
                await uwriter.drain()
                uwire = Wire(ureader, Http1Parser(response=True), uwriter.transport)
                while True:
                    kind, value = await uwire.next()
                    if kind == HEAD and not (100 <= value.status < 200 and value.status != 101):
                        return conn, value, uwire
                    if kind == ERROR:
                        raise UpstreamBroken(f"bad response head: {value.reason}")
                    if kind == CLOSED:
                        raise asyncio.IncompleteReadError(b"", None)
                    # an interim answer (100 Continue...) and its end: not relayed
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                uwriter.close()
                # A pooled connection the upstream had closed: once more on a fresh one when the body allows.
                if conn is pooled and attempt == 0 and body is not None:
                    continue
                raise UpstreamBroken(str(exc) or type(exc).__name__) from None
            except BaseException:
                uwriter.close()
                raise
        raise UpstreamBroken("no connection")

    async def _relay_length(self, writer: asyncio.StreamWriter, rhead: bytes, source: Any,
                            channel: Channel | None) -> None:
        """A body of known length (a JSON answer), relayed as it arrives."""
        first = True
        finished = False
        try:
            async for data in source:
                if channel is not None:
                    data = channel.feed(data)[0]
                if first:
                    writer.write(rhead + data)  # head and first chunk in one segment
                    first = False
                else:
                    writer.write(data)
                await writer.drain()
            if channel is not None:
                finished = True
                rest = channel.finish()[0]
                if rest or first:
                    writer.write(rhead + rest if first else rest)
                    await writer.drain()
        finally:
            if channel is not None and not finished:
                channel.measurer.finish(channel.stream)

    async def _relay_stream(self, wire: Wire, writer: asyncio.StreamWriter, rhead: bytes, source: Any,
                            framed: bool, channel: Channel | None) -> bool:
        """Relay a stream until it ends or the client leaves; True when it went through whole. ``framed``:
        chunked towards the client, else until close."""
        writer.write(rhead)
        await writer.drain()
        gone = asyncio.Event()

        async def watch() -> None:
            try:
                data = await wire.reader.read(CHUNK)
            except (ConnectionError, OSError):  # reset by the client: gone too
                data = b""
            if data:
                wire.parser.feed(data)  # a pipelined request: parsed now, answered next; stop watching
            else:
                gone.set()

        async def pump() -> None:
            finished = False
            try:
                async for data in source:
                    if channel is not None:  # with guards on, whole events go on once guarded
                        data = channel.feed(data)[0]
                        if not data:
                            continue
                    writer.write(b"%x\r\n" % len(data) + data + b"\r\n" if framed else data)
                    await writer.drain()
                if channel is not None:
                    finished = True
                    rest = channel.finish()[0]
                    if rest:
                        writer.write(b"%x\r\n" % len(rest) + rest + b"\r\n" if framed else rest)
                        await writer.drain()
                if framed:
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
            finally:
                if channel is not None and not finished:
                    channel.measurer.finish(channel.stream)

        watching = asyncio.ensure_future(watch())
        pumping = asyncio.ensure_future(pump())
        try:
            while not pumping.done():
                await asyncio.wait({pumping, watching}, return_when=asyncio.FIRST_COMPLETED)
                if gone.is_set():
                    logger.info("mcp-token-otel proxy: client went away mid-stream; upstream request closed")
                    return False
                if watching.done() and not pumping.done():
                    await pumping
                    break
        finally:
            for task in (pumping, watching):
                task.cancel()
            for task in (pumping, watching):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        try:
            pumping.result()
        except (UpstreamBroken, asyncio.IncompleteReadError, HttpError, ConnectionError, OSError) as exc:
            logger.warning("mcp-token-otel proxy: upstream stream broken: %s", exc or type(exc).__name__)
            return False
        return True

    def _response_channel(self, tracker: Any, response: Head) -> Channel | None:
        """How a response body is measured (and guarded): JSON bodies and SSE streams, uncompressed; None: not."""
        if tracker is None or response.status in (401, 403):
            return None
        encoding = (response.get(b"content-encoding") or b"identity").lower()
        if encoding != b"identity":
            return None  # relayed as is; compressed bodies are not measured
        ctype = (response.get(b"content-type") or b"").split(b";")[0].strip().lower()
        measurer = self.telemetry.measurer
        if ctype == b"text/event-stream":
            return Channel(measurer, tracker, S2C, SSE)
        if ctype == b"application/json":
            # Guards on, a body known to be too large to hold is measured as it passes, never held.
            large = self.guard and response.length is not None and response.length > measurer.max_message
            return Channel(measurer, tracker, S2C, BODY, guard=not large)
        return None


async def _upstream_body(uwire: Wire, until_eof: bool) -> Any:
    """A response body's pieces as they arrive (chunked framing removed); ``until_eof``: it ends by closing."""
    while True:
        kind, value = await uwire.next()
        if kind == DATA:
            yield value
        elif kind == END:
            return
        elif kind == CLOSED:
            if until_eof:
                return
            raise UpstreamBroken("upstream closed before the end of the body")
        elif kind == ERROR:
            raise UpstreamBroken(f"bad response body: {value.reason}")


async def _answer_json(writer: asyncio.StreamWriter, body: bytes, keep: bool) -> None:
    """The proxy's own answer to a POST (a refused tools/call): 200, one JSON-RPC response."""
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % len(body)
                 + (b"" if keep else b"connection: close\r\n") + b"\r\n" + body)
    await writer.drain()


def _plain(status: int, reason: bytes, body: bytes, close: bool) -> bytes:
    return (b"HTTP/1.1 %d " % status + reason + b"\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n" % len(body)
            + (b"connection: close\r\n" if close else b"") + b"\r\n" + body)


async def _refuse(writer: asyncio.StreamWriter, exc: HttpError, body: bytes | None = None) -> None:
    """Answer with an error and close (the connection's state is unknown after it)."""
    text = body if body is not None else f"mcp-token-otel proxy: {exc.reason}\n".encode()
    with contextlib.suppress(Exception):
        writer.write(_plain(exc.status, exc.reason.encode("latin-1"), text, True))
        await writer.drain()


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
