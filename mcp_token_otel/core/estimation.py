"""Default token estimator: a fast, pure-Python approximation of o200k_base counts.

``estimate_tokens(text)`` needs no tokenizer, no I/O and only the standard library.

How it works
    Every UTF-8 byte has a character class (a lower, z the lowercase letters rare in English: k z j,
    A upper, 0 digit, space/tab, newline, ``"``, ``<`` angle brackets, ``/``, ``(`` brackets and braces,
    ``_``, ``-``, ``.`` other ASCII punctuation, x UTF-8 continuation, m 2-byte char, p other 3-byte char,
    c CJK U+3000-U+9FFF, k Hangul U+A000-U+DFFF, e 4-byte char/emoji). The estimate is a weighted
    sum of: the byte length and the count of each single class (one ``bytes.translate`` to integer
    weights, summed by ``zlib.adler32``), plus the count of one class transition that splits o200k
    pre-tokens (``A0`` upper->digit: ids, hex, base64) and, for non-ASCII text only, word starts and
    runs of multi-byte scripts (``bytes.count`` on the class bytes; each of these patterns contains a
    non-ASCII class, so it is 0 in ASCII text and switching them on never jumps an estimate). Everything
    is a C-level pass; there is no per-character Python loop. The markup classes carry HTML and logs;
    the rare-letter class carries text in other languages written in Latin script, which o200k (trained
    mostly on English) splits into more tokens per word.

Fitting
    ``benchmarks/fit_estimator.py``: non-negative least squares on relative error (plain Python),
    each content kind weighted equally (``--kind-weight`` to weigh one more), on the training split of
    ``benchmarks/corpus.py`` (real files installed on the machine: stdlib sources, READMEs, licences,
    log files, HTML, translated man pages; seeded generators for JSON, MCP envelopes, TypeScript,
    paths/URLs, CJK, base64, markdown tables, logs, multilingual sentences). Weights are non-negative
    and every feature is a count that can only grow, so ``estimate_tokens(a + b) >= estimate_tokens(a)``
    (below the sampling threshold). Class weights are integers up to WEIGHT_MAX for the adler32 sum;
    the fit picks each rounding by its own objective.

Accuracy (held-out split: other seeds/files, 15 kinds, 600 samples, vs o200k_base)
    6.8% mean absolute error overall; per kind 3.7% (JSON, CJK) .. 13.6% (markdown tables),
    13.0% (translated man pages); see ``python benchmarks/estimator_accuracy.py``. chars/4 is 25% off.

Speed (figures: docs/estimators.md, ``benchmarks/estimator_accuracy.py``)
    ASCII text counts its transitions on the weight bytes (each ASCII class has its own weight, so no
    second translation), and a pattern one of whose bytes never occurs is not counted (a memchr instead
    of a count): the same sums, in the same order.
    Above 64 K characters the estimate is taken from 32 evenly spaced chunks (320 characters, 64 for
    non-ASCII text) scored as one and scaled by length, so the cost of a larger string does not grow with
    its size.
"""

from __future__ import annotations

from zlib import adler32

# Byte -> character-class table. Each UTF-8 byte becomes one class byte, so counting
# class patterns with bytes.count (C speed) counts runs and transitions in the text.
_CLASS = bytearray(b"." * 256)
for _b in range(ord("a"), ord("z") + 1):
    _CLASS[_b] = ord("a")
for _b in range(ord("A"), ord("Z") + 1):
    _CLASS[_b] = ord("A")
for _b in range(ord("0"), ord("9") + 1):
    _CLASS[_b] = ord("0")
_CLASS[ord(" ")] = _CLASS[ord("\t")] = ord(" ")
_CLASS[ord("\n")] = _CLASS[ord("\r")] = ord("\n")
_CLASS[ord('"')] = ord('"')
# Punctuation that marks up text (HTML tags, paths, brackets, identifiers, rules and options) has classes of
# its own, and so do the letters rare in English (more tokens per word in other languages): o200k merges them
# differently from the rest, and a class's weight costs nothing (it is in WEIGHT_TABLE).
for _chars in ("<>", "/", "()[]{}", "_", "-", "zkj"):
    for _ch in _chars:
        _CLASS[ord(_ch)] = ord(_chars[0])
for _b in range(0x80, 0xC0):
    _CLASS[_b] = ord("x")  # UTF-8 continuation byte
for _b in range(0xC0, 0xE0):
    _CLASS[_b] = ord("m")  # 2-byte char: accented Latin, Greek, Cyrillic, Arabic, Hebrew
for _b in (0xE0, 0xE1, 0xE2, 0xEE, 0xEF):
    _CLASS[_b] = ord("p")  # 3-byte char outside CJK: Indic, symbols, arrows, fullwidth
for _b in range(0xE3, 0xEA):
    _CLASS[_b] = ord("c")  # U+3000..U+9FFF: CJK punctuation, kana, ideographs
for _b in range(0xEA, 0xEE):
    _CLASS[_b] = ord("k")  # U+A000..U+DFFF: mostly Hangul syllables
for _b in range(0xF0, 0x100):
    _CLASS[_b] = ord("e")  # 4-byte char: emoji and other astral characters
