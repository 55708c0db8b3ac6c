"""Guards in the proxy (``guard.mode`` observe or enforce, ``"proxy"`` in ``guard.sides``): on the relay path.

With guards off (the default) nothing here runs: the relay forwards bytes and measures off the path, in
another process (measure_process.py). A guard has to see a message whole, with its measurement and the
session's budget, *before* the message goes on: a ``tools/call`` may be refused (answered by the proxy,
never forwarded), a result may be cut, annotated or get a notice. So with guards on the proxy measures in
its own process, on the relay path: :class:`GuardMeasurer` has the :class:`~.jsonrpc.Measurer` interface
but handles everything at once, under one lock (stdio has two relay threads), and the relays hold each
message until it is complete: a line (:class:`LineGuard`), an HTTP body, an SSE event (:class:`SseGuard`).

Never break the relay: a fault anywhere in guarding forwards the original bytes and is counted in the
recorder's fault counter with stage ``guard``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..config import Config
from ..recorder import TokenRecorder
from .jsonrpc import DEFAULT_MAX_MESSAGE, MessageStream, ProxyStats, Tracker
from .lines import LineSplitter

logger = logging.getLogger("mcp_token_otel.proxy")

SIDE = "proxy"


#: A client's request body the HTTP relay guards whole before it goes upstream when it holds one of these: a tool
#: call (it may be refused), a result (the client's answer to a server's request, which may be changed), a
#: resources request (a read of a kept result, a listing of the resources the proxy declared: answered here). Other
#: requests are measured after the response head, as without guards.
HELD_REQUESTS: tuple[bytes, ...] = (b'"tools/call"', b'"result"', b'"resources/')


def held_request(body: bytes) -> bool:
    """Whether the guards must see this request body whole before it goes upstream (see HELD_REQUESTS)."""
    return any(marker in body for marker in HELD_REQUESTS)


def proxy_guarded(config: Config) -> bool:
    """True when some guard mode is on (globally or for a tool) and ``guard.sides`` includes the proxy."""
    from ..core.guard import GuardEngine

    settings = config.guard
    sides = getattr(settings, "sides", (SIDE,))
    return SIDE in sides and GuardEngine(settings).active


class GuardMeasurer:
    """The :class:`~.jsonrpc.Measurer` interface, synchronous: every call is handled before it returns."""

    guarded = True

    def __init__(self, recorder: TokenRecorder, stats: ProxyStats, *, max_message: int = DEFAULT_MAX_MESSAGE) -> None:
        self.recorder = recorder
        self.stats = stats
        self.max_message = max_message
        self._lock = threading.Lock()

    def fault(self) -> None:
        self.stats.faults += 1
        self.recorder.fault("guard")

    def tracker(self, **kwargs: Any) -> Tracker:
        return Tracker(self.recorder, self.stats, guard=True, **kwargs)

    def stream(self, tracker: Tracker, direction: str, framing: str) -> MessageStream:
        return MessageStream(tracker, direction, framing, self.max_message)

    def message(self, stream: MessageStream, raw: bytes) -> tuple[bytes | None, bytes | None]:
        """One whole message of ``stream``: (what to forward, what to answer its sender with); see
        :meth:`Tracker.guarded`. A fault: the original bytes go on."""
        try:
            with self._lock:
                return stream.tracker.guarded(stream.direction, raw, time.time_ns())
        except Exception:
            self.fault()
            logger.debug("mcp_token_otel proxy: guard fault", exc_info=True)
            return raw, None

    def put(self, stream: MessageStream, chunk: bytes, at: int | None = None) -> None:
        """Bytes relayed unguarded (a request body that streams, a compressed or oversized one): measured.
        ``at``: when they passed (``time.time_ns()``; default: now)."""
        if chunk:
            self._run(lambda now: self._feed(stream, stream.feed(chunk), at or now))

    def finish(self, stream: MessageStream, at: int | None = None) -> None:
        self._run(lambda now: self._feed(stream, stream.finish(), at or now))

    @staticmethod
    def _feed(stream: MessageStream, messages: list[bytes], now: int) -> None:
        for message in messages:
            stream.tracker.observe(stream.direction, message, now)

    def close_tracker(self, tracker: Tracker) -> None:
        self._run(tracker.close)

    def inject(self, tracker: Tracker, request_id: Any, trace_id: int, span_id: int) -> None:
        self._run(lambda _now: tracker.inject(request_id, trace_id, span_id))

    def set_tracker(self, tracker: Tracker, **attrs: Any) -> None:
        def apply(_now: int) -> None:
            for key, value in attrs.items():
                setattr(tracker, key, value)

        self._run(apply)

    def _run(self, action: Callable[[int], None]) -> None:
        try:
            with self._lock:
                action(time.time_ns())
        except Exception:  # measuring never stops the relay
            self.stats.faults += 1
            logger.debug("mcp_token_otel proxy: measurement fault", exc_info=True)

    def close(self, timeout: float = 5.0) -> None:
        self.recorder.flush()


class LineGuard:
    """One direction of newline-delimited JSON (stdio) in guard mode: whole lines, each guarded before it goes
    on. A line longer than the measuring limit is forwarded as it comes, unguarded (and counted as oversize)."""

    def __init__(self, measurer: GuardMeasurer, stream: MessageStream, rewrite: Callable[[bytes], bytes] | None = None,
                 max_line: int = DEFAULT_MAX_MESSAGE) -> None:
        self.measurer = measurer
        self.stream = stream
        self.rewrite = rewrite  # --inject-trace-context on the client's lines, before the guard
        self.lines = LineSplitter(max_line, self._oversize)

    @property
    def passing(self) -> bool:
        """Inside a line too long to hold (its pieces are forwarded as they come)."""
        return self.lines.passing

    def _oversize(self) -> None:
        self.measurer.stats.oversize += 1

    def feed(self, chunk: bytes) -> tuple[bytes, bytes]:
        """(what to forward now, what to answer the sender with now) for ``chunk``."""
        out: list[bytes] = []
        replies: list[bytes] = []
        for piece, whole in self.lines.feed(chunk):
            if whole:
                self._line(piece, out, replies)
            else:
                out.append(piece)
        return b"".join(out), b"".join(replies)

    def flush(self) -> tuple[bytes, bytes]:
        """End of input: a last line without its newline (guarded like any line, sent without a newline)."""
        rest, whole = self.lines.flush()
        if not whole:
            return rest, b""
        out: list[bytes] = []
        replies: list[bytes] = []
        self._message(rest, b"", out, replies)
        return b"".join(out), b"".join(replies)

    def _line(self, line: bytes, out: list[bytes], replies: list[bytes]) -> None:
        body = line[:-1]
        if body.endswith(b"\r"):
            body = body[:-1]
        self._message(body, line[len(body):], out, replies)

    def _message(self, body: bytes, ending: bytes, out: list[bytes], replies: list[bytes]) -> None:
        if not body.strip():
            out.append(body + ending)
            return
        if self.rewrite is not None:
            body = self.rewrite(body)
        forward, reply = self.measurer.message(self.stream, body)
        if forward is not None:
            out.append(forward + ending if ending else forward)
        if reply is not None:
            replies.append(reply + b"\n")


class BodyGuard:
    """A JSON response body (server to client) in guard mode: held whole, guarded, then forwarded. A body larger
    than the measuring limit is forwarded as it comes, unguarded."""

    def __init__(self, measurer: GuardMeasurer, stream: MessageStream, max_body: int = DEFAULT_MAX_MESSAGE) -> None:
        self.measurer = measurer
        self.stream = stream
        self.max_body = max_body
        self._parts: list[bytes] = []
        self._size = 0
        self._passing = False

    def feed(self, chunk: bytes) -> bytes:
        if self._passing:
            return chunk
        self._parts.append(chunk)
        self._size += len(chunk)
        if self._size <= self.max_body:
            return b""
        self.measurer.stats.oversize += 1
        self._passing = True
        out = b"".join(self._parts)
        self._parts.clear()
        return out

    def finish(self) -> bytes:
        if self._passing:
            return b""
        body = b"".join(self._parts)
        self._parts.clear()
        return self.finish_body(body) if body else b""

    def finish_body(self, body: bytes) -> bytes:
        """The whole body: what to forward (``body`` itself when unchanged)."""
        forward, _reply = self.measurer.message(self.stream, body)
        return body if forward is None else forward


class SseGuard:
    """An SSE stream (server to client) in guard mode: whole events, each ``data`` message guarded before the
    event goes on. An unchanged event is forwarded byte for byte; a changed one keeps its other fields (``id``,
    ``event``, ``retry``, comments) in place and carries the new message on one ``data:`` line. An event larger
    than the measuring limit is forwarded as it comes, unguarded."""

    def __init__(self, measurer: GuardMeasurer, stream: MessageStream, max_event: int = DEFAULT_MAX_MESSAGE) -> None:
        self.measurer = measurer
        self.stream = stream
        self.max_event = max_event
        self._lines: list[bytes] = []  # the event's lines so far, with their line endings
        self._size = 0
        self._tail = b""  # a line not yet ended
        self._passing = False  # inside an event too large to hold

    def feed(self, chunk: bytes) -> bytes:
        """What to forward now for ``chunk``."""
        out: list[bytes] = []
        data = self._tail + chunk if self._tail else chunk
        self._tail = b""
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            line = data[start:nl + 1]
            start = nl + 1
            blank = line in (b"\n", b"\r\n")
            if self._passing:
                out.append(line)
                if blank:
                    self._passing = False
                continue
            self._lines.append(line)
            self._size += len(line)
            if blank:
                out.append(self._event())
            elif self._size > self.max_event:
                self._pass(out)
        rest = data[start:]
        if rest:
            if self._passing:
                out.append(rest)
            else:
                self._tail = rest
                if self._size + len(rest) > self.max_event:
                    self._lines.append(rest)
                    self._tail = b""
                    self._pass(out)
        return b"".join(out)

    def finish(self) -> bytes:
        """The stream ended: whatever is held goes on as it is."""
        rest = b"".join(self._lines) + self._tail
        self._lines.clear()
        self._tail = b""
        self._size = 0
        return rest

    def _pass(self, out: list[bytes]) -> None:
        self.measurer.stats.oversize += 1
        out.extend(self._lines)
        self._lines.clear()
        self._size = 0
        self._passing = True

    def _event(self) -> bytes:
        lines, self._lines = self._lines, []
        self._size = 0
        raw = b"".join(lines)
        data = [i for i, line in enumerate(lines) if line.startswith(b"data:")]
        if not data:
            return raw  # a comment, a keep-alive, an event without data: not a message
        values = []
        for i in data:
            value = lines[i].rstrip(b"\r\n")[5:]
            values.append(value[1:] if value.startswith(b" ") else value)
        if not any(values):
            return raw  # a priming event (an id to resume from, empty data): not a message
        message = b"\n".join(values)
        forward, _reply = self.measurer.message(self.stream, message)  # a server's message: never refused
        if forward is message or forward is None:
            return raw
        ending = b"\r\n" if lines[-1] == b"\r\n" else b"\n"
        others = set(data[1:])
        new = [line for i, line in enumerate(lines) if i not in others]
        new[data[0]] = b"data: " + forward + ending
        return b"".join(new)
