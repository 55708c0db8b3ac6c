"""Framing and pairing of JSON-RPC messages the proxy has already forwarded (runs on the measuring thread).

With guards on (guard.py) the same trackers run on the relay path instead, one whole message at a time
(:meth:`Tracker.guarded`), before the message is forwarded.

A :class:`MessageStream` is one direction of one byte stream (a stdio pipe, an HTTP body, an SSE stream);
it turns the chunks the relay forwarded into whole JSON-RPC messages. A :class:`Tracker` is one MCP session:
it pairs requests with responses by id in both directions (server-to-client requests too), opens a span per
request and feeds the shared :class:`~mcp_token_otel.recorder.TokenRecorder` with ``side="proxy"``.
Whatever cannot be paired or parsed (a response to an unknown id, invalid JSON) was forwarded unchanged
anyway: here it is only counted.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagate import extract
from opentelemetry.trace import NoOpTracer, ProxyTracer, ProxyTracerProvider, Span, SpanKind, StatusCode

from ..core.budget_key import MessageFacts, client_identity
from ..core.protocol import CLIENT_INFO_META_KEY, is_modern, meta_of, request_version
from ..recorder import Call, TokenRecorder
from ..semconv import A_ERROR_TYPE, call_attributes, span_name
from .measure_queue import MeasureQueue

logger = logging.getLogger(__name__)

#: Directions of a message, as seen by the proxy.
C2S = "client_to_server"
S2C = "server_to_client"
DIRECTIONS = (C2S, S2C)
KINDS = ("request", "response", "notification", "invalid", "unmatched")

LINES, BODY, SSE = "lines", "body", "sse"
DEFAULT_MAX_MESSAGE = 128 * 1024 * 1024
MAX_PENDING = 10_000


class ProxyStats:
    """What the proxy counts beyond the recorder: messages by kind, measurement drops. Plain ints written by
    one thread (the worker) and read by collectors; the queue's own drop counters are read live."""

    def __init__(self) -> None:
        self.messages: dict[tuple[str, str], int] = {(d, k): 0 for d in DIRECTIONS for k in KINDS}
        self.oversize = 0  # messages larger than the measuring limit (forwarded, not measured)
        self.faults = 0
        self.queue: MeasureQueue | None = None
        #: Drops counted by the relay process when measuring runs in its own process (chunks, bytes).
        self.remote_dropped: tuple[int, int] = (0, 0)

    def count(self, direction: str, kind: str) -> None:
        self.messages[(direction, kind)] += 1

    def dropped(self) -> tuple[int, int]:
        q = self.queue
        local = (q.dropped_chunks, q.dropped_bytes) if q is not None else (0, 0)
        return local[0] + self.remote_dropped[0], local[1] + self.remote_dropped[1]


