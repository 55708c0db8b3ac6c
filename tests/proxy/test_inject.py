"""Opt-in context injection (``--inject-trace-context``), stdio and HTTP.

Off (the default) the server receives the client's bytes unchanged. On, a request without a ``traceparent``
in ``params._meta`` gets the proxy span's (``params`` is never created), so the server SDK's own span becomes
a child of the proxy's span.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from mcp_token_otel.proxy.inject import Injector, LineInjector

from .conftest import TEST_SERVER, Receiver, proxy_argv, proxy_env, wait_for
from .test_http import _serve, http_proxy, read_body

CLIENT_TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
MESSAGES = [
    b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "a", "arguments": {}}}',
    b'{"jsonrpc":"2.0","id":"two","method":"ping"}',  # no params: none is created
    b'{"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"_meta": {"traceparent": "%s"}}}'
    % CLIENT_TP.encode(),  # the client's own context is kept
    b'{"jsonrpc": "2.0", "method": "notifications/initialized", "params": {}}',  # not a request
    b'{"jsonrpc": "2.0", "id": 5, "method": "resources/read", "params": {"uri": "x", "_meta": {"k": "v"}}}',
]

# A child that records every line it receives and answers each request with an empty result.
RECORDER = (
    "import json, sys\n"
    "out = open(sys.argv[1], 'ab')\n"
    "for line in sys.stdin.buffer:\n"
    "    out.write(line); out.flush()\n"
    "    m = json.loads(line)\n"
    "    if 'id' in m:\n"
    "        sys.stdout.buffer.write(json.dumps({'jsonrpc': '2.0', 'id': m['id'], 'result': {}}).encode() + b'\\n')\n"
    "        sys.stdout.buffer.flush()\n"
)


def _stdio_received(tmp: Path, *options: str, otlp_port: int | None = None) -> list[bytes]:
    seen = tmp / "seen.jsonl"
    proc = subprocess.run(
        proxy_argv(*options, "--", sys.executable, "-c", RECORDER, str(seen)),
        input=b"".join(m + b"\n" for m in MESSAGES), capture_output=True, timeout=60,
        env={**os.environ, **proxy_env(otlp_port)},
    )
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 4  # every request answered
    return seen.read_bytes().splitlines()


def _check_injected(received: list[bytes]) -> list[str]:
    """The injected traceparents; everything that must not change is byte for byte the client's."""
    assert received[1] == MESSAGES[1] and received[2] == MESSAGES[2] and received[3] == MESSAGES[3]
    first, fifth = json.loads(received[0]), json.loads(received[4])
    assert first["params"]["name"] == "a" and first["params"]["arguments"] == {}
    assert fifth["params"]["uri"] == "x" and fifth["params"]["_meta"]["k"] == "v"
    tps = [first["params"]["_meta"]["traceparent"], fifth["params"]["_meta"]["traceparent"]]
    for tp in tps:
        version, trace_id, span_id, flags = tp.split("-")
        assert version == "00" and len(trace_id) == 32 and len(span_id) == 16 and flags == "01"
    assert tps[0] != tps[1]
    return tps


def _proxy_span_ids(receiver: Receiver, names: set[str]) -> dict[str, str]:
    def ready() -> dict[str, str] | None:
        found = {span.name: f"00-{span.trace_id.hex()}-{span.span_id.hex()}-01"
                 for _, span, _ in receiver.spans() if span.name in names}
        return found if set(found) == names else None

    return wait_for(ready, what=f"proxy spans {names}")


def test_stdio_off_bytes_unchanged(tmp_path: Path) -> None:
    assert _stdio_received(tmp_path) == MESSAGES


def test_stdio_on_injects_the_proxy_span(tmp_path: Path, receiver: Receiver) -> None:
    received = _stdio_received(tmp_path, "--inject-trace-context", otlp_port=receiver.port)
    tps = _check_injected(received)
    spans = _proxy_span_ids(receiver, {"tools/call a", "resources/read"})
    assert spans["tools/call a"] == tps[0] and spans["resources/read"] == tps[1]
    (listed,) = [span for _, span, _ in receiver.spans() if span.name == "tools/list"]
    assert listed.trace_id.hex() == CLIENT_TP.split("-")[1]  # the client's trace continued, as without the flag


