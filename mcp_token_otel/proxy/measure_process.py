"""Measuring in a separate process, so that its CPU time never competes with the relay for the GIL.

The relay never waits for it. stdio (thread mode): records go into the bounded :class:`MeasureQueue`, whose
thread gathers them for LINGER and writes them to the pipe (a blocking write, the GIL released); when the
measuring process falls behind, the pipe fills, that thread waits, the queue fills, and further chunks are
forwarded but counted as dropped. HTTP (event-loop mode, :meth:`RemoteMeasurer.attach_loop`): the loop's thread
gathers records for FLUSH_DELAY and writes them in one non-blocking write, with a bounded backlog when the pipe
is full; what does not fit is forwarded but counted as dropped.

The measuring process (``python -m mcp_token_otel.proxy.measure_process``) owns the recorder, the
OTLP exporters and ``/metrics`` (or, ``--host-store``, its files in the host store that ``mcp-token-otel
serve`` serves, moved into the store's archive as it ends); it reads records from its stdin and ends, after
flushing, at EOF (the relay process exiting, even by SIGKILL, closes the pipe). It ignores SIGINT/SIGTERM: a
Ctrl-C reaches the whole process group, and the relay process decides when measuring ends.

Record: ``<B I I Q`` (op, id, payload length, time in ns) then the payload.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import logging
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Any, BinaryIO

from .measure_queue import MeasureQueue

if TYPE_CHECKING:  # the relay side stays light: it starts before the measuring code is imported
    from .jsonrpc import MessageStream, Tracker

logger = logging.getLogger("mcp_token_otel.proxy")

HEADER = struct.Struct("<BIIQ")
NEW_TRACKER, NEW_STREAM, DATA, FINISH, CLOSE_TRACKER, SET_TRACKER, LOST, DROPPED, INJECT = range(1, 10)
READY = b"ready\n"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: Event-loop mode: records wait at most this long (s) to be written to the measuring process, or until
#: FLUSH_BYTES of payload are pending.
FLUSH_DELAY = 0.002
FLUSH_BYTES = 256 * 1024
#: Thread mode (stdio): the queue's writer, once woken, waits this long (s) and writes what gathered in one go:
#: in a busy session one wake-up of it and of the measuring process per few calls, not per message (each
#: wake-up costs CPU well beyond the work it does). Spans are exported in batches and metrics scraped seconds
#: apart, so the lag is not seen.
LINGER = 0.05


class RemoteTracker:
    """The relay process's handle on a tracker that lives in the measuring process."""

    __slots__ = ("id",)

    def __init__(self, tracker_id: int) -> None:
        self.id = tracker_id


class RemoteStream:
    __slots__ = ("id", "lost")

    def __init__(self, stream_id: int) -> None:
        self.id = stream_id
        self.lost = False  # set by MeasureQueue.put when a chunk of this stream is dropped


