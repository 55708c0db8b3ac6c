"""Guard orchestration: the guard policies (docs/guardrails.md) run around the calls, their actions counted.

Request-side guards may answer a call in the tool's place; result-side guards may change what is delivered
(truncation, padding notices) and say what enters the context. Each action becomes a span event and a
``mcp_token_guard_actions`` count; the estimated price of a result (``guard.model``) a ``mcp_token_cost_usd`` one.
Never raises: a fault is counted (stage ``guard``) and the call goes on unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Span

from ..core.guard import META_GUARD_KEY, GuardAction, GuardEngine
from ..core.guard.settings import GuardSettings
from ..core.measure import Measurement, Policy
from ..emitters.aggregate import Aggregate
from ..semconv import A_GUARD_BUDGET_SOURCE, EVENT_GUARD
from .label_bounds import LabelBounds
from .ledger import SessionLedger, Side
from .spans import enabled

if TYPE_CHECKING:
    from .call import Call

#: (side, server, tool) triples whose guard series were started at 0; cleared past this many.
_MAX_TOUCHED = 10_000


def is_refusal(result: Any) -> bool:
    """A guard's own refusal (its _meta carries the guard key): recorded as the output, never guarded again."""
    meta = result.get("_meta") if isinstance(result, (dict, Mapping)) else None
    return isinstance(meta, (dict, Mapping)) and META_GUARD_KEY in meta


def _rate_key(side: str, key: str) -> str:
    """The rate limiter's key: per side, so an in-process client and server never count one call twice."""
    return f"{side}:{key}"


class SharedRate:
    """The rate limit over a shared budget store: one sliding window per session or conversation for every
    replica."""

    def __init__(self, ledger: SessionLedger, limit: int) -> None:
        self._ledger = ledger
        self._limit = limit

    def hit(self, key: str, *, record_over: bool = False, now: float | None = None) -> tuple[bool, int]:
        count = self._ledger.rate("guard", key, 60.0, self._limit, record_over)  # type: ignore[arg-type]
        return count <= self._limit, count

    def forget(self, key: str) -> None:
        """The window ends by itself (its keys expire)."""


