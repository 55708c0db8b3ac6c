"""Request heads of the standalone /metrics server, parsed by llhttp (``httptools``) as they arrive, and the
WSGI environ built from them (see metrics_server.py)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import httptools

#: Largest request head accepted; a scrape's is a few hundred bytes.
MAX_REQUEST_HEAD = 16 * 1024
BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
TOO_LARGE = b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
SERVER_ERROR = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _HeadComplete(Exception):
    """Raised from llhttp's callback to stop parsing at the end of the first head (nothing after it is read)."""


class RequestHead:
    """One request head, fed as it arrives and parsed by llhttp: ``feed`` returns None while it is incomplete,
    else the refusal to send (None in ``refusal`` when the head is complete and well formed)."""

    __slots__ = ("_cr", "_line_done", "_parser", "headers", "method", "size", "target", "version")

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        # Bare LF line ends are taken, as scrapers' hand-made requests use them (no body is ever read here, so
        # there is no framing to smuggle through). llhttp's flag covers the header lines; the request line's
        # own LF gets its CR below.
        self._parser.set_dangerous_leniencies(lenient_optional_cr_before_lf=True)
        self._line_done = False
        self._cr = False  # the last byte fed was a CR
        self.size = 0
        self.method = ""
        self.target = b""
        self.version = ""
        self.headers: list[tuple[bytes, bytes]] = []

    def feed(self, data: bytes) -> bytes | None:
        """None: the head is not complete yet; b"": complete and well formed; else the refusal to send."""
        self.size += len(data)
        if not self._line_done:
            nl = data.find(b"\n")
            if nl >= 0:
                self._line_done = True
                if not (data[nl - 1:nl] == b"\r" if nl else self._cr):
                    data = data[:nl] + b"\r" + data[nl:]
            self._cr = data.endswith(b"\r")
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _HeadComplete):
                return TOO_LARGE if self._fields() > MAX_REQUEST_HEAD else b""
            return BAD_REQUEST
        except httptools.HttpParserError:
            return BAD_REQUEST
        return TOO_LARGE if self.size > MAX_REQUEST_HEAD else None

    def _fields(self) -> int:
        return len(self.target) + sum(len(name) + len(value) + 4 for name, value in self.headers)

    # llhttp callbacks

    def on_url(self, url: bytes) -> None:
        self.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.version = self._parser.get_http_version()
        self.method = self._parser.get_method().decode("latin-1")
        raise _HeadComplete


def environ_from(head: RequestHead, environ: dict[str, Any]) -> bool:
    """Fill a WSGI ``environ`` from a request head; False when it is not an HTTP/1.x request. Header names
    holding ``_`` are dropped (as wsgiref does: they could pose as others)."""
    if not head.version.startswith("1."):
        return False
    target = head.target.decode("latin-1")
    if "://" in target:  # absolute form: keep the path and query
        target = "/" + target.split("://", 1)[1].partition("/")[2]
    path, _, query = target.partition("?")
    environ.update(REQUEST_METHOD=head.method, PATH_INFO=unquote(path, "latin-1"), QUERY_STRING=query,
                   SERVER_PROTOCOL="HTTP/" + head.version)
    for raw_name, raw_value in head.headers:
        name = raw_name.decode("latin-1")
        if "_" in name:
            continue
        key = name.upper().replace("-", "_")
        key = key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else "HTTP_" + key
        value = raw_value.decode("latin-1").strip()
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    return True
