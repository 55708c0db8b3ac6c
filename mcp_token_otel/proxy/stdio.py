"""The stdio proxy: the server runs as a child process; bytes are copied both ways as they arrive.

One thread relays both directions. It waits (``poll``) on the client's stdin and the child's stdout,
copies raw chunks (``os.read``, 64 KiB, no line limit) and writes each on at once, non-blocking. What a
destination does not take yet stays pending and goes out as it drains; while it is pending that direction's
source is not read, so a slow consumer slows its own producer (backpressure through the pipes), never the
other direction, and nothing buffers beyond what one read brought. Each chunk is handed to the measuring side
just before it is written on: the same thread gathers the records (up to ``LINGER``, see measure_process.py)
and writes them to the measuring process's pipe in one non-blocking write, with a bounded backlog (what does
not fit is dropped and counted), so measuring never blocks the relay. Parsing, pairing and estimating happen
in the measuring process. No thread hand-off per message: a message costs the relay one wake-up, one read
and one write. The child's stderr is inherited. This module imports little: the server is started before the
measuring code is loaded, so that its start-up never waits on the proxy's.

Shutdown follows the MCP stdio transport: EOF on our stdin closes the child's stdin (once what was read before
is written to it); the child then has the shutdown grace to answer what it has read and exit, then gets
SIGTERM, then SIGKILL; SIGINT/SIGTERM received are forwarded to the child; once the child exits, what it
wrote still goes out (for up to the exit grace), and the proxy exits with the child's exit status (128 + N
when killed by signal N).
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import logging
import math
import os
import select
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .inject import Injector
from .startup import StartupError

if TYPE_CHECKING:
    from .transport import Channel

logger = logging.getLogger("mcp_token_otel.proxy")

CHUNK = 64 * 1024  # below malloc's mmap threshold: cheap for small messages, fine for 100 MB ones
#: Seconds the child gets to exit after SIGTERM, and after its stdin closed because the client went away (the
#: SDK's stdio client uses 2).
EXIT_GRACE = 2.0
#: Seconds the child gets, after the client closed its input, to answer the calls in flight and exit.
SHUTDOWN_GRACE = 30.0


def _die_with_parent() -> None:
    """In the child, before exec (Linux): SIGTERM when the proxy dies, even by SIGKILL, so no server is orphaned."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except Exception:
        pass


#: poll(2) where it handles every kind of file (epoll refuses regular files, which a redirected stdin may be;
#: macOS's poll refuses terminals), else select(2): a handful of descriptors either way.
_POLL = hasattr(select, "poll") and sys.platform != "darwin"
#: poll(2) events: what is asked for, and what wakes a reader or a writer (a hang-up or an error too: the
#: read or write that follows tells which).
_POLLIN, _POLLOUT = (select.POLLIN, select.POLLOUT) if _POLL else (1, 4)
_READABLE = _POLLIN | (select.POLLHUP | select.POLLERR | select.POLLNVAL if _POLL else 0)
_WRITABLE = _POLLOUT | (select.POLLHUP | select.POLLERR | select.POLLNVAL if _POLL else 0)


