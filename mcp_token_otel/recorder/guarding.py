"""Guard orchestration: the guard policies (docs/guardrails.md) run around the calls, their actions counted.

Request-side guards may answer a call in the tool's place; result-side guards may change what is delivered
(truncation, padding notices) and say what enters the context. Each action becomes a span event and a
``mcp_token_guard_actions`` count; the estimated price of a result (``guard.model``) a ``mcp_token_cost_usd`` one.
With ``guard.spill`` the server and proxy sides keep what the cap cut and answer its reads themselves (a page, or
a JSON-RPC error), counted in the spill families. Never raises: a fault is counted (stage ``guard``) and the call
goes on unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Span

from ..core.guard import META_GUARD_KEY, GuardAction, GuardEngine
from ..core.guard.settings import GuardSettings
from ..core.guard.spilling import FAULT, SpillNote
from ..core.measure import Measurement, Policy
from ..core.spill import CAPABILITY_METHODS, LISTINGS, READ_OUTCOMES, SERVED, ReadAnswer, empty_listing, is_spill_uri
from ..emitters.aggregate import Aggregate
from ..semconv import A_GUARD_BUDGET_SOURCE, A_SPILL_OUTCOME, A_SPILL_PAGE, EVENT_GUARD
from ..store import open_spill_store
from .label_bounds import LabelBounds
from .ledger import SessionLedger, Side

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
        # Cut results are kept beside the budgets: in a shared store, any replica serves their reads.
        spills = (open_spill_store(ledger.store, settings.spill_ttl, settings.spill_max_bytes) if settings.spills
                  else None)
        self.engine = GuardEngine(settings, policy, max_sessions=max_sessions,
                                  limiter=SharedRate(ledger, settings.calls_per_minute) if ledger.shared else None,
                                  spill_store=spills)
        #: The policies that read a session's budget (a shared store is asked only for them).
        self._budget_on_request = settings.session_hard_limit
        self._budget_on_result = settings.session_warning_note
        #: False when no guard mode is on anywhere: adapters skip every guard step (one bool check).
        self.active = self.engine.active
        self.sides = frozenset(settings.sides)
        #: The sides that keep cut results and answer their reads: a server's, a proxy's, never a client's (a
        #: client's reads go to its server, which may be one that keeps them).
        self.spill_sides = self.sides - {"client"} if self.engine.spill_store is not None else frozenset()
        #: (side, server) -> whether the resources capability of its last initialize / server/discover result was
        #: added here (then its resource listings are answered here, empty).
        self._added: dict[tuple[str, str | None], bool] = {}
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
        self._spilled: set[tuple[str, str, str]] = set()

    def request(
        self, span: Span | None, side: Side, method: str, params: Any, key: str | None, server: str | None,
        held: dict[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """The request-side guards: None to go on, or the CallToolResult wire dict to answer with instead. With a
        shared budget store, ``held`` (the span attributes to set) gets what the decision read: the shared
        figures, or this replica's own when the store did not answer."""
        if not self.active or side not in self.sides:  # suppression: begin() gave an OffCall, never here
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

    def answer(self, call: Call) -> dict[str, Any] | None:
        """The ``resources/*`` requests answered in the server's place on a side that keeps cut results: a read of
        a spill URI (the page to answer with, or None and ``call.refusal_error`` set: the JSON-RPC error), and a
        resource listing when the ``resources`` capability was added here (an empty list). None: the request goes
        on unchanged (any other resources request, a read of any other URI)."""
        if call.side not in self.spill_sides:
            return None
        try:
            method, params = call.method, call.params
            if method == "resources/read":
                uri = params.get("uri") if isinstance(params, (dict, Mapping)) else None
                if not is_spill_uri(uri):
                    return None
                answer = self.engine.read_spill(uri, call.key, call.version)
                if answer is None:
                    return None
                self._read(call, answer)
                if answer.error is not None:
                    call.refusal_error = answer.error
                return answer.result
            if method in LISTINGS and self._added.get((call.side, call.server)):
                return empty_listing(method, call.version)
        except Exception:
            self._fault("guard")
        return None

    def _read(self, call: Call, answer: ReadAnswer) -> None:
        """A spill read's span attributes (outcome, page: never the uri) and counters."""
        call.held[A_SPILL_OUTCOME] = answer.outcome
        if answer.page:
            call.held[A_SPILL_PAGE] = answer.page
        try:
            label = self._labels.server(self._ledger.find_meta(call.side, call.key), call.server)
            tool = self._labels.tool_names(answer.tool, False) if answer.tool else None
            self._aggregate.add("mcp_token_spill_reads", (call.side, label, tool or "", answer.outcome))
            if answer.outcome == SERVED:
                self._aggregate.add("mcp_token_spill_read_tokens", (call.side, label, tool or ""), answer.tokens)
        except Exception:
            self._fault("metrics")

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
                owner=call.key,
                spill=call.side in self.spill_sides,
            )
        except Exception:
            self._fault("guard")
            return result, (), m.total_tokens, self.cost(m.total_tokens)
        if call.method in CAPABILITY_METHODS and call.side in self.spill_sides:
            if len(self._added) >= _MAX_TOUCHED:
                self._added.clear()
            self._added[(call.side, call.server)] = outcome.capability
        if outcome.spill is not None:
            self._spill(call, outcome.spill)
        tokens = outcome.context_tokens if outcome.context_tokens is not None else m.total_tokens
        return outcome.result, outcome.actions, tokens, outcome.cost_usd

    def _spill(self, call: Call, note: SpillNote) -> None:
        """A cut result kept (its tokens counted; its reads' and evictions' series start at 0, so alerts see the
        first) or not (why, counted); older ones dropped to make room."""
        try:
            label = self._labels.server(self._ledger.find_meta(call.side, call.key), call.server)
            tool = self._labels.tool_names(note.tool, False) or ""
            agg = self._aggregate
            if note.refused == FAULT:  # the plain cut was delivered
                self._fault("guard")
            elif note.refused is not None:
                agg.add("mcp_token_spills_refused", (call.side, label, tool, note.refused))
            else:
                agg.add("mcp_token_spilled_tokens", (call.side, label, tool), note.tokens)
                key = (call.side, label, tool)
                if key not in self._spilled:
                    if len(self._spilled) >= _MAX_TOUCHED:
                        self._spilled.clear()
                    self._spilled.add(key)
                    for outcome in READ_OUTCOMES:
                        agg.touch("mcp_token_spill_reads", (*key, outcome))
                    agg.touch("mcp_token_spill_read_tokens", key)
                    agg.touch("mcp_token_spill_evictions", (call.side, label))
            if note.evicted:
                agg.add("mcp_token_spill_evictions", (call.side, label), note.evicted)
        except Exception:
            self._fault("metrics")

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
