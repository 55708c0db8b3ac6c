"""The stdio relay in process on pipes: backpressure per direction (a stuck consumer stops its own producer's
reads only), large writes a pipe takes in parts, and EOF passed on once what was read is written.

Each scenario is bounded by a generous timeout (a hang guard, not a timing assertion)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from mcp_token_otel.proxy.measure_process import RemoteMeasurer
from mcp_token_otel.proxy.stdio import StdioProxy

from .conftest import wait_for

CHILD = Path(__file__).parent / "servers" / "raw_child.py"


class Relay:
    """A StdioProxy on pipes, run in a thread; the test is its client (``to_proxy``, ``from_proxy``)."""

    def __init__(self, *child: str) -> None:
        # The measuring side as in production (records written to a pipe), into a sink.
        self.measurer = RemoteMeasurer(["sh", "-c", "echo ready; cat > /dev/null"])
        self.proxy_in, self.to_proxy = os.pipe()
        self.from_proxy, self.proxy_out = os.pipe()
        self.proxy = StdioProxy([sys.executable, str(CHILD), *child], name="relay", stdin_fd=self.proxy_in,
                                stdout_fd=self.proxy_out, shutdown_grace=5, exit_grace=5)
        self.proxy.start()
        self.codes: list[int] = []
        self.thread = threading.Thread(target=lambda: self.codes.append(
            self.proxy.run(SimpleNamespace(measurer=self.measurer))), daemon=True)
        self.thread.start()

    def write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.to_proxy, view):]

    def read_exactly(self, size: int) -> bytes:
        got = bytearray()
        while len(got) < size:
            chunk = os.read(self.from_proxy, min(1 << 16, size - len(got)))
            assert chunk, "the proxy closed its stdout early"
            got += chunk
        return bytes(got)

    def close(self) -> int:
        """EOF to the proxy; its exit status once it has returned."""
        os.close(self.to_proxy)
        while os.read(self.from_proxy, 1 << 16):  # what is left, to the proxy's EOF
            pass
        self.thread.join(60)
        assert not self.thread.is_alive(), "the relay did not return"
        self.measurer.close()
        for fd in (self.proxy_in, self.from_proxy):
            os.close(fd)
        return self.codes[0]


@pytest.fixture
def relays() -> Iterator[list[Relay]]:
    started: list[Relay] = []
    yield started
    for relay in started:  # a failed test: no child left behind
        proc = relay.proxy.proc
        if proc is not None and proc.poll() is None:
            proc.kill()


def test_stuck_client_reader_does_not_stop_requests(tmp_path: Path, relays: list[Relay]) -> None:
    """The client does not read while the server floods it: the server's output waits (pipes full, the relay's
    reads of it paused), and still every request the client writes reaches the server at once."""
    log, size = tmp_path / "received", 8 << 20
    relay = Relay("flood", str(size), str(log))
    relays.append(relay)
    for n in range(20):
        line = b'{"jsonrpc":"2.0","id":%d,"method":"ping"}\n' % n
        relay.write_all(line)
        wait_for(lambda n=n: log.exists() and log.read_bytes().count(b"\n") == n + 1, timeout=30,
                 what=f"request {n} at the server while its output is stuck")
    assert relay.read_exactly(size) == (b"x" * 1023 + b"\n") * (size // 1024)
    assert relay.close() == 0


def test_stuck_server_reader_does_not_stop_its_output(relays: list[Relay]) -> None:
    """The server never reads while the client writes megabytes: the client's writes wait, and the server's
    lines still reach the client."""
    relay = Relay("deaf")
    relays.append(relay)
    blocked = threading.Event()

    def flood() -> None:
        with contextlib.suppress(OSError):  # the relay stopped reading and the test closed the pipe
            relay.write_all(b"y" * (8 << 20))
        blocked.set()

    writer = threading.Thread(target=flood, daemon=True)
    writer.start()
    received = b""
    while received.count(b"\n") < 40:  # about 0.8 s of the server's lines, while the client's writes wait
        chunk = os.read(relay.from_proxy, 1 << 16)
        assert chunk
        received += chunk
    assert not blocked.is_set()  # 8 MB cannot have gone into a server that never reads
    assert received.startswith(b'{"tick":0}\n{"tick":1}\n')
    proc = relay.proxy.proc
    assert proc is not None
    proc.terminate()
    relay.thread.join(60)
    assert relay.codes == [128 + 15]
    os.close(relay.proxy_in)  # the writer, stuck on a full pipe, gets EPIPE
    writer.join(30)
    relay.measurer.close()
    for fd in (relay.to_proxy, relay.from_proxy):
        os.close(fd)


def test_large_line_relayed_in_parts_then_eof(relays: list[Relay]) -> None:
    """A 16 MB line to an echoing server, written in one go and read back slowly: the pipes take it in parts
    (partial writes retried), nothing is lost or reordered; EOF right after it reaches the server only once all
    of it was written, and the proxy exits with the server's status."""
    relay = Relay("echo")
    relays.append(relay)
    payload = os.urandom(8 << 20).hex().encode() + b"\n"

    def write() -> None:
        relay.write_all(payload)
        os.close(relay.to_proxy)  # EOF at once: the server must still get all of it first

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    digest, size = hashlib.sha256(), 0
    while True:
        chunk = os.read(relay.from_proxy, 4096)  # small reads: the relay's writes to us are partial
        if not chunk:
            break
        digest.update(chunk)
        size += len(chunk)
    writer.join(30)
    relay.thread.join(60)
    assert size == len(payload) and digest.digest() == hashlib.sha256(payload).digest()
    assert relay.codes == [0]
    relay.measurer.close()
    for fd in (relay.proxy_in, relay.from_proxy):
        os.close(fd)
