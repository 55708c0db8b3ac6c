"""The streamable-HTTP proxy (a subprocess) in front of real servers, driven by the mcp 2.x Client."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2 as httpx
import pytest
import uvicorn
from mcp import Client
from mcp.server.mcpserver import MCPServer

from .conftest import (
    Receiver,
    everything,
    free_port,
    listening,
    node_path_env,
    proxy_argv,
    proxy_env,
    running_http_proxy,
    sample,
    scrape,
    wait_for,
)


@contextlib.contextmanager
def http_proxy(upstream: str, *options: str, otlp_port: int | None = None) -> Iterator[tuple[str, int]]:
    """(the proxy's base URL, its metrics port) while a proxy subprocess runs."""
    with running_http_proxy(upstream, *options, env={**os.environ, **proxy_env(otlp_port)}) as running:
        yield running


@pytest.fixture(scope="module")
def everything_http() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([everything(), "streamableHttp"], env={**os.environ, **node_path_env(), "PORT": str(port)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: listening(port) or proc.poll() is not None, what="server-everything listening")
        assert proc.poll() is None
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _dump(result: Any) -> Any:
    return result.model_dump(mode="json", exclude_none=True)


async def _sampling(context: Any, params: Any) -> Any:  # names as in the SDK's SamplingFnT
    from mcp.types import CreateMessageResult, TextContent

    return CreateMessageResult(role="assistant", content=TextContent(type="text", text="sampled!"), model="m")


async def _everything_session(url: str) -> list[Any]:
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    with anyio.fail_after(60):
        async with Client(url, mode="legacy", sampling_callback=_sampling) as client:
            tools = await client.list_tools()
            names = sorted(t.name for t in tools.tools)
            out: list[Any] = [names, _dump(await client.call_tool("echo", {"message": "via http"})),
                              _dump(await client.call_tool("get-sum", {"a": 1, "b": 2})),
                              _dump(await client.list_resources()), _dump(await client.list_prompts())]
            sampler = next(n for n in names if "sampling" in n)
            out.append(_dump(await client.call_tool(sampler, {"prompt": "hi", "maxTokens": 20})))
            long = await client.call_tool("trigger-long-running-operation", {"duration": 0.3, "steps": 3},
                                          progress_callback=on_progress)
            out.append(_dump(long))
            out.append(seen)
            return out


@pytest.mark.slow
def test_everything_http_through_proxy(everything_http: str, receiver: Receiver) -> None:
    direct = anyio.run(_everything_session, everything_http)
    with http_proxy(everything_http, "--name", "everything-http", otlp_port=receiver.port) as (base, mport):
        proxied = anyio.run(_everything_session, base + "/mcp")

        def measured() -> str | None:
            text = scrape(mport)
            done = sample(text, "mcp_token_proxy_messages_total", direction="client_to_server", kind="response")
            return text if done >= 1 else None  # the sampling answer, POSTed by the client

        text = wait_for(measured, what="the sampling response measured")
    assert proxied == direct
    assert sample(text, "mcp_token_tokens_total", side="proxy", method="tools/call", tool="echo",
                  direction="output") > 0
    assert sample(text, "mcp_token_proxy_messages_total", server="everything-http", kind="unmatched") == 0
    assert sample(text, "mcp_token_proxy_messages_total", direction="server_to_client",
                  kind="notification") >= 3  # progress over SSE
    spans: dict[str, list[Any]] = {}
    for _, span, attrs in receiver.spans():
        spans.setdefault(span.name, []).append((span, attrs))
    ((_, a),) = spans["tools/call echo"]
    assert a["network.transport"] == "tcp" and a["server.address"] == "127.0.0.1"
    assert a["mcp_token.server.name"] == "everything-http" and a["server.port"] > 0
    assert a["mcp.session.id"] and a["mcp_token.output_tokens"] > 0
    ((sampled, s),) = spans["sampling/createMessage"]
    assert sampled.kind == sampled.SPAN_KIND_SERVER and s["mcp_token.output_tokens"] > 0
    assert s["mcp.session.id"] == a["mcp.session.id"]
    ((_, i),) = spans["initialize"]
    assert i["mcp.session.id"] == a["mcp.session.id"]  # the exchange that created the session joins it


def _own_server() -> MCPServer:
    server = MCPServer("http-own")

    @server.tool()
    def big(n: int) -> str:
        return "x" * n

    return server


async def read_body(receive: Any) -> bytes:
    """An ASGI request's whole body, however many messages it came in."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


@contextlib.contextmanager
def _serve(app: Any) -> Iterator[int]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, what="uvicorn started")
        yield port
    finally:
        server.should_exit = True
        thread.join(20)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_own_server_http_through_proxy(mode: str) -> None:
    """The Python SDK's server: stateful (legacy) and the sessionless 2026 protocol (auto), 400 KB results."""

    async def session(url: str) -> list[Any]:
        with anyio.fail_after(60):
            async with Client(url, mode=mode) as client:
                return [_dump(await client.call_tool("big", {"n": n})) for n in (10, 200_000)]

    with _serve(_own_server().streamable_http_app()) as port:
        upstream = f"http://127.0.0.1:{port}/mcp"
        direct = anyio.run(session, upstream)
        with http_proxy(upstream) as (base, mport):
            proxied = anyio.run(session, base + "/mcp")

            def measured() -> str | None:
                text = scrape(mport)
                return text if sample(text, "mcp_token_tokens_total", side="proxy", tool="big",
                                      direction="output") > 50_000 else None

            text = wait_for(measured, what="the large result measured")
    assert proxied == direct
    # No --name: the server's own name (serverInfo), not the upstream's address.
    assert sample(text, "mcp_token_tokens_total", side="proxy", server="http-own", tool="big", direction="output") > 0
    assert sample(text, "mcp_token_proxy_messages_total", server="http-own", kind="response") > 0
    assert sample(text, "mcp_token_proxy_messages_total", server="127.0.0.1") == 0


@pytest.mark.parametrize("json_response", [True, False], ids=["json", "sse"])
def test_call_duration_includes_the_servers_time(json_response: bool, receiver: Receiver) -> None:
    """A call's span and duration run from its request passing the proxy to its answer passing back, so they
    include the time the server took (here at least 0.4 s), whether the answer is a JSON body or an SSE event."""
    server = MCPServer("slow")

    @server.tool()
    async def slow() -> str:
        await anyio.sleep(0.4)
        return "done"

    async def session(url: str) -> None:
        with anyio.fail_after(60):
            async with Client(url, mode="legacy") as client:
                await client.call_tool("slow", {})

    with _serve(server.streamable_http_app(json_response=json_response)) as port, \
            http_proxy(f"http://127.0.0.1:{port}/mcp", otlp_port=receiver.port) as (base, mport):
        anyio.run(session, base + "/mcp")
        count = {"side": "proxy", "server": "slow", "tool": "slow"}

        def measured() -> str | None:
            text = scrape(mport)
            return text if sample(text, "mcp_token_operation_duration_seconds_count", **count) >= 1 else None

        text = wait_for(measured, what="the call timed")
    assert sample(text, "mcp_token_operation_duration_seconds_sum", **count) >= 0.4
    assert sample(text, "mcp_token_operation_duration_seconds_bucket", **count, le="0.25") == 0

    def span() -> Any:
        return next((s for _, s, _ in receiver.spans() if s.name == "tools/call slow"), None)

    called = wait_for(span, what="the tools/call span")
    assert called.end_time_unix_nano - called.start_time_unix_nano >= 400_000_000


def test_headers_auth_and_status_pass_through() -> None:
    """401 with WWW-Authenticate, OAuth metadata, custom headers both ways, DELETE, query strings: untouched."""
    seen: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        seen.append({"method": scope["method"], "path": scope["path"], "query": scope["query_string"].decode(),
                     "headers": headers, "body": body})
        if scope["path"].startswith("/.well-known/"):
            status, out, extra = 200, b'{"resource": "x"}', [(b"content-type", b"application/json")]
        elif headers.get("authorization") != "Bearer good":
            status, out = 401, b""
            extra = [(b"www-authenticate", b'Bearer resource_metadata="http://x/.well-known/oauth-protected-resource"')]
        else:
            status, out = 200, body
            extra = [(b"content-type", b"application/json"), (b"mcp-session-id", b"s-1"), (b"x-upstream", b"yes")]
        await send({"type": "http.response.start", "status": status, "headers": extra})
        await send({"type": "http.response.body", "body": out})

    with (_serve(app) as port, http_proxy(f"http://127.0.0.1:{port}/mcp") as (base, _),
          httpx.Client(base_url=base, timeout=10) as client):
        denied = client.post("/mcp", content=b"{}", headers={"authorization": "Bearer bad"})
        assert denied.status_code == 401
        assert denied.headers["www-authenticate"].startswith("Bearer resource_metadata=")
        meta = client.get("/.well-known/oauth-protected-resource/mcp?x=1")
        assert meta.status_code == 200 and meta.json() == {"resource": "x"}
        message = b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}'
        ok = client.post("/mcp?q=2", content=message, headers={
            "authorization": "Bearer good", "mcp-session-id": "s-1", "mcp-protocol-version": "2025-11-25",
            "last-event-id": "ev-9", "x-custom": "kept", "content-type": "application/json"})
        assert ok.status_code == 200 and ok.content == message
        assert ok.headers["x-upstream"] == "yes" and ok.headers["mcp-session-id"] == "s-1"
        gone = client.delete("/mcp", headers={"authorization": "Bearer good", "mcp-session-id": "s-1"})
        assert gone.status_code == 200
    post = seen[2]
    assert post["path"] == "/mcp" and post["query"] == "q=2" and post["body"] == message
    for key, value in {"authorization": "Bearer good", "mcp-session-id": "s-1", "mcp-protocol-version": "2025-11-25",
                       "last-event-id": "ev-9", "x-custom": "kept", "host": base.split("//")[1]}.items():
        assert post["headers"][key] == value
    assert "accept-encoding" not in post["headers"] or post["headers"]["accept-encoding"] == "gzip, deflate"
    assert seen[1]["path"] == "/.well-known/oauth-protected-resource/mcp" and seen[1]["query"] == "x=1"
    assert seen[3]["method"] == "DELETE"


@pytest.mark.parametrize("interval", [0.05, 60.0])
def test_sse_stream_relayed_as_it_arrives_and_client_disconnect(interval: float) -> None:
    """Events reach the client before the stream ends; a client leaving mid-stream closes the upstream one,
    whether the next event would have shown it (a write that fails) or not (an upstream silent meanwhile)."""
    closed = threading.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()  # the empty GET body
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})

        async def events() -> None:
            for n in range(2000):
                event = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"n": n}}
                data = f"id: {n}\ndata: {json.dumps(event)}\n\n"
                await send({"type": "http.response.body", "body": data.encode(), "more_body": True})
                await anyio.sleep(interval)

        async with anyio.create_task_group() as tg:
            tg.start_soon(events)
            while (await receive())["type"] != "http.disconnect":
                pass
            closed.set()  # the proxy closed its upstream connection
            tg.cancel_scope.cancel()

    with _serve(app) as port, http_proxy(f"http://127.0.0.1:{port}/mcp") as (base, mport):
        with httpx.Client(timeout=10) as client, client.stream("GET", base + "/mcp",
                                                                headers={"accept": "text/event-stream"}) as stream:
            lines = stream.iter_lines()
            first = next(line for line in lines if line.startswith("data:"))
            assert '"n": 0' in first  # arrived while the stream is still open upstream
        # The client is gone: the proxy must close the upstream stream (no leak), long before it would end.
        assert closed.wait(15), "upstream stream still open after the client left"
        # Measuring runs off the relay path, in its own process: the count arrives shortly after the bytes.
        wait_for(lambda: sample(scrape(mport), "mcp_token_proxy_messages_total", kind="notification") >= 1,
                 timeout=10, what="the relayed notifications counted")


