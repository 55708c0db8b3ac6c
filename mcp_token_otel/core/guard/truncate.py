"""Response cap: cut a tool result to a token budget without ever producing broken text or broken JSON.

* Text is cut on a token-estimate boundary (whole 4 K-character chunks while they fit, then a binary
  search on the estimator, which only grows with the prefix, inside the next one), moved back to a
  line or word end when one is near, and never inside a surrogate pair or a backslash escape. Python
  strings hold code points, so a cut can never split a UTF-8 sequence; the wire form is re-encoded from
  whole code points.
* JSON (``structuredContent``, and a text block whose text is a JSON object or array) is cut
  structurally: arrays lose whole items from the end (never below the schema's ``minItems``), long
  strings are shortened only where the schema puts no pattern/format/enum/const/minLength on them.
  The value stays JSON and, for the schema keywords honoured here, still validates. When that cannot
  reach the budget (more than 64 arrays, deeper than 6 levels, only short values) and no schema is known,
  the value is cut to a document-order prefix with every open container closed (any width or depth,
  iterative, costing what is kept). JSON text too large (for its budget) or too deep to parse is cut as
  text, moved back to where a value ends and closed (:func:`close_json_prefix`), so it stays JSON too.
* Image, audio and blob blocks that do not fit are replaced by a notice.

Accounting follows :func:`mcp_token_otel.core.measure.measure_result` block by block (same estimator,
same data/overhead rule), so the cut result measures at most ``cap`` data tokens plus the notices added.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..measure import Measurement, Policy, measure_result
from ..payload import Estimator, size_value
from . import notices
from .pagination import Pagination, no_pagination_hint

#: Text blocks larger than this are never parsed as JSON (they are cut as text, closed as JSON).
MAX_JSON_PARSE_CHARS = 8 << 20
#: A JSON text block is parsed (to cut it by whole items) up to this size, or this many characters per token
#: of its budget when that is more; a larger one is cut as a closed prefix of the text, without parsing.
_PARSE_ALWAYS_CHARS = 256 * 1024
_PARSE_BUDGET_FACTOR = 64
#: Arrays searched for when cutting a JSON value, and how deep.
_MAX_ARRAYS = 64
_MAX_DEPTH = 6
#: Object members looked at while searching for them (a 100,000-key object is left to the prefix cut).
_MAX_MEMBERS = 4096
#: Text is cut by whole chunks of this many characters first, then by binary search inside one.
_CHUNK = 4096
#: A line or word end this close before the cut point is preferred to a cut mid-word.
_LINE_LOOKBACK = 256
_WORD_LOOKBACK = 48
#: Whole-value measures the array phase of cut_json may spend (each measures the value being cut).
_MAX_MEASURES = 48
#: Probes of the document-order prefix cut (gallop, then bisect to within 1/64 of the kept size).
_MAX_PROBES = 40
#: A string the prefix cut reaches last is kept shortened when at least this many characters fit.
_MIN_STRING_KEEP = 16
#: Keys longer than this are shortened in the JSON pointers a notice quotes; deep paths are elided.
_POINTER_KEY_CHARS = 32
_POINTER_PARTS = 8
# Schema keywords under which a string must not be shortened.
_STRING_LOCKS = ("pattern", "format", "enum", "const", "contentEncoding", "contentMediaType")


# --------------------------------------------------------------------------------------------- text


def safe_boundary(text: str, cut: int) -> int:
    """Move ``cut`` back so text[:cut] ends neither between a surrogate pair nor inside a ``\\`` escape."""
    cut = max(0, min(cut, len(text)))
    if 0 < cut < len(text) and "\ud800" <= text[cut - 1] <= "\udbff" and "\udc00" <= text[cut] <= "\udfff":
        cut -= 1
    # An escape in the text itself (JSON or code shown as text): \n, \", \\, \uXXXX.
    backslash = text.rfind("\\", max(0, cut - 6), cut)
    if backslash >= 0:
        run_start = backslash
        while run_start > 0 and text[run_start - 1] == "\\":
            run_start -= 1
        if (backslash - run_start) % 2 == 0:  # this backslash starts an escape (it is not itself escaped)
            need = 6 if text[backslash + 1 : backslash + 2] == "u" else 2
            if cut - backslash < need:
                cut = backslash
    return cut


def _nice_boundary(text: str, cut: int) -> int:
    """Prefer the end of a line, then of a word, just before ``cut``."""
    if cut >= len(text):
        return cut
    newline = text.rfind("\n", max(0, cut - _LINE_LOOKBACK), cut)
    if newline > 0:
        return newline + 1
    space = text.rfind(" ", max(0, cut - _WORD_LOOKBACK), cut)
    return space + 1 if space > 0 else cut


def cut_text(text: str, max_tokens: int, estimator: Estimator, total: int | None = None) -> tuple[str, int]:
    """The longest prefix of ``text`` estimated at ``max_tokens`` or fewer, and its estimate."""
    total = estimator(text) if total is None else total
    if total <= max_tokens:
        return text, total
    if max_tokens <= 0 or not text:
        return "", 0
    # Whole chunks first, as far as they fit (the cost follows what is kept, not the text's size), then a
    # binary search inside the chunk that does not; the estimate of the prefix is checked at the end.
    base = 0
    spent = 0
    while len(text) - base > _CHUNK:
        tokens = estimator(text[base : base + _CHUNK])
        if spent + tokens > max_tokens:
            break
        spent += tokens
        base += _CHUNK
    # Invariant: spent + estimate(text[base:lo]) <= max_tokens < spent + estimate(text[base:hi]).
    lo, hi = base, min(len(text), base + _CHUNK)
    if hi == len(text) and spent + estimator(text[base:]) <= max_tokens:
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if spent + estimator(text[base:mid]) <= max_tokens:
            lo = mid
        else:
            hi = mid
    cut = safe_boundary(text, _nice_boundary(text, lo))
    prefix = text[:cut]
    tokens = estimator(prefix) if prefix else 0
    # Chunk estimates add up to about the whole's (a pre-token can straddle a chunk boundary; above the
    # sampling threshold the whole is sampled): shrink in proportion until the prefix itself fits.
    while tokens > max_tokens and cut > 0:
        cut = safe_boundary(text, cut - max(1, cut * (tokens - max_tokens) // tokens, cut // 200))
        prefix = text[:cut]
        tokens = estimator(prefix) if prefix else 0
    return prefix, tokens


# --------------------------------------------------------------------------------------------- JSON


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


Path = tuple[str | int, ...]


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


def _add(dst: Any, key: Any, value: Any) -> None:
    if isinstance(dst, dict):
        dst[key] = value
    else:
        dst.append(value)


def _members(node: Any) -> Any:
    return iter(node.items()) if isinstance(node, dict) else enumerate(node)


def _scalar_chars(value: Any) -> int:
    """About the length of a scalar's JSON (escapes are not counted: the caller measures the result)."""
    if isinstance(value, str):
        return len(value) + 2
    if value is None or value is True:
        return 4
    if value is False:
        return 5
    if isinstance(value, (int, float)):
        return len(repr(value))
    return 8  # another type: only its measured size counts


