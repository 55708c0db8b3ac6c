"""The one interface between the recorder and everything that turns measurements into metrics.

Every sink, built in (Prometheus, OpenTelemetry) or added by a user (``TokenRecorder.add_sink``), gets the same
calls with the same arguments. Attribute values arrive bounded (tool, method and server names past their limits
share an overflow value) and never carry a session or request id. A user sink subclasses :class:`BaseSink` and
overrides what it needs; the rest are no-ops.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ..core.measure import Measurement


class CallInfo:
    """What a response (or a session end) adds beyond its tokens: how it ended, how long it took, where."""

    __slots__ = ("duration", "error_type", "protocol", "transport")

    def __init__(
        self,
        error_type: str | None = None,
        duration: float | None = None,
        transport: str | None = None,
        protocol: str | None = None,
    ) -> None:
        self.error_type = error_type
        self.duration = duration
        self.transport = transport
        self.protocol = protocol


class MetricsSink(Protocol):
    """Where measurements go as metrics. ``server`` is the bounded server label ("" when unknown)."""

    def record_message(
        self, side: str, method: str, tool: str | None, direction: str, measurement: Measurement, server: str
    ) -> None:
        """One MCP message (request or response) and its measurement."""

    def record_call(self, side: str, method: str, tool: str | None, server: str, call: CallInfo) -> None:
        """A timed or failed call (its duration and error type)."""

    def record_transition(self, side: str, state: str, server: str) -> None:
        """A session's budget entered ``state`` (warning, exhausted)."""

    def record_session_end(self, side: str, utilization: float, server: str, call: CallInfo) -> None:
        """A session ended: its final utilization; ``call.duration`` is its lifetime."""

    def record_session_evicted(self, side: str, server: str) -> None:
        """A live session's bookkeeping was dropped to stay within ``budget.max_sessions`` (least recently used)."""

    def record_unbudgeted(self, side: str, server: str, tokens: int) -> None:
        """Tokens of a message that no budget key (``budget.key``) could attribute to a conversation."""

    def record_error(self, stage: str, server: str) -> None:
        """An instrumentation fault at ``stage`` (the MCP call went on unchanged)."""

    def record_tool_definitions(self, server: str, total: int, per_tool: Mapping[str, int]) -> None:
        """What a tools/list result's definitions cost in context, in all and per tool."""

    def record_tool_profiles(self, server: str, parts: Mapping[str, int], static_max: Mapping[str, int]) -> None:
        """The same tools/list result: its definitions' tokens per part (description, schema, names) and the
        static worst case of each tool whose result something bounds."""

    def record_prompt_cache_invalidation(self, side: str, server: str, resent_tokens: int) -> None:
        """A session's tools/list changed (content or order): the definition tokens sent again uncached."""

    def record_wasted(self, side: str, server: str, tool: str | None, kind: str, tokens: int) -> None:
        """Output tokens that add nothing new (kind ``repeated`` or ``duplicated``)."""

    def record_guard_action(
        self, side: str, server: str, policy: str, action: str, enforced: bool, tool: str | None
    ) -> None:
        """A guard policy acted (or would have, in report-only mode)."""

    def record_cost(self, side: str, server: str, tool: str | None, usd: float) -> None:
        """The estimated price of a result entering the context."""


class BaseSink:
    """A :class:`MetricsSink` whose every call does nothing: subclass it and override what you need."""

    def record_message(
        self, side: str, method: str, tool: str | None, direction: str, measurement: Measurement, server: str
    ) -> None:
        return None

    def record_call(self, side: str, method: str, tool: str | None, server: str, call: CallInfo) -> None:
        return None

    def record_transition(self, side: str, state: str, server: str) -> None:
        return None

    def record_session_end(self, side: str, utilization: float, server: str, call: CallInfo) -> None:
        return None

    def record_session_evicted(self, side: str, server: str) -> None:
        return None

    def record_unbudgeted(self, side: str, server: str, tokens: int) -> None:
        return None

    def record_error(self, stage: str, server: str) -> None:
        return None

    def record_tool_definitions(self, server: str, total: int, per_tool: Mapping[str, int]) -> None:
        return None

    def record_tool_profiles(self, server: str, parts: Mapping[str, int], static_max: Mapping[str, int]) -> None:
        return None

    def record_prompt_cache_invalidation(self, side: str, server: str, resent_tokens: int) -> None:
        return None

    def record_wasted(self, side: str, server: str, tool: str | None, kind: str, tokens: int) -> None:
        return None

    def record_guard_action(
        self, side: str, server: str, policy: str, action: str, enforced: bool, tool: str | None
    ) -> None:
        return None

    def record_cost(self, side: str, server: str, tool: str | None, usd: float) -> None:
        return None
