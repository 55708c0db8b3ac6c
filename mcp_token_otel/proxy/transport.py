"""The seam between what a transport does and what every transport shares.

A transport (stdio.py: a child's pipes; http.py: streamable HTTP) moves bytes: it reads them, writes them,
and says where a message ends, its *framing*: a line (stdio), a whole body or an SSE event (HTTP). Every
direction of every exchange then goes through one :class:`Channel`, which does the rest the same way for
both: the message's measurement (handed off the relay path, or on it with guards on), trace-context
injection, and guards (which may hold a message until it is whole, change it, or answer its sender).
"""

from __future__ import annotations

from typing import Any, Protocol

from .guard import BodyGuard, LineGuard, SseGuard
from .inject import Injector, LineInjector
from .jsonrpc import LINES, SSE

#: Request headers never handed to the measuring side: credentials (``principal`` keys a budget by who).
_PRIVATE_HEADERS = frozenset({b"authorization", b"proxy-authorization", b"cookie"})


def http_origin(headers: list[tuple[bytes, bytes]], peername: Any) -> dict[str, Any]:
    """What a budget key (``budget.key``) may read from an HTTP request besides its body: its headers (lower-case
    names, the first of each) for ``header:<name>`` and ``baggage``, and the client's address for ``client``."""
    fields: dict[str, str] = {}
    for name, value in headers:
        lower = name.lower()
        if lower not in _PRIVATE_HEADERS:
            fields.setdefault(lower.decode("latin-1"), value.decode("latin-1"))
    peer = peername[0] if isinstance(peername, tuple) and peername and isinstance(peername[0], str) else None
    return {"headers": fields, "peer": peer}


class Transport(Protocol):
    """A proxy for one kind of MCP transport; built by the CLI, run until the client or the server is done."""

    #: ``network.transport`` on the spans: ``pipe`` for stdio, ``tcp`` for HTTP.
    network: str

    def run(self, telemetry: Any) -> int:
        """Relay until done; the exit status."""


class Channel:
    """One direction of one exchange: chunks in as the transport read them; out, what to forward now and
    what to answer the sender with now (a guard's refusal). Measurement is handed over before the bytes are
    forwarded, so an answer can never be measured ahead of the request that the other direction carried."""

    __slots__ = ("_guard", "_lines", "measurer", "stream")

    def __init__(self, measurer: Any, tracker: Any, direction: str, framing: str,
                 injector: Injector | None = None, *, guard: bool = True) -> None:
        """``guard`` False: measured as relayed, never held, even with guards on (a body known to be too
        large to hold)."""
        self.measurer = measurer
        self.stream = measurer.stream(tracker, direction, framing)
        self._guard: Any = None
        self._lines: LineInjector | None = None
        if guard and getattr(measurer, "guarded", False) is True:  # whole messages, guarded before they go on
            if framing == LINES:
                rewrite = (lambda body: injector.rewrite_body(tracker, body)) if injector is not None else None
                self._guard = LineGuard(measurer, self.stream, rewrite)
            elif framing == SSE:
                self._guard = SseGuard(measurer, self.stream)
            else:
                self._guard = BodyGuard(measurer, self.stream)
        elif injector is not None and framing == LINES:
            self._lines = LineInjector(injector, tracker)

    @property
    def passing(self) -> bool:
        """Inside a line too long to hold, forwarded in pieces (a writer shared by two relays keeps it)."""
        return isinstance(self._guard, LineGuard) and self._guard.passing

    @property
    def holds_body(self) -> bool:
        """Guards on, a JSON body: held until whole (see :meth:`whole`)."""
        return isinstance(self._guard, BodyGuard)

    def feed(self, chunk: bytes) -> tuple[bytes, bytes]:
        guard = self._guard
        if isinstance(guard, LineGuard):
            return guard.feed(chunk)
        if guard is not None:
            return guard.feed(chunk), b""
        if self._lines is not None:
            chunk = self._lines.feed(chunk)
        self.measurer.put(self.stream, chunk)
        return chunk, b""

    def whole(self, body: bytes) -> bytes:
        """A whole body at once (its length was known): what to forward, ``body`` itself when unchanged."""
        if isinstance(self._guard, BodyGuard):
            return self._guard.finish_body(body)
        return self.feed(body)[0]

    def finish(self) -> tuple[bytes, bytes]:
        """The input ended: what was still held, to forward (and answer) now; the message is measured."""
        guard = self._guard
        out = b"", b""
        if isinstance(guard, LineGuard):
            out = guard.flush()
        elif guard is not None:
            out = guard.finish(), b""
        elif self._lines is not None:
            rest = self._lines.flush()
            self.measurer.put(self.stream, rest)
            out = rest, b""
        self.measurer.finish(self.stream)
        return out
