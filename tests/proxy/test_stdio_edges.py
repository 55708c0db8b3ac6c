"""The stdio proxy's edges, byte for byte against the same child run directly: invalid JSON, batches, unknown ids,
a 100 MB line, a server crashing mid-message, exit codes, EOF and signals passed on, startup errors."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .conftest import Receiver, free_port, proxy_argv, proxy_env, sample, scrape, wait_for

CHILD = Path(__file__).parent / "servers" / "raw_child.py"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"



def _scrape(port: int) -> str:
    """/metrics, or "" while it is not up yet: it comes with the measuring process, which the relay does not
    wait for."""
    try:
        return scrape(port)
    except OSError:
        return ""

def _child(*args: str) -> list[str]:
    return [sys.executable, str(CHILD), *args]


def _start_proxy(command: list[str], *options: str, otlp_port: int | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        proxy_argv(*options, "--", *command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, **proxy_env(otlp_port)},
    )


def _finish(proc: subprocess.Popen[bytes], timeout: float = 30) -> tuple[bytes, bytes, int]:
    out, err = proc.communicate(timeout=timeout)
    return out, err, proc.returncode


def _lines() -> bytes:
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
         "params": {"name": "t", "arguments": {"q": "x" * 400},
                    "_meta": {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}}},
        "this is not json",
        [{"jsonrpc": "2.0", "id": "b", "method": "resources/read", "params": {"uri": "file:///a"}},
         {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}],
        {"jsonrpc": "2.0", "id": 77, "result": {}},  # a response to a request nobody sent
    ]
    return b"".join((m.encode() if isinstance(m, str) else json.dumps(m).encode()) + b"\n" for m in messages)


def test_messages_forwarded_unchanged_and_counted(receiver: Receiver) -> None:
    direct = subprocess.run(_child("responder"), input=_lines(), capture_output=True, timeout=30).stdout
    port = free_port()
    proc = _start_proxy(_child("responder"), "--name", "raw", "--metrics-port", str(port), otlp_port=receiver.port)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(_lines())
    proc.stdin.flush()
    got = b""
    while len(got) < len(direct):  # read what the server answers while the proxy is still up
        chunk = proc.stdout.read1(1 << 16)  # type: ignore[attr-defined]
        assert chunk, "proxy closed its stdout early"
        got += chunk

    def counted() -> str | None:
        # Both directions are measured independently: wait for the last message of each (the client's
        # unmatched response, the server's invalid line), not only the client side, before comparing.
        text = _scrape(port)
        done = (sample(text, "mcp_token_proxy_messages_total", kind="unmatched") >= 1
                and sample(text, "mcp_token_proxy_messages_total", direction="server_to_client", kind="invalid") >= 1
                and sample(text, "mcp_token_proxy_messages_total", direction="server_to_client", kind="response") >= 2)
        return text if done else None

    text = wait_for(counted, what="counts")
    out, err, code = _finish(proc)
    assert got + out == direct  # byte for byte what the server wrote
    assert code == 0, err
    assert b"/metrics at" not in err  # a port given: nothing to announce at the default log level
    c2s = {k: sample(text, "mcp_token_proxy_messages_total", direction="client_to_server", kind=k)
           for k in ("request", "invalid", "notification", "unmatched")}
    s2c = {k: sample(text, "mcp_token_proxy_messages_total", direction="server_to_client", kind=k)
           for k in ("response", "invalid", "unmatched")}
    assert c2s == {"request": 2, "invalid": 1, "notification": 1, "unmatched": 1}
    assert s2c == {"response": 2, "invalid": 1, "unmatched": 0}
    spans = {span.name: (span, attrs) for _, span, attrs in receiver.spans()}
    span, attrs = spans["tools/call t"]
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == PARENT_ID  # continues the caller
    assert attrs["mcp_token.input_tokens"] >= 100 and attrs["server.address"] == "raw"
    assert "resources/read" in spans


def test_metrics_port_0_prints_the_port_taken() -> None:
    """--metrics-port 0 serves /metrics on any free port and says which on stderr, once; it counts the calls."""
    proc = _start_proxy(_child("responder"), "--name", "raw", "--metrics-port", "0")
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    lines: list[bytes] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, b"")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    url = wait_for(lambda: next((line.decode().split(" at ", 1)[1].strip() for line in lines
                                 if b"/metrics at " in line), None), what="the /metrics URL on stderr")
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
    assert port > 0
    proc.stdin.write(b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t"}}\n')
    proc.stdin.flush()
    assert b'"id": 1' in proc.stdout.readline()
    wait_for(lambda: sample(_scrape(port), "mcp_token_proxy_messages_total", kind="response") >= 1,
             what="the call counted on the announced port")
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    reader.join(10)
    assert sum(b"/metrics at " in line for line in lines) == 1, lines


@pytest.mark.slow
def test_100_mb_line_relayed_whole() -> None:
    """A 100 MB message on one line, written while nobody reads yet (backpressure), comes back intact."""
    payload = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                          "params": {"name": "big", "arguments": {"blob": "y" * 100_000_000}}}).encode() + b"\n"
    port = free_port()
    proc = _start_proxy(_child("echo"), "--metrics-port", str(port))
    assert proc.stdin is not None and proc.stdout is not None

    def write() -> None:
        assert proc.stdin is not None
        proc.stdin.write(payload)
        proc.stdin.flush()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    time.sleep(0.5)  # the pipes fill and the writer blocks: nothing may be lost meanwhile
    digest, size = hashlib.sha256(), 0
    while size < len(payload):
        chunk = proc.stdout.read1(1 << 20)  # type: ignore[attr-defined]
        assert chunk, "proxy closed its stdout early"
        digest.update(chunk)
        size += len(chunk)
    writer.join(30)
    assert size == len(payload) and digest.digest() == hashlib.sha256(payload).digest()

    def measured() -> str | None:
        text = _scrape(port)  # a message is counted before it is estimated (seconds at 100 MB): wait for both
        return text if sample(text, "mcp_token_proxy_messages_total", direction="server_to_client",
                              kind="request") >= 1 and sample(text, "mcp_token_tokens_total", side="proxy",
                                                              direction="input") >= 2 * 25_000_000 else None

    text = wait_for(measured, timeout=60, what="the 100 MB message measured")
    assert sample(text, "mcp_token_tokens_total", side="proxy", direction="input") >= 2 * 25_000_000
    _, err, code = _finish(proc)
    assert code == 0, err


def test_server_crash_mid_message() -> None:
    """Half a message then exit 5: the half is forwarded, the proxy exits 5 although its stdin is still open."""
    proc = _start_proxy(_child("partial"))
    assert proc.stdout is not None
    out = proc.stdout.read()  # EOF: the proxy closed its stdout after the server's
    proc.wait(timeout=30)
    assert out == b'{"jsonrpc": "2.0", "id": 1, "resu'
    assert proc.returncode == 5
    assert proc.stdin is not None
    proc.stdin.close()


def test_stdin_eof_passed_on() -> None:
    proc = _start_proxy(_child("exit", "3"))
    _, err, code = _finish(proc)
    assert code == 3, err


@pytest.mark.slow
def test_server_ignoring_eof_is_terminated() -> None:
    proc = _start_proxy(_child("sleeper"), "--shutdown-grace", "2")
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    _, _, code = _finish(proc)  # stdin closes; the child never reads it: SIGTERM after the grace period
    assert code == 128 + signal.SIGTERM
    _assert_gone(pid)


def test_sigterm_and_sigint_forwarded() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        proc = _start_proxy(_child("sleeper"))
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        proc.send_signal(sig)
        proc.wait(timeout=30)
        assert proc.returncode in (128 + sig, 1 if sig == signal.SIGINT else -1)  # python exits 1 on SIGINT
        _assert_gone(pid)
        assert proc.stdin is not None
        proc.stdin.close()


def _assert_gone(pid: int) -> None:
    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie nobody has reaped yet (orphans go to PID 1) has exited too
            return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
        except (OSError, IndexError):
            return False

    wait_for(gone, what=f"child {pid} gone")


def test_startup_errors_one_line_exit_2() -> None:
    env = {**os.environ, **proxy_env()}
    missing = subprocess.run(proxy_argv("--", "no-such-mcp-server-xyz"), capture_output=True, text=True,
                             env=env, timeout=30)
    assert missing.returncode == 2
    expected = "mcp-token-otel proxy: error: command not found: no-such-mcp-server-xyz"
    assert missing.stderr.strip().splitlines() == [expected]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = subprocess.run(proxy_argv("--metrics-port", str(port), "--metrics-required", "--",
                                          *_child("exit", "0")),
                               capture_output=True, text=True, env=env, timeout=30)
    assert taken.returncode == 2
    (line,) = taken.stderr.strip().splitlines()
    assert line.startswith("mcp-token-otel proxy: error: cannot listen for /metrics on 127.0.0.1:") and "use" in line
    nothing = subprocess.run(proxy_argv(), capture_output=True, text=True, env=env, timeout=30)
    assert nothing.returncode == 2 and len(nothing.stderr.strip().splitlines()) == 1


def test_client_gone_stops_the_server() -> None:
    """The client closes its end of the proxy's stdout: the next server output cannot be delivered, so the proxy
    closes the server's stdin and ends (no process left behind)."""
    proc = _start_proxy(_child("echo"))
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdout.close()  # the client stops listening
    proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/x"}\n')  # echoed back into a closed pipe
    proc.stdin.flush()
    proc.wait(timeout=30)
    assert proc.returncode == 0  # echo exits 0 on the EOF the proxy passed on
    proc.stdin.close()