CLASS_TABLE = bytes(_CLASS)

CANDIDATE_PATTERNS: tuple[bytes, ...] = (
    b"a", b"A", b"0", b" ", b"\n", b'"', b".",
    b"m", b"p", b"c", b"k", b"e",
    b" a", b" A", b".a", b".A", b'"a', b'"A', b"\na", b"\nA", b"0a", b"0A", b"xa", b"xA",
    b"aA", b"AA", b"AAAA", b"aaaa", b"aaaaaaaa",
    b" 0", b".0", b'"0', b"a0", b"A0", b"\n0", b"000",
    b"a.", b"A.", b"0.", b'a"', b'A"', b'0"', b"..", b'."', b'".', b'""',
    b"  ", b"    ", b"\n ", b"\n\n", b" \n", b".\n",
    b"a ", b"A ", b"0 ", b". ", b'" ',
    b"cc", b"kk", b"mxm", b"cxxa", b"cxx ",
    b" m", b".m", b"mxmxmxmx", b"pxxp", b" p", b"ex", b"mxa", b"amx",
    b"....", b"        ", b" e", b"e",
    b"<", b"/", b"(", b"_", b"-", b"z", b"x", b"\n<", b" -", b" (",
)


# The fitted model (see benchmarks/fit_estimator.py): ASCII patterns are always counted,
# non-ASCII ones only when the text is not ASCII (they would all be 0).
ASCII_PATTERNS: tuple[bytes, ...] = (
    b"a", b"A", b"0", b".", b"\n", b"\"", b" ", b"<", b"/", b"(", b"_", b"-", b"z", b"A0",
)
NON_ASCII_PATTERNS: tuple[bytes, ...] = (
    b"m", b"p", b"c", b"k", b"e", b"x", b" m", b" p", b" e", b"xa", b"mxm", b"amx", b"mxmxmxmx", b"cxx ",
)
PATTERNS = ASCII_PATTERNS + NON_ASCII_PATTERNS


def raw_features(text: str) -> list[int]:
    """All candidate features (for the fitting script): [bytes, chars, *CANDIDATE_PATTERNS]."""
    b = text.encode("utf-8", "surrogatepass")
    t = b.translate(CLASS_TABLE)
    return [len(b), len(text)] + [t.count(p) for p in CANDIDATE_PATTERNS]


def features(text: str) -> list[int]:
    """The model's features: [bytes, *PATTERNS] (for the fitting script); NON_ASCII_PATTERNS are 0 in ASCII text."""
    b = text.encode("utf-8", "surrogatepass")
    t = b.translate(CLASS_TABLE)
    patterns = PATTERNS if len(b) != len(text) else ASCII_PATTERNS
    return [len(b)] + [t.count(p) for p in patterns] + [0] * (len(PATTERNS) - len(patterns))


# Fitted weights for (bytes, *PATTERNS); regenerate with benchmarks/fit_estimator.py.
WEIGHTS: tuple[float, ...] = (
    0.00000,  # bytes
    0.17063, 0.21001, 0.66940, 0.64315, 1.56193, 0.44627, 0.03938,  # ASCII_PATTERNS: a A 0 . \n " space
    0.81378, 0.34126, 0.05250, 0.00000, 0.42002, 1.66694, 5.16075,  # < / ( _ - z A0
    0.00000, 0.26251, 0.68253, 0.65627, 0.00000, 0.00000, 1.84694, 0.74612,  # NON_ASCII_PATTERNS: m p c k e x " m" " p"
    1.29970, 0.00000, 0.00000, 1.14988, 0.29009, 1.36512,  # " e" xa mxm amx mxmxmxmx "cxx "
)

_W_BYTES = WEIGHTS[0]
# Single-class patterns need no count at all: each byte is translated straight to an integer weight
# (the bytes weight plus its class's weight, scaled so the largest is WEIGHT_MAX) and the weights are summed
# by zlib.adler32, whose low 16 bits are 1 + the byte sum mod 65521: exact for chunks of at most
# 65520 // WEIGHT_MAX bytes, and a C loop instead of one bytes.count pass per class.
_ALL_PATTERNS = ASCII_PATTERNS + NON_ASCII_PATTERNS
_CLASS_WEIGHT = {p[0]: w for p, w in zip(_ALL_PATTERNS, WEIGHTS[1:], strict=True) if len(p) == 1}
_BYTE_WEIGHT = [_W_BYTES + _CLASS_WEIGHT.get(CLASS_TABLE[b], 0.0) for b in range(256)]
WEIGHT_MAX = 127  # the grid's steps: at 63 the rounding alone cost compact JSON 1.5 points
_WEIGHT_SCALE = WEIGHT_MAX / max(_BYTE_WEIGHT)
WEIGHT_TABLE = bytes(round(w * _WEIGHT_SCALE) for w in _BYTE_WEIGHT)
_SUM_CHUNK = 65520 // WEIGHT_MAX  # the largest chunk whose byte sum stays below 65521
# Multi-byte patterns (runs and transitions) are counted on the class bytes; the non-ASCII ones only
# when the text is not ASCII (they would all be 0).
_ASCII_PAIRS = tuple((p, w) for p, w in zip(ASCII_PATTERNS, WEIGHTS[1:], strict=False) if len(p) > 1)
_NON_ASCII_RUNS = tuple(
    (p, w)
    for p, w in zip(NON_ASCII_PATTERNS, WEIGHTS[1 + len(ASCII_PATTERNS) :], strict=True)
    if len(p) > 1 and w > 0
)
#: A pattern, its distinct byte values (last first) and its weight.
_Counted = tuple[tuple[bytes, tuple[int, ...], float], ...]