@pytest.mark.parametrize("inject", [False, True])
@pytest.mark.slow
def test_sdk_server_span_parented_to_the_proxy_span(inject: bool, receiver: Receiver) -> None:
    """The project's test server (mcp SDK with a tracer provider): its SERVER span's parent is the proxy span."""
    with tempfile.TemporaryDirectory() as tmp:
        spans_file = Path(tmp) / "server-spans.jsonl"
        lines = [
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "big", "arguments": {"n": 5}}},
        ]
        options = ["--inject-trace-context"] if inject else []
        env = {**os.environ, **proxy_env(receiver.port), "MCP_TOKEN_TEST_INSTRUMENT": "1",
               "MCP_TOKEN_TEST_SPANS": str(spans_file)}
        proc = subprocess.Popen(proxy_argv(*options, "--", sys.executable, str(TEST_SERVER)), env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdin is not None and proc.stdout is not None
        try:
            for message in lines:
                proc.stdin.write(json.dumps(message).encode() + b"\n")
                proc.stdin.flush()
                if "id" in message:
                    answer = json.loads(proc.stdout.readline())
                    assert answer["id"] == message["id"] and "result" in answer
        finally:
            proc.stdin.close()
            proc.wait(timeout=30)
        assert proc.returncode == 0
        proxy = _proxy_span_ids(receiver, {"tools/call big"})["tools/call big"].split("-")
        server = [json.loads(line) for line in spans_file.read_text().splitlines()]
        (sdk,) = [s for s in server if s["kind"] == "SERVER" and s["name"].startswith("tools/call")]
    if inject:
        assert (sdk["trace_id"], sdk["parent_id"]) == (proxy[1], proxy[2])
    else:
        assert sdk["parent_id"] is None and sdk["trace_id"] != proxy[1]  # two unrelated traces


@pytest.mark.slow
def test_http_injection_on_and_off(receiver: Receiver) -> None:
    bodies: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        bodies.append(body)
        rid = json.loads(body).get("id") if body.startswith(b"{") else None
        out = json.dumps({"jsonrpc": "2.0", "id": rid, "result": {}}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": out})

    with _serve(app) as port:
        upstream = f"http://127.0.0.1:{port}/mcp"
        for options in ((), ("--inject-trace-context",)):
            bodies.clear()
            with (http_proxy(upstream, *options, otlp_port=receiver.port) as (base, _),
                  httpx.Client(timeout=10) as client):
                for message in MESSAGES:
                    answer = client.post(base + "/mcp", content=message, headers={"content-type": "application/json"})
                    assert answer.status_code == 200
            if not options:
                assert bodies == MESSAGES
            else:
                tps = _check_injected(bodies)

                def named() -> dict[str, str] | None:
                    by_tp = {f"00-{s.trace_id.hex()}-{s.span_id.hex()}-01": s.name for _, s, _ in receiver.spans()}
                    return by_tp if all(tp in by_tp for tp in tps) else None  # noqa: B023

                by_tp = wait_for(named, what="the proxy spans with the injected ids")
                assert [by_tp[tp] for tp in tps] == ["tools/call a", "resources/read"]


class _Measurer:
    def __init__(self) -> None:
        self.injected: list[tuple[Any, int, int]] = []

    def inject(self, _tracker: Any, request_id: Any, trace_id: int, span_id: int) -> None:
        self.injected.append((request_id, trace_id, span_id))


def test_line_injector_framing() -> None:
    """Lines split across chunks, CRLF, a batch, a last line without newline, an over-long line passed through."""
    measurer = _Measurer()
    lines = LineInjector(Injector(measurer), tracker=None)
    request = b'{"jsonrpc":"2.0","id":7,"method":"x","params":{}}'
    out = lines.feed(request[:10]) + lines.feed(request[10:] + b"\r\n" + MESSAGES[1] + b"\n[")
    batch = b'{"jsonrpc":"2.0","id":8,"method":"y","params":{"a":1}}, {"jsonrpc":"2.0","method":"n"}]'
    out += lines.feed(batch + b"\n") + lines.feed(b'{"no": "newline"}') + lines.flush()
    got = out.split(b"\n")
    assert json.loads(got[0])["params"]["_meta"]["traceparent"] and got[0].endswith(b"\r")
    assert got[1] == MESSAGES[1]
    sent = json.loads(got[2])
    assert sent[0]["params"]["_meta"]["traceparent"] and sent[1] == {"jsonrpc": "2.0", "method": "n"}
    assert got[3] == b'{"no": "newline"}'
    assert [i[0] for i in measurer.injected] == [7, 8]
    huge = b'{"jsonrpc":"2.0","id":9,"method":"z","params":{"t":"' + b"x" * (5 * 1024 * 1024) + b'"}}\n'
    passed = b"".join(lines.feed(huge[i:i + 65536]) for i in range(0, len(huge), 65536))
    assert passed == huge and len(measurer.injected) == 2  # too long to inspect: forwarded as it is


def test_messages_that_cannot_be_rewritten_go_as_they_came() -> None:
    # Regression: a lone surrogate escape made json.dumps(...).encode() raise inside the relay thread, which
    # died: that line and everything after it never reached the server. 1e999 went out as `Infinity` (not JSON).
    measurer = _Measurer()
    lines = LineInjector(Injector(measurer), tracker=None)
    odd = [b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"x":"\\ud800"}}',
           b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"x":1e999}}',
           b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"x":NaN}}']
    for line in odd:
        assert lines.feed(line + b"\n") == line + b"\n"
    assert measurer.injected == []  # no ids announced for a message sent unchanged
    after = lines.feed(b'{"jsonrpc":"2.0","id":4,"method":"ping","params":{}}\n')
    assert json.loads(after)["params"]["_meta"]["traceparent"] and [i[0] for i in measurer.injected] == [4]


def test_stdio_relay_survives_an_unencodable_request(tmp_path: Path) -> None:
    seen = tmp_path / "seen.jsonl"
    sent = [b'{"jsonrpc":"2.0","id":1,"method":"echo","params":{"x":"\\ud800"}}',
            b'{"jsonrpc":"2.0","id":2,"method":"ping"}']
    proc = subprocess.run(
        proxy_argv("--inject-trace-context", "--", sys.executable, "-c", RECORDER, str(seen)),
        input=b"".join(m + b"\n" for m in sent), capture_output=True, timeout=60, env={**os.environ, **proxy_env()},
    )
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr
    assert seen.read_bytes().splitlines() == sent
    assert len(proc.stdout.splitlines()) == 2