class _Timer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Loop:
    """The relay thread's event loop: readers and writers by descriptor, timers, and callbacks run once the
    current wake-up's reads and writes are done. The measuring hand-off uses it as it uses an asyncio loop
    (``call_later``, ``call_soon``, ``add_writer``, ``remove_writer``). Registrations change at once: a
    descriptor is removed before it is closed, never after."""

    def __init__(self) -> None:
        self._poll = select.poll() if _POLL else None
        self._masks: dict[int, int] = {}
        self._readers: dict[int, Callable[[], None]] = {}
        self._writers: dict[int, Callable[[], None]] = {}
        self._timers: list[tuple[float, int, _Timer]] = []
        self._order = itertools.count()
        self._soon: list[Callable[[], None]] = []

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None:
        self._readers[fd] = callback
        self._update(fd)

    def remove_reader(self, fd: int) -> None:
        if self._readers.pop(fd, None) is not None:
            self._update(fd)

    def add_writer(self, fd: int, callback: Callable[[], None]) -> None:
        self._writers[fd] = callback
        self._update(fd)

    def remove_writer(self, fd: int) -> None:
        if self._writers.pop(fd, None) is not None:
            self._update(fd)

    def call_soon(self, callback: Callable[[], None]) -> None:
        self._soon.append(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer(callback)
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._order), timer))
        return timer

    def _update(self, fd: int) -> None:
        mask = (_POLLIN if fd in self._readers else 0) | (_POLLOUT if fd in self._writers else 0)
        old = self._masks.get(fd, 0)
        if mask == old:
            return
        if mask:
            self._masks[fd] = mask
        else:
            del self._masks[fd]
        if self._poll is not None:
            if not mask:
                self._poll.unregister(fd)
            elif old:
                self._poll.modify(fd, mask)
            else:
                self._poll.register(fd, mask)

    def _ready(self, timeout: float | None) -> list[tuple[int, int]]:
        """(descriptor, poll events) of those ready within ``timeout`` seconds (None: no limit)."""
        if self._poll is not None:
            return self._poll.poll(None if timeout is None else math.ceil(timeout * 1000))
        readers, writers, _ = select.select(list(self._readers), list(self._writers), [], timeout)
        ready = dict.fromkeys(readers, _POLLIN)
        for fd in writers:
            ready[fd] = ready.get(fd, 0) | _POLLOUT
        return list(ready.items())

    def run_once(self, deadline: float | None = None) -> None:
        """Wait for the first ready descriptor, due timer or ``deadline`` (monotonic), and handle what is due."""
        timers = self._timers
        while timers and timers[0][2].cancelled:
            heapq.heappop(timers)
        wake = timers[0][0] if timers else None
        if deadline is not None and (wake is None or deadline < wake):
            wake = deadline
        timeout = 0.0 if self._soon else None if wake is None else max(0.0, wake - time.monotonic())
        for fd, events in self._ready(timeout):
            if events & _READABLE:
                reader = self._readers.get(fd)
                if reader is not None:
                    reader()
            if events & _WRITABLE:
                writer = self._writers.get(fd)
                if writer is not None:
                    writer()
        if timers:
            now = time.monotonic()
            while timers and (timers[0][0] <= now or timers[0][2].cancelled):
                timer = heapq.heappop(timers)[2]
                if not timer.cancelled:
                    self._soon.append(timer.callback)
        while self._soon:
            soon, self._soon = self._soon, []
            for callback in soon:
                callback()


#: Why an output takes nothing more when the relay closed it itself (the client's stdout at the server's EOF).
CLOSED = "closed"


class _Output:
    """What is on its way to one destination: written at once as far as it takes it, the rest kept (in order)
    and written as it drains. ``queued`` and ``written`` count bytes since the start."""

    __slots__ = ("error", "fd", "loop", "parts", "queued", "settle", "written")

    def __init__(self, fd: int, loop: _Loop, settle: Callable[[], None]) -> None:
        self.fd = fd
        self.loop = loop
        self.settle = settle  # after a write as it drains: the relay resumes reads, ends what is done
        self.parts: deque[memoryview] = deque()
        self.queued = 0
        self.written = 0
        #: Why nothing more can be written ("peer closed", a write error); what was pending is dropped.
        self.error: str | None = None

    @property
    def pending(self) -> bool:
        return bool(self.parts)

    def push(self, data: bytes) -> None:
        if self.error is not None or not data:
            return
        self.queued += len(data)
        if self.parts:
            self.parts.append(memoryview(data))
            return
        try:
            written = os.write(self.fd, data)  # a pipe may take part of a large write
        except BlockingIOError:
            written = 0
        except OSError as exc:
            self._fail(exc)
            return
        self.written += written
        if written < len(data):
            self.parts.append(memoryview(data)[written:])
            self.loop.add_writer(self.fd, self._drain)

    def _drain(self) -> None:
        parts = self.parts
        try:
            while parts:
                head = parts[0]
                written = os.write(self.fd, head)
                self.written += written
                if written < len(head):
                    parts[0] = head[written:]
                    break
                parts.popleft()
        except BlockingIOError:
            pass
        except OSError as exc:
            self._fail(exc)
        if not parts:
            self.loop.remove_writer(self.fd)
        self.settle()

    def close(self, why: str = "peer closed") -> None:
        """Nothing more goes out (the descriptor is about to be closed, or broke)."""
        if self.error is None:
            self.error = why
        self.parts.clear()
        self.loop.remove_writer(self.fd)

    def _fail(self, exc: OSError) -> None:
        self.close("peer closed" if exc.errno in (errno.EPIPE, errno.EBADF) else f"write error: {exc.strerror}")


