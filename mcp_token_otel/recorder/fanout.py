"""The sink fan-out: every metric point to every sink, one sink's failure never stopping the others.

Every sink gets the calls of :class:`~mcp_token_otel.emitters.sink.MetricsSink`, each with the bounded server
label. A failing call is an instrumentation fault (stage ``metrics``); faults are counted here, in process, and
reported to the sinks as ``record_error`` (the one place a fault is visible when the meter itself fails).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping

from ..core.budget import BudgetUpdate
from ..core.measure import Measurement
from ..emitters.deferred import DeferredSink
from ..emitters.sink import CallInfo, MetricsSink
from .labels import LabelBounds

logger = logging.getLogger("mcp_token_otel.recorder")


class SinkFanout:
    """The sinks and the fault counts."""

    def __init__(self, labels: LabelBounds) -> None:
        #: Every sink, in the order added; a user sink is wrapped in its DeferredSink.
        self.sinks: list[MetricsSink] = []
        #: In-process fault counts per stage.
        self.error_counts: Counter[str] = Counter()
        self._labels = labels

    def add(self, sink: MetricsSink, *, inline: bool = False) -> None:
        """Send metrics to ``sink`` too: inline (on the MCP call path) or replayed by a DeferredSink's thread."""
        if not inline and not isinstance(sink, DeferredSink):
            sink = DeferredSink(sink, on_error=self.fault)
        self.sinks.append(sink)

    def fault(self, stage: str) -> None:
        """Count and log an instrumentation fault; never raises."""
        self.error_counts[stage] += 1
        logger.debug("mcp_token_otel: fault in stage %s", stage, exc_info=True)
        server = self._labels.fault_server()
        for sink in self.sinks:
            try:
                sink.record_error(stage, server)
            except Exception:
                self.error_counts["metrics"] += 1

    def message(
        self,
        side: str,
        method: str,
        tool_name: str | None,
        direction: str,
        m: Measurement,
        update: BudgetUpdate | None,
        server: str = "",
        call: CallInfo | None = None,
    ) -> None:
        """One message's points under bounded labels (its message, and for a response its call) and
        the budget states it entered: one pass over the sinks, each getting its calls in that order. A name is
        admitted as a label by a successful response (see NameLimiter)."""
        labels = self._labels
        output = direction == "output"
        try:
            admit = output and m.error_type is None
            method = labels.method_names(method, admit) or method
            tool = labels.tool_names(tool_name, admit)
        except Exception:
            self.fault("metrics")
            return
        timed = output and call is not None and (call.error_type is not None or call.duration is not None)
        transitions = update.transitions if update is not None else ()
        for sink in self.sinks:
            try:
                sink.record_message(side, method, tool, direction, m, server)
            except Exception:
                self.fault("metrics")
            if timed:
                try:
                    sink.record_call(side, method, tool, server, call)  # type: ignore[arg-type]  # timed: not None
                except Exception:
                    self.fault("metrics")
            for state in transitions:
                try:
                    sink.record_transition(side, state, server)
                except Exception:
                    self.fault("metrics")

    def unbudgeted(self, side: str, server: str, tokens: int) -> None:
        """Tokens that entered a context no budget key could name."""
        for sink in self.sinks:
            try:
                sink.record_unbudgeted(side, server, tokens)
            except Exception:
                self.fault("metrics")

    def session_end(self, side: str, utilization: float, server: str, call: CallInfo) -> None:
        for sink in self.sinks:
            try:
                sink.record_session_end(side, utilization, server, call)
            except Exception:
                self.fault("metrics")

    def session_evicted(self, side: str, server: str) -> None:
        for sink in self.sinks:
            try:
                sink.record_session_evicted(side, server)
            except Exception:
                self.fault("metrics")

    def tool_definitions(self, server: str, total: int, per_tool: Mapping[str, int]) -> None:
        for sink in self.sinks:
            try:
                sink.record_tool_definitions(server, total, per_tool)
            except Exception:
                self.fault("metrics")

    def tool_profiles(self, server: str, parts: Mapping[str, int], static_max: Mapping[str, int]) -> None:
        for sink in self.sinks:
            try:
                sink.record_tool_profiles(server, parts, static_max)
            except Exception:
                self.fault("metrics")

    def prompt_cache_invalidation(self, side: str, server: str, resent_tokens: int) -> None:
        for sink in self.sinks:
            try:
                sink.record_prompt_cache_invalidation(side, server, resent_tokens)
            except Exception:
                self.fault("metrics")

    def wasted(self, side: str, server: str, tool_name: str | None, kind: str, tokens: int) -> None:
        """Wasted output tokens of a tool, under its bounded label (admitted by the response just recorded)."""
        try:
            tool = self._labels.tool_names(tool_name, False)
        except Exception:
            self.fault("metrics")
            return
        for sink in self.sinks:
            try:
                sink.record_wasted(side, server, tool, kind, tokens)
            except Exception:
                self.fault("metrics")

    def guard_action(self, side: str, server: str, policy: str, action: str, enforced: bool, tool: str | None) -> None:
        for sink in self.sinks:
            try:
                sink.record_guard_action(side, server, policy, action, enforced, tool)
            except Exception:
                self.fault("metrics")

    def cost(self, side: str, server: str, tool: str | None, usd: float) -> None:
        for sink in self.sinks:
            try:
                sink.record_cost(side, server, tool, usd)
            except Exception:
                self.fault("metrics")

    def touch_guard(self, side: str, server: str, tool: str | None, series: list[tuple[str, str, bool]]) -> None:
        """Start a tool's refusal and padding series at 0 where a sink keeps zero-valued series (Prometheus's
        aggregates; an OpenTelemetry counter needs no zero): an optional sink method, not part of the protocol."""
        for sink in self.sinks:
            touch = getattr(sink, "touch_guard", None)
            if touch is not None:
                try:
                    touch(side, server, tool, series)
                except Exception:
                    self.fault("metrics")

    def flush(self) -> None:
        """Hand every deferred metric point to its sink now."""
        for sink in self.sinks:
            flush = getattr(sink, "flush", None)
            if callable(flush):
                flush()

    def close(self) -> None:
        for sink in self.sinks:
            close = getattr(sink, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:
                    self.fault("metrics")