def test_proxy_killed_takes_the_server_along() -> None:
    """Even SIGKILL (no handler can run): the server gets SIGTERM from the kernel (Linux parent-death signal)."""
    proc = _start_proxy(_child("sleeper"))
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    proc.kill()
    proc.wait(timeout=30)
    _assert_gone(pid)
    assert proc.stdin is not None
    proc.stdin.close()


def test_stdio_writer_lingers_and_keeps_order_and_put_times(tmp_path: Path) -> None:
    """The stdio relay hands chunks to the writer thread, which lingers to write a burst in one go: every chunk
    reaches the measuring process, in order, stamped with the time it was put (not written); drain waits for
    what lingers."""
    from mcp_token_otel.proxy import measure_process as mp

    assert mp.LINGER > 0
    sink = tmp_path / "records"
    measurer = mp.RemoteMeasurer(["sh", "-c", f"echo ready; cat > {sink}"])
    tracker = measurer.tracker(session_key="k", transport="pipe")
    stream = measurer.stream(tracker, "client_to_server", "lines")
    windows = []
    for i in range(200):
        before = time.time_ns()
        measurer.put(stream, b'{"n":%d}\n' % i)
        windows.append((before, time.time_ns()))
    assert measurer.queue.drain(30)
    measurer.close()
    data, offset, seen = sink.read_bytes(), 0, []
    while offset < len(data):
        op, ident, size, now = mp.HEADER.unpack_from(data, offset)
        offset += mp.HEADER.size
        if op == mp.DATA:
            assert ident == stream.id
            seen.append((data[offset:offset + size], now))
        offset += size
    assert [payload for payload, _ in seen] == [b'{"n":%d}\n' % i for i in range(200)]
    assert all(start <= now <= end for (_, now), (start, end) in zip(seen, windows, strict=True))
