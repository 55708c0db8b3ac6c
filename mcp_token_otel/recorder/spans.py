"""The span annotator: token counts, budgets, captured content, status and events on the MCP spans.

Every span API call is guarded: a fault in the tracing pipeline is counted (stage ``span``) and the MCP call
goes on untouched. Nothing is recorded inside an OpenTelemetry suppression context (:func:`enabled`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer

from ..core.measure import Measurement, Policy
from ..core.risk import BREACH_TIERS
from ..core.spill import span_uri
from ..semconv import (
    A_ADVISORY,
    A_ARGUMENTS,
    A_BUDGET_SOURCE,
    A_COST_USD,
    A_ERROR_TYPE,
    A_ESTIMATOR,
    A_INPUT_TOKENS,
    A_OUTPUT_TOKENS,
    A_OVERHEAD_RATIO,
    A_OVERHEAD_TOKENS,
    A_RESOURCE_URI,
    A_RESULT,
    A_RISK_TIER,
    A_SERVER_NAME,
    A_SESSION_STATE,
    A_SESSION_TOKENS,
    A_SESSION_UTILIZATION,
    A_STATUS_CODE,
    A_TOOL_DEFINITION_TOKENS,
    EVENT_BUDGET,
    EVENT_RISK,
)
from ..store import SharedAnswer
from .bounded_json import truncate
from .context_costs import ToolList

#: The GenAI conventions' content-capture switch, honoured beside ``spans.capture_content``.
CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_CAPTURE_VALUES = frozenset({"true", "1", "yes", "span_only", "span_and_event"})

try:  # the keys is_instrumentation_enabled() reads, read from one context lookup instead of two
    from opentelemetry.instrumentation.utils import (
        _SUPPRESS_INSTRUMENTATION_KEY as _SUPPRESS,
    )
    from opentelemetry.instrumentation.utils import (
        _SUPPRESS_INSTRUMENTATION_KEY_PLAIN as _SUPPRESS_PLAIN,
    )

    def enabled() -> bool:
        """is_instrumentation_enabled(), with one context lookup (it is asked twice per message)."""
        ctx = otel_context.get_current()
        return not (ctx.get(_SUPPRESS) or ctx.get(_SUPPRESS_PLAIN))
except ImportError:  # an instrumentation package that moved its keys: its own function
    enabled = is_instrumentation_enabled


def capture_from_env() -> bool:
    """True when OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT asks for content on spans."""
    return os.environ.get(CAPTURE_ENV, "").strip().lower() in _CAPTURE_VALUES


def _status_unset(span: Span) -> bool:
    # Keep a status (and its description) that the SDK's own instrumentation already set.
    status = getattr(span, "status", None)
    return status is None or status.status_code is StatusCode.UNSET


def status_description(m: Measurement, result: Any, error: Any) -> str:
    """A short status description: the JSON-RPC error's code and message, or the tool error's first text."""
    if m.error_type == "tool_error":
        content = result.get("content") if isinstance(result, (dict, Mapping)) else None
        first = content[0] if isinstance(content, list) and content else None
        text = first.get("text") if isinstance(first, (dict, Mapping)) else None
        return f"tool_error: {text[:200]}" if isinstance(text, str) and text else "tool_error"
    message = error.get("message") if isinstance(error, (dict, Mapping)) else getattr(error, "message", None)
    return f"{m.error_type}: {message[:200]}" if isinstance(message, str) and message else str(m.error_type)


def _content(result: Any) -> Any:
    """What of a tools/call result is captured: its content blocks (or the whole result when it has none)."""
    return result.get("content", result) if isinstance(result, (dict, Mapping)) else result


def _risk_event(span: Span, m: Measurement) -> None:
    event: dict[str, Any] = {A_RISK_TIER: m.risk_tier, A_OUTPUT_TOKENS: m.total_tokens}
    advisories = m.advisories
    if advisories:
        event[A_ADVISORY] = advisories[0]
    span.add_event(EVENT_RISK, event)


def _budget_events(span: Span, update: SharedAnswer) -> None:
    for state in update.transitions:
        span.add_event(
            EVENT_BUDGET,
            {A_SESSION_STATE: state, A_SESSION_TOKENS: update.tokens, A_SESSION_UTILIZATION: update.utilization},
        )


class SpanAnnotator:
    """Opens, annotates and ends the recorder's spans; never raises."""

    def __init__(
        self, tracer: Tracer, policy: Policy, capture: bool, max_chars: int, fault: Callable[[str], None]
    ) -> None:
        self.tracer = tracer
        self.policy = policy
        #: Tool arguments and results go on spans (spans.capture_content or the GenAI environment switch).
        self.capture = capture
        #: Budgets are counted in a shared store: each session figure says what it was decided on.
        self.shared = False
        self._max_chars = max_chars
        self._fault = fault

    def start(self, name: str, kind: SpanKind, attributes: dict[str, Any] | None, context: Any) -> Span | None:
        """Open a span; None when the tracing pipeline fails or instrumentation is suppressed here."""
        if not enabled():
            return None
        try:
            return self.tracer.start_span(
                name,
                context=context,
                kind=kind,
                attributes=attributes,
                record_exception=False,
                set_status_on_exception=False,
            )
        except Exception:
            self._fault("span")
            return None

    def end(self, span: Span | None) -> None:
        if span is None:
            return
        try:
            span.end()
        except Exception:
            self._fault("span")

    def set_attributes(self, span: Span | None, attributes: Mapping[str, Any]) -> None:
        try:
            if span is not None and span.is_recording():
                span.set_attributes(attributes)
        except Exception:
            self._fault("span")

    def exception(self, span: Span | None, exc: BaseException) -> None:
        """A non-JSON-RPC failure of the call (transport error...): error.type is the exception class."""
        try:
            if span is not None and span.is_recording():
                span.set_attribute(A_ERROR_TYPE, type(exc).__qualname__)
                span.set_status(StatusCode.ERROR, f"{type(exc).__qualname__}: {str(exc)[:200]}")
        except Exception:
            self._fault("span")

    def request(
        self,
        span: Span,
        method: str,
        params: Any,
        m: Measurement,
        attributes: Mapping[str, Any] | None,
        hold: dict[str, Any],
        server: str | None = None,
    ) -> None:
        """A request's tokens (and the adapter's ``attributes``) into ``hold``: set with the answer's, in one
        call into the span. ``server``: the name the server gave itself, unless the adapter named it."""
        try:
            if not span.is_recording():
                return
            if attributes:
                hold.update(attributes)
            if server and A_SERVER_NAME not in hold and A_SERVER_NAME not in (getattr(span, "attributes", None) or ()):
                hold[A_SERVER_NAME] = server  # (the proxy's --name is on the span from its start)
            hold[A_INPUT_TOKENS] = m.total_tokens
            hold[A_ESTIMATOR] = self.policy.estimator_name
            if self.capture and method == "tools/call" and isinstance(params, (dict, Mapping)):
                hold[A_ARGUMENTS] = truncate(params.get("arguments"), self._max_chars)
            elif method.startswith("resources/") and isinstance(params, (dict, Mapping)):
                uri = params.get("uri")  # conditionally required; also on spans the SDK opened itself
                if isinstance(uri, str):
                    hold[A_RESOURCE_URI] = span_uri(uri)  # a kept result's id is a secret: hidden
        except Exception:
            self._fault("span")

    def response(
        self,
        span: Span,
        method: str,
        m: Measurement,
        update: SharedAnswer | None,
        definitions: ToolList | None,
        cost: float | None,
        result: Any,
        error: Any,
        held: dict[str, Any],
    ) -> None:
        """An answer's tokens, status and events on ``span``, with the request's ``held`` attributes (which are
        older), in one call into the span."""
        try:
            if not span.is_recording():
                return
            attrs = held
            attrs[A_OUTPUT_TOKENS] = m.total_tokens
            attrs[A_OVERHEAD_TOKENS] = m.overhead_tokens
            attrs[A_OVERHEAD_RATIO] = m.overhead_ratio
            attrs[A_RISK_TIER] = m.risk_tier
            attrs[A_ESTIMATOR] = self.policy.estimator_name
            if update is not None:
                attrs[A_SESSION_TOKENS] = update.tokens
                attrs[A_SESSION_UTILIZATION] = update.utilization
                attrs[A_SESSION_STATE] = update.state
                if self.shared:
                    attrs[A_BUDGET_SOURCE] = update.source
            if m.error_type is not None:
                attrs[A_ERROR_TYPE] = m.error_type
                if m.error_type != "tool_error":
                    attrs[A_STATUS_CODE] = m.error_type
            if definitions is not None:
                attrs[A_TOOL_DEFINITION_TOKENS] = definitions.total
            if cost is not None:
                attrs[A_COST_USD] = cost
            if self.capture and method == "tools/call" and result is not None:
                attrs[A_RESULT] = truncate(_content(result), self._max_chars)
            span.set_attributes(attrs)
            if m.error_type is not None and _status_unset(span):
                span.set_status(StatusCode.ERROR, status_description(m, result, error))
            if m.risk_tier in BREACH_TIERS:
                _risk_event(span, m)
            if update is not None:
                _budget_events(span, update)
        except Exception:
            self._fault("span")