def test_startup_errors_http() -> None:
    """An unreachable upstream is no start-up error (test_http_faults: the proxy starts and answers 502)."""
    env = {**os.environ, **proxy_env()}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = subprocess.run(proxy_argv("--listen", f"127.0.0.1:{port}", "--upstream", f"http://127.0.0.1:{port}/"),
                               capture_output=True, text=True, env=env, timeout=30)
    assert taken.returncode == 2
    (line,) = taken.stderr.strip().splitlines()
    assert line.startswith(f"mcp-token-otel proxy: error: cannot listen for the proxy on 127.0.0.1:{port}")
    bad = subprocess.run(proxy_argv("--listen", "nowhere", "--upstream", "http://127.0.0.1:1/"),
                         capture_output=True, text=True, env=env, timeout=30)
    assert bad.returncode == 2 and "--listen" in bad.stderr


@pytest.mark.parametrize(
    ("options", "message"),
    [
        # Regression: urlsplit's ValueError escaped as a traceback (exit 1).
        (("--listen", "127.0.0.1:0", "--upstream", "http://[::1/mcp"), "--upstream: expected an http"),
        (("--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:99999/mcp"), "--upstream: expected an http"),
        # (--metrics-port 99999 is refused by the option's type: tests/cli/test_cli_first_run.py)
        # Regression: with port 0 the host went unchecked; three lines came from the measuring process.
        (("--metrics-required", "--metrics-host", "no such host!", "--metrics-port", "0", "--", sys.executable,
          "-c", "pass"),
         "cannot listen for /metrics on no such host!:0"),
    ],
)
def test_bad_upstream_and_metrics_options_one_line(options: tuple[str, ...], message: str) -> None:
    env = {**os.environ, **proxy_env()}
    out = subprocess.run(proxy_argv(*options), capture_output=True, text=True, env=env,
                         timeout=30)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("mcp-token-otel proxy: error: ") and message in line, line


