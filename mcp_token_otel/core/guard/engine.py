"""One entry point per message: ``GuardEngine.on_request`` before a request is sent on (or served), and
``GuardEngine.on_result`` when its result comes back. Pure: wire dicts in, wire dicts and small action
records out; the caller (shim adapter, proxy) does the I/O, the recorder turns actions into counters and
span events. See docs/guardrails.md for the integration contract.

Results are never mutated: a changed result is a new dict (containers copied along the changed paths);
an unchanged one is returned as the very same object. With ``guard.mode: off`` (and no tool override
turning a guard on) both calls return at once.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from ..measure import DEFAULT_POLICY, Measurement, Policy, measure_result
from ..risk import tier_of
from ..spill import CAPABILITY_METHODS, MemorySpillStore, ReadAnswer, SpillStore, is_spill_link, read_spill
from ..spill import with_resources_capability as _with_resources
from . import notices
from .annotate import META_GUARD_KEY, annotate
from .cap import cap_result
from .cost import cost_usd
from .limits import RateLimiter, chain_depth
from .padding import PaddingFinding, result_texts, scan_text, strip_result
from .pagination import Pagination
from .settings import GuardSettings, ToolPolicy, resolve_tool
from .spilling import SpillNote, guard_blocks, spill_cut

#: Policy names (the ``policy`` label of the guard counters).
RESPONSE_CAP = "response_cap"
SESSION_LIMIT = "session_limit"
SESSION_WARNING = "session_warning"
RATE_LIMIT = "rate_limit"
CHAIN_DEPTH = "chain_depth"
PADDING = "padding"
ANNOTATE = "annotate_meta"
POLICIES: tuple[str, ...] = (RESPONSE_CAP, SESSION_LIMIT, SESSION_WARNING, RATE_LIMIT, CHAIN_DEPTH, PADDING, ANNOTATE)
#: Action names (what the policy did, or in observe mode would have done).
ACTIONS: tuple[str, ...] = ("truncated", "spilled", "refused", "warned", "found", "stripped", "annotated")

#: Methods whose results carry text the padding checks read.
_TEXT_METHODS = frozenset({"tools/call", "resources/read", "prompts/get"})
_MAX_CACHED = 4096
#: A notice block a guard added upstream (the server's shim, then the client's): one short line in brackets,
#: after the paragraph break that starts an appended note.
_NOTICE = re.compile(r"(?:\n\n)?\[mcp-token-otel(?: security notice)?: [^\n]{1,1500}\]")


class BudgetView(Protocol):
    """What the session policies read of a session: :class:`~mcp_token_otel.core.budget.SessionBudget` fits."""

    @property
    def state(self) -> str: ...
    @property
    def tokens(self) -> int: ...
    @property
    def calls(self) -> int: ...
    @property
    def context_window(self) -> int: ...


@dataclass(frozen=True, slots=True)
class GuardAction:
    """One thing a guard did (``enforced``) or would have done in enforce mode (observe)."""

    policy: str
    action: str
    tool: str | None
    enforced: bool
    numbers: Mapping[str, int | float | str] = field(default_factory=dict)

    def attributes(self, prefix: str = "mcp_token.guard.") -> dict[str, int | float | str | bool]:
        """Flat span-event attributes: policy, action, enforced, tool and every number."""
        out: dict[str, int | float | str | bool] = {
            prefix + "policy": self.policy,
            prefix + "action": self.action,
            prefix + "enforced": self.enforced,
        }
        if self.tool is not None:
            out[prefix + "tool"] = self.tool
        for key, value in self.numbers.items():
            out[prefix + key] = value
        return out


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether a request goes on; when not, ``result`` is the tool error result to answer with instead."""

    allow: bool
    result: dict[str, Any] | None = None
    actions: tuple[GuardAction, ...] = ()


ALLOW = Decision(True)


class GuardOutcome(NamedTuple):
    """``result`` is the input object itself when nothing changed."""

    result: Any
    actions: tuple[GuardAction, ...] = ()
    #: Estimated tokens of the result as it enters the context (after any cut), when measured.
    context_tokens: int | None = None
    #: Their estimated cost in USD (guard.model and guard.pricing), when known.
    cost_usd: float | None = None
    #: What the spill did with a cut result (kept, or why not), when the cap cut one with the spill on.
    spill: SpillNote | None = None
    #: An initialize / server/discover result to which the ``resources`` capability was added (for spill reads).
    capability: bool = False


