"""Pages of a kept result, each within a token budget (the response cap), computed once when it is kept.

The parts of the result (see :mod:`.document`) are laid out in order on pages of at most ``page_tokens``
tokens as the estimator counts each page's texts (what measuring the ``resources/read`` answer counts as its
data). A part starts on a new page unless it fits whole in what is left of the current one. A page holds at
most MAX_PIECES_PER_PAGE pieces; a result that would need more than MAX_PAGES pages is not kept.

* Text is cut on code point boundaries (Python strings hold code points, so a UTF-8 sequence is never split),
  moved back to the end of a line (within 256 characters) or a word (within 48), and never between a surrogate
  pair, a CR and its LF, or before a combining mark, zero-width joiner or variation selector (moved back at most
  32 characters). The pieces of a part concatenate to its text byte for byte.
* A JSON array (an ``items`` part) is cut between items: each piece is ``[`` + the original bytes from its first
  item to its last + ``]``, valid JSON whose items are the original's. An item that does not fit a page alone
  is cut as text (its pieces concatenate to the item's text) and the next item starts a new page.
* A blob (image, audio, binary resource) is one piece of its own, whatever its size: it cannot be cut. Its
  tokens are those of its base64 text, as a ``resources/read`` answer carrying it is measured.
* A page holds at least one character: a budget smaller than one character's estimate still makes progress.

Each cut point is found by a few proportional probes of the estimator, then bisection to within 1/128 of the
page (so a page may end slightly short of its budget): the cost follows the number of pages times the page
size, with no per-character Python loop.
"""

from __future__ import annotations

import sys
import unicodedata
from bisect import bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..measure import DEFAULT_POLICY, Policy, measure_result
from ..payload import Estimator
from .document import BLOB, ITEMS, TEXT, Draft, Part, drafts_of, utf8_len

MAX_PAGES = 10_000
MAX_PIECES_PER_PAGE = 64
#: Estimator probes spent finding one cut point at most (each costs about a page).
MAX_PROBES = 32
#: A line end this close before a cut point is preferred, else a word end.
LINE_LOOKBACK = 256
WORD_LOOKBACK = 48
#: Characters a cut may move back to keep a grapheme whole.
JOIN_LOOKBACK = 32
#: Bytes of bookkeeping counted per part and per piece (the memory a spill is charged beside its texts).
PART_OVERHEAD = 400
PIECE_OVERHEAD = 120

_ZWJ = "\u200d"


class SpillRefused(ValueError):
    """The result is not kept: ``reason`` is ``empty`` (nothing to keep), ``too_large`` (above the byte limit)
    or ``too_many_pages`` (above MAX_PAGES at this page size)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Piece:
    """A slice of one part on one page: ``part.text[start:end]`` (code points), at UTF-8 bytes
    ``[first_byte, end_byte)`` of the part's text. An items piece has ``end_item >= 0`` (items
    ``[first_item, end_item)``, written in brackets); an item cut as text has ``first_item`` its index and
    ``end_item == -1``; any other piece has both -1."""

    part: int
    start: int
    end: int
    first_byte: int
    end_byte: int
    tokens: int
    first_item: int = -1
    end_item: int = -1


@dataclass(frozen=True, slots=True)
class Spill:
    """A kept result: its parts and its pages (precomputed), with the numbers its link and notice state."""

    parts: tuple[Part, ...]
    pages: tuple[tuple[Piece, ...], ...]
    page_tokens: int
    #: The full result's data tokens (what the response cap measures).
    tokens: int
    #: UTF-8 bytes of every part (decoded bytes for blobs): the link's ``size``.
    size: int
    #: About what the spill holds in memory (its texts as Python holds them, and bookkeeping).
    memory: int
    tool: str | None = None
    #: Sources left out: values JSON cannot write (a cycle, a non-string key).
    omitted: tuple[str, ...] = ()

    @property
    def page_count(self) -> int:
        return len(self.pages)

    def piece_text(self, piece: Piece) -> str:
        part = self.parts[piece.part]
        if part.kind == BLOB:
            return part.text
        text = part.text[piece.start : piece.end]
        return f"[{text}]" if part.kind == ITEMS and piece.end_item >= 0 else text

    def page_tokens_of(self, page: int) -> int:
        """Tokens of page ``page`` (1-based)."""
        return sum(piece.tokens for piece in self.pages[page - 1])

    def page_at(self, part: int, offset: int = 0, *, item: int | None = None) -> int:
        """The page (1-based) holding code point ``offset`` of part ``part`` (or, for an items part, item
        ``item``); the part's last page when past its end, 1 when the part has no page."""
        last = 0
        for number, page in enumerate(self.pages, 1):
            for piece in page:
                if piece.part != part:
                    continue
                last = number
                if item is not None and piece.first_item >= 0:
                    end_item = piece.end_item if piece.end_item >= 0 else piece.first_item + 1
                    if piece.first_item <= item < end_item:
                        return number
                elif item is None and piece.start <= offset < piece.end:
                    return number
        return last or 1


