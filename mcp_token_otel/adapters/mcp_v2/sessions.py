"""Who a served request's client is (mcp 2.x): the budget key of its session, ended with it.

- stateful streamable HTTP: the ``mcp-session-id``;
- a handshake-era connection (stdio, SSE, legacy in-memory): one key per ``Connection``, ended with it;
- the 2026-07-28 protocol builds a new ``Connection`` per request, so the key follows what stays the same for
  one client: the in-process ``DirectDispatcher`` pair's transport context (auto mode), or the stream's shared
  outbound channel (stdio/memory streams serving the modern protocol), ended when that dispatcher stops;
- stateless HTTP (a request with no session id): no session, so no budget (never one per call).
"""

from __future__ import annotations

import uuid
import weakref
from typing import Any

from ...recorder import TokenRecorder
from ..key_facts import ServerFacts


def _per_client_anchor(connection: Any, inner: Any) -> Any:
    """What stays the same across the requests of one client when every request has its own Connection
    (2026-07-28 protocol), else None (a handshake-era Connection is itself the session)."""
    outbound = getattr(connection, "outbound", None)
    if type(outbound).__name__ == "NotifyOnlyOutbound":  # modern protocol over one stream (stdio, memory)
        return getattr(outbound, "_outbound", outbound)  # the stream's dispatcher: its run ends with the stream
    if type(inner).__name__ == "_DirectDispatchContext":  # in-process auto mode: one transport per pair
        return getattr(inner, "transport", None)
    return None


class ServerSessions:
    """The budget keys of the clients a server process serves, each ended when its client goes."""

    def __init__(self, recorder: TokenRecorder) -> None:
        self.recorder = recorder
        self._connection_keys: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        #: id(anchor) -> (weak reference to it, budget key, its finalizer): the 2026 protocol's per-client anchors.
        self.anchor_keys: dict[int, tuple[weakref.ref[Any], str, weakref.finalize[Any, Any]]] = {}
        self._anchor_sweep_at = 256

    def session(self, ctx: Any) -> tuple[str | None, str | None]:
        """(the protocol's session id or None, the budget key or None when no client session is knowable)."""
        connection = getattr(ctx.session, "_connection", None)
        session_id = getattr(connection, "session_id", None)
        if session_id:
            key = self._connection_keys.get(connection) if connection is not None else None
            if connection is not None and key is None:
                self._connection_keys[connection] = session_id
                self._on_connection_end(connection, session_id)
            return session_id, session_id
        if connection is None:
            return None, None
        key = self._connection_keys.get(connection)
        if key is not None:  # a handshake-era connection seen before
            return None, key
        outbound = getattr(ctx.session, "_request_outbound", None)
        inner = getattr(outbound, "_inner", None)  # the 2026 wrapper's inner context
        # The 2026 wrapper's own .transport builds a copy on every read (dataclasses.replace): read the inner one.
        transport = getattr(inner if inner is not None else outbound, "transport", None)
        if getattr(transport, "kind", None) == "streamable-http":
            return None, None  # stateless HTTP: nothing identifies the client across requests
        anchor = _per_client_anchor(connection, inner)
        if anchor is not None:
            return None, self._anchor_key(anchor)
        key = self._connection_keys[connection] = uuid.uuid4().hex
        self._on_connection_end(connection, key)
        return None, key

    def key(self, ctx: Any, session: str | None) -> str | None:
        """A served request's budget key from ``budget.key``: ``session`` (see :meth:`session`), the request's
        ``_meta`` and HTTP headers, the SDK's authenticated principal, the client's identity."""
        connection = getattr(ctx.session, "_connection", None)

        def client_info() -> Any:
            return getattr(getattr(connection, "client_params", None), "client_info", None)

        return self.recorder.budget_key(ServerFacts(session, ctx.params, ctx.request, client_info))

    def _on_connection_end(self, connection: Any, key: str) -> None:
        # Every SDK driver unwinds the Connection's exit stack when the connection ends (its per-connection
        # cleanup hook); garbage collection is only the fallback.
        exit_stack = getattr(connection, "exit_stack", None)
        if exit_stack is not None:
            exit_stack.callback(self.recorder.end_session, "server", key)
        else:
            weakref.finalize(connection, self.recorder.end_session_soon, "server", key)

    def _anchor_key(self, anchor: Any) -> str:
        """One budget key per client anchor; the session ends when the anchor's dispatcher stops running (the
        stream closed, the in-process pair closed), else when the anchor is collected or by idle expiry."""
        entry = self.anchor_keys.get(id(anchor))
        if entry is not None and entry[0]() is anchor:
            return entry[1]
        key = uuid.uuid4().hex
        try:
            ref = weakref.ref(anchor)
        except TypeError:
            return key  # not weak-referenceable: cannot follow it; the idle timeout still bounds the budget
        if len(self.anchor_keys) >= self._anchor_sweep_at:  # forget anchors gone since (ids are reused)
            self.anchor_keys = {i: e for i, e in self.anchor_keys.items() if e[0]() is not None}
            self._anchor_sweep_at = max(256, 2 * len(self.anchor_keys))
        # The fallback: runs when the anchor is collected, inside whatever code allocated then: it only queues.
        finalizer = weakref.finalize(anchor, self.recorder.end_session_soon, "server", key)
        self.anchor_keys[id(anchor)] = (ref, key, finalizer)
        return key

    def end_anchor(self, anchor: Any) -> None:
        """The anchor's dispatcher stopped: its client's budget ends now."""
        entry = self.anchor_keys.get(id(anchor))
        if entry is None or entry[0]() is not anchor:
            return
        self.anchor_keys.pop(id(anchor), None)
        entry[2].detach()
        self.recorder.end_session("server", entry[1])
