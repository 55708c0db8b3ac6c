"""Token contracts: profile a whole server, write it down as a lockfile, and classify what changed.

Pure: the lists come in as the wire dicts a server sent (an adapter fetches them); the lockfile goes out as
a JSON-ready dict and its canonical text. Nothing here does I/O.

A lockfile (``LOCK_VERSION`` 1) holds, per tool, the sha256 of its definition, its definition tokens, its
static profile (risk, bounded, max/min tokens, fields, limit and where the limit comes from), its input and
output fields with their JSON types, and the estimator; per resource, resource template and prompt a
hash and its tokens; and the server totals. Keys are sorted and nothing depends on time, so one server
locked twice gives byte-identical files.

:func:`diff_locks` classifies every difference between a lock and a fresh one:

``BREAKING``
    tool (resource, template, prompt) removed; required input added; input made required; input or output
    field removed or retyped.
``RISKY``
    risk tier up; became unbounded; limit raised or removed; definition tokens up more than
    ``CheckLimits.max_token_increase_pct``; server definition tokens over ``CheckLimits.token_budget`` or
    up more than the percentage; a new tool that is unbounded or high/critical.
``SAFE``
    new optional input; input made optional; output field added; description changed; tier down; became
    bounded; limit lowered; a new tool under the limits; a new server version; any other change of a
    definition.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .estimation import estimate_tokens
from .payload import Estimator, size_value
from .profiles import AggregateProfile, StaticProfile, aggregate_profiles, profile_tool_definition
from .risk import BREACH_TIERS, DEFAULT_THRESHOLDS, RISK_TIERS, RiskThresholds

LOCK_VERSION = 1
LOCK_GENERATOR = "mcp-token-otel"
DEFAULT_LOCK_FILE = "mcp-token-otel.lock.json"

ChangeClass = Literal["SAFE", "RISKY", "BREAKING"]
#: Classes in increasing severity.
CHANGE_CLASSES: tuple[ChangeClass, ...] = ("SAFE", "RISKY", "BREAKING")

#: The kinds of listed items besides tools, with the key that names each item and the keys a client puts
#: into the model's context.
OTHER_KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "resources": ("uri", ("uri", "name", "title", "description", "mimeType")),
    "resource_templates": ("uriTemplate", ("uriTemplate", "name", "title", "description", "mimeType")),
    "prompts": ("name", ("name", "title", "description", "arguments")),
}
_SINGULAR = {"tools": "tool", "resources": "resource", "resource_templates": "resource template", "prompts": "prompt"}
#: Output schemas are walked this deep for field paths.
MAX_FIELD_DEPTH = 4


class LockError(ValueError):
    """A lockfile that cannot be read as one: wrong version, missing or mistyped keys."""


# --------------------------------------------------------------------------- hashing and schema fields


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept: equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(value).encode("utf-8", "surrogatepass")).hexdigest()


def schema_type(schema: Any) -> str:
    """A short, stable spelling of a JSON Schema's type: ``string``, ``integer|null``, ``array<string>``,
    ``enum``, ``ref:#/$defs/X``; ``any`` when the schema does not say."""
    if not isinstance(schema, Mapping):
        return "any"
    kind = schema.get("type")
    if isinstance(kind, list):
        names = sorted({str(k) for k in kind})
        return "|".join(names) if names else "any"
    if isinstance(kind, str):
        if kind == "array":
            return f"array<{schema_type(schema.get('items'))}>"
        return kind
    for combinator in ("anyOf", "oneOf"):
        members = schema.get(combinator)
        if isinstance(members, list) and members:
            return "|".join(sorted({schema_type(m) for m in members}))
    if isinstance(schema.get("$ref"), str):
        return f"ref:{schema['$ref']}"
    if "enum" in schema:
        return "enum"
    if "const" in schema:
        return "const"
    return "any"


def _properties(schema: Any) -> Mapping[str, Any]:
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    return props if isinstance(props, Mapping) else {}


