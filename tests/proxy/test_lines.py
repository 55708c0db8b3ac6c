"""The proxy's shared line splitter: however a stream is chunked, whole lines come out whole and in order,
and a line over the bound passes through untouched (the relay never holds more than the bound)."""

from __future__ import annotations

import random

from mcp_token_otel.proxy.lines import LineSplitter


def _split_all(data: bytes, sizes: list[int], max_line: int) -> tuple[list[tuple[bytes, bool]], int]:
    oversize: list[int] = []
    splitter = LineSplitter(max_line, lambda: oversize.append(1))
    pieces: list[tuple[bytes, bool]] = []
    pos = 0
    for size in sizes:
        pieces.extend(splitter.feed(data[pos:pos + size]))
        pos += size
    pieces.extend(splitter.feed(data[pos:]))
    rest = splitter.flush()
    if rest[0]:
        pieces.append(rest)
    return pieces, len(oversize)


def test_any_chunking_gives_the_same_whole_lines() -> None:
    rng = random.Random(7)
    lines = [b'{"id": %d, "x": "%s"}\r\n' % (i, b"a" * rng.randrange(0, 40)) for i in range(200)]
    data = b"".join(lines) + b'{"last": true}'
    for _ in range(50):
        sizes = [rng.randrange(1, 90) for _ in range(rng.randrange(1, 300))]
        pieces, oversize = _split_all(data, sizes, max_line=1000)
        assert oversize == 0
        assert all(whole for _, whole in pieces)
        assert [p for p, _ in pieces] == [*lines, b'{"last": true}']


def test_an_over_long_line_passes_through_and_the_next_line_is_whole_again() -> None:
    long_line = b"x" * 5000 + b"\n"
    data = b"short\n" + long_line + b"after\n"
    pieces, oversize = _split_all(data, [3, 700, 700, 700, 700, 700, 700, 700, 700], max_line=1000)
    assert oversize == 1
    assert b"".join(p for p, _ in pieces) == data  # nothing lost, nothing reordered
    assert pieces[0] == (b"short\n", True) and pieces[-1] == (b"after\n", True)
    assert all(not whole for p, whole in pieces[1:-1])
    assert max(len(p) for p, _ in pieces) <= 1000 + 700  # never held past the bound (plus one chunk)


def test_an_unterminated_over_long_tail_is_not_a_whole_line() -> None:
    splitter = LineSplitter(10)
    forwarded = b"".join(p for p, _ in splitter.feed(b"y" * 25))
    assert forwarded == b"y" * 25 and splitter.passing
    assert splitter.flush() == (b"", False)
