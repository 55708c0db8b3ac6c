"""Spill URIs: ``mcp-token-otel://spill/<id>`` names a kept result, ``?page=N`` one page of it.

The scheme is the project's own (RFC 3986: letters, digits, ``+ - .``), as the MCP specification allows for
resource URIs; nothing but this code ever reads it, so the grammar is strict: the scheme and the host
``spill`` in any case, an id of 32 lowercase hex digits (128 random bits), and either no query (page 1) or
exactly ``page=N`` with N a decimal from 1 to 999,999 without sign or leading zero. Anything else is rejected
with a reason (``malformed`` or ``page_out_of_range``) that the reader turns into a JSON-RPC error.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass

SCHEME = "mcp-token-otel"
#: Every spill URI starts with this (compared without regard to case, as RFC 3986 compares schemes and hosts).
PREFIX = f"{SCHEME}://spill/"
#: The ``_meta`` key of the spill's numbers on a resource link and on each page read: the project's ``_meta``
#: namespace (``io.github.mcp-token-otel/``, as core/guard/annotate.py declares it) plus ``spill``. Spelt out here
#: so the spill core needs nothing from the guard package, which builds on it; a test keeps the two equal.
META_SPILL_KEY = "io.github.mcp-token-otel/spill"
ID_BYTES = 16
#: Pages are numbered 1..MAX_PAGE_NUMBER; a larger number is out of range without being converted.
MAX_PAGE_NUMBER = 999_999
#: A longer URI is malformed without being read further (a real one is under 70 characters).
MAX_URI_CHARS = 256

_ID = re.compile(r"[0-9a-f]{32}")
_PAGE = re.compile(r"page=(0|[1-9][0-9]*)")

IdFactory = Callable[[], str]


def new_spill_id() -> str:
    """A fresh id: 128 bits from the operating system's CSPRNG, as 32 lowercase hex digits."""
    return secrets.token_hex(ID_BYTES)


def is_spill_id(value: str) -> bool:
    return _ID.fullmatch(value) is not None


def spill_uri(spill_id: str, page: int | None = None) -> str:
    """The URI of a spill (``page`` None: the bare URI, which reads page 1) or of one page of it."""
    return PREFIX + spill_id if page is None else f"{PREFIX}{spill_id}?page={page}"


def is_spill_uri(uri: object) -> bool:
    """Whether a ``resources/read`` uri belongs to the spill (then the spill answers it, well formed or not)."""
    return isinstance(uri, str) and uri[: len(PREFIX)].lower() == PREFIX


class SpillUriError(ValueError):
    """A spill URI that cannot be read: ``reason`` is ``malformed`` or ``page_out_of_range``."""

    def __init__(self, reason: str, message: str, spill_id: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        #: Set when the id was well formed (a page out of range): the reader checks ownership first.
        self.spill_id = spill_id


@dataclass(frozen=True, slots=True)
class SpillRef:
    spill_id: str
    #: 1-based; the bare URI is page 1.
    page: int


def parse_spill_uri(uri: object) -> SpillRef:
    """The id and page a spill URI names; :class:`SpillUriError` for anything else. Page numbers are checked
    against the spill's page count by the reader; here only their form and 1..MAX_PAGE_NUMBER."""
    if not isinstance(uri, str):
        raise SpillUriError("malformed", f"expected a string uri, got {type(uri).__name__}")
    if len(uri) > MAX_URI_CHARS:
        raise SpillUriError("malformed", f"a spill URI is under {MAX_URI_CHARS} characters; this one has {len(uri):,}")
    if not is_spill_uri(uri):
        raise SpillUriError("malformed", f"a spill URI starts with {PREFIX}")
    rest = uri[len(PREFIX) :]
    spill_id, sep, query = rest.partition("?")
    if "#" in query or "#" in spill_id:
        raise SpillUriError("malformed", "a spill URI has no fragment (#...)")
    if not is_spill_id(spill_id):
        raise SpillUriError("malformed", f"a spill id is 32 lowercase hex digits, as in {PREFIX}{'0' * 32}?page=1")
    if not sep:
        return SpillRef(spill_id, 1)
    match = _PAGE.fullmatch(query)
    if match is None:
        raise SpillUriError("malformed", "the only query a spill URI takes is ?page=N (N from 1)")
    digits = match.group(1)
    if len(digits) > len(str(MAX_PAGE_NUMBER)) or int(digits) > MAX_PAGE_NUMBER or digits == "0":
        shown = digits if len(digits) <= 12 else digits[:12] + "..."
        raise SpillUriError("page_out_of_range", f"page {shown} is out of range: pages are numbered from 1",
                            spill_id)
    return SpillRef(spill_id, int(digits))


#: What stands for a spill's id where a uri is shown to others than its reader (span attributes): the id is the one
#: secret that guards a kept result.
HIDDEN_ID = "<id>"


def span_uri(uri: str) -> str:
    """``uri`` as a span may carry it: a spill URI with its id hidden (its page kept), any other uri as it is."""
    if not is_spill_uri(uri):
        return uri
    _, sep, query = uri[len(PREFIX) :].partition("?")
    return PREFIX + HIDDEN_ID + (sep + query[:16] if sep else "")


def shown_uri(uri: object, limit: int = 96) -> str:
    """A uri as an error may quote it: bounded, so a megabyte uri does not become a megabyte error."""
    text = uri if isinstance(uri, str) else repr(uri)
    return text if len(text) <= limit else text[: limit - 3] + "..."
