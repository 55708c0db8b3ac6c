"""Token contracts: profile a whole server, write it down as a lockfile, and classify what changed.

Pure: the lists come in as the wire dicts a server sent (an adapter fetches them); the lockfile goes out as
a JSON-ready dict and its canonical text. Nothing here does I/O.

A lockfile (``LOCK_VERSION`` 1) holds, per tool, the sha256 of its definition, its definition tokens, its
static profile (risk, bounded, max/min tokens, fields, limit and where the limit comes from), its input and
output fields with their JSON types, and the estimator; per resource, resource template and prompt a
hash and its tokens; and the server totals. Keys are sorted and nothing depends on time, so one server
locked twice gives byte-identical files.

What changed between a lock and a fresh one is classified by :mod:`.lock_diff`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .estimation import estimate_tokens
from .payload import Estimator, size_value
from .profiles import AggregateProfile, StaticProfile, aggregate_profiles, profile_tool_definition
from .risk import DEFAULT_THRESHOLDS, RISK_TIERS, RiskThresholds
from .schemas import digest, input_fields, number, output_fields, output_max_lengths

LOCK_VERSION = 1
LOCK_GENERATOR = "mcp-token-otel"
DEFAULT_LOCK_FILE = "mcp-token-otel.lock.json"


#: The kinds of listed items besides tools, with the key that names each item and the keys a client puts
#: into the model's context.
OTHER_KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "resources": ("uri", ("uri", "name", "title", "description", "mimeType")),
    "resource_templates": ("uriTemplate", ("uriTemplate", "name", "title", "description", "mimeType")),
    "prompts": ("name", ("name", "title", "description", "arguments")),
}
SINGULAR = {"tools": "tool", "resources": "resource", "resource_templates": "resource template", "prompts": "prompt"}


class LockError(ValueError):
    """A lockfile that cannot be read as one: wrong version, missing or mistyped keys."""


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
            "reason": p.reason,
            "input": input_fields(tool),
            "output": output_fields(tool),
            "output_max_length": output_max_lengths(tool),
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
            "unknown_tools": sorted(profile.aggregate.unknown_tool_names),
        },
        "tools": tools,
    }
    for kind in OTHER_KINDS:
        lock[kind] = {}
    for item in profile.others:
        if item.key in lock[item.kind]:
            raise LockError(f"{SINGULAR[item.kind]} {item.key!r} is listed twice: a lock needs unique keys")
        lock[item.kind][item.key] = {"hash": item.hash, "definition_tokens": item.definition_tokens}
    return lock


def lock_text(lock: Mapping[str, Any]) -> str:
    """The lockfile's text: sorted keys, two-space indent, a final newline."""
    return json.dumps(lock, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validate_bounds(where: str, entry: Mapping[str, Any]) -> None:
    """The keys of a tool entry the diff reads for bounds; older lockfiles lack the newer ones."""
    for key in ("max_tokens", "limit"):
        if entry.get(key) is not None and not _is_int(entry[key]):
            raise LockError(f"{where}.{key}: expected an integer or null, got {entry[key]!r}")
    for field_name, entry_field in entry["input"].items():
        if not isinstance(entry_field, dict):
            raise LockError(f"{where}.input.{field_name}: expected an object, got {entry_field!r}")
        if "maximum" in entry_field and number(entry_field["maximum"]) is None:
            raise LockError(f"{where}.input.{field_name}.maximum: expected a number, got {entry_field['maximum']!r}")
    lengths = entry.get("output_max_length", {})
    if not isinstance(lengths, dict) or not all(_is_int(v) for v in lengths.values()):
        raise LockError(f"{where}.output_max_length: expected an object of integers, got {lengths!r}")


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
        for key, types in (("hash", str), ("definition_tokens", int), ("risk", str), ("input", dict),
                           ("output", dict)):
            if not isinstance(entry.get(key), types):
                raise LockError(f"tools.{name}.{key} is missing or not a {types.__name__}")
        if "bounded" not in entry or not (entry["bounded"] is None or isinstance(entry["bounded"], bool)):
            raise LockError(f"tools.{name}.bounded: expected true, false or null (unknown)")
        _validate_bounds(f"tools.{name}", entry)
        if isinstance(entry["definition_tokens"], bool):
            raise LockError(f"tools.{name}.definition_tokens is missing or not a int")
        if entry["risk"] not in RISK_TIERS:
            raise LockError(f"tools.{name}.risk: expected one of {', '.join(RISK_TIERS)}, got {entry['risk']!r}")
        # every key diff_locks reads is checked here, so a hand-edited lock is one error line, not a traceback
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
