"""Pagination inputs a tool declares (from its inputSchema), and the hint a truncation notice gives."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .truncate import CapReport

# Property names (lower case, without "_" and "-") that mean each kind of pagination input.
_OFFSET = frozenset({"offset", "start", "startline", "skip", "from", "fromline", "startindex", "startat", "line",
                     "begin", "position"})
_CURSOR = frozenset({"cursor", "pagetoken", "nexttoken", "continuationtoken", "after", "nextcursor", "pagecursor"})
_PAGE = frozenset({"page", "pagenumber", "pagenum", "pageno"})
_LIMIT = frozenset({"limit", "maxresults", "pagesize", "perpage", "count", "maxlines", "maxitems", "size",
                    "length", "numresults", "maxtokens", "maxchars", "lines"})


def _norm(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


@dataclass(frozen=True, slots=True)
class Pagination:
    """The first declared input of each kind (None when the tool has none)."""

    offset: str | None = None
    cursor: str | None = None
    page: str | None = None
    limit: str | None = None

    @classmethod
    def from_input_schema(cls, schema: Any) -> Pagination | None:
        """None when the tool declares no pagination input at all."""
        props = schema.get("properties") if isinstance(schema, Mapping) else None
        if not isinstance(props, Mapping):
            return None
        found: dict[str, str] = {}
        for name in props:
            if not isinstance(name, str):
                continue
            key = _norm(name)
            for kind, names in (("offset", _OFFSET), ("cursor", _CURSOR), ("page", _PAGE), ("limit", _LIMIT)):
                if key in names and kind not in found:
                    found[kind] = name
        return cls(**found) if found else None

    def hint(
        self,
        tool: str | None,
        report: CapReport,
        arguments: Mapping[str, Any] | None,
        *,
        lines: int,
        chars: int,
    ) -> str:
        """One sentence telling the model how to get the rest."""
        args = arguments or {}
        name = tool or "the tool"
        if self.offset and report.arrays:
            start = args.get(self.offset)
            start = start if isinstance(start, int) and not isinstance(start, bool) else 0
            return f"Call {name} with {self.offset}={start + report.arrays[0][1]} to continue."
        if self.offset:
            return (f"Call {name} with {self.offset} set past the {lines:,} lines ({chars:,} characters) shown to "
                    "continue.")
        if self.cursor:
            smaller = f" and a smaller {self.limit}" if self.limit else ""
            return f"Call {name} with {self.cursor}{smaller} to page through the rest."
        if self.page and self.limit:
            return f"Call {name} with a smaller {self.limit} to see all of this page."
        if self.page:
            page = args.get(self.page)
            page = page if isinstance(page, int) and not isinstance(page, bool) else 1
            return f"Call {name} with {self.page}={page + 1} for the next page; the rest of this one was cut."
        return f"Call {name} with a smaller {self.limit} to get a response that fits."


def no_pagination_hint(tool: str | None) -> str:
    if tool:
        return f"{tool} declares no pagination inputs: ask for a narrower request to see the rest."
    return "Ask for a narrower request to see the rest."
