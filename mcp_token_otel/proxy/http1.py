"""HTTP/1.1 messages parsed by llhttp (``httptools``, the parser uvicorn uses): the relay's side of the wire.

Sans-IO: :meth:`Http1Parser.feed` takes bytes as they were read and queues events (a head, body pieces, the
end of a message, or a refusal); the relay takes them in order. Requests pipelined on one connection are
queued one after the other, so they are answered in the order they came. llhttp refuses what request
smuggling needs (Content-Length with Transfer-Encoding, duplicate lengths, obsolete line folding, spaces
in header names); the limits on a head's size and field count are checked here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass
from typing import Any

import httptools

#: Limits against misbehaving clients (and upstreams): head size and header count.
MAX_HEAD = 64 * 1024
MAX_HEADERS = 100

#: Event kinds: a message's head, a piece of its body (chunked framing removed), its end, a refusal; and,
#: from :meth:`Wire.next` only, the peer closed the connection.
HEAD, DATA, END, ERROR = range(4)
CLOSED = -1
HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"transfer-encoding", b"upgrade",
})
#: Bytes read from a socket at a time.
CHUNK = 64 * 1024
#: llhttp's usual version strings, as written on a request or status line.
_VERSIONS = {"1.1": b"HTTP/1.1", "1.0": b"HTTP/1.0"}


class HttpError(Exception):
    """A message we refuse: the status to answer with and a short reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def too_large() -> HttpError:
    return HttpError(431, "Request Header Fields Too Large")


def bad_request() -> HttpError:
    return HttpError(400, "Bad Request")


@dataclass(slots=True)
class Head:
    """A request line (or status line) and its header fields, as received."""

    method: bytes
    target: bytes
    status: int
    reason: bytes
    version: bytes
    headers: list[tuple[bytes, bytes]]
    length: int | None
    chunked: bool
    keep_alive: bool
    #: The header names in lower case, in order (one per field of ``headers``).
    names: list[bytes]
    #: The first value of each header, by lower-case name.
    fields: dict[bytes, bytes]

    def get(self, name: bytes) -> bytes | None:
        """The first field called ``name`` (lower case)."""
        return self.fields.get(name)


