"""Static risk profiles: how many tokens a tool *can* return, judged before it is ever called.

A profile bounds a tool's response from what is known about it, in priority order:

1. an egress cap in bytes: ``max_tokens = ceil(egress_max_bytes / 3.5)``;
2. an item limit the agent passes (``limit``, ``maxItems``): ``max_tokens = base_tokens * limit + 50``
   (50 tokens of envelope around the items);
3. neither: the tool is unbounded and ``max_tokens = base_tokens * 100`` stands in for "very large".

``base_tokens`` is the estimated cost of one item: for each field its name plus a typical short value
(``VALUE_TOKENS``), plus the item's braces; an item with no known fields costs ``UNKNOWN_ITEM_TOKENS``.
``min_tokens`` is one item.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .estimation import estimate_tokens
from .payload import size_value
from .risk import RISK_TIERS, RiskThresholds, RiskTier, classify_risk

#: Tokens assumed for one field's value when only its name is known.
VALUE_TOKENS = 8
#: Tokens assumed for one item whose fields are unknown (no field names, no outputSchema).
UNKNOWN_ITEM_TOKENS = 50
#: Envelope tokens around a bounded list of items.
ENVELOPE_TOKENS = 50
#: Stand-in item count for a tool with no limit at all.
UNBOUNDED_ITEMS = 100
#: Bytes per token used to turn an egress cap into tokens (conservative: dense JSON).
BYTES_PER_TOKEN = 3.5
#: More fields than this per item is worth a recommendation.
MAX_FIELDS = 15

# Field names that usually hold collections: plurals and the common container words.
_COLLECTION_NAME = re.compile(
    r"(?i)(items|results|entries|records|rows|list|data|children|messages|files|logs|events|[a-z]{3,}s)$"
)
_NOT_COLLECTION = frozenset({"status", "address", "process", "class", "progress", "alias", "success"})


@dataclass(frozen=True, slots=True)
class StaticProfile:
    tool_name: str
    risk: RiskTier
    bounded: bool
    max_tokens: int
    min_tokens: int
    base_tokens: int
    field_count: int
    recommendations: tuple[str, ...] = ()
    #: Tokens the tool's own definition (from tools/list) costs in the context; 0 when unknown.
    definition_tokens: int = 0


@dataclass(frozen=True, slots=True)
class AggregateProfile:
    overall_risk: RiskTier
    profiles: tuple[StaticProfile, ...]
    unbounded_tool_names: tuple[str, ...]
    critical_tool_names: tuple[str, ...]
    recommendations: tuple[str, ...] = field(default=())
    definition_tokens: int = 0


def _collection_fields(field_names: Sequence[str]) -> list[str]:
    return [
        name
        for name in field_names
        if name.lower() not in _NOT_COLLECTION and _COLLECTION_NAME.search(name) is not None
    ]


def compute_static_profile(
    tool_name: str,
    field_names: Iterable[str],
    agent_limit: int | None = None,
    egress_max_bytes: int | None = None,
    *,
    thresholds: RiskThresholds | None = None,
    collection_fields: Sequence[str] | None = None,
    definition_tokens: int = 0,
) -> StaticProfile:
    """Profile a tool from the fields of one result item, its item limit and its egress cap."""
    names = [str(n) for n in field_names]
    base = 2 + sum(estimate_tokens(f'"{n}":') + VALUE_TOKENS for n in names) if names else UNKNOWN_ITEM_TOKENS
    limit = agent_limit if agent_limit is not None and agent_limit > 0 else None
    egress = egress_max_bytes if egress_max_bytes is not None and egress_max_bytes > 0 else None
    if egress is not None:
        max_tokens = math.ceil(egress / BYTES_PER_TOKEN)
    elif limit is not None:
        max_tokens = base * limit + ENVELOPE_TOKENS
    else:
        max_tokens = base * UNBOUNDED_ITEMS
    bounded = egress is not None or limit is not None
    risk = classify_risk(max_tokens, thresholds)
    collections = _collection_fields(names) if collection_fields is None else list(collection_fields)

    recommendations: list[str] = []
    if not bounded:
        recommendations.append(
            f"Tool '{tool_name}' has no result limit: add a limit or pagination parameter, or cap its "
            "egress bytes."
        )
    if risk in ("high", "critical"):
        recommendations.append(
            f"Tool '{tool_name}' can return up to {max_tokens:,} tokens ({risk}): lower its limit or "
            "summarise results server-side."
        )
    if collections and limit is None:
        recommendations.append(
            f"Tool '{tool_name}' returns collection fields without a limit ({', '.join(collections)}): "
            "bound them (maxItems) or paginate."
        )
    if not names:
        recommendations.append(
            f"Tool '{tool_name}' declares no result fields (no outputSchema): its size cannot be bounded "
            "statically; declare an outputSchema."
        )
    if len(names) > MAX_FIELDS:
        recommendations.append(
            f"Tool '{tool_name}' returns {len(names)} fields per item (more than {MAX_FIELDS}): project "
            "only the fields the agent needs."
        )
    return StaticProfile(
        tool_name=tool_name,
        risk=risk,
        bounded=bounded,
        max_tokens=max_tokens,
        min_tokens=base,
        base_tokens=base,
        field_count=len(names),
        recommendations=tuple(recommendations),
        definition_tokens=definition_tokens,
    )


def profile_tool_definition(
    tool: Mapping[str, Any],
    *,
    egress_max_bytes: int | None = None,
    thresholds: RiskThresholds | None = None,
) -> StaticProfile:
    """Profile a real MCP tool definition (an item of a ``tools/list`` result, camelCase).

    Fields come from its ``outputSchema``: the properties of the items of an array property when there
    is one (the per-item cost), else the top-level properties. The smallest ``maxItems`` among the array
    properties is the limit; any array without ``maxItems`` leaves the tool unbounded. A tool with no
    outputSchema is unbounded with no known fields. The definition itself is costed too.
    """
    name = str(tool.get("name", "?"))
    schema = tool.get("outputSchema")
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    props = props if isinstance(props, Mapping) else {}
    fields: list[str] = []
    collections: list[str] = []
    limits: list[int] = []
    any_unbounded_array = False
    for prop_name, prop in props.items():
        if isinstance(prop, Mapping) and prop.get("type") == "array":
            collections.append(str(prop_name))
            max_items = prop.get("maxItems")
            if isinstance(max_items, int) and not isinstance(max_items, bool) and max_items > 0:
                limits.append(max_items)
            else:
                any_unbounded_array = True
            items = prop.get("items")
            item_props = items.get("properties") if isinstance(items, Mapping) else None
            if isinstance(item_props, Mapping):
                fields.extend(str(k) for k in item_props)
    if not fields:
        fields = [str(k) for k in props]
    if schema is None or any_unbounded_array:
        limit = None
    else:
        limit = min(limits) if limits else 1  # an object with no arrays is a single item
    return compute_static_profile(
        name,
        fields,
        agent_limit=limit,
        egress_max_bytes=egress_max_bytes,
        thresholds=thresholds,
        collection_fields=collections if limit is None else [],
        definition_tokens=size_value(dict(tool), estimate_tokens).tokens,
    )


def aggregate_profiles(profiles: Iterable[StaticProfile]) -> AggregateProfile:
    """Worst-case view over many tools; recommendations ordered critical first, then high, then others."""
    items = tuple(profiles)
    if not items:
        return AggregateProfile("low", (), (), ())
    overall = max((p.risk for p in items), key=RISK_TIERS.index)
    ranked = sorted(items, key=lambda p: -RISK_TIERS.index(p.risk))  # stable within a tier
    return AggregateProfile(
        overall_risk=overall,
        profiles=items,
        unbounded_tool_names=tuple(p.tool_name for p in items if not p.bounded),
        critical_tool_names=tuple(p.tool_name for p in items if p.risk == "critical"),
        recommendations=tuple(r for p in ranked for r in p.recommendations),
        definition_tokens=sum(p.definition_tokens for p in items),
    )
