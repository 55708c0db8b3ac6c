"""Progressive disclosure: a result the response cap cuts is kept whole (a *spill*) and read back page by page
with ``resources/read`` of a ``mcp-token-otel://spill/<id>?page=N`` URI, each page within the cap.

Pure: no I/O, the clock and the id source are the caller's. The pieces, in the order a guard uses them:

* :func:`build_spill` pages a ``tools/call`` result (:mod:`.document` splits it into parts, :mod:`.paging`
  lays them out on pages);
* a :class:`SpillStore` keeps it for its owner (:class:`MemorySpillStore`: TTL, byte cap, LRU);
* :func:`link_block`, :func:`resume_page` and :func:`with_spill` (with the guard's notice) put the link in
  the cut result;
* :func:`read_spill` answers a read: a page, or a JSON-RPC error saying why not;
* :func:`with_resources_capability` declares ``resources`` for a server that did not, so clients read.

docs/guardrails.md describes the behaviour; the URI grammar is in :mod:`.uri`.
"""

from .capability import CAPABILITY_METHODS, LISTINGS, empty_listing, with_resources_capability
from .document import BLOB, ITEMS, TEXT, JsonSummary, Part
from .link import is_spill_link, link_block, resume_page, summaries, with_spill
from .paging import MAX_PAGES, MAX_PIECES_PER_PAGE, Piece, Spill, SpillRefused, build_spill, fit_text
from .read import INVALID, INVALID_PARAMS, ReadAnswer, duration, page_result, read_spill
from .store import (
    EVICTED,
    EXPIRED,
    FORBIDDEN,
    NO_OWNER,
    NOT_FOUND,
    READ_OUTCOMES,
    SERVED,
    TIMED_OUT,
    TOO_LARGE,
    Lookup,
    MemorySpillStore,
    SpillStore,
    Stored,
)
from .uri import (
    META_SPILL_KEY,
    PREFIX,
    SCHEME,
    SpillRef,
    SpillUriError,
    is_spill_id,
    is_spill_uri,
    new_spill_id,
    parse_spill_uri,
    span_uri,
    spill_uri,
)
from .wire import spill_from_wire, spill_to_wire

__all__ = [
    "BLOB", "CAPABILITY_METHODS", "EVICTED", "EXPIRED", "FORBIDDEN", "INVALID", "INVALID_PARAMS", "ITEMS", "LISTINGS",
    "MAX_PAGES", "MAX_PIECES_PER_PAGE", "META_SPILL_KEY", "NOT_FOUND", "NO_OWNER", "PREFIX", "READ_OUTCOMES",
    "SCHEME", "SERVED", "TEXT", "TIMED_OUT", "TOO_LARGE", "JsonSummary", "Lookup", "MemorySpillStore", "Part",
    "Piece", "ReadAnswer", "Spill", "SpillRef", "SpillRefused", "SpillStore", "SpillUriError", "Stored",
    "build_spill", "duration", "empty_listing", "fit_text", "is_spill_id", "is_spill_link", "is_spill_uri",
    "link_block", "new_spill_id", "page_result", "parse_spill_uri", "read_spill", "resume_page", "span_uri",
    "spill_from_wire", "spill_to_wire", "spill_uri", "summaries", "with_resources_capability", "with_spill",
]