class MessageStream:
    """One direction of one byte stream, framed into messages on the worker thread."""

    def __init__(self, tracker: Tracker, direction: str, framing: str, max_message: int = DEFAULT_MAX_MESSAGE):
        self.tracker = tracker
        self.direction = direction
        self.framing = framing
        self.max_message = max_message
        #: Set by the relay when a chunk of this stream was dropped: the worker resynchronises.
        self.lost = False
        self._parts: list[bytes] = []
        self._size = 0
        self._skip = False  # inside a message we cannot measure (lost chunk, too large)
        self._data: list[bytes] = []  # SSE: the data lines of the event being read

    def feed(self, chunk: bytes) -> list[bytes]:
        """The messages this chunk completes."""
        if self.lost:
            self.lost = False
            self._parts.clear()
            self._size = 0
            self._data.clear()
            self._skip = True
        if self.framing == BODY:
            if not self._skip:
                self._append(chunk)
            return []
        out: list[bytes] = []
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                break
            piece = chunk[start:nl]
            if self._skip:
                self._skip = False
                self._parts.clear()
                self._size = 0
            else:
                line = b"".join((*self._parts, piece)) if self._parts else piece
                self._parts.clear()
                self._size = 0
                self._line(line, out)
            start = nl + 1
        if start < len(chunk) and not self._skip:
            self._append(chunk[start:] if start else chunk)
        return out

    def finish(self) -> list[bytes]:
        """End of stream: what is left (a body; a last line without its newline)."""
        out: list[bytes] = []
        if not self._skip and not self.lost and self._parts:
            rest = b"".join(self._parts)
            if self.framing == BODY:
                out.append(rest)
            else:
                self._line(rest, out)
        if self.framing == SSE and any(self._data):
            out.append(b"\n".join(self._data))
        self._parts.clear()
        self._data.clear()
        return out

    def _append(self, piece: bytes) -> None:
        self._size += len(piece)
        if self._size > self.max_message:
            self.tracker.stats.oversize += 1
            self._parts.clear()
            self._size = 0
            self._skip = True
        else:
            self._parts.append(piece)

    def _line(self, line: bytes, out: list[bytes]) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        if self.framing == LINES:
            if line.strip():
                out.append(line)
            return
        # SSE: data lines accumulate until a blank line ends the event; other fields are not messages, nor is
        # an event whose data is empty (a priming event: an id to resume from, no message).
        if not line:
            if any(self._data):
                out.append(b"\n".join(self._data))
            self._data.clear()
        elif line.startswith(b"data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(b" ") else value)


def dumps(message: Any) -> bytes:
    """A message the proxy writes itself (a refusal, a guarded result): compact JSON, UTF-8. Raises ValueError
    for what JSON cannot carry (NaN, a lone surrogate): the caller forwards the original bytes."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _id_key(value: Any) -> tuple[str, Any] | None:
    # 1 and "1" are different ids; anything unhashable is not a valid id.
    if isinstance(value, bool) or (not isinstance(value, (str, int, float)) and value is not None):
        return None
    return (type(value).__name__, value)


class Tracker:
    """One MCP session seen by the proxy (stdio: the stream; HTTP: an ``Mcp-Session-Id``, or one exchange without
    one): pending requests in both directions, their spans and budgets (``budget.key``: the session, the
    conversation's baggage, a header, the client...)."""

    def __init__(
        self,
        recorder: TokenRecorder,
        stats: ProxyStats,
        *,
        session_key: str | None,
        session_id: str | None = None,
        transport: str,
        attributes: Mapping[str, Any] | None = None,
        guard: bool = False,
        origin: Mapping[str, Any] | None = None,
    ) -> None:
        """``session_key``: the session's own key (stdio: the stream's; HTTP: the ``Mcp-Session-Id``; None: no
        session). ``origin``: what else a budget key may read, from the HTTP request that opened the exchange:
        ``headers`` (lower-case names) and ``peer`` (the client's address)."""
        self.recorder = recorder
        self.stats = stats
        self.session_key = session_key
        self.session_id = session_id  # the protocol's Mcp-Session-Id, when there is one
        self.headers: dict[str, str] = dict((origin or {}).get("headers") or {})
        self.peer: str | None = (origin or {}).get("peer")
        self.client_info: Any = None  # an initialize's clientInfo
        self.transport = transport
        self.attributes = dict(attributes or {})
        self.protocol_version: str | None = None
        self.pending: dict[tuple[str, tuple[str, Any]], Call] = {}
        #: Requests the relay injected a context into (--inject-trace-context): id -> (trace id, span id).
        self.injected: dict[tuple[str, Any], tuple[int, int]] = {}
        self.closed = False
        #: Guard mode (guards on, side "proxy"): messages are handled on the relay path by :meth:`guarded`.
        self.guard = guard

    # Everything below runs on the measuring thread only (guard mode: on a relay thread, under the guard lock).

    def observe(self, direction: str, raw: bytes, now: int) -> None:
        try:
            message = json.loads(raw)
        except (ValueError, RecursionError):
            self.stats.count(direction, "invalid")
            return
        if isinstance(message, list):  # a batch: each element is its own message
            self._batch(direction, message, now)
        else:
            self._one(direction, message, now)

    def _batch(self, direction: str, message: Any, now: int) -> list[Any] | None:
        """Each element is its own message. In guard mode the results in a batch are guarded (the batch with
        the changed ones is returned, None: unchanged); its requests are never refused (a batch's answer has
        no place for the proxy's own)."""
        if not isinstance(message, list) or not message:
            self.stats.count(direction, "invalid")
            return None
        changed: list[Any] | None = None
        for index, item in enumerate(message):
            result = self._one(direction, item, now)
            if result is not None:
                if changed is None:
                    changed = list(message)
                changed[index] = {**item, "result": result}
        return changed

    def _one(self, direction: str, message: Any, now: int) -> Any:
        """One message; in guard mode, a response's changed result (None: unchanged)."""
        if not isinstance(message, dict):
            self.stats.count(direction, "invalid")
            return None
        method = message.get("method")
        if isinstance(method, str):
            if "id" in message:
                self._request(direction, method, message, now)
            else:
                self.stats.count(direction, "notification")  # never enters the model's context: no budget
                self.recorder.notify("proxy", method, message.get("params"), self.session_key, at=now / 1e9)
            return None
        if "id" in message and ("result" in message or "error" in message):
            return self._response(direction, message, now)
        self.stats.count(direction, "invalid")
        return None

    def _request(self, direction: str, method: str, message: dict[str, Any], now: int,
                 refuse: bool = False) -> tuple[str, dict[str, Any]] | None:
        """Open the request's span and pair it. ``refuse`` (guard mode, a client's request on its own): the
        request guards run, and what the proxy answers in the server's place is returned (``("result", ...)``: a
        refused tool call, a page of a kept result, an empty listing; ``("error", ...)``: the JSON-RPC error of a
        read of a kept result that cannot be served); the request is then not paired."""
        key = _id_key(message.get("id"))
        if key is None:
            self.stats.count(direction, "invalid")
            return None
        self.stats.count(direction, "request")
        params = message.get("params")
        meta = meta_of(params)
        version = request_version(params) or self.protocol_version
        if method == "initialize" and direction == C2S and isinstance(params, Mapping):
            self.client_info = params.get("clientInfo")
        attrs = call_attributes(
            method, params, session_id=None if is_modern(version) else self.session_id,  # sessionless since 2026
            request_id=message.get("id"), protocol_version=version, transport=self.transport,
        )
        attrs.update(self.attributes)
        forced = self.injected.pop(key, None) if direction == C2S and self.injected else None
        span = self._start_span(method, params, direction, attrs, now, forced)
        call = self.recorder.begin("proxy", method, params, self._budget_key(params, meta), version=version)
        call.span = span
        call.transport = self.transport
        # Before the request counts: the session limit reads the budget as it stood before this call.
        refusal = call.guard() if refuse and direction == C2S else None
        call.open(started=now / 1e9)
        if refusal is not None or call.refusal_error is not None:  # answered by the proxy: the call's output
            answer = call.refused(at=now / 1e9)
            call.close()
            self._end_span(span, now)
            return ("result", answer) if refusal is not None else ("error", answer)
        pending_key = (direction, key)
        old = self.pending.pop(pending_key, None)
        if old is not None:  # the same id reused before its answer: the first can no longer be paired
            self._abandon(old, now, "duplicate_id")
        elif len(self.pending) >= MAX_PENDING:
            oldest = next(iter(self.pending))
            self._abandon(self.pending.pop(oldest), now, "evicted")
        self.pending[pending_key] = call
        return None

    def _budget_key(self, params: Any, meta: Any) -> str | None:
        """The budget this request counts toward (``budget.key``), None: unbudgeted."""
        rec = self.recorder
        if self.session_key is not None and rec.session_first:
            return self.session_key
        info = meta.get(CLIENT_INFO_META_KEY) if isinstance(meta, Mapping) else None
        client = client_identity(info if info is not None else self.client_info, self.peer)
        return rec.budget_key(MessageFacts(session=self.session_key, params=params, headers=self.headers,
                                           client=client))

    def _response(self, direction: str, message: dict[str, Any], now: int) -> Any:
        """Pair a response with its request and record it. In guard mode a result goes through the guards
        (tools/list teaches them the tools): the result to deliver instead is returned (None: as it is)."""
        key = _id_key(message.get("id"))
        request_direction = S2C if direction == C2S else C2S
        pending = self.pending.pop((request_direction, key), None) if key is not None else None
        if pending is None:
            self.stats.count(direction, "unmatched")
            return None
        self.stats.count(direction, "response")
        error = message.get("error")
        changed: Any = None
        if error is not None:
            pending.error(error, at=now / 1e9)
        else:
            result = message.get("result")
            deliver = pending.result(result, at=now / 1e9)  # the guards (guard mode) may change what is delivered
            if deliver is not result:
                changed = deliver
            if pending.method == "initialize" and pending.version is not None:
                self.protocol_version = pending.version
        pending.close()
        self._end_span(pending.span, now)
        return changed

    def guarded(self, direction: str, raw: bytes, now: int) -> tuple[bytes | None, bytes | None]:
        """Guard mode, on the relay path: one whole message, before it is forwarded. Returns (what to forward,
        None: nothing; what to answer its sender with, None: nothing). ``raw`` itself when unchanged.

        A client's ``tools/call`` may be refused, a read of a kept result (``guard.spill``) and a listing of the
        resources this proxy declared are answered (here, not forwarded); a result may come back changed
        (re-serialised, compact). In a batch only the results are guarded (a read in a batch goes on)."""
        try:
            message = json.loads(raw)
        except (ValueError, RecursionError):
            self.stats.count(direction, "invalid")
            return raw, None
        if not isinstance(message, dict):
            batch = self._batch(direction, message, now)
            return (raw if batch is None else dumps(batch)), None
        method = message.get("method")
        if isinstance(method, str) and "id" in message:
            answer = self._request(direction, method, message, now, refuse=self.guard)
            if answer is None:
                return raw, None
            return None, dumps({"jsonrpc": message.get("jsonrpc", "2.0"), "id": message["id"], answer[0]: answer[1]})
        if "id" in message and ("result" in message or "error" in message):
            changed = self._response(direction, message, now)
            if changed is None:
                return raw, None
            return dumps({**message, "result": changed}), None
        self._one(direction, message, now)
        return raw, None

    def close(self, now: int) -> None:
        """The session is over: requests never answered end with an error; the budget closes."""
        if self.closed:
            return
        self.closed = True
        for pending in self.pending.values():
            self._abandon(pending, now, "connection_closed")
        self.pending.clear()
        self.recorder.end_session("proxy", self.session_key)

    def _abandon(self, pending: Call, now: int, why: str) -> None:
        pending.close()  # unanswered: its request still counts toward its budget
        span = pending.span
        try:
            if span is not None and span.is_recording():
                span.set_attribute(A_ERROR_TYPE, why)
                span.set_status(StatusCode.ERROR, why)
        except Exception:
            self.stats.faults += 1
        self._end_span(span, now)

    def inject(self, request_id: Any, trace_id: int, span_id: int) -> None:
        """The relay wrote this context into the request with this id: its span gets exactly these ids."""
        key = _id_key(request_id)
        if key is not None:
            if len(self.injected) >= MAX_PENDING:
                self.injected.pop(next(iter(self.injected)))
            self.injected[key] = (trace_id, span_id)

    def _start_span(self, method: str, params: Any, direction: str, attrs: dict[str, Any], now: int,
                    forced: tuple[int, int] | None = None) -> Span | None:
        # A request the client sends: the proxy is its client toward the server (CLIENT), as the shim's client
        # side is; a request the server sends (sampling, elicitation) is served on the client side (SERVER).
        kind = SpanKind.CLIENT if direction == C2S else SpanKind.SERVER
        try:
            tracer = self.recorder.tracer
            if not _traces(tracer):
                return None  # no tracer provider: the span would record nothing, its set-up costs alone
            if forced is not None:  # a root span with the ids the server was told (the request had no parent)
                return _start_with_ids(tracer, forced, span_name(method, params), kind, attrs, now)
            meta = params.get("_meta") if isinstance(params, Mapping) else None
            parent = extract(meta) if isinstance(meta, Mapping) else None
            # The recorder's tracer, with the time the bytes went through (not the time we got to them).
            return tracer.start_span(
                span_name(method, params), context=parent, kind=kind, attributes=attrs, start_time=now,
                record_exception=False, set_status_on_exception=False,
            )
        except Exception:
            self.stats.faults += 1
            logger.debug("mcp_token_otel proxy: cannot start a span", exc_info=True)
            return None

    def _end_span(self, span: Span | None, now: int) -> None:
        if span is None:
            return
        try:
            span.end(end_time=now)
        except Exception:
            self.stats.faults += 1


def _traces(tracer: Any) -> bool:
    """Whether spans from ``tracer`` can record: not when no tracer provider is set (yet: a proxy tracer
    becomes real once the application sets one)."""
    if isinstance(tracer, NoOpTracer):
        return False
    return not (isinstance(tracer, ProxyTracer) and isinstance(trace.get_tracer_provider(), ProxyTracerProvider))


class _FixedIds:
    """An SDK id generator that hands out one chosen trace id and span id."""

    def __init__(self, trace_id: int, span_id: int) -> None:
        self.trace_id = trace_id
        self.span_id = span_id

    def generate_trace_id(self) -> int:
        return self.trace_id

    def generate_span_id(self) -> int:
        return self.span_id

    def is_trace_id_random(self) -> bool:
        return True  # drawn from SystemRandom by the relay


def _start_with_ids(tracer: Any, ids: tuple[int, int], name: str, kind: SpanKind, attrs: dict[str, Any],
                    now: int) -> Span:
    # The SDK tracer draws ids from its id_generator (a ProxyTracer wraps it): swapped for this one span, on
    # the measuring thread (the only one starting spans in the measuring process). Without the SDK (no
    # tracing configured) the span is not recorded anyway.
    sdk = tracer if hasattr(tracer, "id_generator") else getattr(tracer, "_tracer", None)
    if sdk is None or not hasattr(sdk, "id_generator"):
        return tracer.start_span(name, kind=kind, attributes=attrs, start_time=now)
    saved = sdk.id_generator
    sdk.id_generator = _FixedIds(*ids)
    try:
        return sdk.start_span(name, context=Context(), kind=kind, attributes=attrs, start_time=now,
                              record_exception=False, set_status_on_exception=False)
    finally:
        sdk.id_generator = saved


class Measurer:
    """The off-path measuring side of one proxy: a bounded queue, its worker thread, the trackers' streams."""

    def __init__(
        self, recorder: TokenRecorder, stats: ProxyStats, *, max_queue_bytes: int | None = None,
        max_message: int = DEFAULT_MAX_MESSAGE,
    ) -> None:
        self.recorder = recorder
        self.stats = stats
        self.max_message = max_message
        kwargs: dict[str, Any] = {"max_bytes": max_queue_bytes} if max_queue_bytes else {}
        self.queue = MeasureQueue(self._handle, on_error=self.fault, **kwargs)
        stats.queue = self.queue
        self._lock = threading.Lock()

    def fault(self) -> None:
        self.stats.faults += 1

    def tracker(self, **kwargs: Any) -> Tracker:
        return Tracker(self.recorder, self.stats, **kwargs)

    def stream(self, tracker: Tracker, direction: str, framing: str) -> MessageStream:
        return MessageStream(tracker, direction, framing, self.max_message)

    def put(self, stream: MessageStream, chunk: bytes, at: int | None = None) -> None:
        """After forwarding ``chunk``: hand it over (never blocks; a drop is counted). ``at``: when it passed
        (``time.time_ns()``; default: now), for a chunk handed over after the fact."""
        if chunk:
            self.queue.put(stream, chunk, at)

    def finish(self, stream: MessageStream, at: int | None = None) -> None:
        """The stream ended: measure what it still holds (as of ``at``, default now)."""

        def done(now: int) -> None:
            for message in stream.finish():
                stream.tracker.observe(stream.direction, message, at or now)

        self.queue.control(done)

    def close_tracker(self, tracker: Tracker) -> None:
        self.queue.control(tracker.close)

    def inject(self, tracker: Tracker, request_id: Any, trace_id: int, span_id: int) -> None:
        self.queue.control(lambda _now: tracker.inject(request_id, trace_id, span_id))

    def set_tracker(self, tracker: Tracker, **attrs: Any) -> None:
        """Change a tracker's session key, id or protocol version, in order with the messages."""

        def apply(_now: int) -> None:
            for key, value in attrs.items():
                setattr(tracker, key, value)

        self.queue.control(apply)

    def _handle(self, stream: MessageStream, chunk: bytes, now: int) -> None:
        for message in stream.feed(chunk):
            stream.tracker.observe(stream.direction, message, now)

    def close(self, timeout: float = 5.0) -> None:
        self.queue.close(timeout)
        self.recorder.flush()
