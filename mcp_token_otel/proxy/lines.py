"""Newline-delimited JSON (stdio) cut into whole lines, bounded: the one splitter the proxy's line rewriters
(trace-context injection, guards) share. A line longer than the bound is not held: its bytes pass through
as they come, so a huge message never costs more memory than the bound."""

from __future__ import annotations

from collections.abc import Callable, Iterator


class LineSplitter:
    """Feed chunks; get back ``(bytes, whole)`` pieces in order: ``whole`` True is one complete line
    (newline included) to inspect, False is bytes of an over-long line to forward untouched."""

    def __init__(self, max_line: int, on_oversize: Callable[[], None] | None = None) -> None:
        self.max_line = max_line
        self.on_oversize = on_oversize
        self._partial: list[bytes] = []
        self._size = 0
        #: Inside a line too long to hold: its pieces are forwarded as they come.
        self.passing = False

    def feed(self, chunk: bytes) -> Iterator[tuple[bytes, bool]]:
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                break
            piece = chunk[start:nl + 1]
            if self.passing:
                self.passing = False
                yield piece, False
            else:
                line = b"".join((*self._partial, piece)) if self._partial else piece
                self._partial.clear()
                self._size = 0
                yield line, True
            start = nl + 1
        rest = chunk[start:] if start else chunk
        if not rest:
            return
        if self.passing:
            yield rest, False
            return
        self._partial.append(rest)
        self._size += len(rest)
        if self._size > self.max_line:  # too long to hold: relayed as it comes, not inspected
            if self.on_oversize is not None:
                self.on_oversize()
            held = b"".join(self._partial)
            self._partial.clear()
            self._size = 0
            self.passing = True
            yield held, False

    def flush(self) -> tuple[bytes, bool]:
        """End of input: the last bytes without a newline, and whether they are a whole line to inspect."""
        rest = b"".join(self._partial)
        self._partial.clear()
        self._size = 0
        return rest, bool(rest) and not self.passing
