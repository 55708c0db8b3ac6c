"""JSON text of a value, written only as far as a character limit (content capture on spans).

A 50 MB tool result costs what the 2 KB kept costs: strings are cut before they are encoded, and containers stop
once the limit is met.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: Past this nesting depth a value is written as "…" (a cyclic or absurdly deep structure still ends).
_MAX_DEPTH = 64


def truncate(value: Any, limit: int) -> str:
    """The first ``limit`` characters of ``value``'s JSON (a string is kept as is, not quoted)."""
    if isinstance(value, str):
        return value[:limit]
    out: list[str] = []
    _write(value, out, limit, 0)
    return "".join(out)[:limit]


def _write(value: Any, out: list[str], limit: int, depth: int) -> int:
    """Append JSON for ``value`` to ``out`` until ``limit`` characters are written; returns what is left."""
    if limit <= 0:
        return 0
    if isinstance(value, str):
        piece = json.dumps(value[:limit], ensure_ascii=False)
    elif value is None or isinstance(value, (bool, int, float)):
        piece = json.dumps(value)
    elif depth >= _MAX_DEPTH:
        piece = '"…"'
    elif isinstance(value, (dict, Mapping)):
        return _write_mapping(value, out, limit, depth)
    elif isinstance(value, (list, tuple)):
        return _write_sequence(value, out, limit, depth)
    else:
        piece = json.dumps(str(value)[:limit], ensure_ascii=False)
    out.append(piece)
    return limit - len(piece)


def _write_mapping(value: Mapping[Any, Any], out: list[str], limit: int, depth: int) -> int:
    out.append("{")
    limit -= 1
    for index, (key, item) in enumerate(value.items()):
        if limit <= 0:
            return 0
        key_text = json.dumps(str(key)[:limit], ensure_ascii=False) + ": "  # json.dumps' own separators
        out.append(key_text if index == 0 else ", " + key_text)
        limit = _write(item, out, limit - len(key_text) - 2 * (index > 0), depth + 1)
    out.append("}")
    return limit - 1


def _write_sequence(value: list[Any] | tuple[Any, ...], out: list[str], limit: int, depth: int) -> int:
    out.append("[")
    limit -= 1
    for index, item in enumerate(value):
        if limit <= 0:
            return 0
        if index:
            out.append(", ")
            limit -= 2
        limit = _write(item, out, limit, depth + 1)
    out.append("]")
    return limit - 1
