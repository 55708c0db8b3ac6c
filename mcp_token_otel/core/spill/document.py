"""What a spill keeps of a tool result: its parts, in the order a model reads them.

A ``tools/call`` result becomes a sequence of *parts*, each paged on its own terms:

* a text block, or an embedded resource's text: its text (``text``), paged into slices that concatenate to
  it byte for byte;
* such a text that is JSON: a top-level array is paged by whole items (``items``: each page a JSON array of
  consecutive items, written as the original's bytes); a value wrapped in single-key objects
  (``{"content": "..."}``, ``{"result": [...]}``) is unwrapped first, so a file read through a server that
  wraps it pages the file's own text, and ``pointer`` says where it was (``/content``); any other JSON is
  paged as text;
* ``structuredContent``, unless it repeats a text block (the same JSON, or a single-key object around the
  very text): its compact JSON, with the same rules;
* an image, audio or blob block (``blob``): one piece, never cut;
* any other block (a resource link, an unknown type): its compact JSON, as text.

JSON that is not strict (``NaN``, ``Infinity``), too deep for the parser, larger than MAX_JSON_CHARS or with
more than MAX_ITEMS items is paged as text: pages of its bytes are always possible.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from ..payload import Estimator

TEXT = "text"
ITEMS = "items"
BLOB = "blob"
#: JSON texts longer than this are paged as text without being parsed.
MAX_JSON_CHARS = 8 << 20
#: Arrays with more items than this are paged as text (the item scan is a Python loop).
MAX_ITEMS = 250_000
#: How deep single-key wrappers are unwrapped.
MAX_UNWRAP = 4
#: Items read for the summary's keys, and keys named at most.
SUMMARY_ITEMS = 64
SUMMARY_KEYS = 12

_WS = re.compile(r"[ \t\n\r]*")
_JSON_WS = " \t\n\r"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
#: The decoder's C scanner (not in its type stubs): one value from a position, (value, end) or StopIteration.
_SCAN: Callable[[str, int], tuple[Any, int]] = cast(Any, _DECODER).scan_once


@dataclass(frozen=True, slots=True)
class JsonSummary:
    """What a JSON part is, for the notice's summary: an array's item count and the keys of its items, or an
    object's member count and keys."""

    source: str
    pointer: str
    shape: str  # "array" or "object"
    count: int
    #: The keys (first seen first) of an array's object items, or of the object; at most SUMMARY_KEYS.
    keys: tuple[str, ...] = ()
    more_keys: bool = False
    #: An array whose items (the first SUMMARY_ITEMS) are all objects.
    objects: bool = False


@dataclass(frozen=True, slots=True)
class Part:
    """One part of a kept result. ``text`` is what is paged: the text itself, an array's JSON text (items), or
    a blob's base64 data."""

    source: str
    kind: str
    mime: str
    text: str
    #: Where the paged value sits inside the source's JSON ("" for the source itself).
    pointer: str = ""
    #: UTF-8 bytes of ``text``; for a blob, its decoded bytes.
    size: int = 0
    summary: JsonSummary | None = None
    #: A blob's tokens as a page reads it (its base64 text).
    tokens: int = 0


@dataclass(slots=True)
class Draft:
    """A part and, for an items part, the spans of its items in ``part.text`` (used while paging, then dropped)."""

    part: Part
    starts: array[int] | None = None
    ends: array[int] | None = None


def utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _base64_bytes(data: str) -> int:
    stripped = data.rstrip("=")
    return len(stripped) * 3 // 4


# ------------------------------------------------------------------------------------------------ JSON


def _skip_ws(text: str, pos: int) -> int:
    match = _WS.match(text, pos)
    return match.end() if match else pos


def _parse(text: str) -> Any:
    """The JSON value of ``text`` (strict: no NaN/Infinity), or _NOT_JSON."""
    first = text.lstrip(_JSON_WS)[:1]
    if first not in ("{", "[") or len(text) > MAX_JSON_CHARS:
        return _NOT_JSON
    try:
        return _DECODER.decode(text)
    except (ValueError, RecursionError):
        return _NOT_JSON


