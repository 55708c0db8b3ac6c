"""A real redis-server on a free loopback port, in a temporary directory, for one test or one module.

No persistence (a restart loses every key, as a crashed cache does); ``DEBUG`` allowed from loopback so that a test
can make the server slow. Every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.helpers.support import free_port, require_binary

#: Seconds a start or a stop may take before the test fails.
_WAIT_S = 10.0


class RedisServer:
    def __init__(self, directory: Path, password: str = "") -> None:
        self.binary = require_binary("redis-server")
        self.directory = directory
        self.password = password
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
                "--save", "", "--appendonly", "no", "--daemonize", "no", "--enable-debug-command", "local",
                "--logfile", str(self.directory / "redis.log")]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        self.starts += 1
        deadline = time.monotonic() + _WAIT_S
        while True:
            try:
                if self.client().ping():
                    return
            except Exception:
                if self.process.poll() is not None:
                    log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"redis-server exited with {self.process.returncode}:\n{log}") from None
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL: the server dies mid-run, as in a crash (its keys are lost)."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=_WAIT_S)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=_WAIT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=_WAIT_S)

    def client(self, **kwargs: Any) -> Any:
        """A plain redis-py client of this server (the test's own view of it, not the store's)."""
        import redis

        options = {"socket_timeout": _WAIT_S, "socket_connect_timeout": _WAIT_S, **kwargs}
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password or None, **options)

    def evalsha_calls(self) -> int:
        """EVALSHA commands the server has run since its start (INFO commandstats): round trips of the store."""
        stats = self.client().info("commandstats")
        return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