def _resolve(schema: Any, root: Any) -> Any:
    """A local ``$ref`` (``#/$defs/X``, ``#/definitions/X``) replaced by its target, a few hops at most."""
    for _ in range(MAX_FIELD_DEPTH):
        ref = schema.get("$ref") if isinstance(schema, Mapping) else None
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return schema
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, Mapping) else None
        if not isinstance(target, Mapping):
            return schema
        schema = target
    return schema


def input_fields(tool: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The top-level inputs of a tool: name -> {type, required}."""
    schema = tool.get("inputSchema")
    required = schema.get("required") if isinstance(schema, Mapping) else None
    required_names = {str(r) for r in required} if isinstance(required, list) else set()
    return {
        str(name): {"type": schema_type(_resolve(prop, schema)), "required": str(name) in required_names}
        for name, prop in _properties(schema).items()
    }


def output_fields(tool: Mapping[str, Any]) -> dict[str, str]:
    """The fields of a tool's outputSchema as paths -> type: ``total``, ``issues[].title``, ``owner.login``."""
    out: dict[str, str] = {}
    root = tool.get("outputSchema")

    def walk(schema: Any, prefix: str, depth: int) -> None:
        for name, prop in _properties(_resolve(schema, root)).items():
            path = f"{prefix}{name}"
            prop = _resolve(prop, root)
            out[path] = schema_type(prop)
            if depth >= MAX_FIELD_DEPTH or not isinstance(prop, Mapping):
                continue
            if prop.get("type") == "array":
                walk(prop.get("items"), f"{path}[].", depth + 1)
            else:
                walk(prop, f"{path}.", depth + 1)

    walk(root, "", 1)
    return out


def item_definition_tokens(kind: str, item: Mapping[str, Any], estimator: Estimator = estimate_tokens) -> int:
    """Tokens of a resource, resource template or prompt as listed in the model's context."""
    keys = OTHER_KINDS[kind][1]
    return size_value({k: item[k] for k in keys if k in item}, estimator).tokens


# --------------------------------------------------------------------------- server profile


@dataclass(frozen=True, slots=True)
class ListedItem:
    kind: str
    key: str
    definition_tokens: int
    hash: str


@dataclass(frozen=True, slots=True)
class ServerProfile:
    """Everything a server lists, profiled: what every conversation pays before the first call."""

    server_name: str
    server_version: str
    estimator: str
    rule: str
    thresholds: RiskThresholds
    context_window: int
    tools: tuple[StaticProfile, ...]
    tool_definitions: tuple[Mapping[str, Any], ...]
    others: tuple[ListedItem, ...]
    aggregate: AggregateProfile
    egress_max_bytes: int | None = None
    counts: Mapping[str, int] = field(default_factory=dict)

    @property
    def tool_definition_tokens(self) -> int:
        return sum(p.definition_tokens for p in self.tools)

    @property
    def definition_tokens(self) -> int:
        return self.tool_definition_tokens + sum(i.definition_tokens for i in self.others)

    @property
    def context_share(self) -> float:
        return self.definition_tokens / self.context_window if self.context_window > 0 else 0.0


def profile_server(
    tools: Sequence[Mapping[str, Any]],
    resources: Sequence[Mapping[str, Any]] = (),
    resource_templates: Sequence[Mapping[str, Any]] = (),
    prompts: Sequence[Mapping[str, Any]] = (),
    *,
    server_name: str = "",
    server_version: str = "",
    estimator: Estimator = estimate_tokens,
    estimator_name: str = "default",
    rule: str = "default",
    thresholds: RiskThresholds | None = None,
    context_window: int = 200_000,
    egress_max_bytes: int | None = None,
) -> ServerProfile:
    """Profile every tool and cost every listed item with one estimator, rule and set of thresholds."""
    t = thresholds or DEFAULT_THRESHOLDS
    tool_defs = tuple(tool for tool in tools if isinstance(tool, Mapping))
    profiles = tuple(
        profile_tool_definition(tool, egress_max_bytes=egress_max_bytes, thresholds=t, estimator=estimator, rule=rule)
        for tool in tool_defs
    )
    others: list[ListedItem] = []
    lists = {"resources": resources, "resource_templates": resource_templates, "prompts": prompts}
    for kind, items in lists.items():
        key_name = OTHER_KINDS[kind][0]
        for item in items:
            if isinstance(item, Mapping):
                others.append(
                    ListedItem(kind, str(item.get(key_name, "?")), item_definition_tokens(kind, item, estimator),
                               digest(item))
                )
    counts = {"tools": len(tool_defs), **{kind: sum(1 for o in others if o.kind == kind) for kind in lists}}
    return ServerProfile(
        server_name=server_name,
        server_version=server_version,
        estimator=estimator_name,
        rule=rule,
        thresholds=t,
        context_window=context_window,
        tools=profiles,
        tool_definitions=tool_defs,
        others=tuple(others),
        aggregate=aggregate_profiles(profiles),
        egress_max_bytes=egress_max_bytes,
        counts=counts,
    )


# --------------------------------------------------------------------------- lockfile


def build_lock(profile: ServerProfile) -> dict[str, Any]:
    """The lockfile of a server profile, as a JSON-ready dict (serialise it with :func:`lock_text`)."""
    tools: dict[str, Any] = {}
    for p, tool in zip(profile.tools, profile.tool_definitions, strict=True):
        if p.tool_name in tools:  # keyed by name: a second definition would silently replace the first
            raise LockError(f"tool {p.tool_name!r} is listed twice: a lock needs unique tool names")
        description = tool.get("description")
        tools[p.tool_name] = {
            "hash": digest(tool),
            "description_hash": digest(description if isinstance(description, str) else ""),
            "definition_tokens": p.definition_tokens,
            "estimator": profile.estimator,
            "risk": p.risk,
            "bounded": p.bounded,
            "max_tokens": p.max_tokens,
            "min_tokens": p.min_tokens,
            "fields": sorted(p.fields),
            "limit": p.limit,
            "limit_source": p.limit_source,
            "input": input_fields(tool),
            "output": output_fields(tool),
        }
    lock: dict[str, Any] = {
        "lock_version": LOCK_VERSION,
        "generator": LOCK_GENERATOR,
        "estimator": profile.estimator,
        "rule": profile.rule,
        "thresholds": {"low": profile.thresholds.low, "medium": profile.thresholds.medium,
                       "high": profile.thresholds.high},
        "egress_max_bytes": profile.egress_max_bytes,
        "server": {"name": profile.server_name, "version": profile.server_version},
        "totals": {
            **{f"{kind}": n for kind, n in profile.counts.items()},
            "definition_tokens": profile.definition_tokens,
            "tool_definition_tokens": profile.tool_definition_tokens,
            "context_window": profile.context_window,
            "context_share": round(profile.context_share, 6),
            "risk": profile.aggregate.overall_risk,
            "unbounded_tools": sorted(profile.aggregate.unbounded_tool_names),
        },
        "tools": tools,
    }
    for kind in OTHER_KINDS:
        lock[kind] = {}
    for item in profile.others:
        if item.key in lock[item.kind]:
            raise LockError(f"{_SINGULAR[item.kind]} {item.key!r} is listed twice: a lock needs unique keys")
        lock[item.kind][item.key] = {"hash": item.hash, "definition_tokens": item.definition_tokens}
    return lock


def lock_text(lock: Mapping[str, Any]) -> str:
    """The lockfile's text: sorted keys, two-space indent, a final newline."""
    return json.dumps(lock, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_lock(value: Any) -> dict[str, Any]:
    """``value`` (parsed JSON) as a lock this version reads; LockError naming what is wrong otherwise."""
    if not isinstance(value, dict):
        raise LockError("expected a JSON object")
    version = value.get("lock_version")
    if not _is_int(version) or version != LOCK_VERSION:
        raise LockError(f"lock_version {version!r} is not supported (this version reads {LOCK_VERSION})")
    for key, expected in (("tools", dict), ("totals", dict), ("estimator", str), ("rule", str), ("thresholds", dict)):
        if not isinstance(value.get(key), expected):
            raise LockError(f"'{key}' is missing or not a {expected.__name__}")
    for kind in OTHER_KINDS:
        if not isinstance(value.get(kind, {}), dict):
            raise LockError(f"'{kind}' is not an object")
    for name, entry in value["tools"].items():
        if not isinstance(entry, dict):
            raise LockError(f"tools.{name} is not an object")
        for key, types in (("hash", str), ("definition_tokens", int), ("risk", str), ("bounded", bool),
                           ("input", dict), ("output", dict)):
            if not isinstance(entry.get(key), types):
                raise LockError(f"tools.{name}.{key} is missing or not a {types.__name__}")
        if isinstance(entry["definition_tokens"], bool):
            raise LockError(f"tools.{name}.definition_tokens is missing or not a int")
        if entry["risk"] not in RISK_TIERS:
            raise LockError(f"tools.{name}.risk: expected one of {', '.join(RISK_TIERS)}, got {entry['risk']!r}")
        # every key diff_locks reads is checked here, so a hand-edited lock is one error line, not a traceback
        for key in ("max_tokens", "limit"):
            if entry.get(key) is not None and not _is_int(entry[key]):
                raise LockError(f"tools.{name}.{key}: expected an integer or null, got {entry[key]!r}")
        for field_name, entry_field in entry["input"].items():
            if not isinstance(entry_field, dict):
                raise LockError(f"tools.{name}.input.{field_name}: expected an object, got {entry_field!r}")
        for path, kind in entry["output"].items():
            if not isinstance(kind, str):
                raise LockError(f"tools.{name}.output.{path}: expected a type name, got {kind!r}")
    for kind in OTHER_KINDS:
        for key, entry in value.get(kind, {}).items():
            if not isinstance(entry, dict) or not _is_int(entry.get("definition_tokens", 0)):
                raise LockError(f"{kind}.{key}: expected an object with an integer definition_tokens")
    if not _is_int(value["totals"].get("definition_tokens", 0)):
        raise LockError(f"totals.definition_tokens: expected an integer, got {value['totals']['definition_tokens']!r}")
    server = value.get("server", {})
    if not isinstance(server, dict) or not all(isinstance(server.get(k, ""), str) for k in ("name", "version")):
        raise LockError(f"'server': expected an object with string name and version, got {server!r}")
    try:
        RiskThresholds.coerce(value["thresholds"])
    except (TypeError, ValueError) as exc:
        raise LockError(str(exc)) from None
    return value


# --------------------------------------------------------------------------- diff


@dataclass(frozen=True, slots=True)
class CheckLimits:
    """What makes a growth RISKY: definition tokens up more than ``max_token_increase_pct`` percent (per
    tool and for the server), and the server's definition tokens above ``token_budget`` (None: no budget)."""

    max_token_increase_pct: float = 10.0
    token_budget: int | None = None

    def __post_init__(self) -> None:
        pct = self.max_token_increase_pct
        if isinstance(pct, bool) or not isinstance(pct, int | float) or not math.isfinite(pct) or pct < 0:
            raise ValueError(f"max token increase: expected a percentage >= 0, got {pct!r}")
        budget = self.token_budget
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0):
            raise ValueError(f"token budget: expected a positive number of tokens, got {budget!r}")


@dataclass(frozen=True, slots=True)
class Difference:
    cls: ChangeClass
    kind: str  # tool, resource, resource template, prompt, server
    subject: str
    change: str
    detail: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"class": self.cls, "kind": self.kind, "subject": self.subject, "change": self.change,
                "detail": self.detail}


