"""Static risk profiles: how many tokens a tool *can* return, judged before it is ever called.

A result is bounded only by something that bounds it:

* an egress cap in bytes (``max_tokens = ceil(egress_max_bytes / 3.5)``), whatever the schema says;
* an item limit: ``maxItems`` on an array, or a limit input the caller passes (``limit``, ``max_results``,
  ``per_page``, ``head``/``tail``, ...) that declares a ``maximum`` and is required or has a default (an
  optional limit with no default is simply left out by the caller); ``max_length``-like inputs cap characters;
* ``maxLength`` on a string.

A string that can carry content (no ``maxLength``, ``enum``, ``const`` or ``format``, and a content-like name
such as ``content``, ``text``, ``body``, ``data``, ``html``, ``stdout``, or the result's only field) and an
array without a bound are unbounded at any depth; names, ids, dates and enums are short values. Three
outcomes (``bounded``):

``True``
    a worst case in tokens: one item costs ``base_tokens`` (per field the key plus a typical value, plus the
    braces; longer for a ``maxLength``), a collection ``items x limit``, plus 50 tokens of envelope.
``False`` (unbounded)
    no maximum (``max_tokens`` None); rated ``critical``: nothing stops one call from filling the context.
``None`` (unknown)
    no usable outputSchema: the size cannot be judged statically (``max_tokens`` None); rated ``high``, never
    safer than a declared bound.

Every profile carries a one-line ``reason`` and at most one recommendation per cause, and its definition's
tokens split into parts (:func:`definition_parts`: description, schema, and the rest, names and framing), the
split the recorder reports for every ``tools/list`` too.

Base-token rules (``BASE_RULES``): ``default`` costs a field as the estimated tokens of ``"name":`` plus 8 for a
typical short value (ids, names, e-mails and dates measure 6 to 10 o200k tokens quoted); ``compact`` as
``ceil(len(name) / 4)`` plus 5, which undercounts a realistic item (42 o200k tokens; default 43, compact 28).
``seed`` is accepted as another name for ``compact``.

Advice is ranked by impact (:func:`advice_priority`, :func:`rank_advice`): a tool's priority is its tier (low
reads ``advisory``), except an action's report (``reports_action``: a tool annotated ``readOnlyHint: false``
whose result is unbounded only through text fields, a status or the diff of the model's own edit), which is
advisory unless observed larger. The same advice for several tools of one priority is one line naming them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .bounds import (
    BYTES_PER_TOKEN,
    LimitInput,
    ResultWalk,
    key_tokens,
    limit_inputs,
    value_tokens,
)
from .estimation import estimate_tokens
from .payload import Estimator, size_value
from .risk import RISK_TIERS, RiskThresholds, RiskTier, classify_risk
from .schemas import properties, resolve

#: Tokens assumed for one item whose fields are unknown.
UNKNOWN_ITEM_TOKENS = 50
#: Base-token rules (see the module docstring), and the older names they are also accepted under.
BASE_RULES: tuple[str, ...] = ("default", "compact")
RULE_ALIASES: dict[str, str] = {"seed": "compact"}
#: Envelope tokens around a result: braces, keys and brackets around its items.
ENVELOPE_TOKENS = 50
#: More fields than this per item is worth a recommendation.
MAX_FIELDS = 15
# Field names that usually hold collections (for a tool known only by its field names): plurals and the common
# container words.
_COLLECTION_NAME = re.compile(
    r"(?i)(items|results|entries|records|rows|list|data|children|messages|files|logs|events|[a-z]{3,}s)$"
)
_NOT_COLLECTION = frozenset({"status", "address", "process", "class", "progress", "alias", "success"})
#: The tier of a tool whose result has no bound, and of one whose result cannot be judged.
UNBOUNDED_RISK: RiskTier = "critical"
UNKNOWN_RISK: RiskTier = "high"
#: Advice priorities, least first: the risk tiers, with "low" read as "advisory" (worth doing, no risk).
PRIORITIES: tuple[str, ...] = ("advisory", "medium", "high", "critical")



def canonical_rule(rule: str) -> str:
    """``rule`` under its current name; ValueError for a rule that does not exist."""
    rule = RULE_ALIASES.get(rule, rule)
    if rule not in BASE_RULES:
        raise ValueError(f"unknown base-token rule {rule!r}; valid rules: {', '.join(BASE_RULES)}")
    return rule


@dataclass(frozen=True, slots=True)
class DefinitionParts:
    """A definition's tokens by part, adding up to ``total``. The field names are the ``part`` label values of
    the catalog's ``DEFINITION_PARTS``."""

    description: int
    #: inputSchema and outputSchema.
    schema: int
    #: The rest: the tool's name and the JSON framing around the parts.
    names: int

    @property
    def total(self) -> int:
        return self.description + self.schema + self.names


