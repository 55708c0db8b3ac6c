"""Image dimensions and audio durations read from the header of base64 data, and their token cost.

A model does not read an image's base64 text: it sees the picture, and vendors bill it by its size in
pixels. So an image block is counted from its width and height, read from the header only:

* PNG (IHDR), GIF (logical screen), WebP (``VP8``, ``VP8L``, ``VP8X``) carry them in the first 30 bytes;
* JPEG carries them in its SOF segment, after any APPn segments (Exif can be 64 KB): the segments are
  skipped by their lengths, decoding only the few bytes of each segment header it needs.

Nothing is decoded whole (a 20 MB image costs a few small ``b64decode`` calls), a header that lies
(zero or 4-billion-pixel dimensions, lengths past the end, endless segments) is bounded, and nothing here
raises: an unreadable header is ``None`` and the caller counts the block another way.

Image rules (``IMAGE_TOKEN_RULES``):

``area`` (default)
    ``width x height / 750`` after scaling down to fit 1568 px on the long side, at most 1600 tokens
    (the rule Anthropic publishes for Claude).
``tiles``
    ``85 + 170`` per 512-px tile, after scaling down to fit 2048 x 2048 and then to 768 px on the short
    side (OpenAI's high-detail rule for GPT-4o).
``patches``
    one token per 32-px patch, at most 1536 patches (the image is scaled down to fit), as OpenAI publishes
    for its patch-based models (GPT-4.1 mini and nano, o4-mini); their per-model multipliers are not applied.
``base64``
    the base64 text, as a client that cannot pass media natively inserts it (the upper bound).

Audio: a WAV header gives the duration (data size / byte rate), counted at ``AUDIO_TOKENS_PER_SECOND``
(Gemini's published 32 tokens per second); other formats have no duration in a fixed header: ``None``.
"""

from __future__ import annotations

import binascii
import math
import struct
from base64 import b64decode
from dataclasses import dataclass
from typing import Literal

ImageRule = Literal["area", "tiles", "patches", "base64"]
IMAGE_TOKEN_RULES: tuple[ImageRule, ...] = ("area", "tiles", "patches", "base64")
DEFAULT_IMAGE_RULE: ImageRule = "area"
AUDIO_TOKENS_PER_SECOND = 32

#: Base64 characters decoded to read a fixed header (PNG, GIF, WebP, WAV's first chunks): 96 bytes.
_HEAD_CHARS = 128
#: JPEG segments skipped at most before giving up on finding the SOF (real files have about ten).
_MAX_JPEG_SEGMENTS = 64
#: WAV chunks skipped at most before the "data" chunk.
_MAX_WAV_CHUNKS = 16
_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
#: Markers with no length field (TEM, RSTn): a lone byte pair.
_JPEG_BARE = frozenset({0x01, *range(0xD0, 0xD8)})


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What an image header says: its format ("png", "jpeg", "gif", "webp") and size in pixels."""

    format: str
    width: int
    height: int


class _Base64Window:
    """Random access to the bytes of a base64 string, decoding only the 4-character groups asked for."""

    __slots__ = ("_text", "size")

    def __init__(self, text: str) -> None:
        self._text = text
        self.size = len(text) // 4 * 3 - text[-2:].count("=")  # no rstrip: it would copy a 20 MB string

    def read(self, start: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``start`` (fewer at the end); b"" when the text is not clean base64."""
        if start < 0 or length <= 0 or start >= self.size:
            return b""
        first, last = start // 3 * 4, -(-(start + length) // 3) * 4
        try:
            raw = b64decode(self._text[first:last], validate=True)
        except (binascii.Error, ValueError):
            return b""
        skip = start - first // 4 * 3
        return raw[skip : skip + length]