@dataclass(frozen=True, slots=True)
class ToolInfo:
    """What a tools/list result told about one tool."""

    pagination: Pagination | None = None
    output_schema: Any = None


def tool_error(text: str, policy: str, numbers: Mapping[str, int | float | str]) -> dict[str, Any]:
    """A CallToolResult (wire form) with ``isError: true``: the model reads it, the call was not made."""
    return {
        "content": [{"type": "text", "text": text}],
        "isError": True,
        "_meta": {META_GUARD_KEY: {"policy": policy, **numbers}},
    }


class Limiter(Protocol):
    """What the rate limit asks (:class:`~.limits.RateLimiter` is one)."""

    def hit(self, key: str, *, record_over: bool = False, now: float | None = None) -> tuple[bool, int]: ...

    def forget(self, key: str) -> None: ...


class GuardEngine:
    """The guard policies over one configuration; keeps per-session rate windows and learnt tool schemas."""

    def __init__(
        self,
        settings: GuardSettings,
        policy: Policy = DEFAULT_POLICY,
        *,
        max_sessions: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        limiter: Limiter | None = None,
        spill_store: SpillStore | None = None,
    ) -> None:
        """``limiter``: where the rate limit counts calls (default: this process; a shared deployment passes one
        over its shared budget store); ``spill_store``: where cut results are kept with ``guard.spill`` on
        (default: this process's memory)."""
        self.settings = settings
        #: Seconds, monotonic: the rate windows' and the spills' clock.
        self.clock = clock
        #: Where cut results are kept (None: no tool can spill).
        self.spill_store: SpillStore | None = None
        if settings.spills:  # enforce mode and a cap somewhere
            self.spill_store = spill_store or MemorySpillStore(settings.spill_ttl, settings.spill_max_bytes)
        self.policy = policy
        modes = {settings.mode, *(o.mode for o in settings.tools.values() if o.mode is not None)}
        #: False when no guard can ever run: both entry points return at once.
        self.active = modes != {"off"}
        self._limiter: Limiter = limiter or RateLimiter(settings.calls_per_minute, 60.0, max_keys=max_sessions,
                                                        clock=clock)
        self._tool_policies: dict[str | None, ToolPolicy] = {}
        self._tools: dict[str, ToolInfo] = {}
        #: Tool calls (tools/call requests let through) per session, for the notices; least recently used dropped.
        self._calls: OrderedDict[str, int] = OrderedDict()
        self._max_sessions = max_sessions
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ configuration lookups

    def tool_policy(self, tool: str | None) -> ToolPolicy:
        """The settings for ``tool`` (globs resolved once, then cached; bounded)."""
        cached = self._tool_policies.get(tool)
        if cached is None:
            cached = resolve_tool(self.settings, tool)
            if len(self._tool_policies) >= _MAX_CACHED:
                self._tool_policies.clear()
            self._tool_policies[tool] = cached
        return cached

    def learn_tools(self, result: Any) -> None:
        """Remember each listed tool's pagination inputs and outputSchema (from a tools/list result)."""
        tools = result.get("tools") if isinstance(result, Mapping) else None
        if not isinstance(tools, list):
            return
        with self._lock:
            for tool in tools:
                name = tool.get("name") if isinstance(tool, Mapping) else None
                if not isinstance(name, str):
                    continue
                if len(self._tools) >= _MAX_CACHED and name not in self._tools:
                    self._tools.clear()
                self._tools[name] = ToolInfo(Pagination.from_tool(tool), tool.get("outputSchema"))

    def tool_info(self, tool: str | None) -> ToolInfo | None:
        return self._tools.get(tool) if tool is not None else None

    def read_spill(self, uri: object, owner: str | None, protocol_version: str | None = None) -> ReadAnswer | None:
        """The answer to a ``resources/read`` of a spill URI by ``owner`` (a budget key): a page or a JSON-RPC
        error; None without a spill store."""
        if self.spill_store is None:
            return None
        return read_spill(self.spill_store, uri, owner, self.clock(), protocol_version=protocol_version,
                          ttl=self.settings.spill_ttl)

    def cost_usd(self, tokens: int) -> float | None:
        """USD of ``tokens`` entering the context for the configured model (any mode; None without one)."""
        return cost_usd(tokens, self.settings.model, self.settings.pricing)

    def end_session(self, session_id: str) -> None:
        """Forget a session's rate window and call count (its connection ended)."""
        self._limiter.forget(session_id)
        with self._lock:
            self._calls.pop(session_id, None)

    def calls(self, session_id: str | None) -> int | None:
        """The session's tool calls let through so far (None without a session id to count by)."""
        if session_id is None:
            return None
        with self._lock:
            return self._calls.get(session_id, 0)

    def _count_call(self, session_id: str | None) -> None:
        if session_id is None:
            return
        with self._lock:
            self._calls[session_id] = self._calls.pop(session_id, 0) + 1
            if len(self._calls) > self._max_sessions:
                self._calls.popitem(last=False)

    # ------------------------------------------------------------------ requests

    def on_request(
        self,
        method: str,
        params: Any,
        *,
        session_id: str | None = None,
        budget: BudgetView | None = None,
        depth: int | None = None,
        now: float | None = None,
    ) -> Decision:
        """Decide whether a request goes on. Only ``tools/call`` is ever refused: initialize, ping, list
        methods and notifications always pass.

        ``budget`` is the session's budget before this call; ``depth`` its chain depth (read from
        ``params._meta`` when None); ``session_id`` None leaves the rate limit out (no session to count).
        A call let through is counted toward the session's tool calls (the notices' count)."""
        if not self.active or method != "tools/call":
            return ALLOW
        decision = self._decide(params, session_id, budget, depth, now)
        if decision.allow:
            self._count_call(session_id)
        return decision

    def _decide(
        self, params: Any, session_id: str | None, budget: BudgetView | None, depth: int | None, now: float | None
    ) -> Decision:
        name = params.get("name") if isinstance(params, Mapping) else None
        tool = name if isinstance(name, str) else None
        tp = self.tool_policy(tool)
        if not tp.active:
            return ALLOW
        s = self.settings
        label = tool or "the tool"
        actions: list[GuardAction] = []
        refusal: dict[str, Any] | None = None
        if s.max_chain_depth:
            level = chain_depth(params) if depth is None else depth
            if level > s.max_chain_depth:
                numbers: dict[str, int | float | str] = {"depth": level, "limit": s.max_chain_depth}
                actions.append(GuardAction(CHAIN_DEPTH, "refused", tool, tp.enforce, numbers))
                if tp.enforce:
                    refusal = tool_error(notices.depth_exceeded(label, level, s.max_chain_depth), CHAIN_DEPTH,
                                         numbers)
        if s.session_hard_limit and budget is not None and budget.state == "exhausted":
            calls = self.calls(session_id)
            numbers = _session_numbers(budget.tokens, budget.context_window, calls)
            actions.append(GuardAction(SESSION_LIMIT, "refused", tool, tp.enforce and refusal is None, numbers))
            if tp.enforce and refusal is None:
                refusal = tool_error(
                    notices.budget_exhausted(label, budget.tokens, budget.context_window, calls), SESSION_LIMIT,
                    numbers,
                )
        if s.rate_limit and session_id is not None and refusal is None:
            within, count = self._limiter.hit(session_id, record_over=not tp.enforce, now=now)
            if not within:
                numbers = {"calls_in_window": count, "limit": s.calls_per_minute}
                actions.append(GuardAction(RATE_LIMIT, "refused", tool, tp.enforce, numbers))
                if tp.enforce:
                    refusal = tool_error(notices.rate_limited(label, s.calls_per_minute), RATE_LIMIT, numbers)
        if not actions:
            return ALLOW
        return Decision(refusal is None, refusal, tuple(actions))

    # ------------------------------------------------------------------ results

    def on_result(
        self,
        method: str,
        result: Any,
        *,
        tool: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        budget: BudgetView | None = None,
        measurement: Measurement | None = None,
        session_id: str | None = None,
        owner: str | None = None,
        spill: bool = True,
    ) -> GuardOutcome:
        """Apply the result-side guards to one successful result (a wire dict).

        ``measurement`` is the recorder's measure_result of this very result (saves measuring twice);
        ``arguments`` the call's arguments (pagination hints when the tool's definition was not seen);
        ``budget`` the session's budget before this result is added (the warning note states it with the result
        added); ``session_id`` the one given to :meth:`on_request` (the note's count of tool calls); ``owner`` the
        budget key a kept result belongs to; ``spill`` False keeps nothing (a side that does not answer spill reads).
        """
        if not self.active or not isinstance(result, Mapping):
            return GuardOutcome(result)
        if method == "tools/list":
            self.learn_tools(result)
        elif method in CAPABILITY_METHODS:
            if spill and self.spill_store is not None:  # clients read spills only from a server with resources
                declared, added = _with_resources(result)
                return GuardOutcome(declared, capability=added)
            return GuardOutcome(result)
        tp = self.tool_policy(tool if method == "tools/call" else None)
        if not tp.active:
            return GuardOutcome(result)
        s = self.settings
        m = measurement
        new: Mapping[str, Any] = result
        actions: list[GuardAction] = []
        enforce = tp.enforce
        original_tokens: int | None = None
        note: SpillNote | None = None

        if method == "tools/call" and tp.max_response_tokens:
            if m is None:
                m = measure_result(method, result, tool_name=tool, policy=self.policy)
            data = m.data_tokens
            content = result.get("content")
            if data > tp.max_response_tokens and isinstance(content, list) and content:
                # Cut upstream already (its notices and spill link end it, a padding notice leads it): never cut
                # twice.
                data -= sum(m.blocks[i].data_tokens for i in guard_blocks(content, _is_notice) if i < len(m.blocks))
            if data > tp.max_response_tokens:
                cap = tp.max_response_tokens
                if enforce:
                    info = self.tool_info(tool)
                    cut, report = cap_result(
                        result, cap, policy=self.policy, measurement=m, tool=tool,
                        output_schema=info.output_schema if info else None,
                        pagination=info.pagination if info else Pagination.from_arguments(arguments),
                        arguments=arguments,
                    )
                    if cut is not None:
                        new = cut
                        if spill and tp.spill and self.spill_store is not None:  # kept whole, readable by pages
                            source = strip_result(result)[0] if tp.padding and tp.padding_action == "strip" else result
                            new, note = spill_cut(self.spill_store, s, self.policy, source, cut, report, tool=tool,
                                                  cap=cap, owner=owner, now=self.clock(), tokens=m.data_tokens)
                        original_tokens = m.total_tokens
                    numbers: dict[str, int | float | str] = {
                        "tokens": report.total_tokens, "kept_tokens": report.kept_tokens, "cap": cap,
                        "notice_tokens": report.notice_tokens, "text_blocks_cut": report.text_blocks_cut,
                        "blocks_dropped": report.blocks_dropped, "media_replaced": report.media_replaced,
                        "arrays_cut": len(report.arrays), "over_cap_tokens": report.over_cap_tokens,
                    }
                else:
                    numbers = {"tokens": m.data_tokens, "cap": cap}
                actions.append(GuardAction(RESPONSE_CAP, "truncated", tool, enforce, numbers))
                if note is not None and note.refused is None:
                    actions.append(GuardAction(RESPONSE_CAP, "spilled", tool, True,
                                               {"tokens": note.tokens, "pages": note.pages, "evicted": note.evicted}))

        if tp.padding and method in _TEXT_METHODS:
            new = self._padding(method, result, new, tool, tp, actions)

        context_tokens: int | None = None
        if (s.session_warning_note and method == "tools/call" and budget is not None
                and budget.state != "ok" and isinstance(new.get("content"), list)):
            upstream = any(_bare(b["text"]).startswith(_WARNING) for b in _trailing_notices(new.get("content")))
            new, context_tokens = self._warning(method, result, new, tool, m, budget, self.calls(session_id),
                                                enforce and not upstream, actions)

        if context_tokens is None and new is not result:
            context_tokens = measure_result(method, new, tool_name=tool, policy=self.policy).total_tokens
        elif context_tokens is None and m is not None:
            context_tokens = m.total_tokens

        if tp.annotate_meta:
            if context_tokens is None:
                m = measure_result(method, result, tool_name=tool, policy=self.policy)
                context_tokens = m.total_tokens
            value: dict[str, Any] = {
                "tokens": context_tokens,
                "tier": tier_of(context_tokens, self.policy.thresholds),
                "estimator": self.policy.estimator_name,
            }
            if original_tokens is not None:
                value["originalTokens"] = original_tokens
            annotated = annotate(new, value) if enforce else None
            if not enforce or annotated is not None:
                if annotated is not None:
                    new = annotated
                actions.append(GuardAction(ANNOTATE, "annotated", tool, enforce, {"tokens": context_tokens}))

        cost = None
        if s.model:
            if context_tokens is None:
                context_tokens = measure_result(method, new, tool_name=tool, policy=self.policy).total_tokens
            cost = self.cost_usd(context_tokens)
        if not actions:
            return GuardOutcome(result, (), context_tokens, cost)
        return GuardOutcome(new, tuple(actions), context_tokens, cost, note)

    def _warning(
        self,
        method: str,
        result: Mapping[str, Any],
        new: Mapping[str, Any],
        tool: str | None,
        m: Measurement | None,
        budget: BudgetView,
        calls: int | None,
        write: bool,
        actions: list[GuardAction],
    ) -> tuple[Mapping[str, Any], int]:
        """The session warning (a note appended when ``write``): (result, its context tokens). The note states
        the session's tokens with this result added, its own tokens included, as the budget will report them."""
        if new is result and m is not None:
            tokens = m.total_tokens
        else:
            tokens = measure_result(method, new, tool_name=tool, policy=self.policy).total_tokens
        if write:
            noted = new
            for _ in range(4):  # the note's figure is in its own size: settles in one or two rounds
                note = notices.session_warning(budget.tokens + tokens, budget.context_window, calls)
                noted = {**new, "content": [*new["content"], {"type": "text", "text": note}]}
                size = measure_result(method, noted, tool_name=tool, policy=self.policy).total_tokens
                settled, tokens = size == tokens, size
                if settled:
                    break
            new = noted
        numbers = _session_numbers(budget.tokens + tokens, budget.context_window, calls)
        actions.append(GuardAction(SESSION_WARNING, "warned", tool, write, numbers))
        return new, tokens

    def _padding(
        self,
        method: str,
        result: Mapping[str, Any],
        new: Mapping[str, Any],
        tool: str | None,
        tp: ToolPolicy,
        actions: list[GuardAction],
    ) -> Mapping[str, Any]:
        findings: list[PaddingFinding] = []
        for text in result_texts(result):
            findings.extend(scan_text(text, self.settings.padding))
        if not findings:
            return new
        numbers: dict[str, int | float | str] = {"checks": ",".join(dict.fromkeys(f.check for f in findings))}
        for finding in findings:  # the largest value of each check
            previous = numbers.get(finding.check, 0)
            numbers[finding.check] = max(previous if isinstance(previous, (int, float)) else 0, finding.value)
        if not tp.enforce:
            actions.append(GuardAction(PADDING, "found", tool, False, numbers))
            return new
        stripped = 0
        if tp.padding_action == "strip" and any(f.check == "invisible_chars" for f in findings):
            new, stripped = strip_result(new)
            numbers["stripped"] = stripped
        content = new.get("content")
        noticed = method == "tools/call" and isinstance(content, list)
        if noticed and content and _is_notice(content[0]):  # a guard upstream warned already: one notice
            noticed = False
        if noticed:  # first, so the model reads the warning before the content
            notice = {"type": "text", "text": notices.padding(findings, stripped)}
            new = {**new, "content": [notice, *new["content"]]}
        actions.append(GuardAction(PADDING, "stripped" if stripped else "found", tool, noticed or stripped > 0,
                                   numbers))
        return new


def _session_numbers(tokens: int, window: int, calls: int | None) -> dict[str, int | float | str]:
    numbers: dict[str, int | float | str] = {"session_tokens": tokens, "context_window": window}
    if calls is not None:
        numbers["calls"] = calls
    return numbers


def _bare(text: str) -> str:
    """A notice's text without the paragraph break that starts an appended note."""
    return text.removeprefix(notices.BREAK)


def _is_notice(block: Any) -> bool:
    """A text block that is one of the guards' own notices (as a guard upstream appends or prepends it)."""
    text = block.get("text") if isinstance(block, Mapping) else None
    return (isinstance(text, str) and _bare(text).startswith("[mcp-token-otel")
            and _NOTICE.fullmatch(text) is not None)


_WARNING = f"[{notices.PREFIX}: this session has used "


def _trailing_notices(content: Any) -> list[Mapping[str, Any]]:
    """The guards' notice blocks that end ``content`` (a truncation notice, a session warning note), past the spill
    link a truncation notice may have after it."""
    out: list[Mapping[str, Any]] = []
    if isinstance(content, list):
        for block in reversed(content):
            if is_spill_link(block):
                continue
            if not _is_notice(block):
                break
            out.append(block)
    return out