_NOT_JSON = object()


def _unwrap(text: str, start: int, end: int, value: Any) -> tuple[int, int, Any, str]:
    """Descend through single-key objects: (start, end, value, pointer) of the innermost value, its span in
    ``text`` checked member by member (a duplicated key makes the span differ: the descent stops there)."""
    pointer = ""
    for _ in range(MAX_UNWRAP):
        if not (isinstance(value, dict) and len(value) == 1):
            break
        key, inner = next(iter(value.items()))
        try:
            pos = _skip_ws(text, start + 1)
            _, pos = _DECODER.raw_decode(text, pos)  # the key
            pos = _skip_ws(text, pos)
            if text[pos : pos + 1] != ":":
                break
            inner_start = _skip_ws(text, pos + 1)
            _, inner_end = _DECODER.raw_decode(text, inner_start)
        except (ValueError, RecursionError):
            break
        if _skip_ws(text, inner_end) != end - 1:  # another member follows: a duplicated key
            break
        start, end, value = inner_start, inner_end, inner
        pointer += "/" + key.replace("~", "~0").replace("/", "~1")
    return start, end, value, pointer


def _keys(values: Any) -> tuple[tuple[str, ...], bool]:
    seen: dict[str, None] = {}
    more = False
    for obj in values:
        for key in obj:
            if key not in seen:
                if len(seen) >= SUMMARY_KEYS:
                    more = True
                    break
                seen[key] = None
    return tuple(seen), more


def item_spans(text: str) -> tuple[array[int], array[int], JsonSummary] | None:
    """Where each item of the JSON array ``text`` (a valid array, nothing around it) starts and ends, and the
    summary of its items; None past MAX_ITEMS items or on anything unexpected."""
    starts: array[int] = array("q")
    ends: array[int] = array("q")
    sample: list[Any] = []
    objects = True
    scan = _SCAN
    pos = _skip_ws(text, 1)
    last = len(text) - 1
    try:
        if pos == last:
            return starts, ends, JsonSummary("", "", "array", 0)
        while True:
            value, end = scan(text, pos)
            starts.append(pos)
            ends.append(end)
            if len(starts) <= SUMMARY_ITEMS:
                objects = objects and isinstance(value, dict)
                if isinstance(value, dict):
                    sample.append(value)
            elif len(starts) > MAX_ITEMS:
                return None
            if text[end] == ",":  # the compact separator; else whitespace around the comma
                pos = end + 1
            else:
                pos = _skip_ws(text, end)
                if pos == last:
                    break
                if text[pos] != ",":
                    return None
                pos += 1
            if text[pos] in _JSON_WS:
                pos = pos + 1 if text[pos + 1] not in _JSON_WS else _skip_ws(text, pos)
    except (StopIteration, ValueError, RecursionError, IndexError):
        return None
    keys, more = _keys(sample) if objects else ((), False)
    return starts, ends, JsonSummary("", "", "array", len(starts), keys, more, objects)


def _items_draft(source: str, mime: str, body: str, pointer: str) -> Draft | None:
    """An items part of the JSON array ``body``, or None (not an array, too many items)."""
    if not (body.startswith("[") and body.endswith("]")):
        return None
    spans = item_spans(body)
    if spans is None:
        return None
    starts, ends, found = spans
    summary = JsonSummary(source, pointer, "array", found.count, found.keys, found.more_keys, found.objects)
    return Draft(Part(source, ITEMS, mime, body, pointer, utf8_len(body), summary), starts, ends)


#: json_draft's ``value`` when the caller has not parsed the text.
UNPARSED = object()


