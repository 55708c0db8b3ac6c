"""Size any JSON-like value in tokens and bytes without ever raising.

MCP payloads are JSON, but what reaches the shim can be anything a caller built: pydantic models,
bytes, non-string keys, shared or circular references, 10,000-deep nesting, 100 MB strings. The
walker here is iterative (no recursion limit), bounded in nodes, and never serialises a long string:

* long strings (above ``INLINE_LIMIT`` characters) are estimated on their own, so a 100 MB string
  costs one sampled estimate, not a 100 MB copy;
* everything else (keys, short strings, numbers, punctuation) is written into a compact JSON-like
  *skeleton* which is estimated once, so structure costs tokens as it would on the wire.

The result is the sum of both. ``reason`` explains a partial answer (cycle, node budget, odd type).

Bounded in time, never a silent undercount: a value with more than ``MAX_NODES`` nodes (found before any
wide container is expanded) is sized from its compact JSON instead, written by the standard library's C
encoder in one linear pass and estimated like any long string (sampled above 64 K characters). Only
when that serialisation is impossible (a key JSON cannot write, a cycle, extreme nesting) does the walk
stop at the bound, and then the answer says so in ``reason`` ("... undercount").
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Estimator = Callable[[str], int]

#: Strings longer than this are estimated separately instead of being copied into the skeleton.
INLINE_LIMIT = 256
#: Nodes the walker visits; a larger value is sized from its JSON (faster at that size; the walk wasted is bounded).
MAX_NODES = 20_000
#: Strings up to this length have their estimate cached: skeletons such as '{"type":"text"}' and tool
#: names recur on every message, and a dict hit is ten times cheaper than estimating again.
SHORT_CACHE_CHARS = 256
_SHORT_CACHE_MAX = 4096
_short_cache: dict[tuple[Estimator, str], int] = {}
#: bytes values above this are sized from a base64 sample of their head.
_BYTES_SAMPLE = 48 * 1024


@dataclass(frozen=True, slots=True)
class Size:
    """Token estimate and UTF-8 byte count of a value; ``reason`` is set when the answer is partial."""

    tokens: int
    bytes: int
    reason: str | None = None


ZERO = Size(0, 0)


def utf8_len(text: str) -> int:
    """UTF-8 length of ``text``; huge non-ASCII strings are sampled rather than copied."""
    if text.isascii():
        return len(text)
    if len(text) <= 1 << 20:
        return len(text.encode("utf-8", "surrogatepass"))
    step = len(text) // 16
    sample = "".join(text[i : i + 4096] for i in range(0, len(text), step))
    return round(len(sample.encode("utf-8", "surrogatepass")) * len(text) / len(sample))


def estimate_cached(text: str, estimator: Estimator) -> int:
    """``estimator(text)``, cached for short strings (bounded; cleared when full)."""
    if len(text) > SHORT_CACHE_CHARS:
        return estimator(text)
    key = (estimator, text)
    tokens = _short_cache.get(key)
    if tokens is None:
        if len(_short_cache) >= _SHORT_CACHE_MAX:
            _short_cache.clear()
        tokens = _short_cache[key] = estimator(text)
    return tokens


#: Short strings (tool names, short text blocks, small skeletons such as '{"type":"text"}') -> their Size:
#: the same few recur on every message, and one dict hit replaces the estimate, the UTF-8 length and a new
#: Size. Bounded; cleared when full.
_short_sizes: dict[tuple[Estimator, str], Size] = {}


def _short_size(text: str, estimator: Estimator) -> Size:
    """``Size(estimator(text), utf8_len(text))`` for a non-empty string of at most SHORT_CACHE_CHARS, cached."""
    key = (estimator, text)
    size = _short_sizes.get(key)
    if size is None:
        if len(_short_sizes) >= _SHORT_CACHE_MAX:
            _short_sizes.clear()
        size = _short_sizes[key] = Size(estimator(text), utf8_len(text))
    return size


def size_text(text: str, estimator: Estimator) -> Size:
    """Size one string as it would be inserted verbatim."""
    if not text:
        return ZERO
    if len(text) <= SHORT_CACHE_CHARS:
        return _short_size(text, estimator)
    # Inlined (this runs for every large text block): ASCII's byte length is its length.
    return Size(estimator(text), len(text) if text.isascii() else utf8_len(text))


def _bytes_as_base64(data: bytes | bytearray | memoryview) -> tuple[str, float]:
    """Base64 text of (a head sample of) ``data`` and the factor that scales it back to the whole."""
    raw = bytes(data[:_BYTES_SAMPLE])
    scale = len(data) / len(raw) if raw else 1.0
    return base64.b64encode(raw).decode("ascii"), scale


class _Lit(str):
    """Skeleton text (keys, separators, brackets) queued on the walker's stack between values."""

    __slots__ = ()