class _Direction:
    """One direction of the relay: its source, where its bytes go, its channel, and how far it got."""

    __slots__ = ("_loop", "_on_readable", "answered", "channel", "done", "ended", "eof", "finished", "out",
                 "reading", "src")

    def __init__(self, src: int, out: _Output, channel: Channel, ended: Callable[[str], None], loop: _Loop,
                 readable: Callable[[_Direction], None]) -> None:
        self.src = src
        self.out = out
        self.channel = channel
        self.ended = ended  # told once, why the direction ended ("eof", "peer closed", a read or write error)
        self._loop = loop
        self._on_readable = lambda: readable(self)
        self.reading = False
        self.eof = False  # the source is done: what is pending still goes out, then the direction ends
        self.finished = False  # the channel was told the input ended (measured to its end)
        self.done = False
        #: Called after a chunk that ends a line was forwarded (server to client, measured off the relay).
        self.answered: Callable[[], None] | None = None

    def resume(self) -> None:
        if not self.reading:
            self.reading = True
            self._loop.add_reader(self.src, self._on_readable)

    def pause(self) -> None:
        if self.reading:
            self.reading = False
            self._loop.remove_reader(self.src)

    def stop(self) -> None:
        """No more reads. Broken off before its end: what was held is dropped, what went through is measured."""
        self.pause()
        if not self.finished:
            self.finished = True
            self.channel.measurer.finish(self.channel.stream)


def _set_non_blocking(fd: int) -> bool:
    """A pipe or socket written non-blocking, so that a full one never stops the other direction; True if it
    was changed (to be restored). A terminal or file stays as it is: it is shared with others, and never fills."""
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)) or not os.get_blocking(fd):
            return False
        os.set_blocking(fd, False)
    except OSError:
        return False
    return True


class _ExitNotice:
    """Set when the child has exited, waking the loop: a thread waits for the child (it costs nothing meanwhile)
    and writes to a pipe the loop reads. The thread owns the write end, the loop the read end."""

    def __init__(self, proc: subprocess.Popen[bytes], loop: _Loop) -> None:
        self._loop = loop
        self.exited = False
        self._read, write = os.pipe()
        loop.add_reader(self._read, self._woken)

        def wait() -> None:
            proc.wait()
            self.exited = True  # before the wake-up: the loop that wakes sees it
            with contextlib.suppress(OSError):
                os.write(write, b"x")
            os.close(write)

        threading.Thread(target=wait, name="proxy-child-exit", daemon=True).start()

    def _woken(self) -> None:
        self._loop.remove_reader(self._read)  # once: the pipe stays readable (EOF) from now on

    def close(self) -> None:
        self._loop.remove_reader(self._read)
        os.close(self._read)


