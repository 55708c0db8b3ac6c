"""Servers in other languages behind the proxy: two Go MCP servers (tests/peers/go, one on the official Go SDK,
one on mcp-go, built from pinned modules by scripts/go-peers) and a Rust one (tests/peers/rust, on the official
rmcp crate, built by cargo), with the tools of the Python twin (servers/twin_server.py). Each serves stdio, or
streamable HTTP at /mcp with --http HOST:PORT.

Through the stdio and the HTTP proxy: the bytes direct and proxied are the same, token figures equal the twin's
for the same results, budgets and guards act, nothing is counted as invalid. Every way these servers were seen to
differ from the Python SDK on the wire has a test that the proxy relays it unchanged.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.helpers.support import ROOT

from .conftest import free_port, listening, proxy_argv, proxy_env, running_http_proxy, sample, scrape, wait_for

pytestmark = pytest.mark.slow

GO_SERVERS = ("gosdk", "mcpgo")
SERVERS = (*GO_SERVERS, "rmcp")  # and the Rust server, on the official rmcp crate
RUST_PEER = ROOT / "tests" / "peers" / "rust"
TWIN = Path(__file__).parent / "servers" / "twin_server.py"
TOOLS = ("read_document", "weather", "fail", "image")
WAIT = 30.0  # seconds, for any one answer


def toolchain(name: str, why: str) -> None:
    """Skips when ``name`` is not on PATH, as the project's other peers do; under CI that is a failure."""
    if shutil.which(name) is None:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"'{name}' is not on PATH: {why}")


