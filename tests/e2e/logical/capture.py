"""Capture real 2026-07-28 exchanges between an mcp 2.x ``Client`` and the test server (servers/mrtr_server.py),
without the shim, as JSON fixtures (tests/fixtures/logical_calls/).

    PYTHONPATH=. .venv/bin/python -m tests.e2e.logical.capture tests/fixtures/logical_calls

Over streamable HTTP an ASGI wrapper around the server's app records every POST (its headers, its body) and
its response (a JSON body or the events of an SSE stream); over stdio the client starts the server through
servers/record_relay.py, which records every line. Each fixture holds one client session (its
``server/discover`` included) as a flat list of messages in wire order:
``{"direction": "client_to_server" | "server_to_client", "message": {...}, "http": {...}}`` (``http`` over
HTTP only: a request's method and headers, a response's status and content type).

The scenarios are importable (:data:`SCENARIOS`, :func:`client_options`) for live tests.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
import uvicorn
from mcp import Client, types
from mcp.client.stdio import StdioServerParameters

SERVERS = Path(__file__).resolve().parent / "servers"
sys.path.insert(0, str(SERVERS))
from mrtr_server import make_server  # noqa: E402
from tasks_extension import TasksClient  # noqa: E402

warnings.simplefilter("ignore")  # sampling is deprecated on the 2026 protocol
PROTOCOL = "2026-07-28"
#: Request headers left out of the fixtures: they differ from run to run and say nothing about MCP.
_UNSTABLE_HEADERS = frozenset({"host", "content-length", "user-agent"})


async def elicitation(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    """Answers what the test server asks: a name, or a confirmation (declined for anything about "keep")."""
    schema = getattr(params, "requested_schema", None) or {}
    properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
    if "keep" in params.message:
        return types.ElicitResult(action="decline")
    if "name" in properties:
        return types.ElicitResult(action="accept", content={"name": "Ada"})
    return types.ElicitResult(action="accept", content={"ok": True})


async def sampling(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text="It is old. It is big. It is blue."),
        model="test-model",
    )


def client_options(tasks: bool = False) -> dict[str, Any]:
    options: dict[str, Any] = {"elicitation_callback": elicitation, "sampling_callback": sampling}
    if tasks:
        options["extensions"] = [TasksClient()]
    return options


async def elicit_once(client: Client) -> None:
    result = await client.call_tool("delete_report", {"path": "q3.pdf"})
    assert not result.is_error, result


async def elicit_three(client: Client) -> None:
    for _ in range(3):
        result = await client.call_tool("delete_report", {"path": "q3.pdf"})
        assert not result.is_error, result


async def two_rounds(client: Client) -> None:
    result = await client.call_tool("greet_twice", {})
    assert not result.is_error, result


async def sampled(client: Client) -> None:
    result = await client.call_tool("summarize", {"topic": "the sea"})
    assert not result.is_error, result


async def declined(client: Client) -> None:
    result = await client.call_tool("delete_report", {"path": "keep.pdf"})
    assert result.is_error, result  # declining aborts the call: a tool error


async def prompt(client: Client) -> None:
    result = await client.get_prompt("briefing", {"topic": "tides"})
    assert result.messages, result


async def resource(client: Client) -> None:
    result = await client.read_resource("notes://alpha")
    assert result.contents, result


async def no_state(client: Client) -> None:
    result = await client.call_tool("confirm_plain", {"path": "q3.pdf"})
    assert not result.is_error, result


async def state_only(client: Client) -> None:
    result = await client.call_tool("wait_ready", {})
    assert not result.is_error, result


async def plain_repeats(client: Client) -> None:
    for _ in range(3):
        result = await client.call_tool("big", {"n": 4000})
        assert not result.is_error, result


async def task(client: Client) -> None:
    result = await client.call_tool("slow_report", {"n": 4000})
    assert not result.is_error and result.content, result


Scenario = Callable[[Client], Awaitable[None]]
#: name -> (the client's script, whether the client declares the tasks extension)
SCENARIOS: dict[str, tuple[Scenario, bool]] = {
    "elicit_once": (elicit_once, False),
    "elicit_three": (elicit_three, False),
    "two_rounds": (two_rounds, False),
    "sampling": (sampled, False),
    "declined": (declined, False),
    "prompt": (prompt, False),
    "resource": (resource, False),
    "no_state": (no_state, False),
    "state_only": (state_only, False),
    "plain_repeats": (plain_repeats, False),
    "task": (task, True),
}


# ---------------------------------------------------------------------------------------------- HTTP


class RecordingApp:
    """An ASGI wrapper that records every HTTP exchange (request head and body, response head and body)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.exchanges: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = bytearray()
        response: dict[str, Any] = {"status": None, "headers": {}, "body": bytearray()}

        async def recv() -> Any:
            event = await receive()
            if event["type"] == "http.request":
                body.extend(event.get("body", b""))
            return event

        async def snd(event: Any) -> None:
            if event["type"] == "http.response.start":
                response["status"] = event["status"]
                response["headers"] = {k.decode("latin-1").lower(): v.decode("latin-1")
                                       for k, v in event.get("headers", [])}
            elif event["type"] == "http.response.body":
                response["body"].extend(event.get("body", b""))
            await send(event)

        await self.app(scope, recv, snd)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        self.exchanges.append({
            "method": scope["method"],
            "headers": {k: v for k, v in headers.items() if k not in _UNSTABLE_HEADERS},
            "body": bytes(body),
            "status": response["status"],
            "content_type": response["headers"].get("content-type", ""),
            "response": bytes(response["body"]),
        })


