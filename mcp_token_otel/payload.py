"""Size any JSON-like value in tokens and bytes without ever raising.

MCP payloads are JSON, but what reaches the shim can be anything a caller built: pydantic models,
bytes, non-string keys, shared or circular references, 10,000-deep nesting, 100 MB strings. The
walker here is iterative (no recursion limit), bounded in nodes, and never serialises a long string:

* long strings (above ``INLINE_LIMIT`` characters) are estimated on their own, so a 100 MB string
  costs one sampled estimate, not a 100 MB copy;
* everything else (keys, short strings, numbers, punctuation) is written into a compact JSON-like
  *skeleton* which is estimated once, so structure costs tokens as it would on the wire.

The result is the sum of both. ``reason`` explains a partial answer (cycle, node budget, odd type).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Estimator = Callable[[str], int]

#: Strings longer than this are estimated separately instead of being copied into the skeleton.
INLINE_LIMIT = 256
#: Upper bound on visited nodes; the rest of a larger value is skipped with a reason.
MAX_NODES = 100_000
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


def size_text(text: str, estimator: Estimator) -> Size:
    """Size one string as it would be inserted verbatim."""
    if not text:
        return ZERO
    return Size(estimator(text), utf8_len(text))


def _bytes_as_base64(data: bytes | bytearray | memoryview) -> tuple[str, float]:
    """Base64 text of (a head sample of) ``data`` and the factor that scales it back to the whole."""
    raw = bytes(data[:_BYTES_SAMPLE])
    scale = len(data) / len(raw) if raw else 1.0
    return base64.b64encode(raw).decode("ascii"), scale


class _Punct:
    """Literal skeleton text queued on the walker's stack (keys, separators, brackets)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class _Close(_Punct):
    """A closing bracket; popping it also marks its container as no longer open (cycle detection)."""

    __slots__ = ("ident",)

    def __init__(self, text: str, ident: int) -> None:
        super().__init__(text)
        self.ident = ident


_OPEN_OBJ, _OPEN_ARR, _COMMA = _Punct("{"), _Punct("["), _Punct(",")


def _safe_str(obj: Any) -> str:
    try:
        return str(obj)
    except Exception:
        return f"<{type(obj).__name__}>"


def _plain(obj: Any) -> Any:
    """Turn a non-JSON object (pydantic model, dataclass, bytes...) into something the walker knows."""
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        try:
            return dump(mode="json", by_alias=True, exclude_none=True)
        except Exception:
            return _safe_str(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return _safe_str(obj)


def _push_mapping(stack: list[Any], mapping: Mapping[Any, Any]) -> None:
    try:
        items = list(mapping.items())
    except Exception:
        stack.append(_safe_str(mapping))
        return
    stack.append(_Close("}", id(mapping)))
    for index in range(len(items) - 1, -1, -1):
        key, val = items[index]
        stack.append(val)
        key_text = key if isinstance(key, str) else _safe_str(key)
        stack.append(_Punct(f'"{key_text}":' if index == 0 else f',"{key_text}":'))
    stack.append(_OPEN_OBJ)


def _push_list(stack: list[Any], items: list[Any]) -> None:
    stack.append(_Close("]", id(items)))
    for index in range(len(items) - 1, -1, -1):
        stack.append(items[index])
        if index:
            stack.append(_COMMA)
    stack.append(_OPEN_ARR)


def size_value(value: Any, estimator: Estimator) -> Size:
    """Size ``value`` as its compact JSON would be inserted into a model's context."""
    skeleton: list[str] = []
    long_tokens = 0
    long_bytes = 0
    reasons: list[str] = []
    open_containers: set[int] = set()
    nodes = 0
    # The stack holds values still to write, or literal punctuation to emit once a container closes.
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Punct):
            skeleton.append(item.text)
            if isinstance(item, _Close):
                open_containers.discard(item.ident)
            continue
        nodes += 1
        if nodes > MAX_NODES:
            reasons.append(f"stopped after {MAX_NODES} nodes")
            break
        if isinstance(item, str):
            if len(item) <= INLINE_LIMIT:
                skeleton.append(f'"{item}"')
            else:
                skeleton.append('""')
                long_tokens += estimator(item)
                long_bytes += utf8_len(item)
        elif item is None or isinstance(item, bool):
            skeleton.append("null" if item is None else ("true" if item else "false"))
        elif isinstance(item, (int, float)):
            skeleton.append(repr(item))
        elif isinstance(item, (bytes, bytearray, memoryview)):
            text, scale = _bytes_as_base64(item)
            skeleton.append('""')
            long_tokens += round(estimator(text) * scale)
            long_bytes += round(len(text) * scale)
        elif isinstance(item, (Mapping, list)):
            if id(item) in open_containers:
                reasons.append("circular reference skipped")
                skeleton.append("null")
                continue
            open_containers.add(id(item))
            if isinstance(item, Mapping):
                _push_mapping(stack, item)
            else:
                _push_list(stack, item)
        else:
            stack.append(_plain(item))
            nodes -= 1
    text = "".join(skeleton)
    tokens = long_tokens + (estimator(text) if text else 0)
    size = long_bytes + utf8_len(text)
    return Size(tokens, size, "; ".join(dict.fromkeys(reasons)) or None)


