"""Pagination and limit inputs of a tool, and the hint a truncation notice gives.

Limit inputs (``limit``, ``head``, ``tail``, ``max_length``, ...) are recognised by the static profile's rule
(:func:`~mcp_token_otel.core.bounds.limit_kind`), so a notice and the profile agree on what a tool declares.
When the tool's definition was never seen (no ``tools/list``), only the call's arguments are known: the hint
then speaks of what was passed, never of what the tool declares.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..bounds import limit_kind
from .report import CapReport

# Property names (lower case, without "_" and "-") that mean each kind of position input.
_OFFSET = frozenset({"offset", "start", "startline", "skip", "from", "fromline", "startindex", "startat", "line",
                     "begin", "position"})
_CURSOR = frozenset({"cursor", "pagetoken", "nexttoken", "continuationtoken", "after", "nextcursor", "pagecursor"})
_PAGE = frozenset({"page", "pagenumber", "pagenum", "pageno"})
_KINDS = (("offset", _OFFSET), ("cursor", _CURSOR), ("page", _PAGE))


def _norm(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


@dataclass(frozen=True, slots=True)
class Pagination:
    """The first input of each position kind, and every limit input, in schema (or argument) order.

    ``known``: from the tool's definition; False when only the call's arguments were seen."""

    offset: str | None = None
    cursor: str | None = None
    page: str | None = None
    limits: tuple[str, ...] = ()
    known: bool = True

    @classmethod
    def _from_names(cls, names: Any, known: bool) -> Pagination:
        found: dict[str, str] = {}
        limits: list[str] = []
        for name in names:
            if not isinstance(name, str):
                continue
            key = _norm(name)
            kind = next((k for k, words in _KINDS if key in words), None)
            if kind is not None:
                found.setdefault(kind, name)
            elif limit_kind(name) is not None:
                limits.append(name)
        return cls(**found, limits=tuple(limits), known=known)

    @classmethod
    def from_tool(cls, tool: Mapping[str, Any]) -> Pagination:
        """What a tool's definition (a tools/list entry) declares in its inputSchema."""
        schema = tool.get("inputSchema")
        props = schema.get("properties") if isinstance(schema, Mapping) else None
        return cls._from_names(props if isinstance(props, Mapping) else (), True)

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any] | None) -> Pagination:
        """What the call passed, for a tool whose definition was never seen."""
        return cls._from_names(arguments if isinstance(arguments, Mapping) else (), False)

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
        limit = " or ".join(self.limits[:3])
        if self.offset and report.arrays:
            start = args.get(self.offset)
            start = start if isinstance(start, int) and not isinstance(start, bool) else 0
            return f"Call {name} with {self.offset}={start + report.arrays[0][1]} to continue."
        if self.offset:
            return (f"Call {name} with {self.offset} set past the {lines:,} lines ({chars:,} characters) shown to "
                    "continue.")
        if self.cursor:
            smaller = f" and a smaller {self.limits[0]}" if self.limits else ""
            return f"Call {name} with {self.cursor}{smaller} to page through the rest."
        if self.page and self.limits:
            return f"Call {name} with a smaller {self.limits[0]} to see all of this page."
        if self.page:
            page = args.get(self.page)
            page = page if isinstance(page, int) and not isinstance(page, bool) else 1
            return f"Call {name} with {self.page}={page + 1} for the next page; the rest of this one was cut."
        if limit:
            return f"Call {name} with a smaller {limit} to get a response that fits."
        if self.known:
            return f"{name} declares no pagination inputs: ask for a narrower request to see the rest."
        # Only the arguments are known: say what was (not) passed, never what the tool declares.
        return f"No limit argument was passed to {name}: ask for a narrower request to see the rest."


def no_pagination_hint(tool: str | None) -> str:
    """The hint when neither the tool's definition nor the call's arguments are at hand: it claims nothing."""
    return f"Call {tool} with a narrower request to see the rest." if tool else "Ask for a narrower request instead."
