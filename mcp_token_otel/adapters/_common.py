"""What both SDK adapters need: exact patching and restoring, and small helpers over wire data and spans."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind

#: Marker attribute on everything the shim installs (wrappers, middleware), so nothing is wrapped twice.
MARK = "_mcp_token_otel"
_MISSING = object()


class Patches:
    """Attributes replaced on SDK classes and modules, restored verbatim and in reverse order."""

    def __init__(self) -> None:
        self._originals: list[tuple[Any, str, Any]] = []

    def patch(self, owner: Any, name: str, replacement: Any) -> None:
        # vars(): the attribute as the owner itself holds it (never an inherited one), restored verbatim.
        original = vars(owner).get(name, _MISSING)
        if getattr(original, MARK, False):
            return  # already ours (a stale install): never wrap a wrapper
        with contextlib.suppress(AttributeError, TypeError):
            setattr(replacement, MARK, True)
        self._originals.append((owner, name, original))
        setattr(owner, name, replacement)

    def restore(self) -> None:
        for owner, name, original in reversed(self._originals):
            if original is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._originals.clear()


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


def global_tracing() -> bool:
    """Whether the application set a global tracer provider. Only then do the SDK's own spans (2.x) carry a
    valid context onto the wire; a shim span made current changes which span is the parent, never whether
    trace context is sent."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def wire_dict(model: Any) -> Any:
    """The wire form of a pydantic model (what the SDK itself serializes); other values as they are."""
    dump = getattr(model, "model_dump", None)
    return dump(by_alias=True, mode="json", exclude_none=True) if callable(dump) else model


def detach(token: Any) -> None:
    """Detach an attached OpenTelemetry context; never raises (the call must go on)."""
    if token is not None:
        with contextlib.suppress(Exception):
            otel_context.detach(token)


class ShimSlot:
    """The one installed shim of an adapter module: ``install`` twice returns it, and a failed install
    restores whatever it had patched before failing."""

    def __init__(self, build: Any) -> None:
        self._build = build
        self.shim: Any = None

    def install(self, recorder: Any) -> Any:
        if self.shim is None:
            shim = self._build(recorder)
            try:
                shim.install()
            except Exception:
                shim.uninstall()
                raise
            self.shim = shim
        return self.shim

    def uninstall(self) -> None:
        if self.shim is not None:
            self.shim.uninstall()
            self.shim = None


class PendingEvents:
    """Stands in for a span that is not open yet (a client request is guarded before the SDK opens its span):
    keeps the events the recorder adds, for :meth:`replay` onto the span once it exists."""

    __slots__ = ("events",)

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def is_recording(self) -> bool:
        return True

    def add_event(self, name: str, attributes: Any = None) -> None:
        self.events.append((name, attributes))

    def replay(self, span: Any) -> None:
        if span is not None and self.events and span.is_recording():
            for name, attributes in self.events:
                span.add_event(name, attributes)
        self.events.clear()


def deliver(original: Any, wire: Any, guarded: Any) -> Any:
    """What to hand on after the guards: ``original`` when they changed nothing (``guarded is wire``), else the
    guarded wire dict, validated back into the original's model type when the SDK handed a model. Raises
    when the guarded dict does not fit the model (the caller counts it and hands on ``original``)."""
    if guarded is wire:
        return original
    if isinstance(original, Mapping):
        return guarded
    return type(original).model_validate(guarded, by_name=False)