# ------------------------------------------------------------------------------------------------ cut points


def _joins(text: str, at: int) -> bool:
    """Whether a cut before ``text[at]`` would split what belongs together."""
    prev, nxt = text[at - 1], text[at]
    if "\ud800" <= prev <= "\udbff" and "\udc00" <= nxt <= "\udfff":
        return True
    if prev == "\r" and nxt == "\n":
        return True
    if prev == _ZWJ or nxt == _ZWJ:
        return True
    if nxt.isascii():
        return False
    return unicodedata.category(nxt)[0] == "M" or "\ufe00" <= nxt <= "\ufe0f" or "\U000e0100" <= nxt <= "\U000e01ef"


def _tidy(text: str, start: int, end: int, limit: int) -> int:
    """``end`` moved back to a line or word end when one is near, and off any join (see :func:`_joins`)."""
    if end >= limit:
        return limit
    floor = start + 1
    newline = text.rfind("\n", max(floor, end - LINE_LOOKBACK), end)
    if newline >= 0:
        end = newline + 1
    else:
        space = text.rfind(" ", max(floor, end - WORD_LOOKBACK), end)
        if space >= 0:
            end = space + 1
    cut = end
    for _ in range(JOIN_LOOKBACK):
        if cut <= floor or cut >= limit or not _joins(text, cut):
            break
        cut -= 1
    else:
        return end  # a run of marks longer than the lookback: cut inside it rather than not at all
    return cut if cut > start and (cut >= limit or not _joins(text, cut)) else end


def _largest(
    lo: int, hi: int, cost: Callable[[int], int], budget: int, first: int, propose: Callable[[int, int], int]
) -> tuple[int, int]:
    """The largest x in (lo, hi) with ``cost(x) <= budget``, to within 1/128 of ``x - lo``; ``cost(hi)`` is
    known (or taken) not to fit. Proportional probes (``propose(x, cost)``: where the budget should land)
    while they fall inside the bracket, else bisection. Returns (lo, 0) when nothing fits."""
    best, best_cost, bad = lo, 0, hi
    x = first
    for _ in range(MAX_PROBES):
        if bad - best <= max(1, (best - lo) >> 7):
            break
        if not best < x < bad:
            x = (best + bad) // 2
        c = cost(x)
        if c <= budget:
            best, best_cost = x, c
        else:
            bad = x
        step = max(1, (best - lo) >> 7)
        # Where the budget should land, but at least one tolerance past what fits (or short of what does not):
        # a probe there closes the bracket instead of bisecting a wide one.
        guess = propose(x, c)
        x = max(guess, best + step) if c <= budget else min(guess, bad - step)
    return best, best_cost


def _aim(budget: int) -> int:
    return max(1, budget - (budget >> 7))