def json_draft(text: str, source: str, mime: str | None, value: Any = UNPARSED) -> Draft:
    """The part of a text (a text block, a resource's text, structuredContent's JSON): JSON unwrapped and
    paged by items where it can be, else the text itself. ``value``: the text parsed, when the caller has it."""
    start = len(text) - len(text.lstrip(_JSON_WS))
    end = len(text.rstrip(_JSON_WS))
    json_mime = mime or "application/json"
    scanned = False
    if value is UNPARSED and text[start : start + 1] == "[" and end - start <= MAX_JSON_CHARS:
        # A top-level array: the item scan reads (and checks) it once; parsed first, it would be read twice.
        draft = _items_draft(source, json_mime, text[start:end], "")
        if draft is not None:
            return draft
        scanned = True
    if value is UNPARSED:
        value = _parse(text)
    if value is _NOT_JSON:
        return Draft(Part(source, TEXT, mime or "text/plain", text, size=utf8_len(text)))
    start, end, inner, pointer = _unwrap(text, start, end, value)
    if isinstance(inner, str) and pointer:
        return Draft(Part(source, TEXT, "text/plain", inner, pointer, utf8_len(inner)))
    summary = None
    if isinstance(inner, list):
        draft = None if scanned and not pointer else _items_draft(source, json_mime, text[start:end], pointer)
        if draft is not None:
            return draft
        summary = JsonSummary(source, pointer, "array", len(inner))
    elif isinstance(inner, dict):
        keys, more = _keys([inner])
        summary = JsonSummary(source, pointer, "object", len(inner), keys, more)
    return Draft(Part(source, TEXT, json_mime, text, "", utf8_len(text), summary))


# ------------------------------------------------------------------------------------------------ results


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except RecursionError:
        return False


def _repeats(structured: Any, texts: list[tuple[str, Any]]) -> bool:
    """structuredContent says what a text block says: the same JSON, or a single-key object around the text
    (or around its JSON)."""
    wrapped = next(iter(structured.values())) if isinstance(structured, dict) and len(structured) == 1 else _NOT_JSON
    for text, parsed in texts:
        if wrapped is not _NOT_JSON and isinstance(wrapped, str) and wrapped == text:
            return True
        if parsed is _NOT_JSON:
            continue
        if _same(parsed, structured) or (wrapped is not _NOT_JSON and _same(parsed, wrapped)):
            return True
    return False


def _compact(value: Any) -> str | None:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return None


def drafts_of(result: Mapping[str, Any], estimator: Estimator) -> tuple[list[Draft], list[str]]:
    """The parts of a ``tools/call`` result (a wire dict), and the sources left out (a value JSON cannot
    write: a cycle, a non-string key, nesting past the writer's stack)."""
    drafts: list[Draft] = []
    omitted: list[str] = []
    texts: list[tuple[str, Any]] = []
    has_structured = "structuredContent" in result
    content = result.get("content")
    for index, block in enumerate(content if isinstance(content, list) else ()):
        source = f"content[{index}]"
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text" and isinstance(block.get("text"), str):
            text = block["text"]
            # Parsed up front only to compare with structuredContent; json_draft reads an array more cheaply.
            parsed = _parse(text) if has_structured else UNPARSED
            drafts.append(json_draft(text, source, None, parsed))
            if has_structured:
                texts.append((text, parsed))
            continue
        resource = block.get("resource") if kind == "resource" else None
        if isinstance(resource, Mapping) and isinstance(resource.get("text"), str):
            mime = resource.get("mimeType")
            drafts.append(json_draft(resource["text"], source, mime if isinstance(mime, str) else None))
            continue
        data: Any = None
        mime = None
        if kind in ("image", "audio"):
            data, mime = block.get("data"), block.get("mimeType")
        elif isinstance(resource, Mapping):
            data, mime = resource.get("blob"), resource.get("mimeType")
        if isinstance(data, str):
            mime = mime if isinstance(mime, str) else "application/octet-stream"
            drafts.append(Draft(Part(source, BLOB, mime, data, "", _base64_bytes(data), None, estimator(data))))
            continue
        dumped = _compact(block)
        if dumped is None:
            omitted.append(source)
        else:
            drafts.append(Draft(Part(source, TEXT, "application/json", dumped, "", utf8_len(dumped))))
    if has_structured and not _repeats(result["structuredContent"], texts):
        dumped = _compact(result["structuredContent"])
        if dumped is None:
            omitted.append("structuredContent")
        else:
            drafts.append(json_draft(dumped, "structuredContent", None))
    return drafts, omitted