class GuardOrchestrator:
    """One guard engine per recorder, shared by every side that ``guard.sides`` lists."""

    def __init__(
        self,
        settings: GuardSettings,
        policy: Policy,
        max_sessions: int,
        parts: tuple[SessionLedger, LabelBounds, Aggregate, Callable[[str], None]],
    ) -> None:
        ledger = parts[0]
        self.engine = GuardEngine(settings, policy, max_sessions=max_sessions,
                                  limiter=SharedRate(ledger, settings.calls_per_minute) if ledger.shared else None)
        #: The policies that read a session's budget (a shared store is asked only for them).
        self._budget_on_request = settings.session_hard_limit
        self._budget_on_result = settings.session_warning_note
        #: False when no guard mode is on anywhere: adapters skip every guard step (one bool check).
        self.active = self.engine.active
        self.sides = frozenset(settings.sides)
        #: Cost is observability: computed whenever guard.model is set, guard on or off.
        self.cost_on = bool(settings.model)
        self._ledger, self._labels, self._aggregate, self._fault = parts
        #: The refusal and padding policies switched on: their series start at 0 per (side, server, tool).
        self._zero: tuple[str, ...] = tuple(
            name for name, on in (
                ("chain_depth", settings.max_chain_depth > 0),
                ("session_limit", settings.session_hard_limit),
                ("rate_limit", settings.rate_limit),
                ("padding", settings.padding.enabled),
            ) if on
        )
        self._touched: set[tuple[str, str, str | None]] = set()

    def request(
        self, span: Span | None, side: Side, method: str, params: Any, key: str | None, server: str | None,
        held: dict[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """The request-side guards: None to go on, or the CallToolResult wire dict to answer with instead. With a
        shared budget store, ``held`` (the span attributes to set) gets what the decision read: the shared
        figures, or this replica's own when the store did not answer."""
        if not self.active or side not in self.sides or not enabled():
            return None
        try:
            budget = self._ledger.budget(side, key) if self._budget_on_request else None
            if budget is not None and held is not None and self._ledger.shared:
                held[A_GUARD_BUDGET_SOURCE] = budget.source
            decision = self.engine.on_request(
                method,
                params,
                session_id=_rate_key(side, key) if key is not None else None,
                budget=budget,
            )
        except Exception:
            self._fault("guard")
            return None
        if decision.actions or method == "tools/call":
            label = self._labels.server(self._ledger.find_meta(side, key), server)
            if method == "tools/call":
                self._series(side, label, params)
            if decision.actions:
                self.signals(span, side, decision.actions, None, label)
        return None if decision.allow else decision.result

    def result(self, call: Call, result: Any, m: Measurement) -> tuple[Any, tuple[GuardAction, ...], int, float | None]:
        """The result-side guards on a call's measured result: (result to deliver, actions, tokens entering the
        context, cost). A fault delivers the result unchanged."""
        try:
            outcome = self.engine.on_result(
                call.method,
                result,
                tool=call.tool,
                arguments=call.arguments,
                budget=(self._ledger.budget(call.side, call.key, call.pending_tokens) if self._budget_on_result
                        else None),
                measurement=m,
                session_id=_rate_key(call.side, call.key) if call.key is not None else None,  # its calls
            )
        except Exception:
            self._fault("guard")
            return result, (), m.total_tokens, self.cost(m.total_tokens)
        tokens = outcome.context_tokens if outcome.context_tokens is not None else m.total_tokens
        return outcome.result, outcome.actions, tokens, outcome.cost_usd

    def cost(self, tokens: int) -> float | None:
        """The estimated price of ``tokens`` entering the context (None without guard.model)."""
        if not self.cost_on:
            return None
        try:
            return self.engine.cost_usd(tokens)
        except Exception:
            self._fault("guard")
            return None

    def end_session(self, side: Side, key: str) -> None:
        if not self.active:
            return
        try:
            self.engine.end_session(_rate_key(side, key))
        except Exception:
            self._fault("guard")

    def signals(
        self,
        span: Span | None,
        side: Side,
        actions: tuple[GuardAction, ...],
        cost: tuple[str | None, float] | None,
        server: str,
    ) -> None:
        """Span events (one ``mcp_token.guard`` per action) and the guard counters; ``cost``: (tool, USD)."""
        try:
            if span is not None and actions and span.is_recording():
                for action in actions:
                    span.add_event(EVENT_GUARD, action.attributes())
        except Exception:
            self._fault("span")
        tool_names = self._labels.tool_names
        for action in actions:
            try:
                tool = tool_names(action.tool, False)
            except Exception:
                self._fault("metrics")
                continue
            self._aggregate.add("mcp_token_guard_actions", (side, server, action.policy, action.action,
                                                            "true" if action.enforced else "false", tool or ""))
        if cost is not None:
            try:
                tool = tool_names(cost[0], False)
            except Exception:
                self._fault("metrics")
                return
            self._aggregate.add("mcp_token_cost_usd", (side, server, tool or ""), cost[1])

    def _series(self, side: Side, server: str, params: Any) -> None:
        """A tool's first guarded call (per side and server): its refusal and padding series start at 0, so that
        alert rules taking increase() see the first refusal (a series born with it has no earlier sample)."""
        try:
            name = params.get("name") if isinstance(params, (dict, Mapping)) else None
            if not isinstance(name, str) or not self._zero:
                return
            tool = self._labels.tool_names(name, False)
            key = (side, server, tool)
            if key in self._touched:
                return
            if len(self._touched) >= _MAX_TOUCHED:
                self._touched.clear()
            self._touched.add(key)
            tp = self.engine.tool_policy(name)
            if not tp.active:
                return
            for policy in self._zero:
                if policy != "padding" or tp.padding:
                    action = "found" if policy == "padding" else "refused"
                    self._aggregate.touch("mcp_token_guard_actions", (side, server, policy, action,
                                                                      "true" if tp.enforce else "false", tool or ""))
        except Exception:
            self._fault("metrics")
