"""The answer to a ``resources/read`` of a spill URI: one page, or a JSON-RPC error that says why not.

Every error is ``-32602`` (invalid params), the code the MCP specification gives a resource that is not found
(and JSON-RPC gives bad params), with ``data`` ``{"uri": ..., "reason": ...}``; the reason tells them apart:

* ``not_found``: no spill with this id here, or one that belongs to another conversation (the two read the
  same, so an id that leaked tells its holder nothing; the reads counter says ``forbidden`` for the second);
* ``expired``: the reader's own spill, gone (``cause``: ``ttl``, or ``evicted`` to make room);
* ``malformed``: not a spill URI this code writes (the message says what one looks like);
* ``page_out_of_range``: the page number is past the last page (``pages`` in ``data``).

A page answers with its pieces as ``contents`` (text, or ``blob`` for media), each carrying where it sits in
the kept result in ``_meta`` under :data:`~.uri.META_SPILL_KEY`, and the result's ``_meta`` giving the page
number, the page count, its tokens and the next page's URI (absent on the last page).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..protocol import is_modern
from .document import BLOB, ITEMS
from .paging import Piece, Spill
from .store import EXPIRED, FORBIDDEN, NOT_FOUND, SERVED, TIMED_OUT, SpillStore
from .uri import META_SPILL_KEY, SpillUriError, parse_spill_uri, shown_uri, spill_uri

INVALID_PARAMS = -32602
INVALID = "invalid"


@dataclass(frozen=True, slots=True)
class ReadAnswer:
    """``result`` (a ReadResourceResult wire dict) or ``error`` (a JSON-RPC error object: code, message, data);
    ``outcome`` is what the reads counter records: served, expired, not_found, forbidden or invalid."""

    outcome: str
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    tool: str | None = None
    page: int = 0
    #: The page's tokens (served only): what entered the context.
    tokens: int = 0


def _error(outcome: str, reason: str, message: str, uri: object, tool: str | None = None,
           **data: Any) -> ReadAnswer:
    return ReadAnswer(outcome, error={"code": INVALID_PARAMS, "message": message,
                                      "data": {"uri": shown_uri(uri), "reason": reason, **data}}, tool=tool)


def _not_found(uri: object, outcome: str, tool: str | None) -> ReadAnswer:
    return _error(outcome, NOT_FOUND, f"Resource not found: {shown_uri(uri)} is not a result kept here. Call the "
                  "tool again to get it.", uri, tool if outcome == FORBIDDEN else None)


def _expired(uri: object, cause: str | None, ttl: float | None, tool: str | None) -> ReadAnswer:
    if cause == TIMED_OUT and ttl:
        why = f"it is kept until {duration(ttl)} pass without a read"
    else:
        why = "it was dropped to make room for newer results"
    return _error(EXPIRED, EXPIRED, f"Resource expired: the result kept at {shown_uri(uri)} is gone ({why}). Call "
                  "the tool again to get it.", uri, tool, cause=cause or TIMED_OUT)


def duration(seconds: float) -> str:
    """A TTL as a notice or an error states it: whole minutes from two minutes on, else seconds."""
    if seconds >= 120 and seconds % 60 == 0:
        return f"{int(seconds // 60):,} minutes"
    return "1 second" if seconds == 1 else f"{seconds:,.0f} seconds"


def read_spill(
    store: SpillStore,
    uri: object,
    owner: str | None,
    now: float,
    *,
    protocol_version: str | None = None,
    ttl: float | None = None,
) -> ReadAnswer:
    """Answer a ``resources/read`` of ``uri`` (a spill URI: see :func:`~.uri.is_spill_uri`) for the reader
    whose budget key is ``owner``. ``ttl``: the store's, for the expired message."""
    try:
        ref = parse_spill_uri(uri)
        spill_id, page = ref.spill_id, ref.page
    except SpillUriError as exc:
        if exc.reason != "page_out_of_range" or exc.spill_id is None:
            return _error(INVALID, exc.reason, f"Invalid spill URI {shown_uri(uri)}: {exc.message}.", uri)
        spill_id, page = exc.spill_id, -1  # well formed: whether it exists is answered first
    lookup = store.get(spill_id, owner, now)
    if lookup.outcome in (NOT_FOUND, FORBIDDEN):
        return _not_found(uri, lookup.outcome, lookup.tool)
    if lookup.outcome == EXPIRED or lookup.spill is None:
        return _expired(uri, lookup.cause, ttl, lookup.tool)
    spill = lookup.spill
    pages = spill.page_count
    if not 1 <= page <= pages:
        shown = "that page" if page < 0 else f"page {page:,}"
        return _error(INVALID, "page_out_of_range", f"Invalid spill URI {shown_uri(uri)}: {shown} is out of range; "
                      f"the pages are ?page=1 to ?page={pages:,}.", uri, lookup.tool, pages=pages)
    result = page_result(spill, spill_id, page, protocol_version=protocol_version)
    return ReadAnswer(SERVED, result, None, lookup.tool, page, spill.page_tokens_of(page))