def _pct(old: int, new: int) -> float:
    if old <= 0:
        return math.inf if new > 0 else 0.0
    return (new - old) * 100.0 / old


def _fmt_pct(value: float) -> str:
    return "new" if math.isinf(value) else f"{value:+.1f}%"


def _tokens_change(kind: str, subject: str, old: int, new: int, limits: CheckLimits) -> Difference | None:
    if old == new:
        return None
    pct = _pct(old, new)
    detail = f"{old:,} -> {new:,} tokens ({_fmt_pct(pct)})"
    if pct > limits.max_token_increase_pct:
        return Difference("RISKY", kind, subject, "definition tokens up",
                          f"{detail}, more than {limits.max_token_increase_pct:g}%")
    return Difference("SAFE", kind, subject, "definition tokens changed", detail)


def _diff_tool(name: str, old: Mapping[str, Any], new: Mapping[str, Any], limits: CheckLimits) -> list[Difference]:
    out: list[Difference] = []

    def add(cls: ChangeClass, change: str, detail: str = "") -> None:
        out.append(Difference(cls, "tool", name, change, detail))

    old_in, new_in = old.get("input", {}), new.get("input", {})
    for field_name in sorted(set(old_in) | set(new_in)):
        before, after = old_in.get(field_name), new_in.get(field_name)
        if after is None:
            add("BREAKING", "input removed", f"'{field_name}' ({before.get('type')})")
        elif before is None:
            if after.get("required"):
                add("BREAKING", "required input added", f"'{field_name}' ({after.get('type')})")
            else:
                add("SAFE", "optional input added", f"'{field_name}' ({after.get('type')})")
        else:
            if before.get("type") != after.get("type"):
                add("BREAKING", "input retyped", f"'{field_name}': {before.get('type')} -> {after.get('type')}")
            if after.get("required") and not before.get("required"):
                add("BREAKING", "input made required", f"'{field_name}'")
            elif before.get("required") and not after.get("required"):
                add("SAFE", "input made optional", f"'{field_name}'")
    old_out, new_out = old.get("output", {}), new.get("output", {})
    for path in sorted(set(old_out) | set(new_out)):
        before, after = old_out.get(path), new_out.get(path)
        if after is None:
            add("BREAKING", "output field removed", f"'{path}' ({before})")
        elif before is None:
            add("SAFE", "output field added", f"'{path}' ({after})")
        elif before != after:
            add("BREAKING", "output field retyped", f"'{path}': {before} -> {after}")
    if old.get("description_hash") != new.get("description_hash"):
        add("SAFE", "description changed")
    old_risk, new_risk = RISK_TIERS.index(old["risk"]), RISK_TIERS.index(new["risk"])
    if new_risk > old_risk:
        add("RISKY", "risk tier up", f"{old['risk']} -> {new['risk']} (max {new.get('max_tokens', 0):,} tokens)")
    elif new_risk < old_risk:
        add("SAFE", "risk tier down", f"{old['risk']} -> {new['risk']}")
    if old.get("bounded") and not new.get("bounded"):
        add("RISKY", "became unbounded", f"max {old.get('max_tokens', 0):,} -> {new.get('max_tokens', 0):,} tokens")
    elif not old.get("bounded") and new.get("bounded"):
        add("SAFE", "became bounded", f"by {new.get('limit_source')}")
    old_limit, new_limit = old.get("limit"), new.get("limit")
    if isinstance(old_limit, int) and new_limit is None and old.get("limit_source") != "single object":
        add("RISKY", "limit removed", f"{old_limit} ({old.get('limit_source')})")
    elif isinstance(old_limit, int) and isinstance(new_limit, int):
        if new_limit > old_limit:
            add("RISKY", "limit raised", f"{old_limit} -> {new_limit}")
        elif new_limit < old_limit:
            add("SAFE", "limit lowered", f"{old_limit} -> {new_limit}")
    tokens = _tokens_change("tool", name, int(old.get("definition_tokens", 0)), int(new["definition_tokens"]), limits)
    if tokens is not None:
        out.append(tokens)
    if not out and old.get("hash") != new.get("hash"):
        add("SAFE", "definition changed", "title, annotations or other fields outside the contract")
    return out


