"""JSON cut to a token budget structurally, so it stays JSON and, for the schema keywords honoured here, still
validates.

Arrays lose whole items from the end (never below the schema's ``minItems``); long strings are shortened only where
the schema puts no pattern/format/enum/const/minLength on them. When that cannot reach the budget (more than 64
arrays, deeper than 6 levels, only short values) and no schema is known, the value is cut to a document-order
prefix instead (:mod:`.json_prefix`). A text block whose text is JSON is parsed, cut and written back in its own
style (indented or compact).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..payload import Estimator
from .json_prefix import Path, prefix_cut
from .text_cut import cut_text, safe_boundary

#: Text blocks larger than this are never parsed as JSON (they are cut as text, closed as JSON).
MAX_JSON_PARSE_CHARS = 8 << 20
#: Arrays searched for when cutting a JSON value, and how deep.
_MAX_ARRAYS = 64
_MAX_DEPTH = 6
#: Object members looked at while searching for them (a 100,000-key object is left to the prefix cut).
_MAX_MEMBERS = 4096
#: Whole-value measures the array phase of cut_json may spend (each measures the value being cut).
_MAX_MEASURES = 48
#: Keys longer than this are shortened in the JSON pointers a notice quotes; deep paths are elided.
_POINTER_KEY_CHARS = 32
_POINTER_PARTS = 8
# Schema keywords under which a string must not be shortened.
_STRING_LOCKS = ("pattern", "format", "enum", "const", "contentEncoding", "contentMediaType")


def _resolve(schema: Any, root: Any, seen: int = 0) -> list[Mapping[str, Any]]:
    """The schema nodes that constrain a value: follows local $ref and allOf/anyOf/oneOf branches."""
    if not isinstance(schema, Mapping) or seen > 16:
        return []
    out: list[Mapping[str, Any]] = [schema]
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        node: Any = root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            node = node.get(part) if isinstance(node, Mapping) else None
        out.extend(_resolve(node, root, seen + 1))
    for combinator in ("allOf", "anyOf", "oneOf"):
        branches = schema.get(combinator)
        if isinstance(branches, list):
            for branch in branches:
                out.extend(_resolve(branch, root, seen + 1))
    return out


def _child_schemas(nodes: list[Mapping[str, Any]], key: str | int, root: Any) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    for node in nodes:
        if isinstance(key, str):
            props = node.get("properties")
            sub = props.get(key) if isinstance(props, Mapping) and key in props else node.get("additionalProperties")
        else:
            prefix = node.get("prefixItems")
            sub = prefix[key] if isinstance(prefix, list) and key < len(prefix) else node.get("items")
        out.extend(_resolve(sub, root))
    return out


def _min_items(nodes: list[Mapping[str, Any]]) -> int:
    best = 0
    for node in nodes:
        for keyword in ("minItems", "minContains"):
            value = node.get(keyword)
            if isinstance(value, int) and not isinstance(value, bool):
                best = max(best, value)
        prefix = node.get("prefixItems")
        if isinstance(prefix, list) and node.get("items") is False:
            best = max(best, 0)
    return best


def _string_cuttable(nodes: list[Mapping[str, Any]]) -> tuple[bool, int]:
    """Whether a string may be shortened under these schema nodes, and the shortest length allowed."""
    min_length = 0
    for node in nodes:
        if any(keyword in node for keyword in _STRING_LOCKS):
            return False, 0
        value = node.get("minLength")
        if isinstance(value, int) and not isinstance(value, bool):
            min_length = max(min_length, value)
    return True, min_length


@dataclass(slots=True)
class _Found:
    path: Path
    value: Any
    schemas: list[Mapping[str, Any]]
    tokens: int


def _find(value: Any, schema: Any, measure: Callable[[Any], int], want: type[list[Any]] | type[str]) -> list[_Found]:
    """Arrays (want=list) or long strings (want=str) inside ``value``, with their schema nodes, largest first.
    Objects are walked by key; arrays are not walked into (their items are cut whole). At most
    ``_MAX_MEMBERS`` object members are looked at: a wider value is left to the prefix cut."""
    root = schema
    found: list[_Found] = []
    stack: list[tuple[Path, Any, list[Mapping[str, Any]]]] = [((), value, _resolve(schema, root))]
    seen = 0
    while stack and len(found) < _MAX_ARRAYS and seen < _MAX_MEMBERS:
        path, node, nodes = stack.pop()
        if isinstance(node, want) and (want is list or len(node) > 64):
            found.append(_Found(path, node, nodes, measure(node)))
        if isinstance(node, dict) and len(path) < _MAX_DEPTH:
            for key, child in node.items():
                seen += 1
                if seen > _MAX_MEMBERS:
                    break
                if isinstance(child, (dict, list, str)):
                    stack.append(((*path, key), child, _child_schemas(nodes, key, root)))
    found.sort(key=lambda f: f.tokens, reverse=True)
    return found


def _replace(value: Any, path: Path, new: Any) -> Any:
    """Copy-on-write: ``value`` with the node at ``path`` replaced (containers along the path are copied)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    copy: Any = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _replace(value[head], rest, new)
    return copy


