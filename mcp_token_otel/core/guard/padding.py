"""Padding detection: texts inflated or obfuscated to flood a context or smuggle instructions.

Checks (each a :class:`PaddingFinding` with its number and threshold):

``invisible_chars``
    Zero-width, bidi-control, tag (U+E0000 block), variation-selector-supplement and other invisible
    characters (the zero-width joiner and U+FE0F, which emoji need, are not counted). One regex scan,
    skipped entirely for ASCII text (``str.isascii`` is a C check).
``compression``
    zlib (level 1) size / input size of an evenly spaced sample (at most 8 K characters) of texts of 4 K
    characters or more: natural text is 0.35-0.5, JSON 0.1-0.3, a text repeated over and over well under
    0.03. It also gates the next two checks, which only run on texts that compress well.
``unique_chars``
    Distinct characters in the sample: a long text written with a handful of characters.
``repeated_window``
    A window of the text is found again; the stretch between the two occurrences is the repeated unit,
    and its copies (``str.count``) must cover most of the text (a templated log repeats phrases, but
    its lines differ).
``long_line``
    A run without whitespace: the text is searched in aligned blocks of half the threshold (a run that
    long must contain a whole block); only blocks without whitespace are measured.

Everything is a C-level pass (regex, ``str.count``, ``bytes.translate``, ``zlib``): no per-character
Python loop. Texts under ``min_length`` only get the invisible-character check.
"""

from __future__ import annotations

import re
import sys
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .settings import PaddingSettings

_BMP_INVISIBLE = (
    "\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b\u200c\u200e\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u206f\u3164\ufe00-\ufe0e\ufeff\uffa0"
)
INVISIBLE = re.compile(f"[{_BMP_INVISIBLE}\U000e0000-\U000e007f\U000e0100-\U000e01ef]")
_INVISIBLE_BMP = re.compile(f"[{_BMP_INVISIBLE}]")
_WHITESPACE = re.compile(r"\s")
_SPACES = (" ", "\n", "\t", "\r", "\f", "\v")
_SAMPLE_CHUNK = 2048
_SAMPLE_CHUNKS = 4
#: Texts shorter than this skip the zlib check (and the statistical checks run ungated).
_ZLIB_MIN_CHARS = 4096
#: Characters of the sample whose distinct characters are counted (the count costs per character: this bounds it).
_UNIQUE_SAMPLE = 4096
#: The statistical checks run only on texts whose sample compresses below this ratio.
_STATS_GATE = 0.2
_CPYTHON = sys.implementation.name == "cpython"


def _char_width(text: str) -> int:
    """Bytes per character of CPython's compact string (1, 2 or 4), or 0 when not known. It only picks the
    cheapest correct scan: a Latin-1 string cannot hold U+200B, a 2-byte one cannot hold a tag character."""
    n = len(text)
    if not _CPYTHON or n < 256:
        return 0
    size = sys.getsizeof(text)
    for width in (4, 2, 1):
        if 0 <= size - width * n < 128:
            return width
    return 0


@dataclass(frozen=True, slots=True)
class PaddingFinding:
    """One check that fired: its name, the measured value and the threshold it crossed."""

    check: str
    value: float
    threshold: float
    #: Characters of the text examined (for unique_chars: the sample), window size for repeated_window.
    length: int = 0
    window: int = 0


def _sample(text: str) -> str:
    n = len(text)
    if n <= _SAMPLE_CHUNK * _SAMPLE_CHUNKS:
        return text
    step = (n - _SAMPLE_CHUNK) // (_SAMPLE_CHUNKS - 1)
    return "".join(text[i * step : i * step + _SAMPLE_CHUNK] for i in range(_SAMPLE_CHUNKS))


def _pattern(text: str) -> re.Pattern[str] | None:
    """The narrowest regex that can find invisible characters in ``text`` (None: it holds none)."""
    if text.isascii():
        return None
    width = _char_width(text)
    if width == 1:
        return None if "\u00ad" not in text else _INVISIBLE_BMP
    return _INVISIBLE_BMP if width == 2 else INVISIBLE


def count_invisible(text: str) -> int:
    pattern = _pattern(text)
    return 0 if pattern is None else len(pattern.findall(text))


def strip_invisible(text: str) -> tuple[str, int]:
    """``text`` without invisible characters, and how many were removed."""
    pattern = _pattern(text)
    return (text, 0) if pattern is None else pattern.subn("", text)