class RemoteMeasurer:
    """Same interface as :class:`~.jsonrpc.Measurer`, backed by a measuring subprocess.

    The relay never waits for it to start: records go into the pipe (and the queue behind it) at once and are
    measured when it is ready; the queue's writer waits for its ``ready`` line (up to ``startup_timeout``), and
    if it never comes, relaying goes on unmeasured."""

    def __init__(self, argv: list[str], *, startup_timeout: float = 60.0) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._pipe: IO[bytes] = self.proc.stdin
        self._ready: list[bytes] = []
        self._reader = threading.Thread(target=self._wait_ready, name="mcp-token-otel-measure-start", daemon=True)
        self._reader.start()
        self.startup_timeout = startup_timeout
        self._started = False
        self._ids = itertools.count(1)
        self._broken = False
        self._dropped_sent = (0, 0)
        self.queue = MeasureQueue(self._write_data, linger=LINGER)
        # Event-loop mode (HTTP): records are written from the loop thread itself, non-blocking, with a
        # bounded backlog flushed when the pipe drains; no thread hand-off (and no GIL hand-off) per chunk.
        self._loop: Any = None
        self._backlog: collections.deque[memoryview] = collections.deque()
        self._backlog_bytes = 0
        self.max_backlog = self.queue.max_bytes
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._flush_soon = False
        self._flush_timer: Any = None

    # ------------------------------------------------------------------ relay side (never blocks)

    def tracker(self, **kwargs: Any) -> RemoteTracker:
        handle = RemoteTracker(next(self._ids))
        self._control(NEW_TRACKER, handle.id, json.dumps(kwargs).encode())
        return handle

    def stream(self, tracker: RemoteTracker, direction: str, framing: str) -> RemoteStream:
        handle = RemoteStream(next(self._ids))
        payload = json.dumps({"tracker": tracker.id, "direction": direction, "framing": framing}).encode()
        self._control(NEW_STREAM, handle.id, payload)
        return handle

    def put(self, stream: RemoteStream, chunk: bytes, at: int | None = None) -> None:
        if not chunk:
            return
        if self._loop is None:
            self.queue.put(stream, chunk, at)
        elif self._backlog_bytes + self._pending_bytes + len(chunk) > self.max_backlog:
            self.queue.dropped_chunks += 1  # counted where the thread mode counts it
            self.queue.dropped_bytes += len(chunk)
            stream.lost = True
        else:
            if stream.lost:
                stream.lost = False
                self._loop_write(LOST, stream.id, b"")
            self._loop_write(DATA, stream.id, chunk, at)

    def finish(self, stream: RemoteStream, at: int | None = None) -> None:
        self._control(FINISH, stream.id, b"", at)

    def close_tracker(self, tracker: RemoteTracker) -> None:
        self._control(CLOSE_TRACKER, tracker.id, b"")

    def set_tracker(self, tracker: RemoteTracker, **attrs: Any) -> None:
        self._control(SET_TRACKER, tracker.id, json.dumps(attrs).encode())

    def inject(self, tracker: RemoteTracker, request_id: Any, trace_id: int, span_id: int) -> None:
        self._control(INJECT, tracker.id, json.dumps([request_id, f"{trace_id:032x}", f"{span_id:016x}"]).encode())

    def _control(self, op: int, ident: int, payload: bytes, at: int | None = None) -> None:
        if self._loop is None:
            self.queue.control(lambda now: self._send(op, ident, payload, at or now))
        else:
            self._loop_write(op, ident, payload, at)

    # ------------------------------------------------------------------ event-loop mode

    def attach_loop(self, loop: Any) -> None:
        """From now on every call comes from ``loop``'s thread: write from it, never blocking. HTTP starts
        listening once the measuring process is ready (its /metrics up with the proxy; no child waits)."""
        self._check_started()
        self.queue.drain(10)
        self._pipe.flush()
        os.set_blocking(self._pipe.fileno(), False)
        self._loop = loop

    def detach_loop(self, timeout: float = 10.0) -> None:
        """The loop is stopping: write the backlog out (for at most ``timeout``) and go back to the thread."""
        if self._loop is None:
            return
        self._write_pending()
        loop, self._loop = self._loop, None
        fd = self._pipe.fileno()
        with contextlib.suppress(Exception):
            loop.remove_writer(fd)
        deadline = time.monotonic() + timeout
        try:
            while self._backlog and not self._broken:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([], [fd], [], left)[1]:
                    logger.warning("mcp-token-otel proxy: measuring backlog not delivered at exit")
                    break
                self._flush_backlog()
            os.set_blocking(fd, True)
        except (OSError, ValueError):
            self._broken = True
        self._backlog.clear()
        self._backlog_bytes = 0

    def _loop_write(self, op: int, ident: int, payload: bytes, at: int | None = None) -> None:
        # Records are gathered for FLUSH_DELAY (each keeps its own time) and go out in one write, after the
        # relay's own writes: a few syscalls and wake-ups of the measuring process per millisecond, not per
        # record. Past FLUSH_BYTES they go at the end of this loop iteration.
        if self._broken:
            return
        if not self._pending:
            self._flush_timer = self._loop.call_later(FLUSH_DELAY, self._write_pending)
        self._pending.append(HEADER.pack(op, ident, len(payload), at or time.time_ns()))
        if payload:
            self._pending.append(payload)
            self._pending_bytes += len(payload)
            if self._pending_bytes > FLUSH_BYTES and not self._flush_soon:
                self._flush_soon = True
                self._loop.call_soon(self._write_pending)

    def _write_pending(self) -> None:
        pending, self._pending = self._pending, []
        self._pending_bytes = 0
        self._flush_soon = False
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        if pending and not self._broken:
            self._write_record(b"".join(pending))

    def _write_record(self, record: bytes) -> None:
        if self._backlog:
            self._backlog.append(memoryview(record))
            self._backlog_bytes += len(record)
            return
        try:
            written = os.write(self._pipe.fileno(), record)
        except BlockingIOError:
            written = 0
        except OSError:
            self._gone()
            return
        if written < len(record):
            rest = memoryview(record)[written:]
            self._backlog.append(rest)
            self._backlog_bytes += len(rest)
            self._loop.add_writer(self._pipe.fileno(), self._flush_backlog)

    def _flush_backlog(self) -> None:
        fd = self._pipe.fileno()
        try:
            while self._backlog:
                head = self._backlog[0]
                written = os.write(fd, head)
                self._backlog_bytes -= written
                if written < len(head):
                    self._backlog[0] = head[written:]
                    return
                self._backlog.popleft()
        except BlockingIOError:
            return
        except OSError:
            self._gone()
        if (not self._backlog or self._broken) and self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_writer(fd)

    def _gone(self) -> None:
        self._broken = True
        self._backlog.clear()
        self._backlog_bytes = 0
        logger.warning("mcp-token-otel proxy: the measuring process is gone; relaying goes on unmeasured")

    def _wait_ready(self) -> None:
        assert self.proc.stdout is not None
        self._ready.append(self.proc.stdout.readline())

    @property
    def ready(self) -> bool:
        """The measuring process said it is ready (it measures what was handed over before, in order)."""
        return self._ready == [READY]

    def _check_started(self) -> None:
        """On the queue's thread, before its first write: the measuring process must have started."""
        self._started = True
        self._reader.join(self.startup_timeout)
        if not self.ready:
            self._broken = True
            logger.warning("mcp-token-otel proxy: the measuring process did not start; relaying goes on unmeasured")

    # ------------------------------------------------------------------ queue thread

    def _write_data(self, stream: RemoteStream, chunk: bytes, now: int) -> None:
        dropped = (self.queue.dropped_chunks, self.queue.dropped_bytes)
        if dropped != self._dropped_sent:
            self._dropped_sent = dropped
            self._send(DROPPED, 0, json.dumps(dropped).encode(), now)
        if stream.lost:
            stream.lost = False
            self._send(LOST, stream.id, b"", now)
        self._send(DATA, stream.id, chunk, now)

    def _send(self, op: int, ident: int, payload: bytes, now: int) -> None:
        if not self._started:
            self._check_started()
        if self._broken:
            return
        try:
            self._pipe.write(HEADER.pack(op, ident, len(payload), now))
            if payload:
                self._pipe.write(payload)
            if op != DATA or self.queue_empty():
                self._pipe.flush()
        except (OSError, ValueError):
            self._broken = True
            logger.warning("mcp-token-otel proxy: the measuring process is gone; relaying goes on unmeasured")

    def queue_empty(self) -> bool:
        return self.queue.pending() == 0

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (bounded by ``timeout``), then let the measuring process flush and exit."""
        self.detach_loop(timeout)
        self.queue.control(lambda now: self._send(DROPPED, 0, json.dumps(
            (self.queue.dropped_chunks, self.queue.dropped_bytes)).encode(), now))
        if not self.queue.drain(timeout):  # a stuck measurer: unblock the writer rather than hang
            logger.warning("mcp-token-otel proxy: the measuring process is not keeping up; stopping it")
            self.proc.kill()
        self.queue.close(1.0)
        with contextlib.suppress(OSError, ValueError):
            self._pipe.close()
        try:
            self.proc.wait(timeout)  # it flushes spans and metrics, then exits
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class RemoteTelemetry:
    """What a relay needs from the measuring side: its measurer, and an orderly close."""

    def __init__(self, config_path: str | None, name: str | None, metrics_host: str | None,
                 metrics_port: int | None, host_store: str | None = None, fallback: str | None = None):
        self.measurer = RemoteMeasurer(measuring_argv(config_path, name, metrics_host, metrics_port, host_store,
                                                      fallback))

    def close(self, timeout: float = 10.0) -> None:
        self.measurer.close(timeout)


def measuring_argv(config_path: str | None, name: str | None, metrics_host: str | None, metrics_port: int | None,
                   host_store: str | None = None, fallback: str | None = None) -> list[str]:
    argv = [sys.executable, "-m", "mcp_token_otel.proxy.measure_process"]
    if name:
        argv += ["--name", name]
    if fallback:
        argv += ["--fallback-name", fallback]
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel())  # the relay's --log-level
    if level in LOG_LEVELS:
        argv += ["--log-level", level]
    if config_path:
        argv += ["--config", config_path]
    if metrics_host:
        argv += ["--metrics-host", metrics_host]
    if metrics_port is not None:
        argv += ["--metrics-port", str(metrics_port)]
    if host_store is not None:
        argv += ["--host-store", host_store]
    return argv


# ---------------------------------------------------------------------- the measuring process


def _read_exact(stream: BinaryIO, size: int) -> bytes | None:
    data = stream.read(size)
    return data if data is not None and len(data) == size else None


def serve(source: BinaryIO, telemetry: Any) -> None:
    """Apply records until EOF."""
    trackers: dict[int, Tracker] = {}
    streams: dict[int, MessageStream] = {}
    measurer = telemetry.measurer
    stats = telemetry.stats
    # The host store's copy of the proxy's own counts follows each record that changes them
    # (Telemetry.sync_stats), so a measuring process killed loses none of what it counted.
    sync = getattr(telemetry, "sync_stats", None) or (lambda: None)
    while True:
        header = _read_exact(source, HEADER.size)
        if header is None:
            break
        op, ident, size, now = HEADER.unpack(header)
        payload = _read_exact(source, size) if size else b""
        if payload is None:
            break
        try:
            if op == DATA:
                stream = streams.get(ident)
                if stream is not None:
                    for message in stream.feed(payload):
                        stream.tracker.observe(stream.direction, message, now)
            elif op == NEW_TRACKER:
                trackers[ident] = measurer.tracker(**json.loads(payload))
            elif op == NEW_STREAM:
                spec = json.loads(payload)
                streams[ident] = measurer.stream(trackers[spec["tracker"]], spec["direction"], spec["framing"])
            elif op == FINISH:
                stream = streams.pop(ident, None)
                if stream is not None:
                    for message in stream.finish():
                        stream.tracker.observe(stream.direction, message, now)
            elif op == CLOSE_TRACKER:
                tracker = trackers.pop(ident, None)
                if tracker is not None:
                    tracker.close(now)
            elif op == SET_TRACKER:
                tracker = trackers.get(ident)
                for key, value in json.loads(payload).items() if tracker is not None else ():
                    setattr(tracker, key, value)
            elif op == LOST:
                stream = streams.get(ident)
                if stream is not None:
                    stream.lost = True
            elif op == INJECT:
                tracker = trackers.get(ident)
                if tracker is not None:
                    request_id, trace_id, span_id = json.loads(payload)
                    tracker.inject(request_id, int(trace_id, 16), int(span_id, 16))
            elif op == DROPPED:
                stats.remote_dropped = tuple(json.loads(payload))
        except Exception:  # a fault in measuring never stops it
            stats.faults += 1
            logger.debug("mcp_token_otel proxy: measurement fault", exc_info=True)
        if op in (DATA, FINISH, DROPPED):
            sync()
    end = time.time_ns()
    for tracker in trackers.values():  # the relay is gone: open requests end, budgets close
        tracker.close(end)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcp_token_otel.proxy.measure_process")
    parser.add_argument("--name", help="the server label (else the name the server gives itself)")
    parser.add_argument("--fallback-name", help="the server label until the server names itself")
    parser.add_argument("--config")
    parser.add_argument("--metrics-host")
    parser.add_argument("--metrics-port", type=int)
    parser.add_argument("--host-store", help="write metrics into this host store directory (mcp-token-otel serve)")
    parser.add_argument("--log-level", default="WARNING", choices=LOG_LEVELS)
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError):  # on a busy machine the relay gets the CPU first
        os.nice(5)
    logging.basicConfig(level=args.log_level, stream=sys.stderr, format="%(message)s")
    from ..config import load_config
    from .telemetry import Telemetry

    try:
        telemetry = Telemetry(load_config(args.config), args.name, metrics_host=args.metrics_host,
                              metrics_port=args.metrics_port, host_store=args.host_store,
                              fallback=args.fallback_name)
    except Exception as exc:
        print(f"mcp-token-otel proxy: error: {exc}", file=sys.stderr)
        return 2
    out = sys.stdout.buffer
    out.write(READY)
    out.flush()
    source = os.fdopen(sys.stdin.fileno(), "rb", buffering=1 << 20, closefd=False)
    try:
        serve(source, telemetry)
    finally:
        telemetry.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