@dataclass(frozen=True, slots=True)
class StaticProfile:
    tool_name: str
    risk: RiskTier
    #: True: a worst case is known; False: unbounded; None: unknown (no usable outputSchema).
    bounded: bool | None
    #: The worst case in tokens; None when unbounded or unknown.
    max_tokens: int | None
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
    #: Where the bound comes from: "egress", "maxItems", "single object", "input NAME", "agent limit" or "none".
    limit_source: str = "none"
    #: The base-token rule used ("default" or "compact").
    rule: str = "default"
    #: Why, in one line: "unbounded: string field "content" has no maxLength; no limit parameter".
    reason: str = ""
    #: ``definition_tokens`` by part; None when only the total is known (a tool known by its fields alone).
    definition_parts: DefinitionParts | None = None
    #: An action's report: annotated ``readOnlyHint: false``, with a declared result unbounded only through its
    #: text fields (a status, the diff of the model's own edit). Its advice is advisory unless observed larger.
    reports_action: bool = False


@dataclass(frozen=True, slots=True)
class Advice:
    """One recommendation, for one tool or for several that need the same change, with its priority."""

    priority: str
    tools: tuple[str, ...]
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"priority": self.priority, "tools": list(self.tools), "recommendation": self.text}


@dataclass(frozen=True, slots=True)
class AggregateProfile:
    overall_risk: RiskTier
    profiles: tuple[StaticProfile, ...]
    unbounded_tool_names: tuple[str, ...]
    critical_tool_names: tuple[str, ...]
    recommendations: tuple[str, ...] = field(default=())
    definition_tokens: int = 0
    unknown_tool_names: tuple[str, ...] = ()
    #: The recommendations ranked by impact and grouped (``recommendations`` holds their texts).
    advice: tuple[Advice, ...] = ()


def base_tokens_of(field_names: Sequence[str], rule: str = "default") -> int:
    """The estimated tokens of one result item with these fields, under ``rule`` (``BASE_RULES``)."""
    rule = canonical_rule(rule)
    if not field_names:
        return UNKNOWN_ITEM_TOKENS
    return 2 + sum(key_tokens(n, rule) + value_tokens(rule) for n in field_names)


def _risk_of(bounded: bool | None, max_tokens: int | None, thresholds: RiskThresholds | None) -> RiskTier:
    if bounded is None:
        return UNKNOWN_RISK
    return classify_risk(max_tokens, thresholds) if bounded and max_tokens is not None else UNBOUNDED_RISK