class Http1Parser:
    """One direction of one HTTP/1.1 connection: requests (a client's) or responses (an upstream's)."""

    def __init__(self, response: bool = False, *, max_head: int = MAX_HEAD, max_headers: int = MAX_HEADERS) -> None:
        self._parser: Any = httptools.HttpResponseParser(self) if response else httptools.HttpRequestParser(self)
        self.response = response
        self.max_head = max_head
        self.max_headers = max_headers
        self.events: deque[tuple[int, Any]] = deque()
        self.failed = False
        self._in_head = False
        self._size = 0  # bytes of the head so far
        self._url = b""
        self._reason = b""
        self._headers: list[tuple[bytes, bytes]] = []
        #: The last message ended (its END event queued): a parser that may take the next one.
        self.complete = False

    @property
    def in_head(self) -> bool:
        """A head has started and is not complete yet."""
        return self._in_head

    def feed(self, data: bytes) -> None:
        """Parse ``data``; a malformed message becomes an ERROR event after the events of those before it."""
        if self.failed:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # an Upgrade request: relayed as a plain request (Upgrade is hop-by-hop); the connection closes
        except httptools.HttpParserCallbackError as exc:
            self._fail(exc.__context__ if isinstance(exc.__context__, HttpError) else bad_request())
        except httptools.HttpParserError as exc:
            # llhttp's words: a coding other than chunked last is not implemented, anything else is malformed.
            self._fail(HttpError(501, "Not Implemented") if "invalid `Transfer-Encoding`" in str(exc)
                       else bad_request())
        if self._in_head and not self.failed:
            self._size += len(data)  # a head still open: count what it took (llhttp holds no limit itself)
            if self._size > self.max_head:
                self._fail(too_large())

    def _fail(self, error: HttpError) -> None:
        self.failed = True
        self._in_head = False
        self.events.append((ERROR, error))

    # llhttp callbacks

    def on_message_begin(self) -> None:
        self._in_head = True
        self.complete = False
        self._size = 0
        self._url = b""
        self._reason = b""
        self._headers = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_head:  # else a trailer field of a chunked body: dropped
            self._headers.append((name, value))  # checked whole, once the head is complete

    def on_headers_complete(self) -> None:
        self._in_head = False
        parser = self._parser
        number = parser.get_http_version()
        version = _VERSIONS.get(number)
        if version is None:
            if not number.startswith("1."):
                raise bad_request()  # HTTP/0.9 ("GET /") and whatever is not HTTP/1.x
            version = b"HTTP/" + number.encode()
        headers = self._headers
        if len(headers) > self.max_headers:
            raise too_large()
        names = []  # lower case, once per field: everything after reads these
        fields: dict[bytes, bytes] = {}  # the first value of each name
        size = len(self._url) + len(self._reason)
        for name, value in headers:
            lower = name.lower()
            names.append(lower)
            if lower not in fields:
                fields[lower] = value
            size += len(name) + len(value) + 4
        if size > self.max_head:
            raise too_large()
        length_field = fields.get(b"content-length")
        length = None if length_field is None else int(length_field)  # llhttp checked it: digits, one value
        chunked = False
        if b"transfer-encoding" in fields:  # the last coding of the last field
            for lower, (_, value) in zip(names, headers, strict=True):
                if lower == b"transfer-encoding":
                    chunked = value.rsplit(b",", 1)[-1].strip().lower() == b"chunked"
        self.events.append((HEAD, Head(
            b"" if self.response else parser.get_method(), self._url,
            parser.get_status_code() if self.response else 0, self._reason, version,
            headers, None if chunked else length, chunked, parser.should_keep_alive(), names, fields,
        )))

    def on_body(self, body: bytes) -> None:
        self.events.append((DATA, body))

    def on_message_complete(self) -> None:
        self.complete = True
        self.events.append((END, None))


class Wire:
    """The reading side of one connection: bytes from the socket through the parser, events out in order."""

    __slots__ = ("hook", "parser", "reader", "transport")

    def __init__(self, reader: asyncio.StreamReader, parser: Http1Parser, transport: asyncio.WriteTransport,
                 hook: Hook | None = None) -> None:
        self.reader = reader
        self.parser = parser
        self.transport = transport  # aborted when a deadline passes
        self.hook = hook  # a client's connection: tells when it went away (see Hook)

    async def next(self) -> tuple[int, Any]:
        """The next event (HEAD, DATA, END, ERROR), or CLOSED."""
        events = self.parser.events
        while not events:
            data = await self.reader.read(CHUNK)
            if not data:
                return CLOSED, None
            self.parser.feed(data)
        return events.popleft()

    def ready_body(self) -> bytes | None:
        """The whole body of the message whose head was just taken, when all of it was already read (its end
        taken too); else None, and nothing is taken."""
        events = self.parser.events
        count = 0
        for kind, _ in events:
            if kind == END:
                break
            if kind != DATA:
                return None
            count += 1
        else:
            return None
        pieces = [events.popleft()[1] for _ in range(count)]
        events.popleft()  # the end
        return pieces[0] if count == 1 else b"".join(pieces)

    @property
    def spent(self) -> bool:
        """Nothing read past the message just ended (a connection that may be reused)."""
        return not self.parser.events and not self.parser.in_head and not self.parser.failed


class Hook:
    """A client connection's protocol, wrapped: while the relay waits for the upstream in the middle of a
    response, ``on_change`` is called whenever the client sends, ends or loses its connection, so that a client
    that went away is noticed at once without a task watching its socket."""

    __slots__ = ("inner", "on_change")

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.on_change: Any = None

    def connection_made(self, transport: Any) -> None:
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)
        if self.on_change is not None:
            self.on_change()

    def eof_received(self) -> bool | None:
        keep: bool | None = self.inner.eof_received()
        if self.on_change is not None:
            self.on_change()
        return keep

    def connection_lost(self, exc: BaseException | None) -> None:
        self.inner.connection_lost(exc)
        if self.on_change is not None:
            self.on_change()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


