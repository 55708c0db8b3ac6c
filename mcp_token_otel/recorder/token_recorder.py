"""The recorder: the one object adapters and the proxy talk to.

``recorder.begin(side, method, params, key)`` hands out a :class:`~.call.Call` for each message exchange; the call
does the measuring. The recorder holds what calls share: the session ledger (budgets), the label bounds, the span
annotator, the guards, the context costs, and the one aggregate every emitter reads. It never raises: a fault in
the estimator, the span API, the budget registry or the metrics is counted (``mcp_token_instrumentation_errors``
with ``stage``), logged at debug level, and the MCP call carries on untouched.

Metric labels are bounded: tool names past ``metrics.max_tool_names`` (and method names past ``MAX_METHODS``,
beyond the spec's own) share an overflow value, and no metric ever carries a session or request id.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.trace import Span, SpanKind, Tracer

from ..config import Config, build_policy
from ..core.budget import BUDGET_STATES
from ..core.budget_key import KeyFacts, KeySource, choose_budget_key, parse_key_sources
from ..core.guard import GuardEngine
from ..core.labels import UNKNOWN_SERVER, NameLimiter
from ..core.logical_calls import TASK_NOTIFICATIONS, TASK_RESULT, LogicalCalls
from ..core.measure import Measurement, Policy
from ..core.protocol import server_info_name
from ..emitters.aggregate import Aggregate, MessageSeries
from ..emitters.assembly import Metrics
from ..emitters.otel_metrics import NO_SPAN
from ..semconv import MCP_CLIENT_SESSION_DURATION, MCP_SERVER_SESSION_DURATION, SCHEMA_URL, SCOPE_NAME
from .call import Call, OffCall, message_metrics
from .context_costs import ContextCosts, ToolList, tool_list
from .guarding import GuardOrchestrator
from .label_bounds import LabelBounds
from .ledger import SessionLedger, SessionMeta, Side
from .spans import SpanAnnotator, capture_from_env, enabled

logger = logging.getLogger("mcp_token_otel.recorder")

#: Cached message series, at most (a cache: the series stay in the aggregate when it is cleared).
_SERIES_CACHE = 10_000
_SIDES: tuple[Side, ...] = ("client", "server", "proxy")


class TokenRecorder:
    """Turns MCP messages into token estimates on spans and metrics; shared by every adapter."""

    def __init__(
        self,
        config: Config | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        *,
        policy: Policy | None = None,
        server_name: str | None = None,
        fallback_server: str | None = None,
    ) -> None:
        """``server_name``: the ``server`` label of every series, as the user gave it (the proxy's ``--name``);
        ``fallback_server``: the label until a server names itself (the proxy's name from its command line)."""
        from .. import __version__

        self.config = config or Config()
        self.policy = policy or build_policy(self.config)
        self.tracer: Tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(
            SCOPE_NAME, __version__, schema_url=SCHEMA_URL
        )
        #: In-process fault counts per stage: the one place a fault is visible when the metrics themselves fail.
        self.error_counts: Counter[str] = Counter()
        #: Called with (call, measurement) once a call's answer is recorded (the demo's live table).
        self.listeners: list[Callable[[Call, Measurement], None]] = []
        self._labels = LabelBounds(self.config.metrics, server_name or "", self.fault, fallback_server or "")
        server = self.server_label()
        self.metrics = Metrics(self.config, meter_provider, __version__, server, self.fault)
        #: Every metric family's series, read by every emitter (Prometheus, OpenTelemetry, multiprocess files).
        self.aggregate: Aggregate = self.metrics.aggregate
        self._spans = SpanAnnotator(
            self.tracer,
            self.policy,
            self.config.spans.capture_content or capture_from_env(),
            self.config.spans.max_content_chars,
            self.fault,
        )
        budget = self.config.budget
        #: The parsed ``budget.key``: what adapters key a message's budget by (see :meth:`budget_key`).
        self.key_sources: tuple[KeySource, ...] = parse_key_sources(budget.key)
        #: Whether ``session`` is the first key source: an adapter that knows the session uses it as the key
        #: without reading anything else of the message.
        self.session_first = bool(self.key_sources) and self.key_sources[0].kind == "session"
        self._ledger = SessionLedger(budget, self.fault, self._session_ended, self._meta_evicted,
                                     repeat_window=self.config.metrics.repeat_window, store_error=self._store_error)
        self._spans.shared = self._ledger.shared
        self._costs = ContextCosts(self.config.metrics.repeat_window, self.aggregate, self._labels, self.fault)
        self._guards = GuardOrchestrator(self.config.guard, self.policy, budget.max_sessions,
                                         (self._ledger, self._labels, self.aggregate, self.fault))
        #: The guard policies (docs/guardrails.md); one engine per recorder, shared by every side.
        self.guard: GuardEngine = self._guards.engine
        #: Budgets of the live sessions, per side.
        self.sessions = self._ledger.sessions
        #: Bounded tool-name labels.
        self.tool_names: NameLimiter = self._labels.tool_names
        self._series_cache: dict[tuple[Any, ...], MessageSeries] = {}
        #: The legs of each side's logical calls (multi round-trip requests, tasks), joined.
        #: Each on the clock its side's calls are timed with (the proxy: the wall clock its relay stamps messages
        #: with; the shim: time.perf_counter()), so a logical call's duration is what its legs' add up to.
        self.logical: dict[str, LogicalCalls] = {
            side: LogicalCalls(window=self.config.metrics.logical_call_window,
                               task_window=self.config.metrics.task_window, max_entries=budget.max_sessions,
                               clock=time.time if side == "proxy" else time.perf_counter)
            for side in _SIDES
        }
        self._start_series(server)

    def _start_series(self, server: str) -> None:
        """Series that exist from the start: the configured budgets, the sessions read at collection, and the
        series alerts take increase() of (a series born at its first event hides that event from increase())."""
        agg = self.aggregate
        prom = self.config.prometheus
        budgets = (("tool", prom.tool_output_rate_budget), ("service", prom.service_output_rate_budget))
        # Read at collection: under the server's own name once it is known (the proxy learns it).
        agg.read_with("mcp_token_output_rate_budget_tokens_per_second",
                      lambda: [((scope, self.server_label()), value) for scope, value in budgets])
        agg.read_with("mcp_token_sessions", self._session_rows)
        labels = self._labels
        if labels.fallback_server and not (labels.override or labels.default_server):
            return  # a stand-in name the server's own replaces: its series start when the server names itself
        agg.touch("mcp_token_instrumentation_errors", ("estimate", server))
        for op in ("add", "peek", "rate"):  # the store-error alert takes increase(): 0 until the first error
            agg.touch("mcp_token_budget_store_errors", (server, op))
        if server != UNKNOWN_SERVER:  # an unknown name gets its real one later
            for side in _SIDES:
                agg.touch_server(side, server)

    # ------------------------------------------------------------------ calls

    def begin(self, side: Side, method: str, params: Any, key: str | None, *, server: str | None = None,
              budgeted: bool = True, version: str | None = None) -> Call:
        """A message exchange starting: ``key`` is its budget (:meth:`budget_key`; None: unbudgeted),
        ``server`` the server's own name where the adapter knows it, ``budgeted=False`` a notification (never
        in the model's context), ``version`` the negotiated protocol version where known. Inside an
        OpenTelemetry suppression context nothing is measured (the call passes everything through)."""
        if not enabled():
            return OffCall(self, side, method, params, key, server, budgeted, version)
        return Call(self, side, method, params, key, server, budgeted, version)

    def notify(self, side: Side, method: str, params: Any, key: str | None, *, server: str | None = None,
               span: Span | None = None, at: float | None = None) -> None:
        """A notification: its tokens on the metrics, on no budget (``key`` only names the session's server).
        A task's notification is task bookkeeping; one that delivers its call's result counts that result as
        the call's output (``at``: when, on the side's clock)."""
        outcome = None
        if method in TASK_NOTIFICATIONS:
            try:
                outcome = self.logical[side].notification(method, params, at)
            except Exception:
                self.fault("metrics")
        delivers = outcome is not None and outcome.kind == TASK_RESULT
        call = self.begin(side, method, (outcome.envelope or {}) if delivers else params,  # type: ignore[union-attr]
                          key, server=server, budgeted=False)
        if method in TASK_NOTIFICATIONS:
            call.counts_as = "task"
        call.open(span)
        if delivers:
            call.delivered(outcome)  # type: ignore[arg-type]
        call.close()

    def budget_key(self, facts: KeyFacts) -> str | None:
        """The budget a message counts toward: the first ``budget.key`` source ``facts`` can answer (a session
        key is the session id itself; any other is ``"<source>=<value>"``), or None (its tokens then count as
        unbudgeted). Never raises (a fault gives None)."""
        try:
            return choose_budget_key(self.key_sources, facts)
        except Exception:
            self.fault("budget")
            return None

    @property
    def guard_active(self) -> bool:
        """False when no guard mode is on anywhere: adapters skip every guard step (one bool check)."""
        return self._guards.active

    def guards(self, side: Side) -> bool:
        """Whether ``side`` runs the guards: a mode is on and ``guard.sides`` lists the side."""
        return self._guards.active and side in self._guards.sides

    @property
    def capture_content(self) -> bool:
        """Whether tool arguments and results go on spans (spans.capture_content or the GenAI switch)."""
        return self._spans.capture

    # ------------------------------------------------------------------ what calls share

    def _label(self, meta: SessionMeta | None, server: str | None) -> str:
        """The bounded ``server`` label of a message, kept on its session (until the session learns its
        server's name)."""
        if meta is None:
            return self._labels.server(None, server)
        label = meta.label
        if label is None:
            label = meta.label = self._labels.server(meta, server)
        return label

    def _series(self, side: str, server: str, method: str, tool: str | None, direction: str,
                admit: bool) -> MessageSeries:
        """A message's series under bounded labels (a name is admitted as a label by a successful response,
        see NameLimiter), found once per label set."""
        key = (side, server, method, tool, direction)
        found = self._series_cache.get(key)
        if found is not None:
            return found
        labels = self._labels
        try:
            method_label = labels.method_names(method, admit) or method
            tool_label = labels.tool_names(tool, admit)
        except Exception:
            self.fault("metrics")
            method_label, tool_label = method, labels.tool_names.overflow
        found = self.aggregate.message(side, server, method_label, tool_label, direction)
        if method_label == method and tool_label == tool:  # an overflow label may be admitted later: not kept
            if len(self._series_cache) >= _SERIES_CACHE:
                self._series_cache.clear()
            self._series_cache[key] = found
        return found

    def _learn_server(self, result: Any, meta: SessionMeta | None) -> None:
        """The server's name from a result: initialize's ``serverInfo``, or the serverInfo stamp of a
        2026-07-28 result (server/discover's, and any later one's); the session's, when it has one."""
        try:
            name = server_info_name(result)
            if name is not None:
                label = self._labels.learn(name)
                if meta is not None:
                    meta.server, meta.label = label, None
        except Exception:
            self.fault("metrics")

    def _tool_definitions(self, result: Any) -> ToolList | None:
        """The tools a tools/list result declares and what their definitions cost in context."""
        try:
            return tool_list(result, self.policy.estimator, self._labels.tool_names)
        except Exception:
            self.fault("metrics")
            return None

    def _tools_listed(self, side: Side, server: str, listed: ToolList, changed: bool) -> None:
        """A tools/list result: the server's definition gauges (its last list: tools it no longer lists go) and
        the session's prompt-cache churn."""
        agg = self.aggregate
        agg.set("mcp_token_tool_definitions_tokens", (server,), listed.total)
        agg.replace("mcp_token_tool_definition_tokens", (server,),
                    [((server, tool), tokens) for tool, tokens in listed.per_tool.items()])
        agg.replace("mcp_token_tool_definitions_part_tokens", (server,),
                    [((server, part), tokens) for part, tokens in listed.parts.items()])
        agg.replace("mcp_token_tool_static_max_tokens", (server,),
                    [((server, tool), tokens) for tool, tokens in listed.static_max.items()])
        self._costs.tool_list(side, server, listed, changed)

    # ------------------------------------------------------------------ spans

    def start_span(
        self, name: str, kind: SpanKind, attributes: dict[str, Any] | None = None, context: Any = None
    ) -> Span | None:
        """Open one of our spans; None when the tracing pipeline fails (the call goes on without it) or when
        instrumentation is suppressed in this context."""
        return self._spans.start(name, kind, attributes, context)

    def end_span(self, span: Span | None) -> None:
        self._spans.end(span)

    def set_attributes(self, span: Span | None, attributes: Mapping[str, Any]) -> None:
        self._spans.set_attributes(span, attributes)

    # ------------------------------------------------------------------ faults, flush, close

    def fault(self, stage: str) -> None:
        """Count and log an instrumentation fault; never raises. A fault has no session to name its server: it
        carries server_label()."""
        self.error_counts[stage] += 1
        logger.debug("mcp_token_otel: fault in stage %s", stage, exc_info=True)
        try:
            self.aggregate.add("mcp_token_instrumentation_errors", (stage, self._labels.fault_server()))
        except Exception:
            self.error_counts["metrics"] += 1

    def _store_error(self, op: str) -> None:
        """A budget-store operation answered locally (the shared store failed, timed out or is backing off)."""
        self.aggregate.add("mcp_token_budget_store_errors", (self._labels.fault_server(), op))

    def flush(self) -> None:
        """Hand every deferred OpenTelemetry point to its instrument now (tests, shutdown)."""
        self.metrics.flush()

    def close(self) -> None:
        """Stop background work; the sessions that are still open are not ended (uninstrument calls this)."""
        self._end_queued()
        self._ledger.report_ended()
        self._ledger.close()
        try:  # multiprocess files: what is read from live state is written before the process goes
            self.aggregate.write_readers()
        except Exception:
            self.fault("metrics")
        self.metrics.close()

    # ------------------------------------------------------------------ sessions

    def server_label(self, server: str | None = None) -> str:
        """The bounded ``server`` label of series with no session to tell more: the override, else ``server``
        (a name the caller knows), else the proxy's name."""
        return self._labels.server(None, server)

    def end_session(self, side: Side, key: str | None) -> None:
        """The session (or conversation) ``key`` is over: close its budget (observes
        ``mcp_token.session.utilization``)."""
        if key is None:
            return
        self._ledger.end(side, key)
        self._guards.end_session(side, key)

    def end_session_soon(self, side: Side, key: str) -> None:
        """:meth:`end_session` for a garbage-collection callback. Such a callback runs inside whatever code
        allocated, holding whatever lock it held (not reentrant), so this only queues; the session ends at the
        next safe point (the next message recorded, a read of the session states, close)."""
        self._ledger.end_soon(side, key)

    def _end_queued(self) -> None:
        ending = self._ledger.ending
        while ending:
            try:
                side, key = ending.popleft()
            except IndexError:  # another thread took the last one
                return
            self.end_session(side, key)

    def states(self) -> dict[str, dict[str, int]]:
        """Live sessions per budget state, per side (budgets idle past ``budget.idle_timeout`` ended first)."""
        if self._ledger.ending:
            self._end_queued()
        self._ledger.expire()
        self._ledger.report_ended()
        return self._ledger.states()

    def session_states(self) -> dict[tuple[str, str], dict[str, int]]:
        """Live sessions per (side, server label) and budget state, every state present: what the sessions
        gauges show. Read at collection (one pass over the live sessions); a (side, server) seen once keeps its
        series at 0 when its sessions end. Sessions whose server is not known yet count under server_label()."""
        if self._ledger.ending:
            self._end_queued()
        return self._ledger.session_states(lambda meta: self._labels.server(meta))

    def _session_rows(self) -> list[tuple[tuple[str, ...], float]]:
        return [((side, server, state), float(counts.get(state, 0)))
                for (side, server), counts in sorted(self.session_states().items()) for state in BUDGET_STATES]

    def _session_ended(self, side: Side, utilization: float, meta: SessionMeta | None, why: str) -> None:
        """A session the ledger let go of: its final utilization and lifetime; an eviction is counted too. Runs
        where a session ends (a connection's exit, a message, a collection): never raises."""
        try:
            self._record_session_end(side, utilization, meta, why)
        except Exception:
            self.fault("metrics")

    def _record_session_end(self, side: Side, utilization: float, meta: SessionMeta | None, why: str) -> None:
        agg = self.aggregate
        server = self._labels.server(meta)
        agg.observe("mcp_token_session_utilization_ratio", (side, server), utilization, NO_SPAN)
        if meta is not None:
            lifetime = max(0.0, time.monotonic() - meta.started)
            agg.observe("mcp_token_session_duration_seconds", (side, server), lifetime)
            name = MCP_SERVER_SESSION_DURATION if side == "server" else MCP_CLIENT_SESSION_DURATION
            agg.observe(name, (None if side in ("client", "server") else side, server, meta.transport,
                               meta.protocol), lifetime, NO_SPAN)
            self._record_pending(meta, server)
        if why == "evicted":
            agg.add("mcp_token_sessions_evicted", (side, server))

    def _meta_evicted(self, side: Side, meta: SessionMeta) -> None:
        """A session's metadata evicted at the bound: its held naming request is recorded, the eviction counted."""
        try:
            server = self._labels.server(meta)
            self._record_pending(meta, server)
            self.aggregate.add("mcp_token_sessions_evicted", (side, server))
        except Exception:
            self.fault("metrics")

    def _record_pending(self, meta: SessionMeta, server: str) -> None:
        """A naming request that never got its answer: recorded now, under what the session knows."""
        if meta.pending is not None:
            side, method, tool, m = meta.pending
            meta.pending = None
            message_metrics(self, side, method, tool, "input", m, server)
