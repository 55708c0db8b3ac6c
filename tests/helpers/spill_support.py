"""Helpers of the spill tests: a large real text file, and reading a spill back the way a client would."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from mcp_token_otel.core.estimation import estimate_tokens
from mcp_token_otel.core.spill import META_SPILL_KEY, Spill, page_result

STDLIB = Path(json.__file__).resolve().parent.parent


@functools.lru_cache(maxsize=4)
def source_file(tokens: int) -> str:
    """The standard library's own sources, concatenated in name order and cut to about ``tokens`` tokens: a real
    text of real lines (code, docstrings, some non-ASCII), the same on every run of one Python."""
    parts: list[str] = []
    total = 0
    for path in sorted(STDLIB.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        # A line of other scripts between files: the pages must keep multi-byte characters whole too.
        parts.append(text + "# \u2014 caf\u00e9, na\u0131\u0308ve, \u4e2d\u6587, \U0001f600, \r\n")
        total += estimate_tokens(parts[-1])
        if total >= tokens * 1.3:
            break
    whole = "".join(parts)
    lo, hi = 0, len(whole)  # the shortest prefix estimated at ``tokens`` or more
    while lo < hi:
        mid = (lo + hi) // 2
        if estimate_tokens(whole[:mid]) >= tokens:
            hi = mid
        else:
            lo = mid + 1
    return whole[:lo]


def read_all(spill: Spill, spill_id: str = "0" * 32) -> list[dict[str, Any]]:
    """Every page's ReadResourceResult, in order, following each page's ``next``."""
    out = []
    page = 1
    while True:
        result = page_result(spill, spill_id, page)
        out.append(result)
        meta = result["_meta"][META_SPILL_KEY]
        if "next" not in meta:
            return out
        page += 1
        assert meta["next"].endswith(f"?page={page}")


def part_texts(pages: list[dict[str, Any]]) -> dict[int, list[str]]:
    """The texts of every piece of each part, in reading order."""
    out: dict[int, list[str]] = {}
    for result in pages:
        for item in result["contents"]:
            meta = item["_meta"][META_SPILL_KEY]
            out.setdefault(meta["part"], []).append(item.get("text", item.get("blob")))
    return out


def part_items(pages: list[dict[str, Any]], part: int) -> list[Any]:
    """The items of an items part, read back as a client would: each items piece parsed, each item cut as text
    joined up to the piece whose ``itemContinues`` is false, then parsed."""
    items: list[Any] = []
    pending = ""
    for result in pages:
        for piece in result["contents"]:
            meta = piece["_meta"][META_SPILL_KEY]
            if meta["part"] != part:
                continue
            if "items" in meta:
                value = json.loads(piece["text"])
                assert isinstance(value, list) and meta["items"][:2] == [len(items), len(items) + len(value)]
                items.extend(value)
            else:
                assert meta["item"] == len(items)
                pending += piece["text"]
                if not meta["itemContinues"]:
                    items.append(json.loads(pending))
                    pending = ""
    assert pending == ""
    return items
