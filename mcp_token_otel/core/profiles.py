"""Static risk profiles: how many tokens a tool *can* return, judged before it is ever called.

A profile bounds a tool's response from what is known about it, in priority order:

1. an egress cap in bytes: ``max_tokens = ceil(egress_max_bytes / 3.5)``;
2. an item limit the agent passes (``limit``, ``maxItems``): ``max_tokens = base_tokens * limit + 50``
   (50 tokens of envelope around the items);
3. neither: the tool is unbounded and ``max_tokens = base_tokens * 100`` stands in for "very large".

``base_tokens`` is the estimated cost of one item. Two rules (``BASE_RULES``):

``default``
    for each field the estimated tokens of ``"name":`` plus a typical short value (``VALUE_TOKENS`` = 8:
    ids, names, e-mails and dates measure 6 to 10 o200k tokens once quoted and separated), plus the item's
    braces. Seed 000's worked example (``users``: id, name, email, address; limit 50) gives 2,200, medium.
``seed``
    seed 000's rule, for output comparable with it: per field ``ceil(len(name) / 4)`` plus 5 tokens of
    value (``SEED_VALUE_TOKENS``), plus the braces; the same example gives the seed's 1,450, medium. It
    undercounts a quoted JSON key (``"email":`` is 3 o200k tokens, not 2) and a typical value (6 to 12):
    a realistic ``users`` item measures 42 o200k tokens, the default rule says 43, the seed rule 28. Hence
    not the default.

An item with no known fields costs ``UNKNOWN_ITEM_TOKENS``. ``min_tokens`` is one item.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .estimation import estimate_tokens
from .payload import Estimator, size_value
from .risk import RISK_TIERS, RiskThresholds, RiskTier, classify_risk

#: Tokens assumed for one field's value when only its name is known.
VALUE_TOKENS = 8
#: Tokens assumed for one item whose fields are unknown (no field names, no outputSchema).
UNKNOWN_ITEM_TOKENS = 50
#: Tokens per field value under the seed rule.
SEED_VALUE_TOKENS = 5
#: Base-token rules (see the module docstring).
BASE_RULES: tuple[str, ...] = ("default", "seed")
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
    #: The field names of one result item.
    fields: tuple[str, ...] = ()
    #: The item limit that bounds the result, None when there is none.
    limit: int | None = None
    #: Where the bound comes from: "egress" (a byte cap), "maxItems", "single object", "agent limit" or
    #: "none" (unbounded).
    limit_source: str = "none"
    #: The base-token rule used ("default" or "seed").
    rule: str = "default"


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


def base_tokens_of(field_names: Sequence[str], rule: str = "default") -> int:
    """The estimated tokens of one result item with these fields, under ``rule`` (``BASE_RULES``)."""
    if rule not in BASE_RULES:
        raise ValueError(f"unknown base-token rule {rule!r}; valid rules: {', '.join(BASE_RULES)}")
    if not field_names:
        return UNKNOWN_ITEM_TOKENS
    if rule == "seed":
        return 2 + sum(math.ceil(len(n) / 4) + SEED_VALUE_TOKENS for n in field_names)
    return 2 + sum(estimate_tokens(f'"{n}":') + VALUE_TOKENS for n in field_names)


def compute_static_profile(
    tool_name: str,
    field_names: Iterable[str],
    agent_limit: int | None = None,
    egress_max_bytes: int | None = None,
    *,
    thresholds: RiskThresholds | None = None,
    collection_fields: Sequence[str] | None = None,
    definition_tokens: int = 0,
    rule: str = "default",
    limit_source: str | None = None,
    schema_note: str | None = None,
) -> StaticProfile:
    """Profile a tool from the fields of one result item, its item limit and its egress cap.

    ``limit_source`` names where ``agent_limit`` comes from (default "agent limit"); ``schema_note``, when
    given, replaces the "no outputSchema" recommendation for a tool whose schema says nothing usable.
    """
    names = [str(n) for n in field_names]
    base = base_tokens_of(names, rule)
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
            f"Tool '{tool_name}' declares no result fields ({schema_note or 'no outputSchema'}): its size "
            "cannot be bounded statically; declare an outputSchema with properties."
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
        fields=tuple(names),
        limit=limit if egress is None else None,
        limit_source="egress" if egress is not None else (limit_source or "agent limit") if limit else "none",
        rule=rule,
    )


#: The keys of a tool definition a client puts into the model's context.
TOOL_CONTEXT_KEYS: tuple[str, ...] = ("name", "description", "inputSchema", "outputSchema")


def tool_definition_tokens(tool: Mapping[str, Any], estimator: Estimator = estimate_tokens) -> int:
    """Tokens of a tool definition as it enters the model's context: the compact JSON of its name,
    description, inputSchema and outputSchema (titles, annotations, icons and ``_meta`` stay out)."""
    return size_value({k: tool[k] for k in TOOL_CONTEXT_KEYS if k in tool}, estimator).tokens


def _schema_note(schema: Any) -> str | None:
    """Why an outputSchema tells nothing about the result's size; None when it declares properties."""
    if schema is None:
        return "no outputSchema"
    if not isinstance(schema, Mapping):
        return f"outputSchema is not an object ({type(schema).__name__})"
    props = schema.get("properties")
    if not isinstance(props, Mapping) or not props:
        return "outputSchema declares no properties"
    return None


def profile_tool_definition(
    tool: Mapping[str, Any],
    *,
    egress_max_bytes: int | None = None,
    thresholds: RiskThresholds | None = None,
    estimator: Estimator = estimate_tokens,
    rule: str = "default",
) -> StaticProfile:
    """Profile a real MCP tool definition (an item of a ``tools/list`` result, camelCase).

    Fields come from its ``outputSchema``: the properties of the items of an array property when there
    is one (the per-item cost), else the top-level properties. The smallest ``maxItems`` among the array
    properties is the limit; any array without ``maxItems`` leaves the tool unbounded. A tool whose
    outputSchema is missing, not an object, or declares no properties (``{}``, ``{"type": "object"}``)
    says nothing about its result: it is unbounded with no known fields, exactly as with none. The
    definition itself is costed too (:func:`tool_definition_tokens`, with ``estimator``).
    """
    name = str(tool.get("name", "?"))
    schema = tool.get("outputSchema")
    note = _schema_note(schema)
    props = schema.get("properties") if note is None and isinstance(schema, Mapping) else None
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
    if note is not None or any_unbounded_array:
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
        definition_tokens=tool_definition_tokens(tool, estimator),
        rule=rule,
        limit_source="maxItems" if limits else "single object",
        schema_note=note,
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