class _Exit(int):
    """Queued after a container's items: the container (this id) is closed again (cycle detection)."""

    __slots__ = ()


_OPEN_OBJ, _OPEN_ARR, _COMMA = _Lit("{"), _Lit("["), _Lit(",")
_CLOSE_OBJ, _CLOSE_ARR = _Lit("}"), _Lit("]")
_SCALARS = frozenset({type(None), bool, int, float})


def _safe_str(obj: Any) -> str:
    try:
        text = str(obj)
    except Exception:
        return f"<{type(obj).__name__}>"
    return str.__str__(text) if isinstance(text, str) else f"<{type(obj).__name__}>"


def _plain(obj: Any) -> Any:
    """Turn a non-JSON object (pydantic model, dataclass, bytes...) into something the walker knows."""
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        try:
            dumped = dump(mode="json", by_alias=True, exclude_none=True)
        except Exception:
            return _safe_str(obj)
        if type(dumped) in (dict, list, str, int, float, bool, type(None)):
            return dumped
    return _safe_str(obj)


def _push_mapping(stack: list[Any], mapping: Mapping[Any, Any], limit: int) -> bool:
    """Queue a mapping's items (at most ``limit``); False when it had more."""
    try:
        items = list(mapping.items()) if len(mapping) <= limit else list(_first(mapping.items(), limit))
    except Exception:
        stack.append(_safe_str(mapping))
        return True
    stack.append(_Exit(id(mapping)))
    stack.append(_CLOSE_OBJ)
    for index in range(len(items) - 1, -1, -1):
        key, val = items[index]
        stack.append(val)
        key_text = key if type(key) is str else _safe_str(key)
        stack.append(_Lit(f'"{key_text}":' if index == 0 else f',"{key_text}":'))
    stack.append(_OPEN_OBJ)
    return len(items) == len(mapping)


def _push_sequence(stack: list[Any], sequence: Any, limit: int) -> bool:
    """Queue a sequence's items (at most ``limit``); False when it had more."""
    if type(sequence) is list:
        items = sequence if len(sequence) <= limit else sequence[:limit]
        complete = len(items) == len(sequence)
    else:
        items = list(_first(sequence, limit + 1))
        complete = len(items) <= limit
        items = items[:limit]
    stack.append(_Exit(id(sequence)))
    stack.append(_CLOSE_ARR)
    for index in range(len(items) - 1, -1, -1):
        stack.append(items[index])
        if index:
            stack.append(_COMMA)
    stack.append(_OPEN_ARR)
    return complete


def _first(iterable: Any, limit: int) -> Any:
    for index, item in enumerate(iterable):
        if index >= limit:
            return
        yield item


def _json_default(obj: Any) -> Any:
    """What the C encoder cannot write itself: models, bytes, sets, str/number subclasses are handled."""
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(obj)).decode("ascii")
    if isinstance(obj, (set, frozenset)):
        return list(obj)
    if isinstance(obj, (dict, Mapping)):
        return dict(obj)
    plain = _plain(obj)
    return plain