def test_upstream_dies_mid_stream() -> None:
    """The upstream crashes while streaming: the client's response ends, the proxy keeps serving."""
    port = free_port()
    script = (
        "import socket, time\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('127.0.0.1', {port})); s.listen()\n"
        "while True:\n"
        "    c, _ = s.accept()\n"
        "    try:\n"
        "        if not c.recv(65536): continue\n"  # a bare connection check
        "        c.sendall(b'HTTP/1.1 200 OK\\r\\ncontent-type: text/event-stream\\r\\n'\n"
        "                  b'transfer-encoding: chunked\\r\\n\\r\\n10\\r\\ndata: {\"a\": 1}\\n\\n\\r\\n')\n"
        "        time.sleep(0.2)\n"
        "    except OSError: pass\n"
        "    finally: c.close()\n"
    )
    upstream = subprocess.Popen([sys.executable, "-c", script])
    try:
        wait_for(lambda: listening(port), what="fake upstream")
        with http_proxy(f"http://127.0.0.1:{port}/mcp") as (base, _):
            for _ in range(2):  # the proxy survives the first broken stream
                with (httpx.Client(timeout=10) as client, pytest.raises(httpx.HTTPError) as broken,
                      client.stream("GET", base + "/mcp") as stream):
                    for _chunk in stream.iter_raw():
                        pass
                # the stream ends as broken, not by the client's read timeout (a proxy left hanging)
                assert not isinstance(broken.value, httpx.TimeoutException), repr(broken.value)
    finally:
        upstream.kill()
        upstream.wait()


def test_sessions_end_with_delete_no_state_left() -> None:
    """Each client session ends with DELETE: its budget closes, so nothing accumulates in the proxy."""

    async def sessions(url: str) -> None:
        for _ in range(5):
            with anyio.fail_after(30):
                async with Client(url, mode="legacy") as client:
                    await client.call_tool("big", {"n": 100})

    with _serve(_own_server().streamable_http_app()) as port, \
            http_proxy(f"http://127.0.0.1:{port}/mcp") as (base, mport):
        anyio.run(sessions, base + "/mcp")

        def settled() -> str | None:  # a DELETE ends its session once the proxy has relayed the answer
            text = scrape(mport)
            ended = sample(text, "mcp_token_session_utilization_ratio_count", side="proxy")
            live = sample(text, "mcp_token_sessions", side="proxy")  # every state
            return text if ended >= 5 and live == 0 else None

        text = wait_for(settled, what="five proxy sessions ended and none live")
    assert sample(text, "mcp_token_session_utilization_ratio_count", side="proxy") >= 5
    assert sample(text, "mcp_token_tokens_total", side="proxy", tool="big", direction="output") > 0