def _counted(patterns: tuple[tuple[bytes, float], ...]) -> _Counted:
    # Byte values as ints: `int in bytes` is a bare memchr, while a one-byte bytes needle first fails (and
    # clears) an int conversion, ten times the cost.
    return tuple((p, tuple(dict.fromkeys(reversed(p))), w) for p, w in patterns)


def _add_counts(total: float, classes: bytes, patterns: _Counted) -> float:
    """``total`` plus each pattern's weight times its count in ``classes``, in order (the same float sums)."""
    for pattern, needles, weight in patterns:
        for needle in needles:
            # A pattern with a byte that never occurs ("A0" in text without digits, " e" without emoji) occurs
            # 0 times: `in` is a memchr, many times cheaper than the count.
            if needle not in classes:
                break
        else:
            total += weight * classes.count(pattern)
    return total


_ASCII_PAIRS_COUNTED = _counted(_ASCII_PAIRS)
_NON_ASCII_RUNS_COUNTED = _counted(_NON_ASCII_RUNS)


def _pairs_on_weight_bytes() -> _Counted | None:
    """_ASCII_PAIRS spelt in WEIGHT_TABLE bytes, or None if two ASCII classes share a weight.

    In ASCII text each class has its own weight byte, so the weight bytes are the class bytes renamed one to
    one and a pattern occurs exactly as often in either: ASCII text (the usual payload) then needs no
    CLASS_TABLE translation at all.
    """
    class_of_weight: dict[int, int] = {}
    for byte in range(128):
        if class_of_weight.setdefault(WEIGHT_TABLE[byte], CLASS_TABLE[byte]) != CLASS_TABLE[byte]:
            return None
    weight_of_class = {cls: weight for weight, cls in class_of_weight.items()}
    return _counted(tuple((bytes(weight_of_class[c] for c in p), w) for p, w in _ASCII_PAIRS))


_ASCII_PAIRS_ON_WEIGHTS = _pairs_on_weight_bytes()


def _weighted_byte_sum(weights: bytes) -> int:
    if len(weights) <= _SUM_CHUNK:  # the common case on the hot path: one call, no slicing
        return (adler32(weights) & 0xFFFF) - 1
    total = 0
    for start in range(0, len(weights), _SUM_CHUNK):  # a plain loop: a generator and sum() cost more than the sums
        total += (adler32(weights[start : start + _SUM_CHUNK]) & 0xFFFF) - 1
    return total


# Above this many characters, estimate from evenly spaced samples (bounded cost): 32 chunks, joined and
# scored in one pass (one call instead of 32 saves the per-call cost). Non-ASCII text costs several times
# more per character (3-byte characters, the non-ASCII patterns), so its chunks are shorter. Against a full
# scan of every corpus kind at 300 K characters the estimate is within 2.5%, at the same cost at any size.
SAMPLE_THRESHOLD = 64 * 1024
SAMPLE_CHUNKS = 32
SAMPLE_CHUNK = 320
SAMPLE_CHUNK_NON_ASCII = 64


def _score(text: str) -> float:
    """Unrounded estimate: weighted class counts plus weighted pattern counts (all C-level)."""
    b = text.encode("utf-8", "surrogatepass")  # surrogatepass: lone surrogates never raise
    weights = b.translate(WEIGHT_TABLE)
    total = _weighted_byte_sum(weights) / _WEIGHT_SCALE
    if len(b) == len(text) and _ASCII_PAIRS_ON_WEIGHTS is not None:  # ASCII: count the pairs on the weights
        return _add_counts(total, weights, _ASCII_PAIRS_ON_WEIGHTS)
    t = b.translate(CLASS_TABLE)
    total = _add_counts(total, t, _ASCII_PAIRS_COUNTED)
    if len(b) != len(text):  # non-ASCII present
        total = _add_counts(total, t, _NON_ASCII_RUNS_COUNTED)
    return total


def estimate_tokens(text: str) -> int:
    """Estimated o200k_base token count of `text` (0 for "", otherwise >= 1)."""
    n = len(text)
    if n == 0:
        return 0
    if n <= SAMPLE_THRESHOLD:
        score = _score(text)
    else:
        chunk = SAMPLE_CHUNK if text.isascii() else SAMPLE_CHUNK_NON_ASCII  # isascii() is O(1) on str
        step = (n - chunk) // (SAMPLE_CHUNKS - 1)
        sample = "".join([text[i * step : i * step + chunk] for i in range(SAMPLE_CHUNKS)])
        score = _score(sample) * n / len(sample)
    return max(1, int(score + 0.5))
