"""Context costs beyond each message's own tokens: what a tools/list result is made of, the prompt-cache churn of
a session's tool list, and output tokens that add nothing new.

* A tools/list result: its definitions' tokens in all, per tool, per part (description, schema, names), and the
  static worst case of each tool whose result something bounds (core/profiles' static profile).
* Prompt-cache churn: a model caches the prompt up to the first byte that changes; the tool definitions come
  first, so a tools/list whose tools (content or order) differ from the session's previous one makes the model
  read the definitions, and everything after them, again. Counted per change, with the new list's tokens.
* Wasted tokens: a tools/call with the same tool and arguments as one within ``metrics.repeat_window`` seconds
  in the same session or conversation (its output is ``repeated``), and a structuredContent that repeats the
  text content (``duplicated``: the overhead core/measure.py already found; nothing is measured twice).

The digests of the last tool list and of the recent calls live in the budget store beside the budget (in memory,
or in a Redis every replica shares), so a repeat or a changed list is seen wherever it lands. The call path costs
one JSON dump and one digest per tools/call, nothing when the window is 0.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..catalog import DEFINITION_PARTS
from ..core.labels import NameLimiter
from ..core.measure import Measurement
from ..core.payload import Estimator
from ..core.profiles import (
    TOOL_CONTEXT_KEYS,
    DefinitionParts,
    definition_parts,
    profile_tool_definition,
    sum_parts,
)
from ..emitters.aggregate import Aggregate
from ..store import stable_digest

if TYPE_CHECKING:
    from .label_bounds import LabelBounds
    from .ledger import SessionMeta

#: One encoder, made once (json.dumps with options builds a new one per call).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


@dataclass(slots=True)
class ToolList:
    """What one tools/list result declares and costs in context."""

    total: int
    #: Per tool (names within the tool-name bound).
    per_tool: dict[str, int]
    #: Per part of DEFINITION_PARTS, adding up to ``total``.
    parts: dict[str, int]
    #: The static worst case of each bounded tool (names within the bound).
    static_max: dict[str, int]
    #: The tools as they enter the context, content and order (a digest every process computes alike).
    digest: bytes
    #: The result has a nextCursor: more pages follow.
    paged: bool


def _tool_costs(tool: Mapping[str, Any], estimator: Estimator) -> tuple[DefinitionParts, int | None]:
    """(definition tokens by part, static maximum or None) of one definition."""
    try:
        profile = profile_tool_definition(tool, estimator=estimator)
        parts, worst = profile.definition_parts, profile.max_tokens if profile.bounded else None
    except Exception:  # an odd schema the profiler cannot read: the cost still counts, with no maximum
        parts, worst = None, None
    return parts or definition_parts(tool, estimator), worst


def tool_list(result: Any, estimator: Estimator, tool_names: NameLimiter) -> ToolList | None:
    """Analyse a tools/list result (wire dict); None when it carries no ``tools`` list. The declared names become
    labels before their first call; per-tool figures only for names within the bound."""
    tools = result.get("tools") if isinstance(result, (dict, Mapping)) else None
    if not isinstance(tools, list):
        return None
    costs: list[DefinitionParts] = []
    per_tool: dict[str, int] = {}
    static_max: dict[str, int] = {}
    seen: list[dict[str, Any]] = []
    overflow = tool_names.overflow
    for tool in tools:
        if not isinstance(tool, (dict, Mapping)):
            continue
        cost, worst = _tool_costs(tool, estimator)
        costs.append(cost)
        tokens = cost.total
        seen.append({k: tool[k] for k in TOOL_CONTEXT_KEYS if k in tool})
        name = tool.get("name")
        if isinstance(name, str):
            label = tool_names(name)
            if label is not None and label != overflow:
                per_tool[label] = tokens
                if worst is not None:
                    static_max[label] = worst
    summed = sum_parts(costs)
    parts = {part: getattr(summed, part) for part in DEFINITION_PARTS}
    digest = stable_digest(_CANONICAL.encode(seen))
    return ToolList(summed.total, per_tool, parts, static_max, digest, bool(result.get("nextCursor")))


class ContextCosts:
    """Prompt-cache churn and wasted tokens per session, counted in the aggregate. Whether a call repeats one and
    whether a tool list changed is the budget store's answer (shared by every replica with a shared store): this
    class says what to ask and counts what it answers."""

    def __init__(self, repeat_window: float, aggregate: Aggregate, labels: LabelBounds, fault: Any) -> None:
        self.window = repeat_window
        self._aggregate = aggregate
        self._labels = labels
        self._fault = fault

    def call_digest(self, tool: str, arguments: Any) -> bytes | None:
        """The digest of a tools/call (tool and arguments, canonical JSON) the store checks for a repeat; None when
        the check is off (``metrics.repeat_window: 0``) or the arguments cannot be written as JSON."""
        if not self.window:
            return None
        try:
            return stable_digest(tool, _CANONICAL.encode(arguments) if arguments else "")
        except Exception:  # arguments JSON cannot hold (a circular structure): not compared
            self._fault("metrics")
            return None

    @staticmethod
    def tools_digest(meta: SessionMeta | None, listed: ToolList) -> bytes | None:
        """The tools/list digest the store compares with the session's previous list: a first page only (a page
        after one with a nextCursor continues the same listing)."""
        if meta is None:
            return None
        continuation, meta.tools_paged = meta.tools_paged, listed.paged
        return None if continuation else listed.digest

    def _wasted(self, side: str, server: str, tool: str | None, kind: str, tokens: int) -> None:
        """Wasted output tokens of a tool, under its bounded label (admitted by the response just recorded)."""
        try:
            label = self._labels.tool_names(tool, False)
        except Exception:
            self._fault("metrics")
            return
        self._aggregate.add("mcp_token_wasted_tokens", (side, server, label or "", kind), tokens)

    def output(self, side: str, server: str, m: Measurement, tokens: int, repeat: bool) -> None:
        """A tools/call result that entered the context with ``tokens``: its repeated and duplicated tokens."""
        tool = m.tool_name
        if repeat:
            self._wasted(side, server, tool, "repeated", tokens)
        if len(m.blocks) > 1:
            for block in m.blocks:
                if block.type == "structuredContent" and block.overhead_tokens:  # a duplicate is all overhead
                    self._wasted(side, server, tool, "duplicated", min(block.overhead_tokens, tokens))

    def tool_list(self, side: str, server: str, listed: ToolList, changed: bool) -> None:
        """A tools/list result whose tools differ from the session's previous list: counted, with its tokens."""
        if changed:
            self._aggregate.add("mcp_token_prompt_cache_invalidations", (side, server))
            self._aggregate.add("mcp_token_prompt_cache_resent_tokens", (side, server), listed.total)