class StdioProxy:
    """The stdio :class:`~.transport.Transport`: bytes arrive and leave on pipes; a message is a line."""

    network = "pipe"

    def __init__(
        self, command: Sequence[str], *, name: str, stdin_fd: int = 0, stdout_fd: int = 1,
        exit_grace: float = EXIT_GRACE, shutdown_grace: float = SHUTDOWN_GRACE, inject: bool = False,
    ) -> None:
        self.command = list(command)
        self.name = name
        self.stdin_fd = stdin_fd
        self.stdout_fd = stdout_fd
        self.exit_grace = exit_grace
        self.shutdown_grace = shutdown_grace
        self.inject = inject
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._directions: list[_Direction] = []
        self._to_child: _Output | None = None
        self._to_client: _Output | None = None
        # Guards on, the proxy's own answers to the client: held while a server line too long to hold passes
        # in pieces, and the client's input is not read until they are written (up to ``_replies_end``).
        self._held: list[bytes] = []
        self._replies_end = 0

    def start(self) -> None:
        try:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                                         preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        except FileNotFoundError:
            raise StartupError(f"command not found: {self.command[0]}") from None
        except PermissionError:
            raise StartupError(f"command not executable: {self.command[0]}") from None
        except OSError as exc:
            raise StartupError(f"cannot start {self.command[0]}: {exc.strerror or exc}") from None

    def run(self, telemetry: Any) -> int:
        """Relay until the child exits; its exit status (128 + N for a signal)."""
        from .jsonrpc import A_SERVER_NAME, C2S, LINES, S2C  # the child is running already (see the module doc)
        from .measure_process import LINGER
        from .transport import Channel

        proc = self.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        measurer = telemetry.measurer
        loop = _Loop()
        attach = getattr(measurer, "attach_loop", None)
        if attach is not None:  # records go to the measuring process from this thread, never waiting for it
            attach(loop, wait_ready=False, delay=LINGER)
        tracker = measurer.tracker(
            session_key=uuid.uuid4().hex, transport=self.network,
            attributes={"server.address": self.name, A_SERVER_NAME: self.name},
        )
        injector = Injector(measurer) if self.inject else None
        child_in = proc.stdin.fileno()
        _set_non_blocking(child_in)
        restore = _set_non_blocking(self.stdout_fd)
        self._to_child = _Output(child_in, loop, self._settle)
        self._to_client = _Output(self.stdout_fd, loop, self._settle)
        up = _Direction(self.stdin_fd, self._to_child, Channel(measurer, tracker, C2S, LINES, injector),
                        self._client_ended, loop, self._readable)
        down = _Direction(proc.stdout.fileno(), self._to_client, Channel(measurer, tracker, S2C, LINES),
                          self._server_ended, loop, self._readable)
        if attach is not None:
            down.answered = measurer.answered
        self._directions = [up, down]
        exited = _ExitNotice(proc, loop)
        previous = self._forward_signals()
        try:
            self._settle()
            deadline: float | None = None  # once the child exited, what it wrote still goes out until then
            while True:
                if exited.exited:
                    if down.done:
                        break
                    if deadline is None:
                        deadline = time.monotonic() + self.exit_grace
                    elif time.monotonic() >= deadline:
                        break
                loop.run_once(deadline)
        finally:
            self._restore_signals(previous)
            exited.close()
            for direction in self._directions:
                direction.stop()
            if restore and self._to_client.error != CLOSED:
                with contextlib.suppress(OSError):
                    os.set_blocking(self.stdout_fd, True)
        code = proc.wait()
        measurer.close_tracker(tracker)
        if attach is not None:
            measurer.detach_loop()
        if code < 0:
            logger.info("mcp-token-otel proxy: %s killed by signal %d", self.name, -code)
            return 128 - code
        if code != 0:
            logger.info("mcp-token-otel proxy: %s exited with status %d", self.name, code)
        return code

    def _readable(self, direction: _Direction) -> None:
        """A chunk from ``direction``'s source (EOF: a last line without its newline goes as it is), handed
        over and written on; with guards on, a refused request is answered to the client, never forwarded."""
        try:
            chunk = os.read(direction.src, CHUNK)
        except BlockingIOError:
            return
        except OSError as exc:
            self._end(direction, f"read error: {exc.strerror}")
            self._settle()
            return
        if chunk:
            forward, reply = direction.channel.feed(chunk)
        else:
            forward, reply = direction.channel.finish()
            direction.finished = direction.eof = True
        out = direction.out
        out.push(forward)
        if direction.answered is not None and chunk.endswith(b"\n"):
            direction.answered()  # a server message ended: its measurement goes along with its request's
        if reply:
            self._held.append(reply)
        elif not (out.parts or out.error or direction.eof or self._held):
            return  # all written: the direction reads on, nothing else changed
        self._settle()

    def _settle(self) -> None:
        """After every read or write: end what is done, read only where nothing is pending (backpressure per
        direction), let held answers out between the server's lines."""
        up, down = self._directions
        to_client = self._to_client
        assert to_client is not None
        if self._held and not (down.channel.passing and not down.done):
            for reply in self._held:
                to_client.push(reply)
            self._held.clear()
            self._replies_end = to_client.queued
        for _ in range(2):  # ending one direction may end the other (its destination closed)
            for direction in (up, down):
                if direction.done:
                    continue
                out = direction.out
                if out.error is not None:
                    self._end(direction, out.error)
                elif direction.eof:
                    if not out.pending:
                        self._end(direction, "eof")
                    else:
                        direction.pause()
                elif out.pending or (direction is up and self._answers_pending()):
                    direction.pause()
                else:
                    direction.resume()

    def _answers_pending(self) -> bool:
        to_client = self._to_client
        assert to_client is not None
        return bool(self._held) or (to_client.error is None and to_client.written < self._replies_end)

    def _end(self, direction: _Direction, why: str) -> None:
        direction.done = True
        direction.stop()
        direction.ended(why)

    def _close_child_stdin(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stdin is not None and self._to_child is not None
        self._to_child.close()
        with contextlib.suppress(OSError):
            proc.stdin.close()

    def _client_ended(self, why: str) -> None:
        """Our stdin reached EOF (or the child's stdin broke): pass the EOF on; the child answers what it has
        read (its answers still reach the client) and exits, else it is stopped after the shutdown grace."""
        logger.debug("mcp-token-otel proxy: client side ended (%s)", why)
        self._close_child_stdin()
        self._reap_later(self.shutdown_grace)

    def _server_ended(self, why: str) -> None:
        """The child's stdout ended (it exits or crashed) or our stdout broke (the client is gone)."""
        logger.debug("mcp-token-otel proxy: server side ended (%s)", why)
        if why != "eof":  # the client cannot hear the server any more: stop the server
            self._close_child_stdin()
            self._reap_later()
        else:
            assert self._to_client is not None
            self._to_client.close(CLOSED)
            with contextlib.suppress(OSError):
                os.close(self.stdout_fd)  # the client sees EOF as it would from the server itself

    def _reap_later(self, grace: float | None = None) -> None:
        """Make sure the child goes: SIGTERM after ``grace`` (default: the exit grace), then SIGKILL."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        first = self.exit_grace if grace is None else grace
        threading.Thread(target=self._escalate, args=(first,), name="proxy-reaper", daemon=True).start()

    def _escalate(self, first: float) -> None:
        proc = self.proc
        assert proc is not None
        for sig, grace in ((signal.SIGTERM, first), (signal.SIGKILL, self.exit_grace)):
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    return
                time.sleep(0.02)
            logger.info("mcp-token-otel proxy: %s did not exit; sending %s", self.name, sig.name)
            with contextlib.suppress(OSError):
                proc.send_signal(sig)

    def _forward_signals(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return previous

        def forward(signum: int, _frame: Any) -> None:
            proc = self.proc
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.send_signal(signum)
            self._reap_later()

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, forward)
        return previous

    @staticmethod
    def _restore_signals(previous: dict[int, Any]) -> None:
        for sig, handler in previous.items():
            with contextlib.suppress(Exception):
                signal.signal(sig, handler)


def default_name(command: Sequence[str]) -> str:
    """The server's name when ``--name`` is not given: the command's basename (``npx``: its package)."""
    base = os.path.basename(command[0]) if command else "server"
    if base in ("npx", "uvx", "pipx", "bunx", "node", "python", "python3", "deno", "bun") and len(command) > 1:
        for arg in command[1:]:
            if not arg.startswith("-"):
                return os.path.basename(arg.rstrip("/")) or base
    return base