def fit_text(
    text: str, start: int, limit: int, budget: int, estimator: Estimator, chars_per_token: float
) -> tuple[int, int]:
    """The end of the next piece of ``text[start:limit]``, and its tokens: the longest tidy prefix within
    ``budget`` (see the module docstring), at least one character, or one cluster kept whole (then over the
    budget). ``chars_per_token``: the expected ratio, for the first probe."""
    aim = _aim(budget)

    def cost(x: int) -> int:
        return estimator(text[start:x])

    def propose(x: int, c: int) -> int:
        return start + (x - start) * aim // max(1, c)

    first = start + max(1, int(chars_per_token * aim))
    if limit - start <= 4 * (first - start):  # a short rest: it may fit whole
        tokens = estimator(text[start:limit])
        if tokens <= budget:
            return limit, tokens
    best, _ = _largest(start, limit, cost, budget, first, propose)
    end = _tidy(text, start, max(best, start + 1), limit)
    tokens = estimator(text[start:end])
    # Above the sampling threshold the estimate of a longer prefix may come out smaller: shrink until it fits.
    for _ in range(MAX_PROBES):
        if tokens <= budget or end - start <= 1:
            break
        end = max(start + 1, start + (end - start) * aim // tokens)
        end = _tidy(text, start, end, limit) if end < limit else end
        tokens = estimator(text[start:end])
    if end < limit and end - start <= JOIN_LOOKBACK and _joins(text, end):
        # The piece is a single cluster that does not fit alone (a budget of about a character): keep it whole
        # anyway, over the budget, rather than split it or make no progress.
        while end < limit and end - start < 2 * JOIN_LOOKBACK and _joins(text, end):
            end += 1
        tokens = estimator(text[start:end])
    return end, tokens


# ------------------------------------------------------------------------------------------------ layout


class _Bytes:
    """UTF-8 offsets of increasing code point positions in one text (O(length) in all)."""

    __slots__ = ("_ascii", "_bytes", "_pos", "_text")

    def __init__(self, text: str) -> None:
        self._text, self._pos, self._bytes, self._ascii = text, 0, 0, text.isascii()

    def at(self, pos: int) -> int:
        if self._ascii:
            return pos
        if pos < self._pos:  # not expected (pieces move forward); recount from the start
            self._pos, self._bytes = 0, 0
        self._bytes += utf8_len(self._text[self._pos : pos])
        self._pos = pos
        return self._bytes


class _Layout:
    """Lays pieces out on pages of ``budget`` tokens."""

    def __init__(self, budget: int, estimator: Estimator) -> None:
        self.budget = budget
        self.estimator = estimator
        self.pages: list[tuple[Piece, ...]] = []
        self.page: list[Piece] = []
        self.room = budget

    def close(self) -> None:
        if self.page:
            self.pages.append(tuple(self.page))
            self.page, self.room = [], self.budget
            if len(self.pages) > MAX_PAGES:
                raise SpillRefused("too_many_pages", f"more than {MAX_PAGES:,} pages of {self.budget:,} tokens")

    def put(self, piece: Piece) -> None:
        self.page.append(piece)
        self.room -= piece.tokens
        if self.room <= 0 or len(self.page) >= MAX_PIECES_PER_PAGE:
            self.close()

    def _probe_chars(self, chars_per_token: float) -> int:
        # Only a rest this short is estimated whole (to see whether it fits what is left): estimating a long
        # rest would copy it for every page. A longer one that would fit is found by the cut search instead.
        return max(4096, int(4 * chars_per_token * self.budget))

    def text(
        self, index: int, text: str, start: int, limit: int, item: int = -1, offsets: _Bytes | None = None
    ) -> None:
        """Pieces of ``text[start:limit]`` (part ``index``; ``item``: the item they are the text of; ``offsets``:
        the part's byte counter, shared by every call on the same part)."""
        offsets = offsets or _Bytes(text)
        if start == limit:
            self.put(Piece(index, start, limit, offsets.at(start), offsets.at(limit), 0, item))
            return
        sample = text[start : min(limit, start + 4096)]
        chars_per_token = len(sample) / max(1, self.estimator(sample))
        pos = start
        while pos < limit:
            if limit - pos <= self._probe_chars(chars_per_token):
                tokens = self.estimator(text[pos:limit])
                if tokens <= self.room:
                    self.put(Piece(index, pos, limit, offsets.at(pos), offsets.at(limit), tokens, item))
                    return
            if self.page:
                self.close()
                continue
            end, tokens = fit_text(text, pos, limit, self.budget, self.estimator, chars_per_token)
            self.put(Piece(index, pos, end, offsets.at(pos), offsets.at(end), tokens, item))
            self.close()
            chars_per_token = (end - pos) / max(1, tokens)
            pos = end

    def items(self, index: int, draft: Draft) -> None:
        text, starts, ends = draft.part.text, draft.starts, draft.ends
        assert starts is not None and ends is not None
        offsets = _Bytes(text)
        n = len(starts)
        if n == 0:
            self.put(Piece(index, 1, 1, offsets.at(1), offsets.at(1), self.estimator("[]"), 0, 0))
            return
        estimator = self.estimator
        aim = _aim(self.budget)
        i = 0
        sample_end = min(n, i + 16)
        chars_per_token = (ends[sample_end - 1] - starts[0] + 2) / max(
            1, estimator("[" + text[starts[0] : ends[sample_end - 1]] + "]")
        )
        while i < n:
            first = starts[i]

            def cost(j: int, first: int = first) -> int:
                return estimator("[" + text[first : ends[j - 1]] + "]")

            if ends[n - 1] - first <= self._probe_chars(chars_per_token):
                tokens = cost(n)
                if tokens <= self.room:
                    self.put(Piece(index, first, ends[n - 1], offsets.at(first), offsets.at(ends[n - 1]), tokens, i, n))
                    return
            if self.page:
                self.close()
                continue
            def propose(j: int, c: int, i: int = i, first: int = first) -> int:
                chars = (ends[j - 1] - first + 2) * aim // max(1, c)
                return max(i + 1, bisect_right(ends, first + chars, i, n))

            guess = propose(i + 1, max(1, int((ends[i] - first + 2) / chars_per_token)))
            j, tokens = _largest(i, n, cost, self.budget, guess, propose)
            if j == i:  # this item alone does not fit a page: its text, cut as text
                self.text(index, text, first, ends[i], item=i, offsets=offsets)
                self.close()
                i += 1
                continue
            self.put(Piece(index, first, ends[j - 1], offsets.at(first), offsets.at(ends[j - 1]), tokens, i, j))
            self.close()
            chars_per_token = (ends[j - 1] - first + 2) / max(1, tokens)
            i = j

    def blob(self, index: int, part: Part) -> None:
        if part.tokens > self.room and self.page:
            self.close()
        self.put(Piece(index, 0, len(part.text), 0, part.size, part.tokens))


def _memory(parts: list[Part], pieces: int) -> int:
    return sum(sys.getsizeof(p.text) + PART_OVERHEAD for p in parts) + pieces * PIECE_OVERHEAD


def build_spill(
    result: Mapping[str, Any],
    page_tokens: int,
    *,
    policy: Policy = DEFAULT_POLICY,
    tokens: int | None = None,
    tool: str | None = None,
    max_bytes: int | None = None,
) -> Spill:
    """The spill of a ``tools/call`` result (a wire dict) paged at ``page_tokens``: :class:`SpillRefused`
    when there is nothing to keep, when it would hold more than ``max_bytes`` in memory (checked before any
    page is computed) or need more than MAX_PAGES pages. ``tokens``: the result's data tokens when the caller
    measured it already."""
    if page_tokens <= 0:
        raise ValueError(f"page_tokens must be positive, got {page_tokens}")
    estimator = policy.estimator
    drafts, omitted = drafts_of(result, estimator)
    parts = [d.part for d in drafts]
    if not parts:
        raise SpillRefused("empty", "the result has no content to keep")
    if max_bytes is not None and _memory(parts, len(parts)) > max_bytes:
        raise SpillRefused("too_large", f"the result takes more than the {max_bytes:,} bytes a spill may hold")
    layout = _Layout(page_tokens, estimator)
    for index, draft in enumerate(drafts):
        part = draft.part
        if part.kind == BLOB:
            layout.blob(index, part)
        elif part.kind == ITEMS:
            layout.items(index, draft)
        else:
            layout.text(index, part.text, 0, len(part.text))
        draft.starts = draft.ends = None  # the spans are not kept
    layout.close()
    pieces = sum(len(page) for page in layout.pages)
    memory = _memory(parts, pieces)
    if max_bytes is not None and memory > max_bytes:
        raise SpillRefused("too_large", f"the result takes more than the {max_bytes:,} bytes a spill may hold")
    if tokens is None:
        tokens = measure_result("tools/call", result, tool_name=tool, policy=policy).data_tokens
    return Spill(
        tuple(parts), tuple(layout.pages), page_tokens, tokens, sum(p.size for p in parts), memory, tool,
        tuple(omitted),
    )


__all__ = ["BLOB", "ITEMS", "MAX_PAGES", "MAX_PIECES_PER_PAGE", "TEXT", "Piece", "Spill", "SpillRefused",
           "build_spill", "fit_text"]
