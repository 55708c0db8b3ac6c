"""A spill as plain JSON data and back, for a store shared by several processes (any replica serves a read).

The document holds the parts' texts and the precomputed pages, so a replica answers a read without paging
again; :func:`spill_from_wire` checks every field and raises ``ValueError`` on anything it did not write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .document import BLOB, ITEMS, TEXT, JsonSummary, Part
from .paging import Piece, Spill

VERSION = 1
_KINDS = (TEXT, ITEMS, BLOB)


def spill_to_wire(spill: Spill) -> dict[str, Any]:
    def summary(s: JsonSummary | None) -> dict[str, Any] | None:
        if s is None:
            return None
        return {"source": s.source, "pointer": s.pointer, "shape": s.shape, "count": s.count, "keys": list(s.keys),
                "moreKeys": s.more_keys, "objects": s.objects}

    return {
        "v": VERSION,
        "pageTokens": spill.page_tokens,
        "tokens": spill.tokens,
        "size": spill.size,
        "memory": spill.memory,
        "tool": spill.tool,
        "omitted": list(spill.omitted),
        "parts": [{"source": p.source, "kind": p.kind, "mime": p.mime, "text": p.text, "pointer": p.pointer,
                   "size": p.size, "tokens": p.tokens, "summary": summary(p.summary)} for p in spill.parts],
        "pages": [[[x.part, x.start, x.end, x.first_byte, x.end_byte, x.tokens, x.first_item, x.end_item]
                   for x in page] for page in spill.pages],
    }


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"spill document: {where} is not an integer")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"spill document: {where} is not a string")
    return value


def _summary(data: Any) -> JsonSummary | None:
    if data is None:
        return None
    if not isinstance(data, Mapping) or not isinstance(data.get("keys"), list):
        raise ValueError("spill document: a summary is not an object with keys")
    return JsonSummary(
        _str(data.get("source"), "summary.source"), _str(data.get("pointer"), "summary.pointer"),
        _str(data.get("shape"), "summary.shape"), _int(data.get("count"), "summary.count"),
        tuple(_str(k, "summary.keys") for k in data["keys"]), bool(data.get("moreKeys")), bool(data.get("objects")),
    )


def spill_from_wire(data: Any) -> Spill:
    if not isinstance(data, Mapping) or data.get("v") != VERSION:
        raise ValueError(f"spill document: expected an object of version {VERSION}")
    raw_parts, raw_pages = data.get("parts"), data.get("pages")
    if not isinstance(raw_parts, list) or not isinstance(raw_pages, list):
        raise ValueError("spill document: parts and pages are lists")
    parts: list[Part] = []
    for p in raw_parts:
        if not isinstance(p, Mapping) or p.get("kind") not in _KINDS:
            raise ValueError("spill document: a part is not an object of a known kind")
        parts.append(Part(
            _str(p.get("source"), "part.source"), p["kind"], _str(p.get("mime"), "part.mime"),
            _str(p.get("text"), "part.text"), _str(p.get("pointer"), "part.pointer"), _int(p.get("size"), "part.size"),
            _summary(p.get("summary")), _int(p.get("tokens"), "part.tokens"),
        ))
    pages: list[tuple[Piece, ...]] = []
    for page in raw_pages:
        if not isinstance(page, list) or not page:
            raise ValueError("spill document: a page is not a non-empty list")
        pieces = []
        for raw in page:
            if not isinstance(raw, list) or len(raw) != 8:
                raise ValueError("spill document: a piece is not a list of 8 integers")
            piece = Piece(*(_int(v, "piece") for v in raw))
            if not (0 <= piece.part < len(parts) and 0 <= piece.start <= piece.end <= len(parts[piece.part].text)):
                raise ValueError("spill document: a piece points outside its part")
            pieces.append(piece)
        pages.append(tuple(pieces))
    tool = data.get("tool")
    omitted = data.get("omitted") or []
    return Spill(
        tuple(parts), tuple(pages), _int(data.get("pageTokens"), "pageTokens"), _int(data.get("tokens"), "tokens"),
        _int(data.get("size"), "size"), _int(data.get("memory"), "memory"),
        _str(tool, "tool") if tool is not None else None,
        tuple(_str(o, "omitted") for o in omitted) if isinstance(omitted, list) else (),
    )