def prefix_value(value: Any, max_chars: int) -> tuple[Any, bool, Path]:
    """The document-order prefix of ``value`` whose compact JSON is about ``max_chars`` characters long.

    Every container keeps its first members or items; the one where the room runs out is left out, or cut
    the same way when it is a container (a string is shortened when at least a few characters fit), and every
    container opened is closed, so the prefix is valid JSON of any width and depth. Iterative (no recursion
    limit) and bounded by ``max_chars``: every member kept costs at least one character, so a 100,000-key
    object or a 10,000-deep nesting costs what is kept, not what there is. Returns (prefix, complete, path of
    the place it ends early)."""
    if not isinstance(value, (dict, list, tuple)):
        if isinstance(value, str) and len(value) + 2 > max_chars:
            return value[: safe_boundary(value, max(0, max_chars - 2))], False, ()
        return value, True, ()
    root: Any = {} if isinstance(value, dict) else []
    spent = 2
    # Frames: (members still to visit, the copy being filled, the key of this container in its parent).
    stack: list[tuple[Any, Any, Any]] = [(_members(value), root, None)]

    def where(*last: Any) -> Path:
        return (*(frame[2] for frame in stack[1:]), *last)

    while stack:
        members, dst, _ = stack[-1]
        member = next(members, None)
        if member is None:
            stack.pop()
            continue
        key, child = member
        cost = (1 if dst else 0) + (len(str(key)) + 3 if isinstance(dst, dict) else 0)
        if isinstance(child, (dict, list, tuple)):
            if spent + cost + 2 > max_chars:
                return root, False, where()
            new: Any = {} if isinstance(child, dict) else []
            _add(dst, key, new)
            spent += cost + 2
            stack.append((_members(child), new, key))
            continue
        size = cost + _scalar_chars(child)
        if spent + size <= max_chars:
            _add(dst, key, child)
            spent += size
            continue
        room = max_chars - spent - cost - 2
        if isinstance(child, str) and room >= _MIN_STRING_KEEP:
            _add(dst, key, child[: safe_boundary(child, room)])
            return root, False, where(key)
        return root, False, where()
    return root, True, ()