def sse_messages(body: bytes) -> list[Any]:
    """The JSON messages of an SSE body (events with data; a priming event without data is none)."""
    out: list[Any] = []
    data: list[str] = []
    for raw in [*body.decode("utf-8").splitlines(), ""]:
        if not raw:
            if any(data):
                out.append(json.loads("\n".join(data)))
            data = []
        elif raw.startswith("data:"):
            data.append(raw[5:].lstrip(" "))
    return out


def http_messages(exchanges: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The recorded exchanges as a flat list of messages in wire order."""
    out: list[dict[str, Any]] = []
    for ex in exchanges:
        if ex["body"]:
            out.append({"direction": "client_to_server", "message": json.loads(ex["body"]),
                        "http": {"method": ex["method"], "headers": ex["headers"]}})
        meta = {"status": ex["status"], "content_type": ex["content_type"].split(";")[0]}
        if ex["content_type"].startswith("text/event-stream"):
            replies = sse_messages(ex["response"])
        elif ex["response"] and ex["content_type"].startswith("application/json"):
            replies = [json.loads(ex["response"])]
        else:
            replies = []
        out += [{"direction": "server_to_client", "message": m, "http": meta} for m in replies]
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def capture_http(names: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Each scenario in its own client session against one HTTP server; plus a request whose Mcp-Name header
    disagrees with its body, sent as raw HTTP."""
    app = RecordingApp(make_server().streamable_http_app())
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    url = f"http://127.0.0.1:{port}/mcp"
    captured: dict[str, list[dict[str, Any]]] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(10):
            while not server.started:
                await anyio.sleep(0.02)
        try:
            for name in names:
                script, tasks = SCENARIOS[name]
                app.exchanges.clear()
                with anyio.fail_after(30):
                    async with Client(url, **client_options(tasks)) as client:
                        await script(client)
                captured[name] = http_messages(app.exchanges)
            app.exchanges.clear()
            await header_mismatch(url)
            captured["header_mismatch"] = http_messages(app.exchanges)
        finally:
            server.should_exit = True
    return captured


async def header_mismatch(url: str) -> None:
    """A tools/call whose Mcp-Name header names another tool than its body: the server answers -32020."""
    meta = {"io.modelcontextprotocol/protocolVersion": PROTOCOL,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "big", "arguments": {"n": 10}, "_meta": meta}}
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "mcp-protocol-version": PROTOCOL, "mcp-method": "tools/call", "mcp-name": "delete_report"}
    async with httpx2.AsyncClient(timeout=10) as http:
        response = await http.post(url, content=json.dumps(body), headers=headers)
    assert response.status_code == 400, response.text


# ---------------------------------------------------------------------------------------------- stdio


async def capture_stdio(names: list[str]) -> dict[str, list[dict[str, Any]]]:
    captured: dict[str, list[dict[str, Any]]] = {}
    for name in names:
        script, tasks = SCENARIOS[name]
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "wire.jsonl"
            relay = [str(SERVERS / "record_relay.py"), str(log), "--"]
            params = StdioServerParameters(command=sys.executable, env={**os.environ},
                                           args=[*relay, sys.executable, str(SERVERS / "mrtr_server.py")])
            with anyio.fail_after(60):
                async with Client(params, **client_options(tasks)) as client:
                    await script(client)
            with anyio.fail_after(10):
                while not log.exists():
                    await anyio.sleep(0.05)
            captured[name] = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    return captured


def write(folder: Path, transport: str, captured: dict[str, list[dict[str, Any]]]) -> None:
    import mcp

    version = getattr(mcp, "__version__", None)
    if version is None:
        import importlib.metadata

        version = importlib.metadata.version("mcp")
    for name, messages in captured.items():
        fixture = {"scenario": name, "transport": transport, "protocol": PROTOCOL,
                   "source": f"captured from mcp {version} (tests/e2e/logical/capture.py)", "messages": messages}
        path = folder / f"{name}.{transport}.json"
        path.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"{path}: {len(messages)} messages")


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else Path("tests/fixtures/logical_calls")
    folder.mkdir(parents=True, exist_ok=True)
    names = list(SCENARIOS)
    write(folder, "http", anyio.run(capture_http, names))
    write(folder, "stdio", anyio.run(capture_stdio, names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