def _pointer(path: Path) -> str:
    """A JSON pointer for a notice: long keys shortened and a deep path elided, so a hostile shape cannot make
    the notice itself long."""
    def part(p: str | int) -> str:
        text = str(p).replace("~", "~0").replace("/", "~1")
        return text if len(text) <= _POINTER_KEY_CHARS else text[: _POINTER_KEY_CHARS - 1] + "\u2026"

    if not path:
        return ""
    if len(path) <= _POINTER_PARTS:
        return "/" + "/".join(part(p) for p in path)
    head = "/".join(part(p) for p in path[:3])
    tail = "/".join(part(p) for p in path[-2:])
    return f"/{head}/\u2026/{tail} (depth {len(path):,})"


@dataclass(slots=True)
class JsonCut:
    value: Any
    tokens: int
    #: (JSON pointer, items kept, items there were) for each array cut.
    arrays: list[tuple[str, int, int]] = field(default_factory=list)
    #: JSON pointers of strings shortened.
    strings: list[str] = field(default_factory=list)
    #: Set when the value was cut to a document-order prefix (the fallback): the pointer where it ends early.
    cut_at: str | None = None


def cut_json(
    value: Any, max_tokens: int, measure: Callable[[Any], int], estimator: Estimator, schema: Any = None,
    *, prefix_ok: bool | None = None, tokens: int | None = None,
) -> JsonCut:
    """Cut ``value`` until ``measure(value) <= max_tokens`` (or nothing more may be cut) keeping it valid JSON
    and within ``schema`` (minItems, string constraints). ``measure`` is how the value is counted (its
    JSON text, or ``size_value``).

    Arrays are cut to whole items from the end, then long strings shortened. When that cannot reach the budget
    (more than 64 arrays, deeper than 6 levels, only short values) and ``prefix_ok`` (default: no schema to
    honour), the value is cut to a document-order prefix instead (:func:`prefix_cut`), which reaches any budget
    that fits an empty container. The work is bounded: whole-value measures are counted, and a phase that
    cannot reach the budget even by removing everything it may cut is skipped. ``tokens``: the value's measure
    when the caller has it."""
    prefix_ok = schema is None if prefix_ok is None else prefix_ok
    tokens = measure(value) if tokens is None else tokens
    out = JsonCut(value, tokens)
    if tokens <= max_tokens:
        return out
    measures = 0
    # Sized with ``measure`` so the parts compare with the whole (an indented text counts its indentation).
    arrays = _find(value, schema, measure, list)
    if prefix_ok and tokens - sum(f.tokens for f in arrays) > max_tokens + tokens // 4:
        arrays = []  # even emptying every array found leaves it above the budget: go to the fallback
    for found in arrays:
        if out.tokens <= max_tokens or measures >= _MAX_MEASURES:
            break
        items: list[Any] = found.value
        floor = min(len(items), _min_items(found.schemas))
        if floor >= len(items):  # the schema wants every item there is
            continue
        if prefix_ok and found.tokens > max_tokens * len(items):
            continue  # items larger than the budget on average: whole items keep ~nothing, the prefix cut does better
        # First guess: the share of the items that the room left by the rest of the value pays for (sizes are
        # near additive); then the largest count that fits is found by bisecting around it.
        room = max_tokens - (out.tokens - found.tokens)
        guess = floor + (len(items) - floor) * max(0, room) // max(1, found.tokens)
        best: tuple[int, Any, int] | None = None

        def fits(count: int, path: Path = found.path, items: list[Any] = items) -> bool:
            nonlocal best, measures
            trial = _replace(out.value, path, items[:count])
            trial_tokens = measure(trial)
            measures += 1
            if trial_tokens <= max_tokens:
                if best is None or count > best[0]:
                    best = (count, trial, trial_tokens)
                return True
            return False

        lo, hi = floor, len(items)  # the answer is the largest count in [lo, hi) that fits
        guess = max(floor, min(guess, len(items) - 1))
        if fits(guess):
            lo = guess + 1
            if lo < hi and not fits(lo):
                hi = lo
        else:
            hi = guess
        while lo < hi and measures < _MAX_MEASURES:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid + 1
            else:
                hi = mid
        if best is None:  # even the floor does not fit: keep the floor, go on with other arrays
            trial = _replace(out.value, found.path, items[:floor])
            best = (floor, trial, measure(trial))
            measures += 1
        kept, out.value, out.tokens = best
        if kept < len(items):
            out.arrays.append((_pointer(found.path), kept, len(items)))
    if out.tokens > max_tokens:
        strings = _find(out.value, schema, measure, str)
        if prefix_ok and out.tokens - sum(f.tokens for f in strings) > max_tokens + out.tokens // 4:
            strings = []
        for found in strings:
            if out.tokens <= max_tokens:
                break
            allowed, min_length = _string_cuttable(found.schemas)
            if not allowed:
                continue
            text: str = found.value
            target = max(0, found.tokens - (out.tokens - max_tokens))
            prefix, _ = cut_text(text, target, estimator)
            if len(prefix) < min_length:
                prefix = text[: safe_boundary(text, min_length)] if min_length <= len(text) else text
                if len(prefix) < min_length:
                    continue
            if len(prefix) < len(text):
                out.value = _replace(out.value, found.path, prefix)
                out.tokens = measure(out.value)
                out.strings.append(_pointer(found.path))
    # The fallback, when the cuts above could not reach the budget or kept little of it (whole items of an array
    # whose few items are each large). It starts again from the whole value, so the notice describes one cut.
    if prefix_ok and (out.tokens > max_tokens or out.tokens < max_tokens // 2):
        cut = prefix_cut(value, max_tokens, measure)
        if cut is not None and (out.tokens > max_tokens or cut[1] > out.tokens + max_tokens // 4):
            out = JsonCut(cut[0], cut[1], cut_at=_pointer(cut[2]))
    return out


# --------------------------------------------------------------------------------------------- JSON text


def dumped_size(dump: Callable[[Any], str], estimator: Estimator) -> Callable[[Any], int]:
    """The tokens of a value as ``dump`` writes it."""
    return lambda value: estimator(dump(value))


def dumper(original: str) -> Callable[[Any], str]:
    """Writes JSON in the style of the text it replaces (indented or compact); the style is read once."""
    if "\n" in original.strip():
        return lambda value: json.dumps(value, ensure_ascii=False, indent=2)
    if ", " in original or ": " in original:
        return lambda value: json.dumps(value, ensure_ascii=False)
    return lambda value: json.dumps(value, ensure_ascii=False, separators=(",", ":"))


#: Text that is not a JSON object or array.
NOT_JSON = object()
#: Text that starts like JSON but is too large or too deeply nested to parse here: it can only be cut as text.
UNPARSED = object()


def parse_json_text(text: str, max_chars: int = MAX_JSON_PARSE_CHARS) -> Any:
    """The value of a text block that holds a JSON object or array, else :data:`NOT_JSON` or :data:`UNPARSED`."""
    stripped = text.lstrip()
    if not stripped or stripped[0] not in "{[":
        return NOT_JSON
    if len(text) > min(max_chars, MAX_JSON_PARSE_CHARS):
        return UNPARSED
    try:
        return json.loads(text)
    except RecursionError:
        return UNPARSED
    except ValueError:
        return NOT_JSON


def cut_json_text(
    text: str, parsed: Any, budget: int, estimator: Estimator, tokens: int,
) -> tuple[str, JsonCut] | None:
    """A JSON text block cut as JSON (valid JSON in the same style), or None when that cannot fit ``budget``."""
    dump = dumper(text)
    try:
        cut = cut_json(parsed, budget, lambda v: estimator(dump(v)), estimator, prefix_ok=True, tokens=tokens)
        new_text = dump(cut.value)
    except RecursionError:  # nested about as deep as the parser allows: the writer runs out of stack
        return None
    return (new_text, cut) if cut.tokens <= budget else None
