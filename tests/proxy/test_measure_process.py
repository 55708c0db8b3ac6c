"""The relay side of the measuring process: bounded, never blocking, even when the measurer stops reading.

Each scenario runs in a thread joined with a generous bound: a relay that blocked on the pipe would still be
running (a hang guard, not a timing assertion)."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable

from mcp_token_otel.proxy.jsonrpc import C2S, LINES
from mcp_token_otel.proxy.measure_process import RemoteMeasurer

STUCK = [sys.executable, "-c", "import sys, time; print('ready', flush=True); time.sleep(120)"]


def _finishes(work: Callable[[], None]) -> bool:
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(60)
    return not thread.is_alive()


def test_stuck_measurer_never_blocks_the_loop_and_drops_are_counted() -> None:
    measurer = RemoteMeasurer(STUCK)
    measurer.max_backlog = 1 << 20

    async def relay() -> None:
        measurer.attach_loop(asyncio.get_running_loop())
        stream = measurer.stream(measurer.tracker(session_key=None, transport="tcp"), C2S, LINES)
        for _ in range(200):  # 20 MB into a pipe nobody reads
            measurer.put(stream, b"x" * 100_000)

    assert _finishes(lambda: asyncio.run(relay()))
    queue = measurer.queue
    assert queue.dropped_chunks > 150 and queue.dropped_bytes == 100_000 * queue.dropped_chunks
    assert _finishes(lambda: measurer.close(timeout=1.0))  # although the backlog can never be delivered
    assert measurer.proc.poll() is not None


def test_stuck_measurer_thread_mode_close_is_bounded() -> None:
    measurer = RemoteMeasurer(STUCK)
    stream = measurer.stream(measurer.tracker(session_key=None, transport="pipe"), C2S, LINES)

    def relay() -> None:
        for _ in range(100):
            measurer.put(stream, b"y" * 100_000)  # the writer thread blocks on the full pipe; put never does

    assert _finishes(relay)
    assert _finishes(lambda: measurer.close(timeout=1.0))
    assert measurer.proc.poll() is not None
