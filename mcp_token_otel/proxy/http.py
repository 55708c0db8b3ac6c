"""The streamable-HTTP reverse proxy: a lean HTTP/1.1 relay on raw asyncio streams.

Each client connection is served by one coroutine: it reads a request head (strict limits: 64 KiB, 100
header lines, a deadline against slow senders), forwards it to the upstream's origin at the same path and
query on a kept-alive upstream connection from a small pool, relays the request body (by ``Content-Length``
or chunked) and the response (by ``Content-Length``, chunked, or until the upstream closes) as the bytes
arrive, then waits for the client's next request (keep-alive). Every header but the hop-by-hop ones goes
through untouched, ``Host`` and ``Origin`` included: a server's DNS-rebinding protection sees what the
client sent (rewriting Host would let a rebinding page through a protecting server). ``Mcp-Session-Id``,
``WWW-Authenticate``, 401s and the OAuth ``/.well-known/...`` paths pass like anything else.

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

from .guard import BodyGuard, SseGuard
from .inject import Injector
from .jsonrpc import A_SERVER_NAME, BODY, C2S, S2C, SSE
from .telemetry import StartupError, check_port_free

logger = logging.getLogger("mcp_token_otel.proxy")

HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"transfer-encoding", b"upgrade",
})
MAX_SESSIONS = 10_000
#: Limits against misbehaving clients (and upstreams): head size, header count, open client connections.
MAX_HEAD = 64 * 1024
MAX_HEADERS = 100
MAX_CONNECTIONS = 1024
#: Seconds a client has to send a whole request head once it started one; an idle keep-alive connection
#: is closed after KEEPALIVE_IDLE seconds without a new request.
HEADER_TIMEOUT = 10.0
KEEPALIVE_IDLE = 75.0
CONNECT_TIMEOUT = 10.0
#: Request bodies up to this size are read whole and sent with the head in one write (and may be retried
#: on a fresh upstream connection when a pooled one turns out closed); larger or chunked ones stream.
SMALL_BODY = 1024 * 1024
CHUNK = 64 * 1024
MAX_IDLE_UPSTREAM = 64


class HttpError(Exception):
    """A request we refuse before it goes upstream: status and a short reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class UpstreamBroken(Exception):
    """The upstream failed (reset, EOF, bad framing) after the response started."""


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


