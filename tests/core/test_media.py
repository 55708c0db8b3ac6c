"""Image and audio headers read from base64, token rules, and bounded behaviour on garbage and lies."""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_token_otel.core import media
from mcp_token_otel.core.measure import Policy, measure_result
from mcp_token_otel.core.media import ImageInfo, image_info, image_tokens, media_tokens, wav_seconds


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_header(width: int, height: int) -> bytes:
    """Signature and IHDR only: for sizes whose pixels would not fit in memory (a lying header)."""
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))


def png(width: int, height: int) -> bytes:
    """A real, decodable PNG: grey, 8-bit, one filter byte per row."""
    pixels = zlib.compress(b"".join(b"\x00" + b"\x80" * width for _ in range(height)))
    return png_header(width, height) + _chunk(b"IDAT", pixels) + _chunk(b"IEND", b"")


def gif(width: int, height: int) -> bytes:
    """A 2-colour GIF89a with one image whose pixels are all colour 0."""
    screen = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    image = b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0) + b"\x02\x02\x44\x01\x00"
    return screen + image + b"\x3b"


def jpeg(width: int, height: int, *, sof: int = 0xC0, exif_bytes: int = 0) -> bytes:
    """SOI, JFIF APP0, an optional large Exif APP1, a DQT, the SOFn frame header, then EOI."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    app1 = b"\xff\xe1" + struct.pack(">H", exif_bytes + 2) + b"E" * exif_bytes if exif_bytes else b""
    dqt = b"\xff\xdb" + struct.pack(">H", 67) + b"\x00" + bytes(range(1, 65))
    frame = b"\xff" + bytes([sof]) + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + app1 + dqt + frame + b"\xff\xd9"


def webp_vp8x(width: int, height: int) -> bytes:
    body = b"VP8X" + struct.pack("<I", 10) + b"\x00\x00\x00\x00"
    body += (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body


def webp_vp8l(width: int, height: int) -> bytes:
    bits = (width - 1) | ((height - 1) << 14)
    body = b"VP8L" + struct.pack("<I", 5) + b"\x2f" + bits.to_bytes(4, "little")
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body + b"\x00"


def webp_vp8(width: int, height: int) -> bytes:
    frame = b"\x00\x00\x00" + b"\x9d\x01\x2a" + struct.pack("<HH", width, height)
    body = b"VP8 " + struct.pack("<I", len(frame)) + frame
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body


def wav(seconds: float, rate: int = 8000, *, claimed: int | None = None) -> bytes:
    """16-bit mono PCM; ``claimed`` overrides the data size the header states."""
    data = b"\x00\x00" * round(seconds * rate)
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    size = len(data) if claimed is None else claimed
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", size) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (png(3, 2), ImageInfo("png", 3, 2)),
        (png(1, 700), ImageInfo("png", 1, 700)),
        (gif(5, 7), ImageInfo("gif", 5, 7)),
        (jpeg(640, 480), ImageInfo("jpeg", 640, 480)),
        (jpeg(1920, 1080, sof=0xC2), ImageInfo("jpeg", 1920, 1080)),  # progressive (SOF2)
        (jpeg(800, 600, exif_bytes=60_000), ImageInfo("jpeg", 800, 600)),  # SOF 60 KB in
        (webp_vp8x(4000, 3000), ImageInfo("webp", 4000, 3000)),
        (webp_vp8l(300, 200), ImageInfo("webp", 300, 200)),
        (webp_vp8(1024, 768), ImageInfo("webp", 1024, 768)),
    ],
)
def test_header_dimensions(raw: bytes, expected: ImageInfo) -> None:
    assert image_info(b64(raw)) == expected


def test_real_png_round_trips() -> None:
    raw = png(4, 3)
    assert zlib.decompress(raw[41:-16]) == b"\x00\x80\x80\x80\x80" * 3  # the IDAT really holds the pixels
    assert image_info(b64(raw)) == ImageInfo("png", 4, 3)


@pytest.mark.parametrize(
    ("size", "area", "tiles", "patches"),
    [
        ((1000, 1000), 1334, 765, 1024),  # area: 1e6 / 750; tiles: 768 x 768 is 4 tiles
        ((200, 200), 54, 255, 49),
        ((4000, 3000), 1600, 765, 1485),  # area capped; tiles: 2048 -> 1024 x 768
        ((2048, 4096), 1600, 1105, 1458),  # tiles: 768 x 1536 is 6 tiles; patches: 864 x 1728
        ((1800, 2400), 1600, 765, 1452),  # patches: OpenAI's worked example
    ],
)
def test_token_rules(size: tuple[int, int], area: int, tiles: int, patches: int) -> None:
    assert image_tokens(*size, "area") == area
    assert image_tokens(*size, "tiles") == tiles
    assert image_tokens(*size, "patches") == patches


def test_area_fits_1568_on_the_long_side() -> None:
    # 3136 x 200 becomes 1568 x 100: 210 tokens (156,800 / 750 rounded up), not the 837 of the full size
    assert image_tokens(3136, 200, "area") == 210


def test_wav_duration_and_tokens() -> None:
    assert wav_seconds(b64(wav(2.5))) == pytest.approx(2.5)
    assert media_tokens("audio", b64(wav(2.5)), "area") == 80  # 32 tokens per second
    # a stream header claiming 4 GB of data is cut to the bytes present
    assert wav_seconds(b64(wav(1.0, claimed=0xFFFFFFFF))) == pytest.approx(1.0)


@pytest.mark.parametrize("raw", [b"ID3\x04" + b"\x00" * 40, b"OggS" + b"\x00" * 40, b"", b"RIFF....WAVE"])
def test_audio_without_a_duration_is_unknown(raw: bytes) -> None:
    assert media_tokens("audio", b64(raw), "area") is None


@pytest.mark.parametrize(
    "raw",
    [
        png_header(0, 10),  # zero width
        b"\x89PNG\r\n\x1a\n\x00\x00",  # cut short
        jpeg(0, 0),
        b"\xff\xd8\xff\xda\x00\x02",  # scan before any frame header
        b"\xff\xd8" + b"\xff\xfe\x00\x02" * 200,  # endless comments: bounded walk
        b"\xff\xd8\xff\xe1\xff\xff",  # a segment running past the end
        b"RIFF\x00\x00\x00\x00WEBPVP8 ",
        b"GIF89a\x01",
        b"not an image at all",
    ],
)
def test_unreadable_headers_are_none(raw: bytes) -> None:
    assert image_info(b64(raw)) is None


@pytest.mark.parametrize("text", ["!!!!not base64", "iVBO\nRw0K", "é" * 40, "", "="])
def test_text_that_is_not_base64(text: str) -> None:
    assert image_info(text) is None and wav_seconds(text) is None


@pytest.mark.parametrize(
    "raw",
    [png_header(0xFFFFFFFF, 0xFFFFFFFF), png_header(1, 0x7FFFFFFF), gif(65535, 65535), webp_vp8x(1 << 24, 1 << 24)],
)
def test_lying_dimensions_are_bounded(raw: bytes) -> None:
    info = image_info(b64(raw))
    assert info is not None
    assert 1 <= image_tokens(info.width, info.height, "area") <= 1600
    assert 85 <= image_tokens(info.width, info.height, "tiles") <= 85 + 170 * 8
    assert 1 <= image_tokens(info.width, info.height, "patches") <= 1536


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from([b"", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"RIFF", b"GIF89a"]))
def test_random_bytes_never_raise(raw: bytes, magic: bytes) -> None:
    data = b64(magic + raw)
    info = image_info(data)
    if info is not None:
        for rule in ("area", "tiles", "patches"):
            assert image_tokens(info.width, info.height, rule) >= 1  # type: ignore[arg-type]
    seconds = wav_seconds(data)
    assert seconds is None or seconds >= 0


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 1 << 32), st.integers(1, 1 << 32))
def test_rules_are_bounded_for_any_size(width: int, height: int) -> None:
    assert 1 <= image_tokens(width, height, "area") <= 1600
    assert 255 <= image_tokens(width, height, "tiles") <= 85 + 170 * 8
    assert 1 <= image_tokens(width, height, "patches") <= 1536


def test_a_20_mb_image_is_never_decoded_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[int] = []
    real = media.b64decode

    def counting(text: Any, validate: bool = False) -> bytes:
        decoded.append(len(text))
        return real(text, validate=validate)

    monkeypatch.setattr(media, "b64decode", counting)
    big = b64(jpeg(6000, 4000, exif_bytes=65_000) + b"\x00" * (15 << 20))
    assert len(big) > 20_000_000
    assert image_info(big) == ImageInfo("jpeg", 6000, 4000)
    assert sum(decoded) < 1024


# --------------------------------------------------------------------------- measured blocks


def _image_result(data: str, kind: str = "image", mime: str = "image/png") -> dict[str, Any]:
    return {"content": [{"type": kind, "data": data, "mimeType": mime}]}


@pytest.mark.parametrize(("rule", "tokens"), [("area", 1334), ("tiles", 765), ("patches", 1024)])
def test_image_block_counts_its_dimensions(rule: Any, tokens: int) -> None:
    data = b64(png(1000, 1000))
    m = measure_result("tools/call", _image_result(data), policy=Policy(image_tokens=rule))
    block = m.blocks[0]
    assert block.type == "image" and block.data_tokens == tokens
    assert block.overhead_tokens > 0  # type and mimeType framing
    assert m.bytes >= len(data) and m.reason is None


def test_image_rule_base64_counts_the_text() -> None:
    data = b64(png(1000, 1000))
    by_area = measure_result("tools/call", _image_result(data)).blocks[0].data_tokens
    as_text = measure_result("tools/call", _image_result(data), policy=Policy(image_tokens="base64"))
    assert as_text.blocks[0].data_tokens != by_area and as_text.reason is None


def test_unreadable_image_and_unknown_audio_count_base64_and_say_so() -> None:
    m = measure_result("tools/call", _image_result("QUJD" * 250))
    assert m.blocks[0].data_tokens > 0 and "image header unreadable" in (m.reason or "")
    m = measure_result("tools/call", _image_result(b64(b"ID3\x04" + b"\x01" * 3000), "audio", "audio/mpeg"))
    assert m.blocks[0].data_tokens > 100 and "audio duration unknown" in (m.reason or "")


def test_wav_block_counts_its_duration() -> None:
    m = measure_result("tools/call", _image_result(b64(wav(3.0)), "audio", "audio/wav"))
    assert m.blocks[0].data_tokens == 96 and m.reason is None


def test_prompt_message_image_is_counted_by_dimensions() -> None:
    image = {"type": "image", "data": b64(gif(100, 100)), "mimeType": "image/gif"}
    result = {"messages": [{"role": "user", "content": image}]}
    m = measure_result("prompts/get", result)
    assert m.blocks[0].type == "message:image" and m.blocks[0].data_tokens == 14


def test_embedded_resource_blob_keeps_its_base64_count() -> None:
    data = b64(png(1000, 1000))
    result = {"content": [{"type": "resource", "resource": {"uri": "file:///a.png", "blob": data}}]}
    plain = measure_result("tools/call", result).blocks[0].data_tokens
    assert plain == measure_result("tools/call", result, policy=Policy(image_tokens="base64")).blocks[0].data_tokens
    assert plain > 1334
