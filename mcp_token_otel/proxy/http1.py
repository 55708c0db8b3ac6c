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

    def get(self, name: bytes) -> bytes | None:
        """The first field called ``name`` (lower case)."""
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None


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
        self._size = 0
        self._url = b""
        self._reason = b""
        self._headers = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:
            return  # a trailer field of a chunked body: dropped
        self._headers.append((name, value))
        if len(self._headers) > self.max_headers:
            raise too_large()

    def on_headers_complete(self) -> None:
        self._in_head = False
        parser = self._parser
        version = parser.get_http_version()
        if not version.startswith("1."):
            raise bad_request()  # HTTP/0.9 ("GET /") and whatever is not HTTP/1.x
        length: int | None = None
        chunked = False
        size = len(self._url) + len(self._reason)
        for name, value in self._headers:
            size += len(name) + len(value) + 4
            lower = name.lower()
            if lower == b"content-length":
                length = int(value)  # llhttp checked it: digits, one value
            elif lower == b"transfer-encoding":
                chunked = value.rsplit(b",", 1)[-1].strip().lower() == b"chunked"
        if size > self.max_head:
            raise too_large()
        self.events.append((HEAD, Head(
            b"" if self.response else parser.get_method(), self._url,
            parser.get_status_code() if self.response else 0, self._reason, b"HTTP/" + version.encode(),
            self._headers, None if chunked else length, chunked, parser.should_keep_alive(),
        )))

    def on_body(self, body: bytes) -> None:
        self.events.append((DATA, body))

    def on_message_complete(self) -> None:
        self.events.append((END, None))


class Wire:
    """The reading side of one connection: bytes from the socket through the parser, events out in order."""

    __slots__ = ("parser", "reader", "transport")

    def __init__(self, reader: asyncio.StreamReader, parser: Http1Parser, transport: asyncio.WriteTransport) -> None:
        self.reader = reader
        self.parser = parser
        self.transport = transport  # aborted when a deadline passes

    async def next(self) -> tuple[int, Any]:
        """The next event (HEAD, DATA, END, ERROR), or CLOSED."""
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


def connection_tokens(headers: list[tuple[bytes, bytes]]) -> set[bytes]:
    """Header names listed in Connection (hop-by-hop too, RFC 9110 7.6.1)."""
    out: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            out.update(t.strip().lower() for t in value.split(b","))
    return out


def hop_by_hop(headers: list[tuple[bytes, bytes]]) -> frozenset[bytes] | set[bytes]:
    return HOP_BY_HOP | connection_tokens(headers) if any(n.lower() == b"connection" for n, _ in headers) \
        else HOP_BY_HOP


async def upstream_body(uwire: Wire, until_eof: bool) -> Any:
    """A response body's pieces as they arrive (chunked framing removed); ``until_eof``: it ends by closing."""
    while True:
        try:
            kind, value = await uwire.next()
        except (ConnectionError, OSError) as exc:  # reset by the upstream
            raise UpstreamBroken(str(exc) or type(exc).__name__) from None
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
