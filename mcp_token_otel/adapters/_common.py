"""What both SDK adapters need: hooking the SDK with wrapt and removing only our own hooks again, and small
helpers over spans and trace context."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

import wrapt
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind

from .console_output import STDIO_SERVER, ConsoleGuard, console_exporter_classes

logger = logging.getLogger(__name__)

#: Marker attribute on what the shim adds to SDK objects (its server middleware, its state on a request), so
#: that nothing is added twice.
MARK = "_mcp_token_otel"

#: A wrapt wrapper: ``(wrapped, instance, args, kwargs) -> result``.
Wrapper = Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any]


class Hooks:
    """The SDK attributes an adapter wraps (wrapt ``FunctionWrapper``s, on class methods, ``__init__`` and module
    functions alike). ``remove`` takes out only our own wrappers: one another library added over ours later stays
    in place and keeps working, and an attribute nobody else touched is restored to its original object.

    A hook on ``stdio_server`` also moves OpenTelemetry's console exporters to standard error once a server
    serves on this process's stdout (console_output.py): their output would corrupt the protocol stream."""

    def __init__(self) -> None:
        self._handles: list[tuple[Any, str, Any]] = []
        self._console: ConsoleGuard | None = None

    def wrap(self, owner: Any, name: str, wrapper: Wrapper) -> None:
        if name == STDIO_SERVER:  # it serves MCP on stdout: console exporters must not write there from then on
            wrapper = self._console_guard().serving_stdio(wrapper)
        self._handles.append((owner, name, wrapt.wrap_function_wrapper(owner, name, wrapper)))

    def _console_guard(self) -> ConsoleGuard:
        if self._console is None:
            self._console = ConsoleGuard()
            for exporter in console_exporter_classes():
                self.wrap(exporter, "export", self._console.export)
        return self._console

    def remove(self) -> None:
        for owner, name, handle in reversed(self._handles):
            try:  # missing_ok: an attribute someone replaced wholesale no longer holds our wrapper
                wrapt.unwrap_object(owner, name, handle, missing_ok=True)
            except wrapt.WrapperNotOutermostError:
                # A plain (non-wrapt) wrapper sits over ours and cannot be relinked: ours stays in its chain, and
                # its shim, inactive from now on, passes every call straight through.
                logger.debug("mcp_token_otel: %r.%s is wrapped over ours; left as a pass-through", owner, name)
        self._handles.clear()
        self._console = None


class Shim(Protocol):
    """What an adapter's ``install(recorder)`` returns to its one owner, the instrumentor."""

    def install(self) -> None:
        """Hook the SDK."""

    def uninstall(self) -> None:
        """Restore the SDK; sessions that exist keep working, unmeasured."""

    def instrument_server(self, server: Any) -> None:
        """Instrument a server object built before ``install``."""


_S = TypeVar("_S", bound=Shim)


def installed(shim: _S) -> _S:
    """``shim`` with its hooks in place; all or nothing: a failure restores what was hooked, then raises."""
    try:
        shim.install()
    except Exception:
        shim.uninstall()
        raise
    return shim


def argument(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    """A wrapped call's argument, passed by position or by keyword."""
    return args[index] if len(args) > index else kwargs.get(name)


def is_mcp_span(span: Span, kind: SpanKind, method: str) -> bool:
    """A recording span of this kind for this MCP method (the SDK's, or an outer instrumentation's)."""
    if not span.is_recording() or getattr(span, "kind", None) is not kind:
        return False
    attrs = getattr(span, "attributes", None) or {}
    return attrs.get("mcp.method.name") == method


def extract_parent(meta: Any) -> Any:
    """The context carried in ``_meta``, or None (ambient parenting) when it holds no valid traceparent."""
    if not isinstance(meta, Mapping) or not meta:
        return None
    try:
        ctx = propagate.extract(meta)
    except (ValueError, TypeError):
        return None
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def makes_spans(tracer: Any) -> bool:
    """Whether ``tracer`` (an SDK's own) starts spans of its own. Each such span, sampled or not, has a valid
    context that the SDK injects into a request's ``_meta``, so a shim span made current changes only which span
    is the parent. A no-op tracer starts none (no provider was ever set, or a library or test fixture put one in
    place while a global provider is set): the SDK then injects the application's current context, and a shim
    span made current would reach the wire."""
    if isinstance(tracer, trace.ProxyTracer):
        tracer = tracer._tracer  # what it delegates to now: the global provider's tracer, or a no-op one
    return tracer is not None and not isinstance(tracer, trace.NoOpTracer)


def detach(token: Any) -> None:
    """Detach an attached OpenTelemetry context; never raises (the call must go on)."""
    if token is not None:
        with contextlib.suppress(Exception):
            otel_context.detach(token)