def _following(spill: Spill, page: int, index: int) -> Piece | None:
    """The piece after piece ``index`` of ``page`` (on this page or the next), if any."""
    pieces = spill.pages[page - 1]
    if index + 1 < len(pieces):
        return pieces[index + 1]
    return spill.pages[page][0] if page < spill.page_count else None


def _piece_meta(spill: Spill, piece: Piece, page: int, index: int) -> dict[str, Any]:
    part = spill.parts[piece.part]
    meta: dict[str, Any] = {"part": piece.part, "source": part.source}
    if part.pointer:
        meta["pointer"] = part.pointer
    meta["bytes"] = [piece.first_byte, piece.end_byte]
    if part.kind == ITEMS and piece.end_item >= 0:
        meta["items"] = [piece.first_item, piece.end_item, part.summary.count if part.summary else piece.end_item]
    following = _following(spill, page, index)
    if part.kind == ITEMS and piece.end_item < 0:
        meta["item"] = piece.first_item
        # Whether this item's text goes on in the next piece (its pieces join to the item's JSON).
        meta["itemContinues"] = (following is not None and following.part == piece.part
                                 and following.first_item == piece.first_item and following.end_item < 0)
    meta["continues"] = following is not None and following.part == piece.part
    return meta


def page_result(spill: Spill, spill_id: str, page: int, *, protocol_version: str | None = None) -> dict[str, Any]:
    """The ReadResourceResult (wire dict) of page ``page`` (1-based, in range) of a spill."""
    uri = spill_uri(spill_id, page)
    contents: list[dict[str, Any]] = []
    for index, piece in enumerate(spill.pages[page - 1]):
        part = spill.parts[piece.part]
        item: dict[str, Any] = {"uri": uri}
        if part.kind == BLOB:
            item["mimeType"] = part.mime
            item["blob"] = part.text
        else:
            item["mimeType"] = "text/plain" if part.kind == ITEMS and piece.end_item < 0 else part.mime
            item["text"] = spill.piece_text(piece)
        item["_meta"] = {META_SPILL_KEY: _piece_meta(spill, piece, page, index)}
        contents.append(item)
    meta: dict[str, Any] = {"page": page, "pages": spill.page_count, "tokens": spill.page_tokens_of(page),
                            "pageTokens": spill.page_tokens, "totalTokens": spill.tokens}
    if page < spill.page_count:
        meta["next"] = spill_uri(spill_id, page + 1)
    result: dict[str, Any] = {"contents": contents, "_meta": {META_SPILL_KEY: meta}}
    if is_modern(protocol_version):
        # The page never changes while it is kept, but it is one conversation's data: private, not cached.
        result.update({"resultType": "complete", "cacheScope": "private", "ttlMs": 0})
    return result
