"""Text cut to a token budget: the longest prefix that fits, never inside a surrogate pair or a backslash escape.

Whole 4 K-character chunks are kept while they fit, then a binary search on the estimator (which only grows with
the prefix) runs inside the next one; the cut moves back to a line or word end when one is near. Python strings
hold code points, so a cut can never split a UTF-8 sequence; the wire form is re-encoded from whole code points.
"""

from __future__ import annotations

from ..payload import Estimator

#: Text is cut by whole chunks of this many characters first, then by binary search inside one.
_CHUNK = 4096
#: A line or word end this close before the cut point is preferred to a cut mid-word.
_LINE_LOOKBACK = 256
_WORD_LOOKBACK = 48


def safe_boundary(text: str, cut: int) -> int:
    """Move ``cut`` back so text[:cut] ends neither between a surrogate pair nor inside a ``\\`` escape."""
    cut = max(0, min(cut, len(text)))
    if 0 < cut < len(text) and "\ud800" <= text[cut - 1] <= "\udbff" and "\udc00" <= text[cut] <= "\udfff":
        cut -= 1
    # An escape in the text itself (JSON or code shown as text): \n, \", \\, \uXXXX.
    backslash = text.rfind("\\", max(0, cut - 6), cut)
    if backslash >= 0:
        run_start = backslash
        while run_start > 0 and text[run_start - 1] == "\\":
            run_start -= 1
        if (backslash - run_start) % 2 == 0:  # this backslash starts an escape (it is not itself escaped)
            need = 6 if text[backslash + 1 : backslash + 2] == "u" else 2
            if cut - backslash < need:
                cut = backslash
    return cut


def _nice_boundary(text: str, cut: int) -> int:
    """Prefer the end of a line, then of a word, just before ``cut``."""
    if cut >= len(text):
        return cut
    newline = text.rfind("\n", max(0, cut - _LINE_LOOKBACK), cut)
    if newline > 0:
        return newline + 1
    space = text.rfind(" ", max(0, cut - _WORD_LOOKBACK), cut)
    return space + 1 if space > 0 else cut


def cut_text(text: str, max_tokens: int, estimator: Estimator, total: int | None = None) -> tuple[str, int]:
    """The longest prefix of ``text`` estimated at ``max_tokens`` or fewer, and its estimate."""
    total = estimator(text) if total is None else total
    if total <= max_tokens:
        return text, total
    if max_tokens <= 0 or not text:
        return "", 0
    # Whole chunks first, as far as they fit (the cost follows what is kept, not the text's size), then a
    # binary search inside the chunk that does not; the estimate of the prefix is checked at the end.
    base = 0
    spent = 0
    while len(text) - base > _CHUNK:
        tokens = estimator(text[base : base + _CHUNK])
        if spent + tokens > max_tokens:
            break
        spent += tokens
        base += _CHUNK
    # Invariant: spent + estimate(text[base:lo]) <= max_tokens < spent + estimate(text[base:hi]).
    lo, hi = base, min(len(text), base + _CHUNK)
    if hi == len(text) and spent + estimator(text[base:]) <= max_tokens:
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if spent + estimator(text[base:mid]) <= max_tokens:
            lo = mid
        else:
            hi = mid
    cut = safe_boundary(text, _nice_boundary(text, lo))
    prefix = text[:cut]
    tokens = estimator(prefix) if prefix else 0
    # Chunk estimates add up to about the whole's (a pre-token can straddle a chunk boundary; above the
    # sampling threshold the whole is sampled): shrink in proportion until the prefix itself fits.
    while tokens > max_tokens and cut > 0:
        cut = safe_boundary(text, cut - max(1, cut * (tokens - max_tokens) // tokens, cut // 200))
        prefix = text[:cut]
        tokens = estimator(prefix) if prefix else 0
    return prefix, tokens