def prefix_cut(value: Any, max_tokens: int, measure: Callable[[Any], int]) -> tuple[Any, int, Path] | None:
    """The longest document-order prefix of ``value`` (see :func:`prefix_value`) that measures at most
    ``max_tokens``: a gallop then a bisection on its length, at most ``_MAX_PROBES`` probes, each costing
    what it keeps. None when not even the empty container fits."""
    best: tuple[Any, int, Path] | None = None
    lo, hi = 0, 0  # the longest length known to fit, the shortest known not to (0: none yet)
    chars = max(16, max_tokens * 4)
    for _ in range(_MAX_PROBES):
        prefix, complete, path = prefix_value(value, chars)
        tokens = measure(prefix)
        if tokens <= max_tokens:
            best, lo = (prefix, tokens, path), chars
            if complete or tokens >= max_tokens - max_tokens // 32:  # within 3% of the budget: done
                break
        else:
            hi = chars
        if hi and hi - lo <= max(2, lo // 64):
            break
        # Tokens grow about in proportion to the length kept: aim just under the budget, bisect if that
        # lands outside the bracket.
        guess = max(2, chars * (max_tokens - max_tokens // 64) // max(1, tokens))
        if hi:
            chars = guess if lo < guess < hi else max(2, (lo + hi) // 2)
        else:
            chars = max(guess, chars * 2)
        if chars in (lo, hi):  # the empty container was tried (and did not fit, or is all that fits)
            break
    return best


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


def _dumped_size(dump: Callable[[Any], str], estimator: Estimator) -> Callable[[Any], int]:
    """The tokens of a value as ``dump`` writes it."""
    return lambda value: estimator(dump(value))


def _dumper(original: str) -> Callable[[Any], str]:
    """Writes JSON in the style of the text it replaces (indented or compact); the style is read once."""
    if "\n" in original.strip():
        return lambda value: json.dumps(value, ensure_ascii=False, indent=2)
    if ", " in original or ": " in original:
        return lambda value: json.dumps(value, ensure_ascii=False)
    return lambda value: json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _dumps_like(value: Any, original: str) -> str:
    """JSON text of ``value`` in the style of the text it replaces (indented or compact)."""
    return _dumper(original)(value)


_NOT_JSON = object()
#: Text that starts like JSON but is too large or too deeply nested to parse here: it can only be cut as text.
_UNPARSED = object()


def _parse(text: str, max_chars: int = MAX_JSON_PARSE_CHARS) -> Any:
    stripped = text.lstrip()
    if not stripped or stripped[0] not in "{[":
        return _NOT_JSON
    if len(text) > min(max_chars, MAX_JSON_PARSE_CHARS):
        return _UNPARSED
    try:
        return json.loads(text)
    except RecursionError:
        return _UNPARSED
    except ValueError:
        return _NOT_JSON


def _cut_json_text(
    text: str, parsed: Any, budget: int, estimator: Estimator, tokens: int,
) -> tuple[str, JsonCut] | None:
    """A JSON text block cut as JSON (valid JSON in the same style), or None when that cannot fit ``budget``."""
    dump = _dumper(text)
    try:
        cut = cut_json(parsed, budget, lambda v: estimator(dump(v)), estimator, prefix_ok=True, tokens=tokens)
        new_text = dump(cut.value)
    except RecursionError:  # nested about as deep as the parser allows: the writer runs out of stack
        return None
    return (new_text, cut) if cut.tokens <= budget else None


# ------------------------------------------------------------------------------------ JSON text, unparsed

# One JSON token after optional whitespace: a string, a number or literal, or punctuation.
_JSON_TOKEN = re.compile(
    r'[ \t\r\n]*(?:("(?:[^"\\\n]|\\.)*")|(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null)'
    r"|([{}\[\]:,]))"
)
_NUMBER_CHARS = frozenset("0123456789.eE+-")


@dataclass(slots=True)
class _Frame:
    """An open container while a JSON prefix is read (a linked stack: a safe point keeps its frame in O(1))."""

    closer: str
    parent: _Frame | None


def close_json_prefix(text: str, end: int) -> str | None:
    """``text[:end]`` moved back to the last point where a value (or an opening bracket) ends, with every
    container still open closed: valid JSON whenever ``text`` is, at any depth, reading only ``text[:end]``
    (the tokens are matched by a regular expression; no parser and no recursion). None when ``text[:end]`` is
    not the beginning of a JSON object or array, or no point in it can be closed."""
    pos = 0
    frame: _Frame | None = None
    # What comes next: "value" (a value, or a closing bracket right after an opening one), "key", "colon",
    # "after" (a comma or a closing bracket).
    expect = "value"
    safe: tuple[int, _Frame | None, bool] | None = None  # (where, the open containers, right after an opening)
    while pos < end:
        match = _JSON_TOKEN.match(text, pos, end)
        if match is None:
            break  # an incomplete token (a string cut in two) or not JSON: stop at the last safe point
        string, scalar, punct = match.groups()
        token_end = match.end()
        if scalar is not None and token_end == end and end < len(text) and text[end] in _NUMBER_CHARS:
            break  # a number cut in two
        if punct in ("{", "["):
            if expect != "value":
                return None
            frame = _Frame("}" if punct == "{" else "]", frame)
            expect = "key" if punct == "{" else "value"
            safe = (token_end, frame, True)  # an empty container can be closed right here
        elif punct in ("}", "]"):
            if frame is None or frame.closer != punct or expect in ("colon",):
                return None
            frame = frame.parent
            expect = "after"
            if frame is None:
                return text[:token_end]  # the whole value is complete
            safe = (token_end, frame, False)
        elif punct == ",":
            if expect != "after" or frame is None:
                return None
            expect = "key" if frame.closer == "}" else "value"
        elif punct == ":":
            if expect != "colon":
                return None
            expect = "value"
        elif string is not None and expect == "key":
            expect = "colon"
        elif expect == "value" and frame is not None:  # a string or scalar value inside a container
            expect = "after"
            safe = (token_end, frame, False)
        else:
            return None  # a bare scalar at the top, or a token out of place
        pos = token_end
    if safe is None:
        return None
    cut, open_frame, empty = safe
    closers = []
    while open_frame is not None:
        closers.append(open_frame.closer)
        open_frame = open_frame.parent
    newline = text.find("\n", 0, cut)
    if newline < 0:  # compact: the brackets follow at once
        return text[:cut] + "".join(closers)
    # Indented: each bracket on its own line at its depth, in the text's indentation unit (that of line 2).
    unit_end = newline + 1
    while unit_end < cut and text[unit_end] in " \t":
        unit_end += 1
    unit = text[newline + 1 : unit_end] or "  "
    depth = len(closers)
    parts = [text[:cut]]
    for i, closer in enumerate(closers):
        parts.append(closer if i == 0 and empty else "\n" + unit * (depth - 1 - i) + closer)
    return "".join(parts)


def _cut_json_text_unparsed(text: str, budget: int, estimator: Estimator, tokens: int) -> tuple[str, int] | None:
    """A JSON text cut without parsing it: a prefix closed by :func:`close_json_prefix` that fits ``budget``
    (the closing brackets count too), or None. Costs what is kept, whatever the text's size or depth."""
    target = budget
    for _ in range(8):
        if target <= 0:
            break
        prefix, _ = cut_text(text, target, estimator, tokens)
        closed = close_json_prefix(text, len(prefix))
        if closed is None:
            return None
        closed_tokens = estimator(closed)
        if closed_tokens <= budget:
            return closed, closed_tokens
        # The closing brackets pushed it over; keeping less also needs fewer of them (deep text: as many
        # brackets as kept), so give up half the excess at a time.
        target -= max(1, (closed_tokens - budget + 1) // 2)
    # Last resort: the outer container alone, emptied ("[]" or "{}").
    start = len(text) - len(text.lstrip())
    closed = close_json_prefix(text, start + 1)
    if closed is not None and estimator(closed) <= budget:
        return closed, estimator(closed)
    return None


# --------------------------------------------------------------------------------------------- results


@dataclass(slots=True)
class CapReport:
    """What the cap did (or, in observe mode, would do) to one result."""

    cap: int
    total_tokens: int
    kept_tokens: int = 0
    notice_tokens: int = 0
    text_blocks_cut: int = 0
    blocks_dropped: int = 0
    media_replaced: int = 0
    arrays: list[tuple[str, int, int]] = field(default_factory=list)
    strings: list[str] = field(default_factory=list)
    #: (where, JSON pointer) of each JSON value cut to a document-order prefix (the wide/deep fallback).
    prefixes: list[tuple[str, str]] = field(default_factory=list)
    #: Text blocks that looked like JSON too large or too deep to parse, cut as plain text (no longer JSON).
    json_as_text: list[str] = field(default_factory=list)
    #: The cut could not reach the cap (minItems or constrained strings): tokens above it.
    over_cap_tokens: int = 0
    #: An outputSchema constrained the cut (else only the JSON's shape can keep it above the cap).
    schema_bound: bool = False
    notice: str = ""


def _duplicate_index(content: list[Any], structured: Any) -> tuple[int, bool] | None:
    """Which text block structuredContent repeats: (index, wrapped) where wrapped means {"result": text}."""
    wrapped = structured.get("result", _NOT_JSON) if isinstance(structured, dict) and len(structured) == 1 else None
    for index, block in enumerate(content):
        if not isinstance(block, Mapping) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            continue
        text = block["text"]
        if wrapped is not None and wrapped is not _NOT_JSON and isinstance(wrapped, str) and wrapped == text:
            return index, True
        parsed = _parse(text)
        if parsed is _NOT_JSON or parsed is _UNPARSED:
            continue
        try:
            if parsed == structured:
                return index, False
            if wrapped is not None and parsed == wrapped:
                return index, True
        except RecursionError:  # both nested beyond the comparison's stack: not a duplicate worth keeping equal
            continue
    return None


def cap_result(
    result: Mapping[str, Any],
    cap: int,
    *,
    policy: Policy,
    measurement: Measurement | None = None,
    tool: str | None = None,
    output_schema: Any = None,
    pagination: Pagination | None = None,
    arguments: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any] | None, CapReport]:
    """Cut a tools/call result to ``cap`` data tokens. Returns (new result, report); the new result is None
    when the result fits (then the report's kept_tokens is its total).

    Without an ``output_schema`` the cut always reaches the cap (plus the notices). With one, only what the
    schema allows is cut; whatever it forces above its share is taken from the text blocks' share, so only the
    part the schema itself cannot give up stays above the cap (reported in ``over_cap_tokens``)."""
    m = measurement if measurement is not None else measure_result("tools/call", result, policy=policy)
    report = CapReport(cap, m.data_tokens, kept_tokens=m.data_tokens)
    if m.data_tokens <= cap:
        return None, report
    estimator = policy.estimator
    content = result.get("content")
    content = content if isinstance(content, list) else []
    has_structured = "structuredContent" in result
    structured: Any = result.get("structuredContent")
    duplicate = _duplicate_index(content, structured) if has_structured else None
    block_tokens = [b.data_tokens for b in m.blocks[: len(content)]]
    structured_tokens = 0
    if has_structured and duplicate is None and len(m.blocks) > len(content):
        structured_tokens = m.blocks[len(content)].data_tokens
    new_structured = structured
    kept = 0
    if structured_tokens:
        # structuredContent that is data of its own gets a share of the cap in proportion to its size, and is
        # cut first: what its schema keeps above that share comes out of the text blocks' share.
        structured_budget = max(1, cap * structured_tokens // m.data_tokens)  # room for at least "{}"
        cut = cut_json(
            structured, structured_budget, lambda v: size_value(v, estimator).tokens, estimator, output_schema,
            prefix_ok=output_schema is None, tokens=structured_tokens,
        )
        new_structured = cut.value
        kept += cut.tokens
        report.arrays.extend(("structuredContent" + p, k, n) for p, k, n in cut.arrays)
        report.strings.extend("structuredContent" + p for p in cut.strings)
        if cut.cut_at is not None:
            report.prefixes.append(("structuredContent", cut.cut_at))
    remaining = cap - kept
    new_content: list[Any] = []
    lines = chars = 0  # of the text shown, for the pagination hint
    for index, block in enumerate(content):
        tokens = block_tokens[index] if index < len(block_tokens) else 0
        kind = block.get("type") if isinstance(block, Mapping) else None
        if tokens <= remaining:
            new_content.append(block)
            remaining -= tokens
            kept += tokens
            if kind == "text" and isinstance(block.get("text"), str):
                lines += block["text"].count("\n")
                chars += len(block["text"])
            continue
        if kind in ("image", "audio") or (
            kind == "resource" and isinstance(block.get("resource"), Mapping) and "blob" in block["resource"]
        ):
            mime = block.get("mimeType") if kind != "resource" else block["resource"].get("mimeType")
            text = notices.media_removed(kind, mime if isinstance(mime, str) else None, tokens, cap)
            new_content.append({"type": "text", "text": text})
            report.media_replaced += 1
            report.notice_tokens += estimator(text)
            continue
        is_duplicate = duplicate is not None and duplicate[0] == index
        if remaining <= 0 and not is_duplicate:  # the duplicate is cut (to its floor) to keep the pair equal
            report.blocks_dropped += 1
            continue
        where = f"content[{index}]"
        if kind == "text" and isinstance(block.get("text"), str):
            text = block["text"]
            if is_duplicate and duplicate is not None:
                # The text and structuredContent say the same: cut the JSON once, write the text from it.
                wrapped = duplicate[1]
                inner = structured["result"] if wrapped else structured
                if isinstance(inner, str):
                    new_text, tokens_kept = cut_text(text, max(0, remaining), estimator, tokens)
                    new_inner: Any = new_text
                    if len(new_text) < len(text):
                        report.text_blocks_cut += 1
                else:
                    sub_schema = _wrapped_schema(output_schema) if wrapped else output_schema
                    dump = _dumper(text)
                    cut = cut_json(inner, max(0, remaining), _dumped_size(dump, estimator), estimator, sub_schema,
                                   prefix_ok=output_schema is None, tokens=tokens)
                    new_inner, new_text, tokens_kept = cut.value, dump(cut.value), cut.tokens
                    prefix = "/result" if wrapped else ""
                    report.arrays.extend((prefix + p, k, n) for p, k, n in cut.arrays)
                    report.strings.extend(prefix + p for p in cut.strings)
                    if cut.cut_at is not None:
                        report.prefixes.append(("structuredContent", prefix + cut.cut_at))
                new_structured = {**structured, "result": new_inner} if wrapped else new_inner
            else:
                # A text far larger than the budget is not parsed: a closed prefix costs what it keeps.
                parsed = _parse(text, max(_PARSE_ALWAYS_CHARS, _PARSE_BUDGET_FACTOR * remaining))
                as_json = None
                unparsed = None
                if parsed is not _NOT_JSON and parsed is not _UNPARSED:
                    as_json = _cut_json_text(text, parsed, remaining, estimator, tokens)
                if as_json is None and parsed is not _NOT_JSON:
                    unparsed = _cut_json_text_unparsed(text, remaining, estimator, tokens)
                if as_json is not None:
                    new_text, cut = as_json
                    tokens_kept = cut.tokens
                    report.arrays.extend((where + p, k, n) for p, k, n in cut.arrays)
                    if cut.strings:
                        report.text_blocks_cut += 1
                    if cut.cut_at is not None:
                        report.prefixes.append((where, cut.cut_at))
                        report.text_blocks_cut += 1
                elif unparsed is not None:  # too large or too deep to parse: a closed prefix of the text itself
                    new_text, tokens_kept = unparsed
                    report.prefixes.append((where, ""))
                    report.text_blocks_cut += 1
                else:  # not JSON, or JSON whose beginning cannot be closed (e.g. a long string): cut as text
                    new_text, tokens_kept = cut_text(text, remaining, estimator, tokens)
                    report.text_blocks_cut += 1
                    if parsed is not _NOT_JSON:
                        report.json_as_text.append(where)
            new_content.append({**block, "text": new_text})
            lines += new_text.count("\n")
            chars += len(new_text)
        elif kind == "resource" and isinstance(block.get("resource"), Mapping) and isinstance(
            block["resource"].get("text"), str
        ):
            text = block["resource"]["text"]
            new_text, tokens_kept = cut_text(text, remaining, estimator, tokens)
            new_content.append({**block, "resource": {**block["resource"], "text": new_text}})
            report.text_blocks_cut += 1
        else:  # a block that cannot be cut (resource link, unknown type) and does not fit
            report.blocks_dropped += 1
            continue
        kept += tokens_kept
        remaining -= tokens_kept
    report.kept_tokens = kept
    report.over_cap_tokens = max(0, kept - cap)
    report.schema_bound = output_schema is not None
    hint = (pagination.hint(tool, report, arguments, lines=lines, chars=chars) if pagination
            else no_pagination_hint(tool))
    report.notice = notices.truncated(report, tool, hint)
    report.notice_tokens += estimator(report.notice)
    new_content.append({"type": "text", "text": report.notice})
    new_result = {**result, "content": new_content}
    if has_structured:
        new_result["structuredContent"] = new_structured
    return new_result, report


def _wrapped_schema(schema: Any) -> Any:
    """The schema of ``result`` inside MCPServer's {"result": ...} wrapper (with $defs kept reachable)."""
    if not isinstance(schema, Mapping):
        return None
    props = schema.get("properties")
    sub = props.get("result") if isinstance(props, Mapping) else None
    if not isinstance(sub, Mapping):
        return None
    # Keep the root's definitions so local $refs inside still resolve.
    defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    return {**defs, **sub}
