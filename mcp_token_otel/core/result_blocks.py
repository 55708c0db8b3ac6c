"""The output side, block by block: content blocks (text, image, audio, resource link, embedded resource), a
structuredContent that repeats a text block, resources/read contents, prompts/get messages and the items of
list results, each split into data and overhead by the rule in :mod:`.measure`'s docstring.

Media: an image block counts the tokens its dimensions cost under ``Policy.image_tokens`` (read from the
header only, see core/media.py), a WAV audio block the tokens of its duration. An image whose header cannot
be read, and audio in any other format (no duration in a fixed header), count their base64 text, the upper
bound, and say so in ``reason``; so does every media block under the rule "base64". Embedded resource blobs
count their base64 text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .measurement import Builder, as_mapping
from .media import media_tokens
from .payload import ZERO, Size

#: Content blocks, list items and result fields measured one by one; the rest is sized in bulk.
MAX_BLOCKS = 2000
#: Text blocks larger than this are not parsed when looking for a duplicated structuredContent.
_MAX_DUPLICATE_CHECK_CHARS = 4 << 20
#: List results whose items are definitions, and the fields of an item that are data.
LIST_DATA_FIELDS: dict[str, tuple[str, ...]] = {
    "tools": ("name", "description", "inputSchema", "outputSchema"),
    "prompts": ("name", "description", "arguments"),
    "resources": ("uri", "name", "description"),
    "resourceTemplates": ("uriTemplate", "name", "description"),
}
RESULT_PAYLOAD_KEYS = frozenset({"content", "structuredContent", "contents", "messages", *LIST_DATA_FIELDS})
#: A text block's framing when it is exactly {type, text}, and MCPServer's structuredContent wrapper less the text.
TEXT_FRAMING: dict[str, str] = {"type": "text"}
RESULT_WRAPPER: dict[str, str] = {"result": ""}


def _content_block(b: Builder, block: Any, type_prefix: str = "") -> tuple[str, Size] | None:
    """Add one content block; for a text block, return its text and data size (duplicate detection)."""
    blk = as_mapping(block)
    if blk is None:
        b.add(type_prefix + "unknown", b.value(block))
        return None
    kind = blk.get("type")
    label = type_prefix + (kind if isinstance(kind, str) else "unknown")
    if kind == "text":
        text = blk.get("text")
        data = b.text(text)
        # The common block is exactly {type, text}: its framing is {"type": "text"} (no copy of the block).
        rest = TEXT_FRAMING if len(blk) == 2 and "text" in blk else {k: v for k, v in blk.items() if k != "text"}
        b.add(label, data, b.value(rest) if rest else ZERO)
        return (text, data) if isinstance(text, str) else None
    if kind in ("image", "audio"):
        _media_block(b, blk, label, kind)
    elif kind == "resource_link":
        b.split(label, blk, ("uri", "name", "title", "description"))
    elif kind == "resource":
        _embedded_resource(b, blk, label)
    else:
        b.add(label, b.value(blk))
    return None


def _media_block(b: Builder, blk: Mapping[str, Any], label: str, kind: str) -> None:
    """An image or audio block: its data counts what the picture or sound costs when its header says."""
    data = blk.get("data")
    text = data if type(data) is str else None
    tokens = None if text is None else media_tokens(kind, text, b.policy.image_tokens)
    if text is None or tokens is None:
        if text is not None and b.policy.image_tokens != "base64":
            what = "header unreadable" if kind == "image" else "duration unknown"
            b.reasons.append(f"{kind} {what}: counted as its base64 text")
        b.split(label, blk, ("data",))
        return
    rest = {k: v for k, v in blk.items() if k != "data"}
    b.add(label, Size(tokens, len(text)), b.value(rest))


def _embedded_resource(b: Builder, blk: Mapping[str, Any], label: str) -> None:
    resource = as_mapping(blk.get("resource")) or {}
    key = "text" if "text" in resource else "blob"
    data = b.text(resource.get(key))
    rest = {k: v for k, v in blk.items() if k != "resource"}
    rest["resource"] = {k: v for k, v in resource.items() if k != key}
    b.add(label, data, b.value(rest))


def _parsed_json(text: str) -> Any:
    stripped = text.strip()
    if not stripped or stripped[0] not in "{[" or len(stripped) > _MAX_DUPLICATE_CHECK_CHARS:
        return _NOT_JSON
    try:
        return json.loads(stripped)
    except (ValueError, RecursionError):
        return _NOT_JSON


_NOT_JSON = object()


def _duplicate_of(structured: Any, texts: list[tuple[str, Size]]) -> tuple[Size, str | None] | None:
    """How structuredContent repeats a text block, if it does: (that text's size, the key of the one-member
    object that wraps the very string, or None when the structure is the text's JSON). A wrapper's size is then
    the text's plus the wrapper's: MCPServer's ``{"result": text}``, the filesystem server's ``{"content": text}``,
    any one-member object around a text block."""
    key: str | None = None
    wrapped: Any = _NOT_JSON
    if isinstance(structured, (dict, Mapping)) and len(structured) == 1:
        key, wrapped = next(iter(structured.items()))
        if not isinstance(key, str):
            key, wrapped = None, _NOT_JSON
    for text, size in texts:
        if wrapped is not _NOT_JSON and (wrapped is text or wrapped == text):
            return size, key
        parsed = _parsed_json(text)
        if parsed is _NOT_JSON:
            continue
        try:
            if parsed == structured or (wrapped is not _NOT_JSON and parsed == wrapped):
                return size, None
        except RecursionError:
            continue
    return None


def _bounded(b: Builder, items: list[Any], label: str) -> list[Any]:
    """The items to measure one by one; past MAX_BLOCKS the rest is sized in bulk from its JSON, split into
    data and overhead in the proportion the measured ones had (bounded time, no silent undercount)."""
    if len(items) <= MAX_BLOCKS:
        return items
    head, tail = items[:MAX_BLOCKS], items[MAX_BLOCKS:]

    def bulk() -> None:
        measured_total = sum(blk.tokens for blk in b.blocks[start:])
        measured_overhead = sum(blk.overhead_tokens for blk in b.blocks[start:])
        share = measured_overhead / measured_total if measured_total else 0.0
        # The tail's JSON is scaled by how the measured head compares with its own JSON: the rules above
        # count a text block's text verbatim, not as a JSON string with its key and quotes.
        as_json = b.value(head)
        scale = measured_total / as_json.tokens if as_json.tokens and measured_total else 1.0
        raw = b.value(tail)
        size = Size(round(raw.tokens * scale), raw.bytes)
        overhead = Size(round(size.tokens * share), round(size.bytes * share))
        b.add(f"{label}:bulk", Size(size.tokens - overhead.tokens, size.bytes - overhead.bytes), overhead)
        b.reasons.append(f"{len(tail)} {label} items past the first {MAX_BLOCKS} sized in bulk from their JSON")

    start = len(b.blocks)
    b.pending.append(bulk)
    return head


def measure_payload(b: Builder, result: Mapping[str, Any]) -> None:
    content = result.get("content")
    texts: list[tuple[str, Size]] = []  # text blocks and their data sizes, to spot a duplicate
    if isinstance(content, list):
        for block in _bounded(b, content, "content"):
            data = _content_block(b, block)
            if data is not None:
                texts.append(data)
        b.run_pending()
    if "structuredContent" in result:
        structured = result["structuredContent"]
        duplicate = _duplicate_of(structured, texts)
        if duplicate is None:
            b.add("structuredContent", b.value(structured))
        elif duplicate[1] is not None:  # {key: text}: no need to estimate the same string twice
            text = duplicate[0]
            wrapper = b.value(RESULT_WRAPPER) if duplicate[1] == "result" else b.value({duplicate[1]: ""})
            b.add("structuredContent", overhead=Size(text.tokens + wrapper.tokens, text.bytes + wrapper.bytes))
        else:
            b.add("structuredContent", overhead=b.value(structured))
    contents = result.get("contents")
    if isinstance(contents, list):  # resources/read
        for item in _bounded(b, contents, "contents"):
            res = as_mapping(item) or {}
            b.split("resource", res, ("text",) if "text" in res else ("blob",))
        b.run_pending()
    messages = result.get("messages")
    if isinstance(messages, list):  # prompts/get
        for message in _bounded(b, messages, "messages"):
            msg = as_mapping(message) or {}
            _content_block(b, msg.get("content"), "message:")
            rest = {k: v for k, v in msg.items() if k != "content"}
            if rest:
                b.add("message_framing", overhead=b.value(rest))
        b.run_pending()
    for key, data_fields in LIST_DATA_FIELDS.items():
        items = result.get(key)
        if isinstance(items, list):
            singular = key[:-1]
            for item in _bounded(b, items, key):
                definition = as_mapping(item)
                if definition is None:
                    b.add(singular, b.value(item))
                else:
                    b.split(singular, definition, data_fields)
            b.run_pending()