def _size_as_json(value: Any, estimator: Estimator) -> Size | None:
    """Size ``value`` from its compact JSON (one C-speed linear pass); None when it cannot be written."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_json_default)
    except (TypeError, ValueError, RecursionError, OverflowError):
        return None
    except Exception:  # a model_dump or __str__ that raises inside the encoder
        return None
    return Size(estimator(text), utf8_len(text), None)


class _TooLarge(Exception):
    """The walk would pass MAX_NODES: size the value another way."""


_SEQUENCES = (list, tuple, set, frozenset)


def _flat_skeleton(mapping: dict[Any, Any], depth: int = 0) -> str | None:
    """The compact JSON of a small dict of short scalars, or of such dicts one level down (most framing and
    _meta, e.g. the 2026 protocol's serverInfo envelope), or None."""
    parts = []
    for key, val in mapping.items():
        kind = type(val)
        if type(key) is not str:
            return None
        if kind is dict and depth == 0 and len(val) <= 8:
            inner = _flat_skeleton(val, 1)
            if inner is None:
                return None
            parts.append(f'"{key}":{inner}')
        elif kind is str and len(val) <= INLINE_LIMIT:
            parts.append(f'"{key}":"{val}"')
        elif kind is bool:
            parts.append(f'"{key}":true' if val else f'"{key}":false')
        elif val is None:
            parts.append(f'"{key}":null')
        elif kind is int or kind is float:
            parts.append(f'"{key}":{val!r}')
        else:
            return None
    return "{" + ",".join(parts) + "}"


def size_value(value: Any, estimator: Estimator) -> Size:
    """Size ``value`` as its compact JSON would be inserted into a model's context."""
    if type(value) is dict and len(value) <= 8:  # the hot path: framing, small _meta, arguments
        flat = _flat_skeleton(value)
        if flat is not None:  # a skeleton is never empty: its Size is the same as the string's
            if len(flat) > SHORT_CACHE_CHARS:
                return Size(estimator(flat), utf8_len(flat))
            return _short_size(flat, estimator)
    try:
        return _walk(value, estimator, partial=False)
    except _TooLarge:
        pass
    size = _size_as_json(value, estimator)
    if size is not None:
        return size
    return _walk(value, estimator, partial=True)


def _walk(value: Any, estimator: Estimator, *, partial: bool) -> Size:
    """The walker; past MAX_NODES it raises _TooLarge, or with ``partial`` stops and says it undercounts.

    The bound is checked before a container is expanded (queued items count), so a 3M-key dict costs
    nothing here: it is refused at once.
    """
    skeleton: list[str] = []
    long_tokens = 0
    long_bytes = 0
    reasons: list[str] = []
    open_containers: set[int] = set()
    nodes = 0
    queued = 0  # values queued on the stack and not yet visited
    # The stack holds values still to write, skeleton text (_Lit) and container exits (_Exit).
    # Dispatch is on the exact type first: an ABC isinstance check costs far more.
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is _Lit:
            skeleton.append(item)
            continue
        if kind is _Exit:
            open_containers.discard(item)
            continue
        nodes += 1
        if nodes > MAX_NODES:
            reasons.append(f"stopped after {MAX_NODES} nodes (undercount)")
            break
        if kind is str:
            if len(item) <= INLINE_LIMIT:
                skeleton.append(f'"{item}"')
            else:
                skeleton.append('""')
                long_tokens += estimator(item)
                long_bytes += utf8_len(item)
        elif kind in _SCALARS:
            skeleton.append("null" if item is None else ("true" if item else "false") if kind is bool else repr(item))
        elif kind is dict or kind is list or isinstance(item, (Mapping, *_SEQUENCES)):
            if id(item) in open_containers:
                reasons.append("circular reference skipped")
                skeleton.append("null")
                continue
            try:
                width = len(item)
            except Exception:
                width = 0
            room = MAX_NODES - nodes - queued
            if width > room and not partial:
                raise _TooLarge
            open_containers.add(id(item))
            limit = max(0, room)
            if kind is dict or (kind is not list and isinstance(item, (dict, Mapping))):
                complete = _push_mapping(stack, item, limit)
            else:
                complete = _push_sequence(stack, item, limit)
            queued += min(width, limit)
            if not complete:
                reasons.append(f"stopped after {MAX_NODES} nodes (undercount)")
        elif isinstance(item, (bytes, bytearray, memoryview)):
            text, scale = _bytes_as_base64(item)
            skeleton.append('""')
            long_tokens += round(estimator(text) * scale)
            long_bytes += round(len(text) * scale)
        elif isinstance(item, str):  # subclasses (enums...): the base-class conversion always gives an exact str
            stack.append(str.__str__(item))
            queued += 1
        elif isinstance(item, (int, float)):
            stack.append(float.__float__(item) if isinstance(item, float) else int.__int__(item))
            queued += 1
        else:
            # Every conversion counts as a node, so a value that converts to itself cannot loop forever.
            stack.append(_plain(item))
            queued += 1
        queued -= 1 if queued > 0 else 0
    text = "".join(skeleton)
    tokens = long_tokens + (estimate_cached(text, estimator) if text else 0)
    size = long_bytes + utf8_len(text)
    return Size(tokens, size, "; ".join(dict.fromkeys(reasons)) or None)
