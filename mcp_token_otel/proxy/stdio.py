"""The stdio proxy: the server runs as a child process; bytes are copied both ways as they arrive.

Two relay threads copy raw chunks (``os.read``/``os.write``, no line limit, partial writes retried); each
chunk is appended to the measuring queue (never blocks) and written on at once; parsing, pairing and
estimating happen on the measuring side. A blocked write blocks that relay's reads, so a
slow consumer slows its producer (backpressure through the pipes) instead of growing a buffer. The child's
stderr is inherited. This module imports little: the server is started before the measuring code is loaded,
so that its start-up never waits on the proxy's.

Shutdown follows the MCP stdio transport: EOF on our stdin closes the child's stdin; the child then has the
shutdown grace to answer what it has read and exit, then gets SIGTERM, then SIGKILL; SIGINT/SIGTERM received
are forwarded to the child; the proxy exits with the child's exit status (128 + N when killed by signal N).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
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


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)  # a pipe may take part of a large write
        view = view[written:]


class StdioProxy:
    """The stdio :class:`~.transport.Transport`: bytes arrive and leave on pipes; a message is a line."""

    network = "pipe"

    def __init__(
        self, command: Sequence[str], *, name: str, stdin_fd: int = 0, stdout_fd: int = 1,
        exit_grace: float = EXIT_GRACE, shutdown_grace: float = SHUTDOWN_GRACE, inject: bool = False,
        named: bool = True,
    ) -> None:
        """``name``: what logs and ``server.address`` call the server; ``named``: the user gave it (``--name``),
        so spans carry it as the server's name (else they carry the name the server gives itself)."""
        self.command = list(command)
        self.name = name
        self.named = named
        self.stdin_fd = stdin_fd
        self.stdout_fd = stdout_fd
        self.exit_grace = exit_grace
        self.shutdown_grace = shutdown_grace
        self.inject = inject
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()

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
        from ..semconv import A_SERVER_NAME
        from .jsonrpc import C2S, LINES, S2C  # the child is running already (see the module doc)
        from .transport import Channel

        proc = self.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        measurer = telemetry.measurer
        tracker = measurer.tracker(
            session_key=uuid.uuid4().hex, transport=self.network,
            attributes={"server.address": self.name, **({A_SERVER_NAME: self.name} if self.named else {})},
        )
        injector = Injector(measurer) if self.inject else None
        up = Channel(measurer, tracker, C2S, LINES, injector)
        down = Channel(measurer, tracker, S2C, LINES)
        # Guards on: the client's stdout takes server lines and the proxy's own answers, from two threads.
        out_lock = threading.Lock() if getattr(measurer, "guarded", False) is True else None
        t_up = threading.Thread(target=self._pump, args=(self.stdin_fd, proc.stdin.fileno(), up, self._client_ended,
                                                         out_lock), name="proxy-client-to-server", daemon=True)
        t_down = threading.Thread(target=self._pump, args=(proc.stdout.fileno(), self.stdout_fd, down,
                                                           self._server_ended, out_lock),
                                  name="proxy-server-to-client", daemon=True)
        previous = self._forward_signals()
        try:
            t_up.start()
            t_down.start()
            code = proc.wait()
        finally:
            self._restore_signals(previous)
        t_down.join(self.exit_grace)  # what the child wrote before exiting still goes out
        measurer.close_tracker(tracker)
        if code < 0:
            logger.info("mcp-token-otel proxy: %s killed by signal %d", self.name, -code)
            return 128 - code
        if code != 0:
            logger.info("mcp-token-otel proxy: %s exited with status %d", self.name, code)
        return code

    def _pump(self, src: int, dst: int, channel: Channel, ended: Callable[[str], None],
              out_lock: threading.Lock | None) -> None:
        """Copy raw chunks from ``src`` to ``dst`` through ``channel`` until EOF. With guards on, a line is
        written to the client whole under ``out_lock`` (an over-long line passing in pieces keeps the lock
        until its end), and a refused request is answered to the client, never sent to the server."""
        to_client = dst == self.stdout_fd and out_lock is not None
        why = "eof"
        holding = finished = False
        try:
            while True:
                try:
                    chunk = os.read(src, CHUNK)
                except OSError as exc:
                    why = f"read error: {exc.strerror}"
                    break
                if chunk:
                    forward, reply = channel.feed(chunk)
                else:  # EOF: a last line without its newline goes as it is
                    forward, reply = channel.finish()
                    finished = True
                if reply and out_lock is not None:
                    try:
                        with out_lock:
                            _write_all(self.stdout_fd, reply)
                    except OSError:
                        pass  # the client is gone: the other relay sees it too
                try:
                    if forward:
                        if to_client and not holding:
                            out_lock.acquire()  # type: ignore[union-attr]
                            holding = True
                        _write_all(dst, forward)
                    if holding and not channel.passing:
                        out_lock.release()  # type: ignore[union-attr]
                        holding = False
                except OSError as exc:
                    why = "peer closed" if exc.errno in (errno.EPIPE, errno.EBADF) else f"write error: {exc.strerror}"
                    break
                if not chunk:
                    break
        finally:
            if holding:
                out_lock.release()  # type: ignore[union-attr]
            if not finished:  # broken off: what was held is dropped, what went through is measured
                channel.measurer.finish(channel.stream)
            ended(why)

    def _client_ended(self, why: str) -> None:
        """Our stdin reached EOF (or the child's stdin broke): pass the EOF on; the child answers what it has
        read (its answers still reach the client) and exits, else it is stopped after the shutdown grace."""
        proc = self.proc
        assert proc is not None and proc.stdin is not None
        logger.debug("mcp-token-otel proxy: client side ended (%s)", why)
        with contextlib.suppress(OSError):
            proc.stdin.close()
        self._reap_later(self.shutdown_grace)

    def _server_ended(self, why: str) -> None:
        """The child's stdout ended (it exits or crashed) or our stdout broke (the client is gone)."""
        logger.debug("mcp-token-otel proxy: server side ended (%s)", why)
        if why != "eof":  # the client cannot hear the server any more: stop the server
            proc = self.proc
            assert proc is not None and proc.stdin is not None
            with contextlib.suppress(OSError):
                proc.stdin.close()
            self._reap_later()
        else:
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