def image_info(data: str) -> ImageInfo | None:
    """Format and dimensions from the header of base64 image ``data``; None when it cannot be read."""
    window = _Base64Window(data)
    head = window.read(0, _HEAD_CHARS // 4 * 3)
    if head.startswith(b"\x89PNG\r\n\x1a\n") and head[12:16] == b"IHDR":
        width, height = struct.unpack_from(">II", head, 16) if len(head) >= 24 else (0, 0)
        return _info("png", width, height)
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        return _info("gif", *struct.unpack_from("<HH", head, 6))
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return _webp(head)
    if head[:3] == b"\xff\xd8\xff":
        return _jpeg(window)
    return None


def _info(fmt: str, width: int, height: int) -> ImageInfo | None:
    return ImageInfo(fmt, width, height) if width > 0 and height > 0 else None


def _webp(head: bytes) -> ImageInfo | None:
    chunk = head[12:16]
    if chunk == b"VP8 " and len(head) >= 30 and head[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack_from("<HH", head, 26)
        return _info("webp", width & 0x3FFF, height & 0x3FFF)
    if chunk == b"VP8L" and len(head) >= 25 and head[20] == 0x2F:
        bits = int.from_bytes(head[21:25], "little")
        return _info("webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X" and len(head) >= 30:
        width = int.from_bytes(head[24:27], "little") + 1
        height = int.from_bytes(head[27:30], "little") + 1
        return _info("webp", width, height)
    return None


def _jpeg(window: _Base64Window) -> ImageInfo | None:
    """Walk the segments from SOI to the first SOF, reading each segment's 9-byte head only."""
    offset = 2
    for _ in range(_MAX_JPEG_SEGMENTS):
        head = window.read(offset, 9)
        if len(head) < 2 or head[0] != 0xFF:
            return None
        marker = head[1]
        if marker == 0xFF:  # fill byte before a marker
            offset += 1
            continue
        if marker in _JPEG_BARE:
            offset += 2
            continue
        if marker in _JPEG_SOF:
            if len(head) < 9:
                return None
            height, width = struct.unpack_from(">HH", head, 5)
            return _info("jpeg", width, height)
        if marker in (0xD9, 0xDA) or len(head) < 4:  # end of image, or scan data before any frame header
            return None
        offset += 2 + struct.unpack_from(">H", head, 2)[0]
    return None


def wav_seconds(data: str) -> float | None:
    """Duration of base64 WAV ``data`` from its header (data chunk size / byte rate), or None.

    A data size past the end of the payload (streams write 0xFFFFFFFF) is cut to the bytes present.
    """
    window = _Base64Window(data)
    head = window.read(0, 12)
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    offset, byte_rate = 12, 0
    for _ in range(_MAX_WAV_CHUNKS):
        chunk = window.read(offset, 20)
        if len(chunk) < 8:
            return None
        size = struct.unpack_from("<I", chunk, 4)[0]
        if chunk[:4] == b"fmt " and len(chunk) >= 20:
            byte_rate = struct.unpack_from("<I", chunk, 16)[0]
        elif chunk[:4] == b"data":
            present = min(size, window.size - offset - 8)
            return present / byte_rate if byte_rate > 0 and present >= 0 else None
        offset += 8 + size + (size & 1)  # chunks are padded to an even length
    return None


def image_tokens(width: int, height: int, rule: ImageRule) -> int:
    """Tokens of a ``width`` x ``height`` image under ``rule`` ("area", "tiles" or "patches")."""
    if rule == "tiles":
        return _tiles(width, height)
    if rule == "patches":
        return _patches(width, height)
    scale = min(1.0, 1568 / max(width, height))
    return max(1, min(1600, math.ceil(width * scale * (height * scale) / 750)))


def _tiles(width: int, height: int) -> int:
    scale = min(1.0, 2048 / max(width, height))
    scale *= min(1.0, 768 / max(1.0, min(width, height) * scale))
    w, h = max(1, round(width * scale)), max(1, round(height * scale))
    return 85 + 170 * math.ceil(w / 512) * math.ceil(h / 512)


def _patches(width: int, height: int, cap: int = 1536) -> int:
    patches = math.ceil(width / 32) * math.ceil(height / 32)
    if patches <= cap:
        return patches
    # Scaled so the patches fit the cap, then down to whole patches on the tighter side (the published steps).
    scale = math.sqrt(cap * 32 * 32 / (width * height))
    scale *= min(_whole_patches(width * scale), _whole_patches(height * scale))
    w, h = max(1.0, width * scale), max(1.0, height * scale)
    return max(1, min(cap, math.ceil(w / 32) * math.ceil(h / 32)))


def _whole_patches(side: float) -> float:
    """The factor that shrinks ``side`` pixels to whole 32-px patches (1 below one patch)."""
    return math.floor(side / 32) / (side / 32) if side >= 32 else 1.0


def audio_tokens(seconds: float) -> int:
    return max(1, math.ceil(seconds * AUDIO_TOKENS_PER_SECOND))


def media_tokens(kind: str, data: str, rule: ImageRule) -> int | None:
    """Tokens of an "image" or "audio" block's base64 ``data`` under ``rule``; None when the header does not
    say (or the rule is "base64"): the caller then counts the base64 text."""
    if rule == "base64":
        return None
    if kind == "image":
        info = image_info(data)
        return None if info is None else image_tokens(info.width, info.height, rule)
    seconds = wav_seconds(data)
    return None if seconds is None else audio_tokens(seconds)
