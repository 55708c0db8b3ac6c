"""Document-order prefixes of JSON, valid JSON at any width and depth, costing what they keep.

* Of a value (:func:`prefix_value`, :func:`prefix_cut`): every container keeps its first members, the one where
  the room runs out is cut the same way, and every container opened is closed. The fallback of
  :func:`~.json_cut.cut_json` when whole items and shortened strings cannot reach the budget.
* Of a text (:func:`close_json_prefix`, :func:`cut_json_text_unparsed`): JSON text too large or too deep to
  parse is cut as text, moved back to where a value ends and closed, read by a regular expression (no parser,
  no recursion).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..payload import Estimator
from .text_cut import cut_text, safe_boundary

#: Probes of the document-order prefix cut (gallop, then bisect to within 1/64 of the kept size).
_MAX_PROBES = 40
#: A string the prefix cut reaches last is kept shortened when at least this many characters fit.
_MIN_STRING_KEEP = 16

#: Where a value is, as JSON pointer parts: object keys and array indexes.
Path = tuple[str | int, ...]


# --------------------------------------------------------------------------------------------- of a value


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


# --------------------------------------------------------------------------------------------- of a text

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


def cut_json_text_unparsed(text: str, budget: int, estimator: Estimator, tokens: int) -> tuple[str, int] | None:
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