def _size_recommendations(name: str, risk: RiskTier, max_tokens: int | None, fields: int) -> list[str]:
    out: list[str] = []
    if max_tokens is not None and risk in ("high", "critical"):
        out.append(f"Tool '{name}' can return up to {max_tokens:,} tokens ({risk}): lower its limit or "
                   "summarise results server-side.")
    if fields > MAX_FIELDS:
        out.append(f"Tool '{name}' returns {fields} fields per item (more than {MAX_FIELDS}): project only the "
                   "fields the agent needs.")
    return out


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
) -> StaticProfile:
    """Profile a tool known only by the fields of one result item, its item limit and its egress cap: bounded
    by the cap (first) or the limit, unbounded without either. ``collection_fields`` names the fields that grow
    with the data, for the recommendation."""
    rule = canonical_rule(rule)
    names = [str(n) for n in field_names]
    base = base_tokens_of(names, rule)
    limit = agent_limit if agent_limit is not None and agent_limit > 0 else None
    egress = egress_max_bytes if egress_max_bytes is not None and egress_max_bytes > 0 else None
    max_tokens: int | None = None
    recommendations: list[str] = []
    if egress is not None:
        max_tokens, source, reason = math.ceil(egress / BYTES_PER_TOKEN), "egress", f"egress cap of {egress:,} bytes"
        reason = f"bounded: {reason}"
    elif limit is not None:
        max_tokens, source = base * limit + ENVELOPE_TOKENS, limit_source or "agent limit"
        reason = f"bounded: at most {limit:,} items ({source})"
    else:
        source, reason = "none", "unbounded: no item limit and no egress cap"
        if collection_fields is None:
            collection_fields = [n for n in names if n.lower() not in _NOT_COLLECTION and _COLLECTION_NAME.search(n)]
        grow = ", ".join(collection_fields)
        recommendations.append(
            f"Tool '{tool_name}' has no result limit"
            + (f": its collection fields without a limit ({grow}) grow with the data" if grow else "")
            + "; add maxItems, a limit or pagination parameter, or cap its egress bytes.")
    bounded = max_tokens is not None
    risk = _risk_of(bounded, max_tokens, thresholds)
    recommendations += _size_recommendations(tool_name, risk, max_tokens, len(names))
    return StaticProfile(
        tool_name=tool_name, risk=risk, bounded=bounded, max_tokens=max_tokens, min_tokens=base, base_tokens=base,
        field_count=len(names), recommendations=tuple(recommendations), definition_tokens=definition_tokens,
        fields=tuple(names), limit=limit if source not in ("egress", "none") else None, limit_source=source,
        rule=rule, reason=reason,
    )


#: The keys of a tool definition a client puts into the model's context.
TOOL_CONTEXT_KEYS: tuple[str, ...] = ("name", "description", "inputSchema", "outputSchema")


def tool_definition_tokens(tool: Mapping[str, Any], estimator: Estimator = estimate_tokens) -> int:
    """Tokens of a tool definition as it enters the model's context: the compact JSON of its name,
    description, inputSchema and outputSchema (titles, annotations, icons and ``_meta`` stay out)."""
    return size_value({k: tool[k] for k in TOOL_CONTEXT_KEYS if k in tool}, estimator).tokens


_SCHEMA_KEYS = ("inputSchema", "outputSchema")


def definition_parts(tool: Mapping[str, Any], estimator: Estimator = estimate_tokens) -> DefinitionParts:
    """:func:`tool_definition_tokens` split into the description (the string), the schemas (the compact JSON of
    inputSchema and outputSchema) and the rest. Each part is estimated on its own, so the parts may overshoot
    the whole by a token or two: they are capped, description first, so that they always add up to it."""
    total = tool_definition_tokens(tool, estimator)
    text = tool.get("description")
    description = min(total, size_value(text, estimator).tokens if isinstance(text, str) else 0)
    schemas = {k: tool[k] for k in _SCHEMA_KEYS if k in tool}
    schema = min(total - description, size_value(schemas, estimator).tokens if schemas else 0)
    return DefinitionParts(description, schema, total - description - schema)


def sum_parts(parts: Iterable[DefinitionParts]) -> DefinitionParts:
    """Part by part over many definitions: a server's tool list."""
    items = list(parts)
    return DefinitionParts(sum(p.description for p in items), sum(p.schema for p in items),
                           sum(p.names for p in items))


def _schema_note(schema: Any) -> str | None:
    """Why an outputSchema tells nothing about the result's size; None when it declares properties."""
    if schema is None:
        return "no outputSchema"
    if not isinstance(schema, Mapping):
        return f"outputSchema is not an object ({type(schema).__name__})"
    if not properties(schema):
        return "outputSchema declares no properties"
    return None


def _item_fields(schema: Any) -> list[str]:
    """The field names of one result item: of an array property's items, else the top-level properties."""
    for prop in properties(schema).values():
        prop = resolve(prop, schema)
        if isinstance(prop, Mapping) and prop.get("type") == "array":
            item_props = properties(resolve(prop.get("items"), schema))
            if item_props:
                return [str(k) for k in item_props]
    return [str(k) for k in properties(schema)]


_CAUSE_TEXT = {"string": 'string field "{}" has no maxLength', "array": 'array "{}" has no maxItems',
               "object": 'field "{}" declares no properties', "any": 'field "{}" declares no type'}
_CAUSE_FIX = {
    "string": "declare a maxLength, or a limit input (head, max_length) with a maximum and a default",
    "array": "declare maxItems, or a limit input (limit, per_page) with a maximum and a default",
    "object": "declare its properties, with bounds (maxItems, maxLength)",
    "any": "declare its type, with bounds (maxItems, maxLength)",
}


