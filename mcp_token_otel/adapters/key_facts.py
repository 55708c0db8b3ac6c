"""What both SDK adapters tell the recorder about a message's budget key (``budget.key``), and the client side's
opt-in conversation baggage (``budget.propagate``).

The facts are read lazily: the session first, ``_meta`` baggage and headers only when an earlier source is
absent, the authenticated principal and the client's identity only when a source asks for them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import baggage
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context

from ..core.budget_key import CONVERSATION_ID, MessageFacts, client_identity

_BAGGAGE = W3CBaggagePropagator()


def authenticated_principal() -> str | None:
    """The subject of the request's access token where the server has the SDK's authentication (qualified by
    its issuer, since a subject is unique only per issuer), else the token's client id; None without auth."""
    try:
        from mcp.server.auth.middleware.auth_context import get_access_token
    except ImportError:  # the server extra is not installed: no authentication either
        return None
    token = get_access_token()
    if token is None:
        return None
    subject = getattr(token, "subject", None)
    if isinstance(subject, str) and subject:
        claims = getattr(token, "claims", None)
        issuer = claims.get("iss") if isinstance(claims, Mapping) else None
        return f"{issuer}#{subject}" if isinstance(issuer, str) and issuer else subject
    client_id = getattr(token, "client_id", None)
    return client_id if isinstance(client_id, str) and client_id else None


class ServerFacts(MessageFacts):
    """A served request's facts: the HTTP request's headers and peer (``request``: a Starlette request, or None
    off HTTP), the SDK's authentication, the client's ``clientInfo`` (``client_info()``: called when asked).
    ``carried``: an OpenTelemetry context already extracted from the request (baggage the shim took out of
    ``_meta`` before any handler saw it)."""

    __slots__ = ("_carried", "_client_info", "_request")

    def __init__(self, session: str | None, params: Any, request: Any, client_info: Callable[[], Any],
                 carried: Context | None = None) -> None:
        headers = getattr(request, "headers", None) if request is not None else None
        super().__init__(session=session, params=params, headers=headers)
        self._request = request
        self._client_info = client_info
        self._carried = carried

    def baggage(self, name: str) -> str | None:
        value = super().baggage(name)
        if value is None and self._carried is not None:
            carried = baggage.get_baggage(name, self._carried)
            value = carried if isinstance(carried, str) and carried else None
        return value

    def principal(self) -> str | None:
        return authenticated_principal()

    def client(self) -> str | None:
        client = getattr(self._request, "client", None) if self._request is not None else None
        peer = getattr(client, "host", None)
        return client_identity(self._client_info(), peer if isinstance(peer, str) else None)


class ClientFacts(MessageFacts):
    """An outgoing request's facts on the client side: baggage not yet on the wire is read from the current
    OpenTelemetry context (the SDK or ``budget.propagate`` puts it there), so both sides agree on the key."""

    __slots__ = ()

    def baggage(self, name: str) -> str | None:
        value = super().baggage(name)
        if value is None:
            current = baggage.get_baggage(name)
            value = current if isinstance(current, str) and current else None
        return value


def with_conversation_baggage(params: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``params`` with ``_meta.baggage`` carrying the context's conversation entry, when the context has one and
    the request carries no baggage yet (one ``baggage`` key at most: the SDK's own injection replaces it with the
    context's whole baggage where it injects); else ``params`` itself."""
    conversation = baggage.get_baggage(CONVERSATION_ID)
    if not isinstance(conversation, str) or not conversation:
        return params
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    if isinstance(meta, Mapping) and "baggage" in meta:
        return params
    carrier: dict[str, str] = {}
    _BAGGAGE.inject(carrier, baggage.set_baggage(CONVERSATION_ID, conversation, Context()))
    if "baggage" not in carrier:
        return params
    new_meta = {**meta, "baggage": carrier["baggage"]} if isinstance(meta, Mapping) else carrier
    return {**params, "_meta": new_meta} if isinstance(params, Mapping) else {"_meta": new_meta}