@pytest.fixture(scope="session")
def go_peers() -> dict[str, str]:
    """Server name -> binary, built (or found in the cache) by scripts/go-peers."""
    toolchain("go", "the Go MCP test servers are built from source with Go 1.26")
    done = subprocess.run([str(ROOT / "scripts" / "go-peers")], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr
    return {Path(path).name: path for path in done.stdout.split()}


@pytest.fixture(scope="session")
def rust_peer() -> str:
    """The Rust server (tests/peers/rust, on rmcp), built by cargo into the cache (nothing to do once built)."""
    toolchain("cargo", "the Rust MCP test server is built from source")
    target = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mcp-token-otel" / "rust-peers"
    done = subprocess.run(["cargo", "build", "--release", "--locked", "--quiet", "--manifest-path",
                           str(RUST_PEER / "Cargo.toml"), "--target-dir", str(target)],
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr
    return str(target / "release" / "rmcp-peer")


def peer_binary(request: pytest.FixtureRequest, server: str) -> str:
    """The binary of a server: a Go one, or the Rust one (rmcp)."""
    if server == "rmcp":
        return str(request.getfixturevalue("rust_peer"))
    return str(request.getfixturevalue("go_peers")[server])


def message(msg_id: int | str | None, method: str, params: dict[str, Any] | None = None) -> bytes:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if msg_id is not None:
        body["id"] = msg_id
    if params is not None:
        body["params"] = params
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def initialize(version: str = "2025-11-25") -> list[tuple[bytes, int]]:
    params = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}
    return [(message(1, "initialize", params), 1), (message(None, "notifications/initialized"), 0)]


def call(msg_id: int | str, tool: str, arguments: dict[str, Any] | None = None) -> tuple[bytes, int]:
    return message(msg_id, "tools/call", {"name": tool, "arguments": arguments or {}}), 1


#: (a line the client writes, how many lines it answers): every tool, ids of both types.
CONVERSATION = [*initialize(), (message(2, "tools/list"), 1), call(3, "read_document"), call(4, "weather"),
                call(5, "fail"), call(6, "image"), call("doc-7", "read_document", {"lines": 3})]


class Stdio:
    """A process spoken to in raw lines; its stdout is read on a thread, every wait is bounded."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, b""):
            self.lines.put(line)
        self.lines.put(b"")  # EOF

    def send(self, line: bytes, replies: int) -> list[bytes]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()
        return [self.lines.get(timeout=WAIT) for _ in range(replies)]

    def finish(self) -> tuple[bytes, int]:
        """Closes stdin: what the process still wrote, and its exit status."""
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()
        rest = b"".join(iter(lambda: self.lines.get(timeout=WAIT), b""))
        return rest, self.proc.wait(timeout=WAIT)


@contextlib.contextmanager
def stdio(argv: list[str], env: dict[str, str]) -> Iterator[Stdio]:
    talker = Stdio(argv, env)
    try:
        yield talker
    finally:
        if talker.proc.poll() is None:
            talker.proc.kill()
        talker.proc.wait(timeout=WAIT)


def proxied(command: list[str], name: str, metrics_port: int, **env: str) -> tuple[list[str], dict[str, str]]:
    """The stdio proxy's argv and environment in front of ``command``, the default estimator."""
    argv = proxy_argv("--name", name, "--metrics-port", str(metrics_port), "--", *command)
    return argv, {**os.environ, **proxy_env(), "MCP_TOKEN_OTEL_ESTIMATOR": "default", **env}


def responses_seen(count: int) -> Callable[[str], bool]:
    """Whether /metrics shows ``count`` responses from the server (measured off the relay path: it lags)."""
    return lambda text: sample(text, "mcp_token_proxy_messages_total", direction="server_to_client",
                               kind="response") >= count


def metrics_when(port: int, ready: Callable[[str], bool]) -> str:
    def scraped() -> str | None:
        with contextlib.suppress(OSError):
            text = scrape(port)
            return text if ready(text) else None
        return None

    return wait_for(scraped, timeout=WAIT, what="the proxy's metrics")


def converse(argv: list[str], env: dict[str, str], lines: list[tuple[bytes, int]], metrics_port: int | None = None,
             ready: Callable[[str], bool] | None = None) -> tuple[bytes, int, str]:
    """(every byte the process wrote, its exit status, the proxy's /metrics once ``ready`` (default: every
    answer was measured), or "" without a metrics port)."""
    with stdio(argv, env) as talker:
        out = b"".join(b"".join(talker.send(line, replies)) for line, replies in lines)
        ready = ready or responses_seen(sum(replies for _, replies in lines))
        text = metrics_when(metrics_port, ready) if metrics_port is not None else ""
        rest, status = talker.finish()
    return out + rest, status, text


def answers(out: bytes) -> list[Any]:
    return [json.loads(line) for line in out.splitlines()]


def tool_figures(text: str, server: str) -> dict[str, dict[str, float]]:
    """Per tool: the proxy's token and byte counts, both directions, and its responses per tier."""
    figures: dict[str, dict[str, float]] = {}
    for tool in TOOLS:
        labels = {"side": "proxy", "server": server, "tool": tool}
        figures[tool] = {f"{family}:{direction}": sample(text, family, **labels, direction=direction)
                         for family in ("mcp_token_tokens_total", "mcp_token_bytes_total")
                         for direction in ("input", "output")}
        for tier in ("low", "medium", "high", "critical"):
            figures[tool][tier] = sample(text, "mcp_token_responses_total", **labels, risk_tier=tier)
    return figures


def assert_clean(text: str, server: str) -> None:
    """Nothing counted as not JSON-RPC, nothing the measurer dropped."""
    assert sample(text, "mcp_token_proxy_messages_total", server=server, kind="invalid") == 0
    assert sample(text, "mcp_token_proxy_measurement_dropped_bytes_total", server=server) == 0
    assert sample(text, "mcp_token_instrumentation_errors_total", server=server) == 0


@pytest.mark.parametrize("server", SERVERS)
def test_stdio_byte_identical(request: pytest.FixtureRequest, server: str) -> None:
    """Every byte the Go server writes reaches the client unchanged (its HTML-safe escapes \\u003c \\u0026, its
    key order, its omitted fields), and the proxy counts each message by kind, none invalid."""
    binary = peer_binary(request, server)
    direct = converse([binary], dict(os.environ), CONVERSATION)
    port = free_port()
    out, status, text = converse(*proxied([binary], server, port), CONVERSATION, metrics_port=port)
    assert (out, status) == direct[:2] and status == 0
    # Go's encoding/json escapes <, > and &; Rust's serde_json and the Python SDK do not.
    assert (b"\\u003cdraft\\u003e \\u0026 notes" in out) == (server in GO_SERVERS)
    assert_clean(text, server)
    assert sample(text, "mcp_token_proxy_messages_total", server=server, kind="unmatched") == 0
    assert sample(text, "mcp_token_proxy_messages_total", server=server, direction="server_to_client",
                  kind="response") == 7
    assert sample(text, "mcp_token_call_errors_total", side="proxy", server=server, tool="fail",
                  error_type="tool_error") == 1
    assert sample(text, "mcp_token_tool_definition_tokens", server=server, tool="read_document") > 0


def stdio_figures(server: str, command: list[str]) -> tuple[list[Any], dict[str, dict[str, float]]]:
    """The tool results (not initialize, not tools/list) and per-tool figures through the stdio proxy."""
    port = free_port()
    out, status, text = converse(*proxied(command, server, port), CONVERSATION, metrics_port=port)
    assert status == 0
    assert_clean(text, server)
    return [a["result"] for a in answers(out) if a["id"] not in (1, 2)], tool_figures(text, server)


@pytest.fixture(scope="module")
def twin_figures() -> tuple[list[Any], dict[str, dict[str, float]]]:
    return stdio_figures("twin", [sys.executable, str(TWIN)])


@pytest.mark.parametrize("server", SERVERS)
def test_token_figures_equal_the_python_twin(request: pytest.FixtureRequest, server: str,
                                             twin_figures: tuple[list[Any], dict[str, dict[str, float]]]) -> None:
    """The same results from SDKs in three languages (Go's escapes and key order, Rust's, Python's), measured
    through the stdio proxy with the default estimator: every per-tool figure equals the Python twin's."""
    results, figures = stdio_figures(server, [peer_binary(request, server)])
    assert results == twin_figures[0]  # the same JSON values
    assert figures == twin_figures[1]
    assert figures["read_document"]["mcp_token_tokens_total:output"] > 8_000  # ~42 KB, twice read
    assert figures["image"]["mcp_token_tokens_total:output"] > 0


@pytest.mark.parametrize("server", SERVERS)
def test_guards_and_budget(request: pytest.FixtureRequest, server: str) -> None:
    """Guards enforced in front of a Go server: the large result is cut to the cap, a result left alone goes on
    as the server's very bytes, the session budget passes warning and exhaustion once each, then calls are
    refused by the proxy."""
    binary = peer_binary(request, server)
    lines = [*initialize(), (message(2, "tools/list"), 1), *(call(i, "read_document") for i in range(3, 7)),
             call(7, "weather")]
    direct = converse([binary], dict(os.environ), lines)[0].splitlines()
    port = free_port()
    env = {"MCP_TOKEN_OTEL_GUARD_MODE": "enforce", "MCP_TOKEN_OTEL_GUARD_MAX_RESPONSE_TOKENS": "2000",
           "MCP_TOKEN_OTEL_BUDGET_CONTEXT_WINDOW": "6000", "MCP_TOKEN_OTEL_GUARD_SESSION_HARD_LIMIT": "true"}
    # Three reads reach the server (about 2,000 tokens each enter the context), the rest are refused.
    out, status, text = converse(*proxied([binary], server, port, **env), lines, metrics_port=port,
                                 ready=responses_seen(5))
    assert status == 0
    proxied_lines = out.splitlines()
    assert proxied_lines[:2] == direct[:2]  # initialize and tools/list: not changed, the same bytes
    got = {a["id"]: a["result"] for a in answers(out)}
    full = json.loads(direct[2])["result"]["content"][0]["text"]
    (kept, notice) = got[3]["content"]
    assert len(kept["text"]) < len(full) / 3 and full.startswith(kept["text"])
    assert "truncated to the limit of 2,000 tokens" in notice["text"]
    for refused, tool in ((got[6], "read_document"), (got[7], "weather")):
        assert refused["isError"] is True and f"The call to {tool} was not made" in refused["content"][0]["text"]
    labels = {"side": "proxy", "server": server}
    assert sample(text, "mcp_token_guard_actions_total", **labels, policy="response_cap", action="truncated",
                  enforced="true") == 3
    assert sample(text, "mcp_token_guard_actions_total", **labels, policy="session_limit", action="refused",
                  enforced="true") == 2
    assert sample(text, "mcp_token_session_transitions_total", **labels, state="warning") == 1
    assert sample(text, "mcp_token_session_transitions_total", **labels, state="exhausted") == 1
    assert_clean(text, server)


# ---------------------------------------------------------------------- streamable HTTP

#: Response headers that belong to one connection (RFC 9110 7.6.1) or one moment, not to the message.
NOT_RELAYED = {"connection", "keep-alive", "transfer-encoding", "date"}
BATCH = json.dumps([{"jsonrpc": "2.0", "id": 90, "method": "ping"}, {"jsonrpc": "2.0", "id": 91, "method": "ping"}])


@contextlib.contextmanager
def serving(command: list[str]) -> Iterator[str]:
    """The URL of ``command --http 127.0.0.1:PORT`` while it runs."""
    port = free_port()
    proc = subprocess.Popen([*command, "--http", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: listening(port) or proc.poll() is not None, timeout=WAIT, what="the server listening")
        assert proc.poll() is None
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=WAIT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=WAIT)


def post(url: str, body: str, session: str | None) -> tuple[int, list[tuple[str, str]], bytes]:
    """One POST on its own connection: (status, every header as sent, names in their case, the body)."""
    parts = urllib.parse.urlsplit(url)
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if session:
        headers |= {"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=WAIT)
    try:
        connection.request("POST", parts.path, body=body.encode(), headers=headers)
        response = connection.getresponse()
        return response.status, response.getheaders(), response.read()
    finally:
        connection.close()


def http_conversation(url: str) -> list[tuple[int, list[tuple[str, str]], bytes]]:
    """initialize, initialized, every tool, a batch and a ping, raw; the session id replaced by SESSION."""
    first = post(url, initialize()[0][0].decode(), None)
    session = next(v for k, v in first[1] if k.lower() == "mcp-session-id")  # every server here has sessions
    bodies = [initialize()[1][0], *(line for line, _ in CONVERSATION[2:])]
    # A ping last: once its answer is measured, so is the batch's (the measurer reads records in order).
    last = [post(url, BATCH, session), post(url, message(99, "ping").decode(), session)]
    exchanges = [first, *(post(url, body.decode(), session) for body in bodies), *last]
    return [(status, [(k, v.replace(session, "SESSION")) for k, v in headers if k.lower() not in NOT_RELAYED],
             body.replace(session.encode(), b"SESSION")) for status, headers, body in exchanges]


@contextlib.contextmanager
def http_proxy(upstream: str, name: str) -> Iterator[tuple[str, int]]:
    """(the HTTP proxy's base URL, its metrics port) while it runs, with the default estimator."""
    env = {**os.environ, **proxy_env(), "MCP_TOKEN_OTEL_ESTIMATOR": "default"}
    with running_http_proxy(upstream, "--name", name, env=env, timeout=WAIT) as running:
        yield running


#: Per server over HTTP: how it writes the session header's name (Go canonicalises it, hyper writes it lowercase
#: as the Python SDK does), its Content-Type for a tool's answer, and its status for a batch on 2025-11-25.
HTTP_WAYS: dict[str, tuple[str, str, int]] = {
    "gosdk": ("Mcp-Session-Id", "text/event-stream", 400),
    "mcpgo": ("Mcp-Session-Id", "application/json", 400),
    "rmcp": ("mcp-session-id", "text/event-stream", 415),  # 415 Unsupported Media Type: a body it cannot parse
}


@pytest.mark.parametrize("server", SERVERS)
def test_http_byte_identical(request: pytest.FixtureRequest, server: str) -> None:
    """Every status, header (in the server's own capitalisation: Go's Mcp-Session-Id) and body byte as direct: the
    Go SDK's SSE answer to every POST, mcp-go's plain JSON, rmcp's SSE with its empty priming event and event ids,
    and their different refusals of a batch."""
    with serving([peer_binary(request, server)]) as url:
        direct = http_conversation(url)
        with http_proxy(url, server) as (base, metrics_port):
            through = http_conversation(base + "/mcp")
            text = metrics_when(metrics_port, responses_seen(8))
    assert through == direct
    session_header, content_type, batch_status = HTTP_WAYS[server]
    assert (session_header, "SESSION") in direct[0][1]
    assert [v for k, v in direct[3][1] if k.lower() == "content-type"] == [content_type]
    # rmcp opens each SSE answer with an empty priming event (an event id and a retry, for resuming the stream).
    assert direct[3][2].startswith(b"data: \nid: ") == (server == "rmcp")
    # A batch on 2025-11-25 is refused: go-sdk in text/plain, rmcp in text with no Content-Type, mcp-go in JSON-RPC.
    assert direct[-2][0] == batch_status
    assert_clean(text, server)
    # mcp-go's refusal is a JSON-RPC error with id null: a response to no request, counted as unmatched.
    null_id_errors = sum(body.startswith(b'{"jsonrpc":"2.0","id":null,"error"') for _, _, body in direct)
    assert null_id_errors == (server == "mcpgo")
    assert sample(text, "mcp_token_proxy_messages_total", server=server, kind="unmatched") == null_id_errors
    assert sample(text, "mcp_token_call_errors_total", side="proxy", server=server, tool="fail") == 1


def test_http_token_figures_equal_the_python_twin(request: pytest.FixtureRequest) -> None:
    """Over the HTTP proxy too, the same results give the same figures, whatever the SDK's framing."""
    commands = {**{server: [peer_binary(request, server)] for server in SERVERS}, "twin": [sys.executable, str(TWIN)]}
    figures = {}
    for server, command in commands.items():
        with serving(command) as url, http_proxy(url, server) as (base, metrics_port):
            http_conversation(base + "/mcp")
            text = metrics_when(metrics_port, responses_seen(8))
        assert_clean(text, server)
        figures[server] = tool_figures(text, server)
    assert figures["gosdk"] == figures["mcpgo"] == figures["rmcp"] == figures["twin"]
    assert figures["twin"]["read_document"]["mcp_token_tokens_total:output"] > 0


@pytest.mark.parametrize("server", SERVERS)
def test_http_guard_cuts_either_framing(request: pytest.FixtureRequest, server: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards over HTTP: the large result is cut inside the SSE event of the Go SDK and rmcp and in mcp-go's JSON
    body (its Content-Length written again); every other exchange is the server's bytes."""
    monkeypatch.setenv("MCP_TOKEN_OTEL_GUARD_MODE", "enforce")
    monkeypatch.setenv("MCP_TOKEN_OTEL_GUARD_MAX_RESPONSE_TOKENS", "2000")
    with serving([peer_binary(request, server)]) as url:
        direct = http_conversation(url)
        with http_proxy(url, server) as (base, metrics_port):
            through = http_conversation(base + "/mcp")
            text = metrics_when(metrics_port, responses_seen(8))
    assert [i for i, exchange in enumerate(direct) if through[i] != exchange] == [3]  # read_document
    body = through[3][2]
    assert b"truncated to the limit of 2,000 tokens" in body and len(body) < len(direct[3][2]) / 3
    assert sample(text, "mcp_token_guard_actions_total", side="proxy", server=server, policy="response_cap",
                  action="truncated") == 1
    assert_clean(text, server)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize("server", SERVERS)
def test_sdk_client_negotiates_the_same_through_the_proxy(request: pytest.FixtureRequest, server: str,
                                                         mode: str) -> None:
    """The mcp 2.x Client over HTTP: the protocol each server settles on (auto: mcp-go and rmcp speak 2026-07-28,
    the Go SDK's HTTP handler answers 2025-11-25) and every result are the same through the proxy."""

    async def session(url: str) -> list[Any]:
        with anyio.fail_after(WAIT):
            async with Client(url, mode=mode) as client:
                results = [(await client.call_tool(tool, {})).model_dump(mode="json", exclude_none=True)
                           for tool in TOOLS]
                return [client.protocol_version, *results]

    with serving([peer_binary(request, server)]) as url:
        direct = anyio.run(session, url)
        with http_proxy(url, server) as (base, metrics_port):
            through = anyio.run(session, base + "/mcp")
            text = metrics_when(metrics_port, responses_seen(4))
    assert through == direct
    assert direct[0] == ("2026-07-28" if mode == "auto" and server != "gosdk" else "2025-11-25")
    assert_clean(text, server)


# ---------------------------------------------------------------------- where Go differs from the Python SDK

BIG_ID = 2**53 + 1  # an integer a float64 cannot hold


def unmatched_seen(count: int) -> Callable[[str], bool]:
    return lambda text: sample(text, "mcp_token_proxy_messages_total", kind="unmatched") >= count


#: Per server: the id its answer to BIG_ID carries, its answer to a batch (None: it exits, with status 1), and
#: how the proxy counts that answer.
BATCH_ANSWERS: dict[str, tuple[int, dict[str, Any] | None, str | None]] = {
    "gosdk": (BIG_ID - 1, None, None),
    "mcpgo": (BIG_ID - 1, {"jsonrpc": "2.0", "id": None,
                           "error": {"code": -32700, "message": "Failed to parse message"}}, "unmatched"),
    # No id at all, where JSON-RPC 2.0 asks for "id": null: not JSON-RPC, so counted invalid.
    "rmcp": (BIG_ID, {"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid request"}}, "invalid"),
}


@pytest.mark.parametrize("server", SERVERS)
def test_stdio_differences_relayed_unchanged(request: pytest.FixtureRequest, server: str) -> None:
    """What these servers do that the Python SDK does not, relayed as they do it (the same bytes and exit
    status as direct): an id above 2**53 answered rounded by both Go SDKs (they decode ids as float64), so the
    answer pairs with no request; their own error texts for an unknown method; a batch on 2025-11-25 refused
    with an id-null parse error (mcp-go), an error without id (rmcp), or by ending the whole session (Go SDK)."""
    binary = peer_binary(request, server)
    answered_id, batch_answer, batch_kind = BATCH_ANSWERS[server]
    before = [*initialize("2099-01-01"), (message(BIG_ID, "ping"), 1), (message("", "ping"), 1),
              (message(8, "no/such/method"), 1)]
    after = [(BATCH.encode(), 1), (message(9, "ping"), 1)] if batch_answer else [(BATCH.encode(), 0)]
    direct = converse([binary], dict(os.environ), before + after)
    unmatched = (answered_id != BIG_ID) + (batch_kind == "unmatched")
    port = free_port()
    with stdio(*proxied([binary], server, port)) as talker:
        out = b"".join(b"".join(talker.send(line, replies)) for line, replies in before)
        if batch_answer is None:  # read before the batch: the server's exit ends the proxy and its /metrics
            text = metrics_when(port, responses_seen(3))
        out += b"".join(b"".join(talker.send(line, replies)) for line, replies in after)
        if batch_answer is not None:
            text = metrics_when(port, responses_seen(4))
        rest, status = talker.finish()
    assert (out + rest, status) == direct[:2]
    got = answers(out + rest)
    assert got[0]["result"]["protocolVersion"] == "2025-11-25"  # an unknown version: all offer 2025-11-25
    assert got[1] == {"jsonrpc": "2.0", "id": answered_id, "result": {}}
    assert got[2]["id"] == "" and got[3]["error"]["code"] == -32601
    assert got[4:] == ([] if batch_answer is None else [batch_answer, {"jsonrpc": "2.0", "id": 9, "result": {}}])
    assert status == (1 if batch_answer is None else 0)
    # initialize, the pings, the error: responses; the rounded id and an id-null error pair with no request.
    assert sample(text, "mcp_token_proxy_messages_total", server=server, direction="server_to_client",
                  kind="response") == 3 + (batch_answer is not None) + (answered_id == BIG_ID)
    assert sample(text, "mcp_token_proxy_messages_total", server=server, kind="unmatched") == unmatched
    assert sample(text, "mcp_token_proxy_messages_total", server=server, kind="invalid") == \
        (batch_kind == "invalid")


@pytest.mark.parametrize("server", SERVERS)
def test_stdio_2026_protocol_through_the_proxy(request: pytest.FixtureRequest, server: str) -> None:
    """Over stdio the Go SDKs and rmcp speak 2026-07-28 (server/discover, serverInfo in each result's _meta)
    with the mcp 2.x Client in auto mode: the same protocol and results through the proxy, none invalid."""
    port = free_port()
    binary = peer_binary(request, server)
    argv, env = proxied([binary], server, port)
    scraped: list[str] = []

    async def session(params: StdioServerParameters, metrics_port: int | None) -> list[Any]:
        with anyio.fail_after(WAIT * 2):
            async with Client(params, mode="auto") as client:
                results = [(await client.call_tool(tool, {})).model_dump(mode="json", exclude_none=True)
                           for tool in TOOLS]
                if metrics_port is not None:  # while the proxy runs
                    scraped.append(await anyio.to_thread.run_sync(metrics_when, metrics_port, responses_seen(5)))
                return [client.protocol_version, *results]

    direct = anyio.run(session, StdioServerParameters(command=binary), None)
    through = anyio.run(session, StdioServerParameters(command=argv[0], args=argv[1:], env=env), port)
    assert through == direct and direct[0] == "2026-07-28"
    (text,) = scraped
    assert_clean(text, server)
    assert sample(text, "mcp_token_tokens_total", side="proxy", server=server, tool="read_document",
                  direction="output") > 8_000
