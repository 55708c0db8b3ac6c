"""Opt-in context injection (``--inject-trace-context``): requests that carry no W3C ``traceparent`` in
``params._meta`` get the proxy span's, so the server's spans become children of the proxy's.

Runs on the relay path, so it stays cheap: only a message that looks like a request (``"method"`` in it,
no ``traceparent``) is parsed, and only a message it changes is re-serialised; everything else goes on as
the very same bytes. ``params`` is never created where a request had none (nor made from a non-object);
``_meta`` is added inside an existing ``params`` object. The proxy span's ids are chosen here and handed
to the measuring side (in order, before the message's bytes), which then opens the request's span with
exactly those ids.

HTTP: a request whose ``_meta`` carries no ``baggage`` also gets the conversation's entry
(``gen_ai.conversation.id``) when the HTTP request's ``baggage`` header has one, as the client shim adds it
with ``budget.propagate``: a server that reads only ``_meta`` keys the conversation's budget too.
"""

from __future__ import annotations

import json
import random
from typing import Any
from urllib.parse import quote

from ..core.budget_key import CONVERSATION_ID, parse_baggage
from .lines import LineSplitter

#: stdio lines longer than this are forwarded uninspected (the relay never holds more than this per line).
MAX_INSPECTED_LINE = 4 * 1024 * 1024

_random = random.SystemRandom()


def traceparent(trace_id: int, span_id: int) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-01"


class Injector:
    def __init__(self, measurer: Any) -> None:
        self.measurer = measurer

    def rewrite_body(self, tracker: Any, raw: bytes, baggage: bytes | None = None) -> bytes:
        """``raw`` itself when nothing is injected, else the re-serialised message (or batch). ``baggage``: the
        HTTP request's ``baggage`` header."""
        member = _conversation_member(baggage)
        if b'"method"' not in raw or (b"traceparent" in raw and member is None):
            return raw
        try:
            message = json.loads(raw)
        except (ValueError, RecursionError):
            return raw
        injected: list[tuple[Any, int, int]] = []
        changed = False
        for item in message if isinstance(message, list) else (message,):
            changed = self._inject(item, injected, member) or changed
        if not changed:
            return raw
        try:
            body = json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        except (ValueError, RecursionError):  # a lone surrogate ("\ud800") or 1e999 (inf has no JSON): as it came
            return raw
        # The measuring side learns the ids only for a message that really goes out rewritten.
        for request_id, trace_id, span_id in injected:
            self.measurer.inject(tracker, request_id, trace_id, span_id)
        return body

    @staticmethod
    def _inject(message: Any, injected: list[tuple[Any, int, int]], member: str | None) -> bool:
        """Whether ``message`` was changed: a traceparent (its ids added to ``injected``), the conversation's
        baggage ``member``."""
        if not isinstance(message, dict) or not isinstance(message.get("method"), str) or "id" not in message:
            return False
        params = message.get("params")
        if not isinstance(params, dict):
            return False  # never create params (nor replace a non-object)
        meta = params.get("_meta")
        if meta is not None and not isinstance(meta, dict):
            return False
        request_id = message["id"]
        if isinstance(request_id, bool) or not isinstance(request_id, (str, int, float)):
            return False
        trace = meta is None or "traceparent" not in meta
        carry = member is not None and (meta is None or "baggage" not in meta)
        if not trace and not carry:
            return False
        if meta is None:
            meta = params["_meta"] = {}
        if trace:
            trace_id = _random.getrandbits(128) or 1
            span_id = _random.getrandbits(64) or 1
            meta["traceparent"] = traceparent(trace_id, span_id)
            injected.append((request_id, trace_id, span_id))
        if carry:
            meta["baggage"] = member
        return True


def _conversation_member(header: bytes | None) -> str | None:
    """The conversation's W3C baggage member from a ``baggage`` header, None without one."""
    if not header or CONVERSATION_ID.encode() not in header:
        return None
    value = parse_baggage(header.decode("latin-1")).get(CONVERSATION_ID)
    return f"{CONVERSATION_ID}={quote(value, safe='')}" if isinstance(value, str) and value else None


class LineInjector:
    """One direction of newline-delimited JSON (stdio, client to server): whole lines, rewritten or not."""

    def __init__(self, injector: Injector, tracker: Any) -> None:
        self.injector = injector
        self.tracker = tracker
        self.lines = LineSplitter(MAX_INSPECTED_LINE)

    def feed(self, chunk: bytes) -> bytes:
        """What to forward now for ``chunk`` (a line's tail waits for its newline, up to the bound)."""
        out = [self._line(piece) if whole else piece for piece, whole in self.lines.feed(chunk)]
        return b"".join(out) if len(out) != 1 else out[0]

    def flush(self) -> bytes:
        """End of input: a last line without its newline goes as it is."""
        return self.lines.flush()[0]

    def _line(self, line: bytes) -> bytes:
        body = line[:-1]
        if body.endswith(b"\r"):
            body = body[:-1]
        new = self.injector.rewrite_body(self.tracker, body)
        return line if new is body else new + line[len(body):]