#: Programs that run another: the server's name is in what they run.
_LAUNCHERS = frozenset({"npx", "uvx", "pipx", "bunx", "pnpx", "node", "python", "python3", "deno", "bun", "uv",
                        "docker", "podman", "npm", "pnpm", "yarn"})
#: Words of a launcher's command line that are not the server (subcommands).
_LAUNCHER_WORDS = frozenset({"run", "exec", "dlx", "x", "tool", "--"})
#: A launcher's options whose value is not the server either (docker's -v, uvx's --from, npx's -p, ...).
_VALUED_OPTIONS = frozenset({"-e", "--env", "--env-file", "-v", "--volume", "--mount", "--name", "-p", "--publish",
                             "--network", "--net", "-w", "--workdir", "-u", "--user", "--platform", "--entrypoint",
                             "--with", "--from", "--python", "--directory", "--project", "--package", "--index-url",
                             "--registry", "--cache", "--prefix", "--require", "-r", "--import"})
#: Files that say nothing about which server they start: the folder above them does.
_ENTRY_FILES = frozenset({"index.js", "index.mjs", "index.cjs", "main.js", "server.js", "cli.js", "main.py",
                          "server.py", "__main__.py", "index.ts", "main.ts"})
_VERSION_TAIL = re.compile(r"@[^@/]*$")


def default_name(command: Sequence[str]) -> str:
    """A name for the server from its command line, until the server names itself (``serverInfo.name``): the
    program, or what a launcher runs (``npx -y @scope/server@1.2`` is ``server``, ``docker run ... img:tag`` is
    ``img``, ``node .../server-x/dist/index.js`` is ``server-x``, ``python -m pkg.mod`` is ``pkg``), without a
    version."""
    if not command:
        return "server"
    program = os.path.basename(command[0])
    if program not in _LAUNCHERS:
        return _bare(command[0]) or program
    args = list(command[1:])
    if program in ("python", "python3") and "-m" in args and args.index("-m") + 1 < len(args):
        return args[args.index("-m") + 1].split(".")[0]
    skip = False
    for arg in args:
        if skip or arg.startswith("-") or arg in _LAUNCHER_WORDS or "=" in arg:
            skip = arg in _VALUED_OPTIONS
            continue
        return _bare(arg) or program
    return program


def _bare(target: str) -> str:
    """The name in a package, image or path: its last part, without a version or a tag, an entry file's folder."""
    path = target.rstrip("/")
    parts = [p for p in path.split("/") if p]
    if not parts:
        return ""
    name = parts[-1]
    if name in _ENTRY_FILES or (len(parts) > 1 and parts[-2] in ("dist", "build", "lib", "bin", "src")
                                and os.path.splitext(name)[1] in (".js", ".mjs", ".cjs", ".py", ".ts")):
        folders = [p for p in parts[:-1] if p not in ("dist", "build", "lib", "bin", "src")]
        name = folders[-1] if folders else name
    name = _VERSION_TAIL.sub("", name) if not name.startswith("@") or "@" in name[1:] else name
    name = name.split(":")[0] if ":" in name and "/" not in name.split(":")[-1] else name  # an image's tag
    return os.path.splitext(name)[0] if os.path.splitext(name)[1] in (".js", ".mjs", ".cjs", ".py", ".ts") else name
