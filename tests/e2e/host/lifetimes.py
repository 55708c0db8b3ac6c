"""Many short measuring-process lifetimes against one host store, for tests/e2e/host/test_lifetimes.py.

Each lifetime is a forked child that runs what a stdio proxy's measuring process runs, minus the pipe and the
interpreter start: ``Telemetry`` with the host store, ``measure_process.serve`` over the records a relay sends
for one session (initialize and two tools/call exchanges, then the session's end), then ``Telemetry.close``
(which moves its files into the archive). Every tenth child is killed with SIGKILL instead of closing.

    python lifetimes.py STORE COUNT BATCH
    prints "batch N" after each BATCH lifetimes and waits for a line on stdin; "done N" at the end.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys

import prometheus_client  # noqa: F401  (imported once here, not in every child: the lifetimes are the test)

from mcp_token_otel.config import load_config
from mcp_token_otel.emitters import host_store, prometheus_service  # noqa: F401
from mcp_token_otel.proxy import measure_process as mp
from mcp_token_otel.proxy.telemetry import Telemetry

NAMES = ("alpha", "bravo", "charlie", "delta", "echo")
PARALLEL = 2


def lines() -> tuple[bytes, bytes]:
    up, down = [], []
    up.append({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}})
    down.append({"jsonrpc": "2.0", "id": 0, "result": {
        "protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "s", "version": "1"}}})
    for i, size in ((1, 400), (2, 1200)):
        up.append({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                   "params": {"name": "big", "arguments": {"n": size}}})
        down.append({"jsonrpc": "2.0", "id": i, "result": {"content": [{"type": "text", "text": "x" * size}]}})
    return tuple(b"".join(json.dumps(m).encode() + b"\n" for m in side) for side in (up, down))  # type: ignore[return-value]


def records() -> bytes:
    up, down = lines()
    out = io.BytesIO()

    def put(op: int, ident: int, payload: bytes = b"") -> None:
        out.write(mp.HEADER.pack(op, ident, len(payload), 1_000_000_000))
        out.write(payload)

    put(mp.NEW_TRACKER, 1, json.dumps({"session_key": "k", "transport": "pipe", "attributes": {}}).encode())
    put(mp.NEW_STREAM, 2, json.dumps({"tracker": 1, "direction": "client_to_server", "framing": "lines"}).encode())
    put(mp.NEW_STREAM, 3, json.dumps({"tracker": 1, "direction": "server_to_client", "framing": "lines"}).encode())
    for a, b in zip(up.splitlines(keepends=True), down.splitlines(keepends=True), strict=True):
        put(mp.DATA, 2, a)
        put(mp.DATA, 3, b)
    put(mp.FINISH, 2)
    put(mp.FINISH, 3)
    put(mp.CLOSE_TRACKER, 1)
    return out.getvalue()


def lifetime(store: str, n: int, data: bytes) -> None:
    config = load_config()
    telemetry = Telemetry(config, NAMES[n % len(NAMES)], metrics_host=None, metrics_port=None, host_store=store)
    mp.serve(io.BytesIO(data), telemetry)
    if n % 10 == 9:
        os.kill(os.getpid(), signal.SIGKILL)
    telemetry.close()


def main() -> int:
    store, count, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    data = records()
    running: set[int] = set()
    for n in range(count):
        if len(running) >= PARALLEL:
            pid, _ = os.wait()
            running.discard(pid)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                lifetime(store, n, data)
            except BaseException:
                code = 1
            os._exit(code)
        running.add(pid)
        if (n + 1) % batch == 0:
            while running:
                running.discard(os.wait()[0])
            print(f"batch {n + 1}", flush=True)
            sys.stdin.readline()
    while running:
        running.discard(os.wait()[0])
    print(f"done {count}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