def _parse_head(head: bytes) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The first line and the header fields of a head ending with CRLF CRLF; HttpError when malformed."""
    lines = head[:-4].split(b"\r\n")
    if len(lines) - 1 > MAX_HEADERS:
        raise HttpError(431, "Request Header Fields Too Large")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        # No obsolete line folding, no whitespace in or around names (request smuggling vectors).
        if not sep or not name or name != name.strip() or b" " in name or b"\t" in name or b"\n" in line:
            raise HttpError(400, "Bad Request")
        headers.append((name, value.strip(b" \t")))
    return lines[0], headers


def _framing(headers: list[tuple[bytes, bytes]]) -> tuple[int | None, bool, bool]:
    """(content length, chunked, connection close) from header fields; HttpError when contradictory."""
    length: int | None = None
    chunked = False
    close = False
    for name, value in headers:
        lower = name.lower()
        if lower == b"content-length":
            if not value.isdigit() or (length is not None and int(value) != length):
                raise HttpError(400, "Bad Request")
            length = int(value)
        elif lower == b"transfer-encoding":
            codings = [c.strip().lower() for c in value.split(b",")]
            if codings[-1] != b"chunked" or chunked:
                raise HttpError(501, "Not Implemented")
            chunked = True
        elif lower == b"connection":
            close = close or b"close" in value.lower()
    if chunked and length is not None:
        raise HttpError(400, "Bad Request")
    return length, chunked, close


def _connection_tokens(headers: list[tuple[bytes, bytes]]) -> set[bytes]:
    """Header names listed in Connection (hop-by-hop too, RFC 9110 7.6.1)."""
    out: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            out.update(t.strip().lower() for t in value.split(b","))
    return out


async def _read_chunked(reader: asyncio.StreamReader, limit: int) -> Any:
    """Yield the data of a chunked body as it arrives (trailers read and dropped)."""
    while True:
        line = await reader.readuntil(b"\r\n")
        size_text = line[:-2].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise HttpError(400, "Bad Request") from None
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailer fields
                pass
            return
        left = size
        while left:
            data = await reader.read(min(left, limit))
            if not data:
                raise asyncio.IncompleteReadError(b"", left)
            left -= len(data)
            yield data
        if await reader.readexactly(2) != b"\r\n":
            raise HttpError(400, "Bad Request")


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
    def __init__(self, upstream: str, host: str, port: int, *, name: str | None = None,
                 inject: bool = False) -> None:
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
        self.name = name or url.hostname
        self.inject = inject

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
        #: Guards on (guard.py): request bodies that may be refused and response bodies are guarded on the path.
        self.guard = getattr(telemetry.measurer, "guarded", False) is True
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
            await self._connection(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:  # a bug here must not take the proxy down
            logger.exception("mcp-token-otel proxy: connection failed")
        finally:
            self.connections.discard(task)
            writer.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        transport = writer.transport
        task = asyncio.current_task()
        timeout = HEADER_TIMEOUT
        carry = b""  # bytes of the next request read while watching for a disconnect
        while True:
            # Deadlines by timer (cheaper than wait_for's task per read): an idle keep-alive connection waits for
            # the first byte of its next request, then a started head must be complete in HEADER_TIMEOUT.
            timer = None
            try:
                if not carry:
                    timer = loop.call_later(timeout, transport.abort)
                    self.idle.add(task)  # between requests: a shutdown need not wait for it
                    try:
                        carry = await reader.read(1)
                    finally:
                        self.idle.discard(task)
                    timer.cancel()
                    if not carry:
                        return
                timer = loop.call_later(HEADER_TIMEOUT, transport.abort)
                head = carry + await reader.readuntil(b"\r\n\r\n")
                timer.cancel()
                carry = b""
                if len(head) > MAX_HEAD:
                    raise HttpError(431, "Request Header Fields Too Large")
                first, headers = _parse_head(head)
                parts = first.split(b" ")
                if len(parts) != 3 or not parts[2].startswith(b"HTTP/1.") or not parts[0].isalpha():
                    raise HttpError(400, "Bad Request")
                method, target, version = parts
                length, chunked, close = _framing(headers)
            except (asyncio.LimitOverrunError, ValueError):  # (readuntil: ValueError once over the limit)
                await _refuse(writer, HttpError(431, "Request Header Fields Too Large"))
                await _linger(reader, writer)
                return
            except HttpError as exc:
                await _refuse(writer, exc)
                await _linger(reader, writer)
                return
            except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                return  # too slow (aborted) or gone: closed without an answer
            finally:
                if timer is not None:
                    timer.cancel()
            keep = version == b"HTTP/1.1" and not close
            keep, carry = await self._exchange(reader, writer, method, target, headers, length, chunked, keep)
            if not keep:
                return
            timeout = KEEPALIVE_IDLE

    async def _exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, method: bytes, target: bytes,
        headers: list[tuple[bytes, bytes]], length: int | None, chunked: bool, keep: bool,
    ) -> tuple[bool, bytes]:
        """One request and its response; (keep the client connection, bytes read ahead of the next request)."""
        measurer = self.telemetry.measurer
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
        if expect and (length or chunked):
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if length is not None and length <= SMALL_BODY:  # the usual POST: whole, then sent with the head
            try:
                body = await reader.readexactly(length) if length else b""
            except (asyncio.IncompleteReadError, ConnectionError):  # the client left mid-body
                if up is not None:
                    measurer.finish(up)
                if tracker is not None and session_id is None:
                    measurer.close_tracker(tracker)
                return False, b""
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
                    return keep, b""
                if forward is not None and forward is not body:
                    body = forward
                    length = len(body)
            out.append(b"content-length: %d\r\n" % length)
        elif length is not None:
            out.append(b"content-length: %d\r\n" % length)
        elif chunked:
            out.append(b"transfer-encoding: chunked\r\n")
        else:
            body = b""  # GET, DELETE...: no body (and a retry on a fresh connection is safe)
        out.append(b"\r\n")
        head = b"".join(out)
        response_started = False
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        reusable = False
        try:
            try:
                conn, status, reason, rheaders, rversion = await self._send(
                    head, body, reader, length, chunked, up, measurer)
            except HttpError as exc:
                await _refuse(writer, exc)
                return False, b""
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                    UpstreamBroken, ValueError) as exc:
                logger.warning("mcp-token-otel proxy: upstream %s %s failed: %s",
                               method.decode("latin-1"), target.decode("latin-1"), exc or type(exc).__name__)
                await _refuse(writer, HttpError(502, "Bad Gateway"),
                              b"mcp-token-otel proxy: upstream unreachable\n")
                return False, b""
            new_session = _header(rheaders, b"mcp-session-id")
            if tracker is not None and session_id is None and new_session:
                new_id = new_session.decode("latin-1")
                measurer.set_tracker(tracker, session_key=new_id, session_id=new_id)  # joins the session
            if up is not None:  # measured after the session is known: the request's span carries it
                measurer.finish(up)
                up = None
            rlength, rchunked, rclose = _framing(rheaders)
            no_body = method == b"HEAD" or status in (204, 304)
            until_eof = not no_body and rlength is None and not rchunked
            drop = HOP_BY_HOP | _connection_tokens(rheaders) if rclose or any(
                n.lower() == b"connection" for n, _ in rheaders) else HOP_BY_HOP
            rout = [b"HTTP/1.1 %d " % status + reason + b"\r\n"]
            rout += [n + b": " + v + b"\r\n" for n, v in rheaders if n.lower() not in drop]
            if not no_body and rlength is None:
                if keep:
                    rout.append(b"transfer-encoding: chunked\r\n")
                else:
                    until_eof = True
            if not keep:
                rout.append(b"connection: close\r\n")
            rout.append(b"\r\n")
            rhead = b"".join(rout)
            down = self._response_stream(tracker, status, rheaders) if not no_body else None
            guard = None  # guards on: the response is held whole (a JSON body) or by event (SSE), guarded
            if self.guard and down is not None:
                guard = SseGuard(measurer, down) if down.framing == SSE else BodyGuard(measurer, down)
            ureader = conn[0]
            response_started = True
            if no_body or rlength == 0:
                writer.write(rhead)
                await writer.drain()
                reusable = not rclose and rversion == b"HTTP/1.1"
            elif guard is not None and isinstance(guard, BodyGuard) and rlength is not None \
                    and rlength <= measurer.max_message:
                body = await ureader.readexactly(rlength)
                forward = guard.finish_body(body)
                if forward is not body:  # re-serialised: its own length
                    rhead = b"".join(line for line in rout[:-1] if not line.lower().startswith(b"content-length:")) \
                        + b"content-length: %d\r\n\r\n" % len(forward)
                writer.write(rhead + forward)
                await writer.drain()
                reusable = not rclose and rversion == b"HTTP/1.1"
            elif rlength is not None:
                reusable = await self._relay_length(ureader, writer, rhead, rlength, down, measurer)
                reusable = reusable and not rclose and rversion == b"HTTP/1.1"
            else:
                # Streams (SSE...): relayed chunk by chunk while watching the client for a disconnect.
                framed = keep  # chunked towards the client, else until close
                source = _read_chunked(ureader, CHUNK) if rchunked else _read_eof(ureader)
                carry, completed = await self._relay_stream(reader, writer, rhead, source, framed, down, measurer,
                                                            guard)
                if not completed:
                    return False, b""
                reusable = rchunked and not rclose and rversion == b"HTTP/1.1"
                if session_id is not None and (method == b"DELETE" or status == 404):
                    self._end_session(session_id)
                return keep, carry
            if session_id is not None and (method == b"DELETE" or status == 404):
                self._end_session(session_id)  # gone upstream: its budget closes
            return keep and not until_eof, b""
        except (UpstreamBroken, asyncio.IncompleteReadError, HttpError, ValueError) as exc:
            logger.warning("mcp-token-otel proxy: upstream response broken: %s", exc or type(exc).__name__)
            reusable = False
            if not response_started:
                await _refuse(writer, HttpError(502, "Bad Gateway"))
            return False, b""
        except (OSError, asyncio.CancelledError):
            reusable = False
            raise
        finally:
            if up is not None:
                measurer.finish(up)
            if conn is not None:
                if reusable:
                    self.upstream.give_back(conn)
                else:
                    conn[1].close()
            if tracker is not None and session_id is None:
                measurer.close_tracker(tracker)

    async def _send(
        self, head: bytes, body: bytes | None, reader: asyncio.StreamReader, length: int | None, chunked: bool,
        up: Any, measurer: Any,
    ) -> tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter], int, bytes, list[tuple[bytes, bytes]], bytes]:
        """Send the request upstream and read the response head (1xx answers relayed... and skipped)."""
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
                    await uwriter.drain()
                else:
                    uwriter.write(head)
                    if length is not None:
                        await _copy_length(reader, uwriter, length, up, measurer)
                    elif chunked:
                        async for data in _read_chunked(reader, CHUNK):
                            if up is not None:
                                measurer.put(up, data)
                            uwriter.write(b"%x\r\n" % len(data) + data + b"\r\n")
                            await uwriter.drain()
                        uwriter.write(b"0\r\n\r\n")
                    await uwriter.drain()
                while True:
                    rhead = await ureader.readuntil(b"\r\n\r\n")
                    first, rheaders = _parse_head(rhead)
                    version, _, rest = first.partition(b" ")
                    code, _, reason = rest.partition(b" ")
                    if not version.startswith(b"HTTP/1.") or not code.isdigit():
                        raise UpstreamBroken(f"bad status line {first[:80]!r}")
                    status = int(code)
                    if 100 <= status < 200 and status != 101:
                        continue  # interim answers (100 Continue...) are not relayed
                    return conn, status, reason, rheaders, version
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

    async def _relay_length(self, ureader: asyncio.StreamReader, writer: asyncio.StreamWriter, rhead: bytes,
                            left: int, down: Any, measurer: Any) -> bool:
        """A body of known length (a JSON answer), relayed straight; True when the whole body went through."""
        first = True
        try:
            while left:
                data = await ureader.read(min(left, CHUNK))
                if not data:
                    raise UpstreamBroken(f"upstream closed with {left} bytes of the body missing")
                left -= len(data)
                if down is not None:
                    measurer.put(down, data)
                if first:
                    writer.write(rhead + data)  # head and first chunk in one segment
                    first = False
                else:
                    writer.write(data)
                await writer.drain()
        finally:
            if down is not None:
                measurer.finish(down)
        return True

    async def _relay_stream(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rhead: bytes, source: Any, framed: bool,
        down: Any, measurer: Any, guard: Any = None,
    ) -> tuple[bytes, bool]:
        """Relay a stream until it ends or the client leaves; (bytes read ahead, completed)."""
        writer.write(rhead)
        await writer.drain()
        carry = b""
        gone = asyncio.Event()

        async def watch() -> None:
            nonlocal carry
            try:
                data = await reader.read(CHUNK)
            except (ConnectionError, OSError):  # reset by the client: gone too
                data = b""
            if data:
                carry = data  # a pipelined request: kept for later; stop watching
            else:
                gone.set()

        async def pump() -> None:
            try:
                async for data in source:
                    if guard is not None:  # whole events (or the whole body) go on once guarded
                        data = guard.feed(data)
                        if not data:
                            continue
                    elif down is not None:
                        measurer.put(down, data)
                    writer.write(b"%x\r\n" % len(data) + data + b"\r\n" if framed else data)
                    await writer.drain()
                rest = guard.finish() if guard is not None else b""
                if rest:
                    writer.write(b"%x\r\n" % len(rest) + rest + b"\r\n" if framed else rest)
                    await writer.drain()
                if framed:
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
            finally:
                if down is not None:
                    measurer.finish(down)

        watching = asyncio.ensure_future(watch())
        pumping = asyncio.ensure_future(pump())
        try:
            while not pumping.done():
                await asyncio.wait({pumping, watching}, return_when=asyncio.FIRST_COMPLETED)
                if gone.is_set():
                    logger.info("mcp-token-otel proxy: client went away mid-stream; upstream request closed")
                    return b"", False
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
            return b"", False
        return carry, True

    def _response_stream(self, tracker: Any, status: int, headers: list[tuple[bytes, bytes]]) -> Any:
        if tracker is None or status in (401, 403):
            return None
        encoding = (_header(headers, b"content-encoding") or b"identity").lower()
        if encoding != b"identity":
            return None  # relayed as is; compressed bodies are not measured
        ctype = (_header(headers, b"content-type") or b"").split(b";")[0].strip().lower()
        if ctype == b"text/event-stream":
            return self.telemetry.measurer.stream(tracker, S2C, SSE)
        if ctype == b"application/json":
            return self.telemetry.measurer.stream(tracker, S2C, BODY)
        return None


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


async def _read_eof(reader: asyncio.StreamReader) -> Any:
    while True:
        data = await reader.read(CHUNK)
        if not data:
            return
        yield data


async def _copy_length(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, left: int, up: Any,
                       measurer: Any) -> None:
    while left:
        data = await reader.read(min(left, CHUNK))
        if not data:
            raise asyncio.IncompleteReadError(b"", left)
        left -= len(data)
        if up is not None:
            measurer.put(up, data)
        writer.write(data)
        await writer.drain()


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
