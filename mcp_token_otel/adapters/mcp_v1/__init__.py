"""mcp 1.x hooks (verified against mcp 1.20-1.30; see docs/instrumentation-mcp1.md).

mcp 1.x emits no spans of its own, so the shim opens both sides, with the same names, attributes and events as
the 2.x adapter:

- ``outbound``: requests a session sends (``BaseSession.send_request``, client calls and server->client
  sampling alike) get a CLIENT span, current for the call, whose W3C context is injected into ``params._meta``;
  notifications it sends are measured without a span;
- ``inbound``: requests it receives (``RequestResponder``) get a SERVER span whose parent is extracted from the
  request's ``_meta``; server-side inbound notifications get a SERVER span, as in 2.x;
- ``sessions``: what is kept per session object (budget key, transport, negotiated protocol version); the
  budget ends when the session's ``async with`` exits (``BaseSession.__aexit__``), never on garbage collection;
- ``hooks``: the patches and their removal.

Guards (docs/guardrails.md; only when ``recorder.guard_active``): the request-side decision is taken where the
request is sent or entered, before it is recorded; a refused ``tools/call`` is answered with the refusal instead
of being sent, or (server side) instead of running the handler. The server side keeps an incoming request's
chain depth while its handler runs; the ``tools/call`` and ``sampling/createMessage`` requests sent meanwhile
carry depth + 1. Every path measures through the recorder's :class:`~mcp_token_otel.recorder.Call`.
"""

from ...recorder import TokenRecorder
from .._common import installed
from .hooks import V1Shim


def install(recorder: TokenRecorder) -> V1Shim:
    """Hook mcp 1.x for ``recorder``; all or nothing. The caller owns the shim: its ``uninstall()`` restores the
    SDK."""
    return installed(V1Shim(recorder))


__all__ = ["V1Shim", "install"]
