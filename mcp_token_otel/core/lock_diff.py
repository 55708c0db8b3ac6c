"""What changed between a lockfile and a fresh lock of the same server, classified.

:func:`diff_locks` classifies every difference between a lock and a fresh one:

``BREAKING``
    tool (resource, template, prompt) removed; required input added; input made required; input or output
    field removed or retyped.
``RISKY``
    risk tier up; became unbounded (or its size unknown); limit raised or removed; a limit input (``limit``,
    ``max_results``, ``head``, ...) with a ``maximum`` removed (BREAKING too: an input removed), or whose
    ``maximum`` was removed or raised, or that became optional without a default; a string output that lost its
    ``maxLength`` (or whose ``maxLength`` was raised); definition tokens up more than
    ``CheckLimits.max_token_increase_pct``; server definition tokens over ``CheckLimits.token_budget`` or up more
    than the percentage; a new tool that is not bounded, or high or critical; the server's version going backwards.
``SAFE``
    new optional input; input made optional; output field added; description changed; tier down; became
    bounded; limit, limit maximum or maxLength lowered; a new tool under the limits; a new server version; any
    other change of a definition.

A lockfile written before limit maximums and maxLengths were recorded has neither: those rules then have
nothing to compare and stay silent.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .bounds import limit_kind
from .contract import OTHER_KINDS, SINGULAR
from .risk import BREACH_TIERS, RISK_TIERS
from .schemas import number

ChangeClass = Literal["SAFE", "RISKY", "BREAKING"]
#: Classes in increasing severity.
CHANGE_CLASSES: tuple[ChangeClass, ...] = ("SAFE", "RISKY", "BREAKING")


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


def _max_text(entry: Mapping[str, Any]) -> str:
    """The worst case of a lock entry in words: 'max 86 tokens', 'unbounded', 'size unknown'."""
    tokens = entry.get("max_tokens")
    if entry.get("bounded") is None:
        return "size unknown"
    return f"max {tokens:,} tokens" if entry.get("bounded") and isinstance(tokens, int) else "unbounded"


def _diff_inputs(old_in: Mapping[str, Any], new_in: Mapping[str, Any]) -> list[tuple[ChangeClass, str, str]]:
    out: list[tuple[ChangeClass, str, str]] = []
    for name in sorted(set(old_in) | set(new_in)):
        before, after = old_in.get(name), new_in.get(name)
        if after is None:
            out.append(("BREAKING", "input removed", f"'{name}' ({(before or {}).get('type')})"))
            if limit_kind(name) is not None and number((before or {}).get("maximum")) is not None:
                # callers' code breaks, and what it held to a maximum is no longer bounded by it
                out.append(("RISKY", "limit input removed", f"'{name}': the result is no longer bounded by it"))
        elif before is None:
            required = bool(after.get("required"))
            out.append(("BREAKING" if required else "SAFE", f"{'required' if required else 'optional'} input added",
                        f"'{name}' ({after.get('type')})"))
        else:
            if before.get("type") != after.get("type"):
                out.append(("BREAKING", "input retyped", f"'{name}': {before.get('type')} -> {after.get('type')}"))
            if after.get("required") and not before.get("required"):
                out.append(("BREAKING", "input made required", f"'{name}'"))
            elif before.get("required") and not after.get("required") and limit_kind(name) is None:
                out.append(("SAFE", "input made optional", f"'{name}'"))
            if limit_kind(name) is not None:
                out.extend(_diff_limit_input(name, before, after))
    return out


def _diff_limit_input(name: str, before: Mapping[str, Any], after: Mapping[str, Any]) -> list[tuple[ChangeClass, str,
                                                                                                        str]]:
    """A limit input (``limit``, ``max_results``, ``head``, ...) that stops bounding the result is RISKY: its
    maximum removed or raised, or leaving it out no longer bounded (optional without a default)."""
    out: list[tuple[ChangeClass, str, str]] = []
    old_max, new_max = number(before.get("maximum")), number(after.get("maximum"))
    if old_max is not None and new_max is None:
        out.append(("RISKY", "limit maximum removed", f"'{name}': maximum {old_max:g} removed"))
    elif old_max is not None and new_max is not None and new_max != old_max:
        cls: ChangeClass = "RISKY" if new_max > old_max else "SAFE"
        out.append((cls, f"limit maximum {'raised' if new_max > old_max else 'lowered'}",
                    f"'{name}': {old_max:g} -> {new_max:g}"))
    was_bound = before.get("required") or before.get("has_default")
    if was_bound and not (after.get("required") or after.get("has_default")):
        out.append(("RISKY", "limit optional without a default", f"'{name}': leaving it out no longer bounds"))
    elif before.get("required") and not after.get("required"):
        out.append(("SAFE", "input made optional", f"'{name}' (default {'kept' if after.get('has_default') else ''})"
                    .replace(" ()", "")))
    return out


def _diff_outputs(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[ChangeClass, str, str]]:
    out: list[tuple[ChangeClass, str, str]] = []
    old_out, new_out = old.get("output", {}), new.get("output", {})
    for path in sorted(set(old_out) | set(new_out)):
        before, after = old_out.get(path), new_out.get(path)
        if after is None:
            out.append(("BREAKING", "output field removed", f"'{path}' ({before})"))
        elif before is None:
            out.append(("SAFE", "output field added", f"'{path}' ({after})"))
        elif before != after:
            out.append(("BREAKING", "output field retyped", f"'{path}': {before} -> {after}"))
    old_len, new_len = old.get("output_max_length"), new.get("output_max_length") or {}
    for path, length in sorted((old_len or {}).items()):  # a lock from before maxLength was recorded has none
        if path not in new_out:
            continue
        if path not in new_len:
            out.append(("RISKY", "output lost its maxLength", f"'{path}': maxLength {length:,} removed"))
        elif new_len[path] != length:
            cls: ChangeClass = "RISKY" if new_len[path] > length else "SAFE"
            out.append((cls, f"output maxLength {'raised' if cls == 'RISKY' else 'lowered'}",
                        f"'{path}': {length:,} -> {new_len[path]:,}"))
    return out


def _diff_bounds(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[ChangeClass, str, str]]:
    out: list[tuple[ChangeClass, str, str]] = []
    old_risk, new_risk = RISK_TIERS.index(old["risk"]), RISK_TIERS.index(new["risk"])
    if new_risk > old_risk:
        out.append(("RISKY", "risk tier up", f"{old['risk']} -> {new['risk']} ({_max_text(new)})"))
    elif new_risk < old_risk:
        out.append(("SAFE", "risk tier down", f"{old['risk']} -> {new['risk']}"))
    if old.get("bounded") is True and new.get("bounded") is not True:
        out.append(("RISKY", "became unbounded", f"{_max_text(old)} -> {new.get('reason') or _max_text(new)}"))
    elif old.get("bounded") is not True and new.get("bounded") is True:
        out.append(("SAFE", "became bounded", f"by {new.get('limit_source')}"))
    old_limit, new_limit = old.get("limit"), new.get("limit")
    if isinstance(old_limit, int) and new_limit is None and old.get("limit_source") != "single object":
        out.append(("RISKY", "limit removed", f"{old_limit} ({old.get('limit_source')})"))
    elif isinstance(old_limit, int) and isinstance(new_limit, int) and new_limit != old_limit:
        raised = new_limit > old_limit
        out.append(("RISKY" if raised else "SAFE", f"limit {'raised' if raised else 'lowered'}",
                    f"{old_limit} -> {new_limit}"))
    return out


def _diff_tool(name: str, old: Mapping[str, Any], new: Mapping[str, Any], limits: CheckLimits) -> list[Difference]:
    found = _diff_inputs(old.get("input", {}), new.get("input", {})) + _diff_outputs(old, new)
    if old.get("description_hash") != new.get("description_hash"):
        found.append(("SAFE", "description changed", ""))
    found += _diff_bounds(old, new)
    out = [Difference(cls, "tool", name, change, detail) for cls, change, detail in found]
    tokens = _tokens_change("tool", name, int(old.get("definition_tokens", 0)), int(new["definition_tokens"]), limits)
    if tokens is not None:
        out.append(tokens)
    if not out and old.get("hash") != new.get("hash"):
        out.append(Difference("SAFE", "tool", name, "definition changed",
                              "title, annotations or other fields outside the contract"))
    return out


def _new_tool(name: str, entry: Mapping[str, Any]) -> Difference:
    detail = (f"risk {entry['risk']}, {_max_text(entry)}, definition {entry.get('definition_tokens', 0):,} tokens")
    if entry.get("bounded") is True and entry["risk"] not in BREACH_TIERS:
        return Difference("SAFE", "tool", name, "tool added", detail)
    return Difference("RISKY", "tool", name, "tool added over the limits", detail)


_RELEASE = re.compile(r"v?(\d+(?:\.\d+)*)")


def _release(version: str) -> tuple[int, ...] | None:
    """The numeric release of a version ('2026.8.31', 'v1.2.0-beta' -> (1, 2, 0)); None when it has none."""
    found = _RELEASE.match(version.strip())
    if found is None:
        return None
    parts = [int(p) for p in found.group(1).split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def _version_change(server: str, old_version: str, new_version: str) -> Difference | None:
    if not old_version or not new_version or old_version == new_version:
        return None
    old_release, new_release = _release(old_version), _release(new_version)
    if old_release is not None and new_release is not None and new_release < old_release:
        return Difference("RISKY", "server", server, "version went backwards", f"{old_version} -> {new_version}")
    return Difference("SAFE", "server", server, "version changed", f"{old_version} -> {new_version}")


def server_mismatch(lock: Mapping[str, Any], server_name: str) -> str | None:
    """'lockfile is for server X, this is server Y' when both name a server and the names differ."""
    locked = str(lock.get("server", {}).get("name") or "")
    if locked and server_name and locked != server_name:
        return f"lockfile is for server {locked!r}, this is server {server_name!r}"
    return None


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
        label = SINGULAR[kind]
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
    version = _version_change(server, old_version, new_version)
    if version is not None:
        out.append(version)
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