def _new_tool(name: str, entry: Mapping[str, Any]) -> Difference:
    detail = (f"risk {entry['risk']}, {'bounded' if entry.get('bounded') else 'unbounded'}, "
              f"max {entry.get('max_tokens', 0):,} tokens, definition {entry.get('definition_tokens', 0):,} tokens")
    if entry.get("bounded") and entry["risk"] not in BREACH_TIERS:
        return Difference("SAFE", "tool", name, "tool added", detail)
    return Difference("RISKY", "tool", name, "tool added over the limits", detail)


def diff_locks(old: Mapping[str, Any], new: Mapping[str, Any], limits: CheckLimits | None = None) -> list[Difference]:
    """Every difference between a lock and a fresh one, BREAKING first, then RISKY, then SAFE."""
    limits = limits or CheckLimits()
    out: list[Difference] = []
    old_tools, new_tools = old.get("tools", {}), new.get("tools", {})
    for name in sorted(set(old_tools) | set(new_tools)):
        if name not in new_tools:
            out.append(Difference("BREAKING", "tool", name, "tool removed"))
        elif name not in old_tools:
            out.append(_new_tool(name, new_tools[name]))
        else:
            out.extend(_diff_tool(name, old_tools[name], new_tools[name], limits))
    for kind in OTHER_KINDS:
        label = _SINGULAR[kind]
        before_items, after_items = old.get(kind, {}), new.get(kind, {})
        for key in sorted(set(before_items) | set(after_items)):
            if key not in after_items:
                out.append(Difference("BREAKING", label, key, f"{label} removed"))
            elif key not in before_items:
                out.append(Difference("SAFE", label, key, f"{label} added",
                                      f"{after_items[key].get('definition_tokens', 0):,} tokens"))
            elif before_items[key].get("hash") != after_items[key].get("hash"):
                change = _tokens_change(label, key, int(before_items[key].get("definition_tokens", 0)),
                                        int(after_items[key].get("definition_tokens", 0)), limits)
                out.append(change or Difference("SAFE", label, key, f"{label} changed"))
    old_total = int(old.get("totals", {}).get("definition_tokens", 0))
    new_total = int(new.get("totals", {}).get("definition_tokens", 0))
    server = str(new.get("server", {}).get("name") or old.get("server", {}).get("name") or "server")
    old_version = str(old.get("server", {}).get("version") or "")
    new_version = str(new.get("server", {}).get("version") or "")
    if old_version and new_version and old_version != new_version:
        out.append(Difference("SAFE", "server", server, "version changed", f"{old_version} -> {new_version}"))
    total = _tokens_change("server", server, old_total, new_total, limits)
    if total is not None:
        out.append(total)
    if limits.token_budget is not None and new_total > limits.token_budget:
        out.append(Difference("RISKY", "server", server, "over the token budget",
                              f"tool definitions and listings cost {new_total:,} tokens, budget "
                              f"{limits.token_budget:,}"))
    return sort_differences(out)


def sort_differences(differences: Iterable[Difference]) -> list[Difference]:
    return sorted(differences, key=lambda d: (-CHANGE_CLASSES.index(d.cls), d.kind != "server", d.kind, d.subject))


def failing(differences: Iterable[Difference], fail_on: str) -> list[Difference]:
    """The differences at or above ``fail_on`` (``breaking`` or ``risky``)."""
    floor = CHANGE_CLASSES.index(fail_on.upper())
    return [d for d in differences if CHANGE_CLASSES.index(d.cls) >= floor]
