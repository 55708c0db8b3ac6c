"""What a cut result carries about its spill: a ``resource_link`` block to the kept result, the page where the
text shown ends (so the notice can say where to read on), and the JSON summaries the notice states.

The sentence itself is written by :func:`mcp_token_otel.core.guard.notices.spill_hint` with the other texts the
guards put in front of a model; :func:`with_spill` puts the notice and the link at the end of a cut result.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .document import BLOB, ITEMS, MAX_JSON_CHARS, JsonSummary, Part
from .paging import Spill
from .uri import META_SPILL_KEY, PREFIX, spill_uri

#: Tool names longer than this are shortened in the link's name.
_NAME_CHARS = 64


def link_block(spill: Spill, spill_id: str) -> dict[str, Any]:
    """The ``resource_link`` content block to a spill: its URI (page 1 is the bare URI), a name from the tool,
    the parts' media type (``multipart/mixed`` when they differ), ``size`` in bytes and, in ``_meta``, the
    whole result's tokens, the page count and the page size."""
    tool = spill.tool or "tool"
    if len(tool) > _NAME_CHARS:
        tool = tool[: _NAME_CHARS - 1] + "\u2026"
    mimes = {_mime(part) for part in spill.parts}
    return {
        "type": "resource_link",
        "uri": spill_uri(spill_id),
        "name": f"{tool} result",
        "mimeType": mimes.pop() if len(mimes) == 1 else "multipart/mixed",
        "size": spill.size,
        "_meta": {META_SPILL_KEY: {"tokens": spill.tokens, "pages": spill.page_count,
                                   "pageTokens": spill.page_tokens}},
    }


def _mime(part: Part) -> str:
    return part.mime


def is_spill_link(block: Any) -> bool:
    """A resource link a spill added (a guard downstream must not count it as the tool's data)."""
    if not isinstance(block, Mapping) or block.get("type") != "resource_link":
        return False
    uri = block.get("uri")
    return isinstance(uri, str) and uri[: len(PREFIX)].lower() == PREFIX


def summaries(spill: Spill, limit: int = 2) -> list[JsonSummary]:
    """The JSON summaries the notice states: the first ``limit`` parts that are JSON arrays or objects."""
    return [part.summary for part in spill.parts if part.summary is not None][:limit]


def with_spill(cut: Mapping[str, Any], notice: str, link: Mapping[str, Any]) -> dict[str, Any]:
    """``cut`` (a result the response cap cut, its last block the truncation notice) with that notice's text
    replaced by ``notice`` and ``link`` after it."""
    content = list(cut.get("content") or [])
    if content and isinstance(content[-1], Mapping) and content[-1].get("type") == "text":
        content[-1] = {**content[-1], "text": notice}
    else:
        content.append({"type": "text", "text": notice})
    content.append(dict(link))
    return {**cut, "content": content}


# --------------------------------------------------------------------------------------------- where to read on


def _descend(value: Any, pointer: str) -> Any:
    for raw in pointer.split("/")[1:] if pointer else ():
        key = raw.replace("~1", "/").replace("~0", "~")
        if not isinstance(value, dict) or key not in value:
            return _MISSING
        value = value[key]
    return value


_MISSING = object()


def _shown_value(part: Part, shown: Any) -> Any:
    """What the cut shows of ``part``: its text block's text or structuredContent, unwrapped like the part."""
    if part.kind == ITEMS or part.pointer:
        if isinstance(shown, str):
            if len(shown) > MAX_JSON_CHARS:
                return _MISSING
            try:
                shown = json.loads(shown)
            except (ValueError, RecursionError):
                return _MISSING
        return _descend(shown, part.pointer)
    return shown


def _resume_in(spill: Spill, index: int, part: Part, original: Any, shown: Any) -> int | None:
    """None when the cut shows all of ``part``; else the page to read on from."""
    if shown is _MISSING:
        return spill.page_at(index)
    try:
        if shown == original:
            return None
    except RecursionError:
        pass
    value = _shown_value(part, shown)
    if part.kind == ITEMS:
        count = part.summary.count if part.summary else 0
        if isinstance(value, list):
            return None if len(value) >= count else spill.page_at(index, item=len(value))
        return spill.page_at(index)
    if part.kind == BLOB:
        return spill.page_at(index)
    if isinstance(value, str) and part.text.startswith(value):
        return None if len(value) == len(part.text) else spill.page_at(index, len(value))
    return spill.page_at(index)


def resume_page(spill: Spill, full: Mapping[str, Any], cut: Mapping[str, Any]) -> int:
    """The page where what the cut result shows ends: the page holding the first character (or item) of the
    kept result it does not show; 1 when that cannot be told (the cut rewrote the part)."""
    full_content = full.get("content")
    cut_content = cut.get("content")
    full_blocks = full_content if isinstance(full_content, list) else []
    cut_blocks = cut_content if isinstance(cut_content, list) else []
    for index, part in enumerate(spill.parts):
        if part.source == "structuredContent":
            original: Any = full.get("structuredContent")
            shown: Any = cut.get("structuredContent", _MISSING)
        else:
            at = int(part.source[len("content[") : -1])
            original = full_blocks[at] if at < len(full_blocks) else _MISSING
            block = cut_blocks[at] if at < len(cut_blocks) else _MISSING
            if original is _MISSING or block is _MISSING or not isinstance(block, Mapping):
                return spill.page_at(index)
            if block == original:
                continue
            if block.get("type") != original.get("type"):
                return spill.page_at(index)
            resource = block.get("resource")
            shown = resource.get("text", _MISSING) if isinstance(resource, Mapping) else block.get("text", _MISSING)
            resource = original.get("resource")
            original = resource.get("text") if isinstance(resource, Mapping) else original.get("text")
        page = _resume_in(spill, index, part, original, shown)
        if page is not None:
            return page
    return 1
