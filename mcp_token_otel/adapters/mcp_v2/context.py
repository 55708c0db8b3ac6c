"""What the mcp 2.x hooks pass along in the running task: context variables and the shim's own span parenting.

Transparency: the shim never adds trace context to a request. Its own spans are made current only while the
SDK's own tracer makes spans (then the SDK already puts a ``traceparent`` of its own span on every JSON-RPC
request, so only the parent changes); otherwise, a global tracer provider set or not, they parent one another
through a private context variable.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import TYPE_CHECKING, Any

import mcp.shared._otel as sdk_otel
from opentelemetry import trace
from opentelemetry.trace import Span

from ...core.guard.limits import deeper as chain_deeper
from .._common import detach, extract_parent, makes_spans

if TYPE_CHECKING:
    from .client import OutboundCall

#: A long-lived request whose end is the client going away (a cancellation): its duration is recorded then.
LISTEN = "subscriptions/listen"

#: The request whose SDK CLIENT span the next ``otel_span(kind=CLIENT)`` hands over (single use).
CAPTURE: contextvars.ContextVar[OutboundCall | None] = contextvars.ContextVar("mcp_token_capture", default=None)
#: The shim's own span that is the parent of the next shim span in this task, when it is not made current.
SHIM_PARENT: contextvars.ContextVar[Span | None] = contextvars.ContextVar("mcp_token_shim_parent", default=None)
#: Server: inside a request handler, (the budget key, the request's adapter attributes, its protocol version)
#: for the requests the handler sends (their attributes are picked from these only when one is sent).
SERVER_CALL: contextvars.ContextVar[tuple[str | None, dict[str, Any], Any] | None] = contextvars.ContextVar(
    "mcp_token_server_call", default=None
)
#: Client: the transport opened last in this task, ("tcp", StreamableHTTPTransport) or ("pipe", None).
CLIENT_TRANSPORT: contextvars.ContextVar[tuple[str, Any] | None] = contextvars.ContextVar(
    "mcp_token_client_transport", default=None
)
#: Server, guards on: the chain depth of the request whose handler runs (docs/guardrails.md "Chain depth");
#: requests the handler sends carry one more.
DEPTH: contextvars.ContextVar[int | None] = contextvars.ContextVar("mcp_token_depth", default=None)
#: Server: inside the SDK's own tools/list that validates a tools/call's Mcp-Param-* headers (not traffic).
SCHEMA_LOOKUP: contextvars.ContextVar[bool] = contextvars.ContextVar("mcp_token_schema_lookup", default=False)
#: Server: "pipe" inside stdio_server() (memory and stdio streams look the same to a middleware).
SERVER_TRANSPORT: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mcp_token_server_transport", default=None
)


def deeper(method: str, params: Any) -> Any:
    """``params`` with the next chain depth when a chained request is sent from inside a served request (guards
    on), else as is."""
    return chain_deeper(method, params, DEPTH.get())


def parent_context(meta: Any = None) -> Any:
    """Where a shim span hangs: the trace context in ``_meta``, else the ambient one, else (no valid ambient
    span: the shim's spans are not current while the SDK's tracer is a no-op) the shim's own enclosing span."""
    parent = extract_parent(meta)
    if parent is not None:
        return parent
    if trace.get_current_span().get_span_context().is_valid:
        return None
    shim_parent = SHIM_PARENT.get()
    return trace.set_span_in_context(shim_parent) if shim_parent is not None else None


def activate(span: Span | None) -> tuple[Any, Any]:
    """Make a shim span the parent of what follows in this task. Current (the OTel context) only while the SDK's
    own tracer makes spans: then the SDK already puts a ``traceparent`` of its own span on every JSON-RPC request,
    and only the parent changes. Else privately: the SDK injects whatever context is current, so a current shim
    span would add to ``_meta`` what the application never sees without the shim."""
    if span is None:
        return None, None
    if makes_spans(getattr(sdk_otel, "_tracer", None)):
        return trace.context_api.attach(trace.set_span_in_context(span)), None
    return None, SHIM_PARENT.set(span)


def deactivate(tokens: tuple[Any, Any]) -> None:
    detach(tokens[0])
    if tokens[1] is not None:
        with contextlib.suppress(ValueError):
            SHIM_PARENT.reset(tokens[1])


def reset(var: contextvars.ContextVar[Any], token: contextvars.Token[Any] | None) -> None:
    """Reset a context variable set in this task; a token from another context is ignored."""
    if token is not None:
        try:  # noqa: SIM105 - contextlib.suppress builds an object and makes two calls on every request
            var.reset(token)
        except ValueError:
            pass