def longest_run_without_whitespace(text: str, at_least: int) -> int:
    """Length of the first run of at least ``at_least`` characters without whitespace, else 0. A run that
    long contains a whole aligned block of half that size, so only blocks without whitespace are measured."""
    n = len(text)
    if n < at_least:
        return 0
    block = max(1, at_least // 2)
    search = _WHITESPACE.search
    for start in range(0, n - block + 1, block):
        if search(text, start, start + block) is not None:
            continue
        run_start = max(text.rfind(c, 0, start) for c in _SPACES) + 1
        after = search(text, start + block)
        run_end = n if after is None else after.start()
        if run_end - run_start >= at_least:
            return run_end - run_start
    return 0


def scan_text(text: str, s: PaddingSettings) -> list[PaddingFinding]:
    """Every padding check on one text; an empty list when it looks normal."""
    findings: list[PaddingFinding] = []
    n = len(text)
    invisible = count_invisible(text)
    if invisible >= s.min_invisible_chars:
        findings.append(PaddingFinding("invisible_chars", invisible, s.min_invisible_chars, n))
    if n < s.min_length:
        return findings
    sample = _sample(text)
    gate = True
    if n >= _ZLIB_MIN_CHARS:  # below, zlib's set-up costs more than the checks it gates
        raw = sample.encode("utf-8", "surrogatepass")
        ratio = len(zlib.compress(raw, 1)) / len(raw)
        if ratio < s.min_compression_ratio:
            findings.append(PaddingFinding("compression", round(ratio, 4), s.min_compression_ratio, n))
        gate = ratio < _STATS_GATE
    # A text with few distinct characters has few in its head too: a set of 256 characters screens it.
    if gate and len(set(text[:256])) <= s.max_unique_chars:
        # Contiguous slices (a stride would alias with a periodic text), spread over the sample.
        part = _UNIQUE_SAMPLE // 4
        gap = max(part, len(sample) // 4)
        seen = "".join(sample[i * gap : i * gap + part] for i in range(4))
        unique = len(set(seen))
        if unique <= s.max_unique_chars:
            findings.append(PaddingFinding("unique_chars", unique, s.max_unique_chars, len(seen)))
    window = s.repeat_window
    if gate and n >= window * s.min_repeats:
        best, unit_length = 0, 0
        for i in (1, 2):  # windows from the middle and the end
            at = (n - window) * i // 2
            probe = text[at : at + window]
            # The repeated unit runs from one occurrence of the window to the next; a templated log
            # repeats phrases, but its lines (the units) differ, so only true copies count.
            first = text.find(probe)
            second = text.find(probe, first + 1)
            if second < 0 or (second - first) * s.min_repeats > n:
                continue
            unit = text[first:second]
            copies = text.count(unit)
            if copies * len(unit) > best * max(unit_length, 1):
                best, unit_length = copies, len(unit)
        if best >= s.min_repeats and best * unit_length >= s.min_repeat_coverage * n:
            findings.append(PaddingFinding("repeated_window", best, s.min_repeats, n, unit_length))
    run = longest_run_without_whitespace(text, s.max_line_chars)
    if run:
        findings.append(PaddingFinding("long_line", run, s.max_line_chars, n))
    return findings


def result_texts(result: Mapping[str, Any]) -> list[str]:
    """The texts a model reads in a result: text blocks, embedded resources, resource contents, prompt messages."""
    out: list[str] = []
    blocks: list[Any] = []
    for key in ("content", "contents"):
        value = result.get(key)
        if isinstance(value, list):
            blocks.extend(value)
    messages = result.get("messages")
    if isinstance(messages, list):
        blocks.extend(m.get("content") for m in messages if isinstance(m, Mapping))
    for block in blocks:
        if not isinstance(block, Mapping):
            continue
        text = block.get("text")
        if isinstance(text, str):
            out.append(text)
        resource = block.get("resource")
        if isinstance(resource, Mapping) and isinstance(resource.get("text"), str):
            out.append(resource["text"])
    return out


def _strip_block(block: Any) -> tuple[Any, int]:
    if not isinstance(block, Mapping):
        return block, 0
    text = block.get("text")
    if isinstance(text, str):
        clean, count = strip_invisible(text)
        return ({**block, "text": clean}, count) if count else (block, 0)
    resource = block.get("resource")
    if isinstance(resource, Mapping) and isinstance(resource.get("text"), str):
        clean, count = strip_invisible(resource["text"])
        return ({**block, "resource": {**resource, "text": clean}}, count) if count else (block, 0)
    return block, 0


def strip_result(result: Mapping[str, Any]) -> tuple[Mapping[str, Any], int]:
    """A copy of ``result`` without invisible characters in its texts, and how many were removed."""
    total = 0
    out = dict(result)
    for key in ("content", "contents"):
        value = result.get(key)
        if isinstance(value, list):
            blocks = []
            for block in value:
                clean, count = _strip_block(block)
                blocks.append(clean)
                total += count
            out[key] = blocks
    messages = result.get("messages")
    if isinstance(messages, list):
        cleaned = []
        for message in messages:
            if isinstance(message, Mapping):
                content, count = _strip_block(message.get("content"))
                total += count
                message = {**message, "content": content} if count else message
            cleaned.append(message)
        out["messages"] = cleaned
    return (out, total) if total else (result, 0)
