"""Helpers for the host store tests: writer processes, ``mcp-token-otel serve`` as a subprocess, scrapes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.support import ROOT, free_port

T = TypeVar("T")
WRITER = Path(__file__).resolve().parent / "writer_child.py"
#: A scrape as {(sample name, sorted labels): value}.
Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_TOKEN_OTEL_", "OTEL_", "PROMETHEUS_"))}
    env.update({"PYTHONPATH": str(ROOT), "MCP_TOKEN_OTEL_ESTIMATOR": "chars/4"})
    env.update(extra)
    return env


class Writer:
    """A writer_child.py process."""

    def __init__(self, store: Path, server: str = "s") -> None:
        self.proc = subprocess.Popen([sys.executable, str(WRITER), str(store)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=child_env(HS_SERVER=server))
        assert self.proc.stdout is not None
        self.ident = self.proc.stdout.readline().strip()
        assert self.ident, "the writer did not start"

    def send(self, *lines: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("".join(f"{line}\n" for line in (*lines, "sync")))
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"

    def close(self) -> None:
        """Ends as a proxy does: its own files compacted into the archive."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("close\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "closed"
        assert self.proc.wait(30) == 0

    def exit(self) -> None:
        """Ends without compacting (as a killed process would)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("exit\n")
        self.proc.stdin.flush()
        assert self.proc.wait(30) == 0

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def parse(text: str) -> Scrape:
    out: Scrape = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(scrape: Scrape, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for (n, lab), v in scrape.items() if n == name and labels.items() <= dict(lab).items())


def has(scrape: Scrape, name: str, **labels: str) -> bool:
    return any(n == name and labels.items() <= dict(lab).items() for (n, lab) in scrape)


def wait_for(predicate: Callable[[], T | None], timeout: float = 30.0, what: str = "condition") -> T:
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)


class Serve:
    """``mcp-token-otel serve`` on a free port for one store."""

    def __init__(self, store: Path, *, env: dict[str, str] | None = None, interval: float = 30.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        store.parent.mkdir(parents=True, exist_ok=True)
        self.log = store.parent / f"serve-{self.port}.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mcp_token_otel", "serve", "--port", str(self.port), "--state-dir",
                 str(store), "--compact-interval", str(interval)],
                stdout=log, stderr=subprocess.STDOUT, env=env or child_env())
        wait_for(lambda: "/metrics at" in self.log.read_text() or self.proc.poll() is not None, what="serve")
        assert self.proc.poll() is None, self.log.read_text()

    def text(self) -> str:
        with urllib.request.urlopen(self.url, timeout=30) as response:
            return response.read().decode()

    def scrape(self) -> Scrape:
        return parse(self.text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "state" / "mcp-token-otel" / "metrics"


@pytest.fixture
def serve(store: Path) -> Iterator[Serve]:
    server = Serve(store)
    yield server
    server.stop()


def files(store: Path) -> list[str]:
    return sorted(name for name in os.listdir(store) if not name.startswith("."))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def gone(pid: int) -> bool:
    """The process has ended (a zombie waiting for its reaper counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in ("Z", "X")
    except OSError:
        return True