def _gap_groups(limits: Sequence[LimitInput]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for item in limits:
        if not item.effective:
            groups.setdefault(item.gap, []).append(f'"{item.name}"')
    return groups


def _input_gaps(limits: Sequence[LimitInput]) -> str:
    """Why the limit inputs do not bound the result, grouped: '"head" and "tail" are optional without a default'."""
    if not limits:
        return "no limit parameter"
    parts = []
    for gap, names in _gap_groups(limits).items():
        if len(names) > 1:
            gap = gap.replace("has no", "have no").replace("is optional", "are optional")
        parts.append(f"{' and '.join(names)} {gap}")
    return "; ".join(parts)


_GAP_FIX = {"has no maximum": "a maximum", "has no maximum and no default": "a maximum and a default",
            "is optional without a default": "a default (or make it required)"}


def _unbounded(name: str, walk: ResultWalk, limits: Sequence[LimitInput]) -> tuple[str, list[str]]:
    """The reason line and one recommendation per cause of an unbounded result."""
    causes = list(dict.fromkeys(walk.causes))
    text = [_CAUSE_TEXT[kind].format(path) for kind, path in causes]
    reason = "; ".join(text[:3]) + (f" (and {len(text) - 3} more)" if len(text) > 3 else "")
    if walk.top_causes:
        reason += f"; {_input_gaps(limits)}"
    recs = [f"Tool '{name}': {_CAUSE_TEXT[kind].format(path)}: {_CAUSE_FIX[kind]}." for kind, path in causes]
    if walk.top_causes:
        for gap, names in _gap_groups(limits).items():
            inputs = f"{' and '.join(names)} input{'s' if len(names) > 1 else ''}"
            recs.append(f"Tool '{name}': give the {inputs} {_GAP_FIX[gap]}, so that leaving "
                        f"{'them' if len(names) > 1 else 'it'} out still bounds the result.")
    return f"unbounded: {reason}", recs


def profile_tool_definition(
    tool: Mapping[str, Any],
    *,
    egress_max_bytes: int | None = None,
    thresholds: RiskThresholds | None = None,
    estimator: Estimator = estimate_tokens,
    rule: str = "default",
) -> StaticProfile:
    """Profile a real MCP tool definition (an item of a ``tools/list`` result, camelCase): bounded, unbounded
    or unknown with its reason, from its outputSchema, its limit inputs and the egress cap (module docstring).
    The definition itself is costed too, by part (:func:`definition_parts`, with ``estimator``)."""
    name = str(tool.get("name", "?"))
    rule = canonical_rule(rule)
    parts = definition_parts(tool, estimator)
    definition = parts.total
    schema = tool.get("outputSchema")
    note = _schema_note(schema)
    fields = _item_fields(schema) if note is None else []
    limits = limit_inputs(tool)
    effective = [item for item in limits if item.effective]
    items = min((i for i in effective if i.kind == "items"), key=lambda i: i.maximum or 0, default=None)
    caps = [(math.ceil((i.maximum or 0) / (BYTES_PER_TOKEN if i.kind == "chars" else 1)), i)
            for i in effective if i.kind != "items"]
    cap = min(caps, key=lambda c: c[0], default=None)
    if egress_max_bytes is not None and egress_max_bytes > 0:
        capped = compute_static_profile(name, fields, egress_max_bytes=egress_max_bytes, thresholds=thresholds,
                                        definition_tokens=definition, rule=rule)
        return replace(capped, definition_parts=parts)
    walk = ResultWalk(schema, rule)
    cost = walk.result(schema, items) if note is None and isinstance(schema, Mapping) else None
    recs: list[str] = []
    limit, source = None, "none"
    if cost is not None:
        max_tokens: int | None = cost + ENVELOPE_TOKENS
        bounded: bool | None = True
        counts = [c for c in (properties(schema).get(a, {}).get("maxItems") for a in properties(schema))
                  if isinstance(c, int) and not isinstance(c, bool)]
        if items is not None and any(items.name in b for b in walk.bounds):
            limit, source = items.maximum, f"input {items.name}"
        elif counts:
            limit, source = min(counts), "maxItems"
        else:
            limit, source = 1, "single object"
        reason = "bounded: " + ("; ".join(walk.bounds) if walk.bounds else "one object of short values")
    elif cap is not None:
        max_tokens, bounded, limit, source = cap[0] + ENVELOPE_TOKENS, True, cap[1].maximum, f"input {cap[1].name}"
        reason = f'bounded: input "{cap[1].name}" caps the result at {cap[1].maximum:,} {cap[1].kind}'
    elif note is not None:
        max_tokens, bounded = None, None
        reason = f"unknown: {note}"
        recs.append(f"Tool '{name}': no result fields declared ({note}): the result's size cannot be judged "
                    "statically; declare an outputSchema with properties and bounds (maxItems, maxLength).")
    else:
        max_tokens, bounded = None, False
        reason, recs = _unbounded(name, walk, limits)
    annotations = tool.get("annotations")
    read_only = annotations.get("readOnlyHint") if isinstance(annotations, Mapping) else None
    reports_action = bounded is False and read_only is False and all(kind == "string" for kind, _ in walk.causes)
    risk = _risk_of(bounded, max_tokens, thresholds)
    recs += _size_recommendations(name, risk, max_tokens, len(fields))
    base = base_tokens_of(fields, rule)
    return StaticProfile(
        tool_name=name, risk=risk, bounded=bounded, max_tokens=max_tokens, min_tokens=base, base_tokens=base,
        field_count=len(fields), recommendations=tuple(dict.fromkeys(recs)), definition_tokens=definition,
        fields=tuple(fields), limit=limit, limit_source=source, rule=rule, reason=reason, definition_parts=parts,
        reports_action=reports_action,
    )


def advice_priority(profile: StaticProfile, tier: RiskTier | None = None, observed: RiskTier | None = None) -> str:
    """How much a tool's advice matters (``PRIORITIES``): its tier (``tier``: the effective one, with
    observations), except that an action's report (``reports_action``) is advisory, or its ``observed`` tier."""
    chosen = (observed or "low") if profile.reports_action else (tier or profile.risk)
    return PRIORITIES[RISK_TIERS.index(chosen)]


def _names(tools: Sequence[str]) -> str:
    quoted = [f"'{t}'" for t in tools]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


def rank_advice(entries: Sequence[tuple[StaticProfile, str, int]]) -> tuple[Advice, ...]:
    """Every recommendation of ``entries`` (a profile, its priority, its observed size or -1), ranked by
    impact: priority first, then the larger observed size, then as listed. The same advice (the text after
    ``Tool 'NAME': ``) at one priority is one line naming every tool it is for, where the first of them ranks."""
    order = sorted(range(len(entries)), key=lambda i: (-PRIORITIES.index(entries[i][1]), -entries[i][2], i))
    grouped: dict[tuple[str, str], list[str]] = {}
    for index in order:
        profile, priority, _ = entries[index]
        prefix = f"Tool '{profile.tool_name}': "
        for text in profile.recommendations:
            if text.startswith(prefix):
                grouped.setdefault((priority, text[len(prefix):]), []).append(profile.tool_name)
            else:  # a sentence of its own (it names a size or a count): not merged
                grouped.setdefault((priority, text), [])
    return tuple(Advice(priority, tuple(tools), f"{'Tools' if len(tools) > 1 else 'Tool'} {_names(tools)}: {text}"
                        if tools else text) for (priority, text), tools in grouped.items())


def aggregate_profiles(profiles: Iterable[StaticProfile]) -> AggregateProfile:
    """Worst-case view over many tools; recommendations ranked by impact (:func:`rank_advice`)."""
    items = tuple(profiles)
    if not items:
        return AggregateProfile("low", (), (), ())
    overall = max((p.risk for p in items), key=RISK_TIERS.index)
    advice = rank_advice([(p, advice_priority(p), -1) for p in items])
    return AggregateProfile(
        overall_risk=overall,
        profiles=items,
        unbounded_tool_names=tuple(p.tool_name for p in items if p.bounded is False),
        critical_tool_names=tuple(p.tool_name for p in items if p.risk == "critical"),
        recommendations=tuple(a.text for a in advice),
        definition_tokens=sum(p.definition_tokens for p in items),
        unknown_tool_names=tuple(p.tool_name for p in items if p.bounded is None),
        advice=advice,
    )