def hook(writer: asyncio.StreamWriter) -> Hook:
    """Wrap the protocol of a client connection served by asyncio streams (see Hook)."""
    transport = writer.transport
    wrapped = Hook(transport.get_protocol())
    transport.set_protocol(wrapped)  # type: ignore[arg-type]  # a protocol by its methods
    return wrapped


async def answer_json(writer: asyncio.StreamWriter, body: bytes, keep: bool, status: bytes = b"200 OK") -> None:
    """The proxy's own answer to a POST: a refused tools/call (200), an upstream that never answered (502)."""
    writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % len(body)
                 + (b"" if keep else b"connection: close\r\n") + b"\r\n" + body)
    await writer.drain()


async def refuse(writer: asyncio.StreamWriter, exc: HttpError, body: bytes | None = None) -> None:
    """Answer with an error and close (the connection's state is unknown after it)."""
    text = body if body is not None else f"mcp-token-otel proxy: {exc.reason}\n".encode()
    with contextlib.suppress(Exception):
        writer.write(b"HTTP/1.1 %d " % exc.status + exc.reason.encode("latin-1")
                     + b"\r\ncontent-type: text/plain\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(text)
                     + text)
        await writer.drain()


class UpstreamBroken(Exception):
    """The upstream failed (reset, EOF, bad framing) after the response started."""


#: What a usual ``Connection`` field adds to the hop-by-hop headers (by its value in lower case).
_CONNECTION_DROPS = {b"keep-alive": HOP_BY_HOP, b"close": HOP_BY_HOP | {b"close"}}


def hop_by_hop(head: Head) -> frozenset[bytes]:
    """The lower-case names of the header fields not forwarded: the hop-by-hop ones and those listed in
    ``Connection`` (RFC 9110 7.6.1)."""
    value = head.fields.get(b"connection")
    if value is None:
        return HOP_BY_HOP
    if head.names.count(b"connection") == 1:
        known = _CONNECTION_DROPS.get(value.lower())
        if known is not None:
            return known
    listed = {token.strip().lower() for lower, (_, field) in zip(head.names, head.headers, strict=True)
              if lower == b"connection" for token in field.split(b",")}
    return HOP_BY_HOP | listed


class Body:
    """A response body as it arrives: :meth:`take` what was read (chunked framing removed, in one piece), then
    :meth:`more` to wait for the next bytes, until ``ended``. Nothing is copied or awaited that was already
    there: a response read whole goes on in one write."""

    __slots__ = ("ended", "until_eof", "wire")

    def __init__(self, wire: Wire, until_eof: bool) -> None:
        self.wire = wire
        self.until_eof = until_eof  # it ends by closing (no length, not chunked)
        self.ended = False

    def take(self) -> bytes:
        """The body's bytes read and not taken yet (maybe none); ``ended`` is set once its end is taken. A
        malformed body raises UpstreamBroken once the bytes before the fault are taken."""
        events = self.wire.parser.events
        pieces = []
        while events:
            kind, value = events[0]
            if kind == DATA:
                pieces.append(value)
            elif kind == END:
                self.ended = True
            elif kind == ERROR and not pieces:
                raise UpstreamBroken(f"bad response body: {value.reason}")
            else:
                break
            events.popleft()
            if self.ended:
                break
        if not pieces:
            return b""
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def more(self) -> None:
        """Wait for more bytes of the body (read and parsed); ``ended`` when it ends by closing."""
        try:
            data = await self.wire.reader.read(CHUNK)
        except (ConnectionError, OSError) as exc:  # reset by the upstream
            raise UpstreamBroken(str(exc) or type(exc).__name__) from None
        if data:
            self.wire.parser.feed(data)
        elif self.until_eof:
            self.ended = True
        else:
            raise UpstreamBroken("upstream closed before the end of the body")

    async def whole(self) -> bytes:
        """The rest of the body, once it has all arrived."""
        pieces = [self.take()]
        while not self.ended:
            await self.more()
            pieces.append(self.take())
        return b"".join(pieces)
