"""The spill through the proxies (guard.spill on the proxy side), all real processes on 127.0.0.1: the
filesystem-shaped test server (tests/fixtures/filesystem_server.py) reads a 150,000-token file, the proxy cuts it
at 5,000 tokens, keeps it, and answers its reads itself.

Clients: the Python SDK (``read_resource``) and the TypeScript SDK's own client (npm ``@modelcontextprotocol/sdk``,
tests/proxy/ts_spill_client.cjs), through the stdio proxy and the HTTP proxy; the Go and Rust test servers behind
the stdio proxy (protocol 2026-07-28). Every page read in order gives back what the tool answered, byte for byte;
another conversation is told not_found; past the TTL, expired; bad input gets clear errors and keeps nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, types
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from mcp_token_otel.core.spill import META_SPILL_KEY, is_spill_uri
from tests.helpers.spill_support import source_file
from tests.helpers.support import ROOT, _missing, node_env

from .conftest import free_port, listening, proxy_argv, running_http_proxy, sample, scrape, wait_for
from .servers.twin_server import document
from .test_go_servers import SERVERS, go_peers, peer_binary, rust_peer  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow

CAP = 5000
GUARD = {"mode": "enforce", "max_response_tokens": CAP, "spill": True, "sides": ["proxy"]}
FS_SERVER = ROOT / "tests" / "fixtures" / "filesystem_server.py"
TS_CLIENT = Path(__file__).parent / "ts_spill_client.cjs"
NODE_MODULES = ROOT / ".npm-peers" / "node_modules"
WAIT = 120.0


def the_file(tmp_path: Path) -> tuple[Path, str]:
    """The file on disk, and what read_file answers for it (the server reads with universal newlines)."""
    path = tmp_path / "big.py"
    path.write_text(source_file(150_000), encoding="utf-8", newline="")
    return path, path.read_text(encoding="utf-8")


def proxy_env(tmp_path: Path, **guard: Any) -> dict[str, str]:
    config = tmp_path / f"spill-{len(list(tmp_path.glob('spill-*')))}.json"
    config.write_text(json.dumps({"guard": {**GUARD, **guard}}))
    return {**os.environ, "PYTHONPATH": str(ROOT), "MCP_TOKEN_OTEL_CONFIG": str(config),
            "OTEL_METRIC_EXPORT_INTERVAL": "3600000"}


def stdio_params(env: dict[str, str], metrics_port: int, command: list[str] | None = None) -> StdioServerParameters:
    argv = proxy_argv("--name", "fs", "--metrics-port", str(metrics_port), "--",
                      *(command or [sys.executable, str(FS_SERVER)]))
    return StdioServerParameters(command=argv[0], args=argv[1:], env=env)


@contextlib.contextmanager
def fs_over_http() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(FS_SERVER), "--http", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: listening(port) or proc.poll() is not None, what="the filesystem server listening")
        assert proc.poll() is None
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@contextlib.contextmanager
def http_proxy(upstream: str, env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """(the proxy's /mcp URL, its metrics port) while an HTTP proxy runs in front of ``upstream``."""
    with running_http_proxy(upstream, "--name", "fs", env=env, expect_clean_exit=False) as (base, metrics_port):
        yield f"{base}/mcp", metrics_port


async def cut_link(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    result = await client.call_tool(tool, arguments)
    link, notice = result.content[-1], result.content[-2]
    assert isinstance(link, types.ResourceLink) and is_spill_uri(str(link.uri)), result.content[-1]
    # A client that ignores the link still has the cut result and its notice.
    assert isinstance(notice, types.TextContent) and str(link.uri) in notice.text
    assert f"pages of up to {CAP:,} tokens" in notice.text and "response truncated" in notice.text
    return str(link.uri)


async def read_every_page(client: Client, uri: str) -> str:
    texts: list[str] = []
    pages = 0
    next_uri: str | None = uri
    while next_uri is not None:
        page = await client.read_resource(next_uri)
        meta = (page.meta or {})[META_SPILL_KEY]
        pages += 1
        assert meta["page"] == pages and meta["tokens"] <= CAP
        for item in page.contents:
            assert isinstance(item, types.TextResourceContents)
            texts.append(item.text)
        next_uri = meta.get("next")
        assert pages <= meta["pages"]
    return "".join(texts)


async def refused(client: Client, uri: str) -> dict[str, Any]:
    with pytest.raises(MCPError) as error:
        await client.read_resource(uri)
    assert error.value.code == -32602
    assert isinstance(error.value.data, dict)
    return error.value.data


def metrics(port: int) -> str:
    return scrape(port)


# ---------------------------------------------------------------------------------------------- the Python SDK


def test_stdio_proxy_with_the_python_sdk(tmp_path: Path) -> None:
    path, text = the_file(tmp_path)
    env = proxy_env(tmp_path, spill_ttl=3)
    port = free_port()

    async def main() -> str:
        with anyio.fail_after(WAIT):
            async with Client(stdio_params(env, port), mode="legacy") as client:
                caps = client.server_capabilities
                assert caps is not None and caps.resources is not None  # the server declares none: added
                assert (await client.list_resources()).resources == []
                assert (await client.list_resource_templates()).resource_templates == []
                uri = await cut_link(client, "read_file", {"path": str(path)})
                assert (await read_every_page(client, uri)).encode() == text.encode()
                async with Client(stdio_params(env, free_port()), mode="legacy") as other:  # another conversation
                    assert (await refused(other, uri))["reason"] == "not_found"
                scraped = await anyio.to_thread.run_sync(metrics, port)
                await anyio.sleep(3.5)  # the TTL passes without a read
                gone = await refused(client, uri)
                assert gone["reason"] == "expired" and gone["cause"] == "ttl"
                return scraped

    scraped = anyio.run(main)
    labels = {"side": "proxy", "server": "fs", "tool": "read_file"}
    assert sample(scraped, "mcp_token_spill_reads_total", **labels, outcome="served") >= 30
    assert sample(scraped, "mcp_token_spilled_tokens_total", **labels) == sample(
        scraped, "mcp_token_spill_read_tokens_total", **labels)
    assert sample(scraped, "mcp_token_guard_actions_total", **labels, action="spilled") == 1


def test_http_proxy_with_the_python_sdk(tmp_path: Path) -> None:
    path, text = the_file(tmp_path)
    env = proxy_env(tmp_path)
    with fs_over_http() as upstream, http_proxy(upstream, env) as (url, metrics_port):
        async def main() -> None:
            with anyio.fail_after(WAIT):
                async with Client(url, mode="legacy") as client:
                    caps = client.server_capabilities
                    assert caps is not None and caps.resources is not None
                    assert (await client.list_resources()).resources == []
                    uri = await cut_link(client, "read_file", {"path": str(path)})
                    assert (await read_every_page(client, uri)).encode() == text.encode()
                    async with Client(url, mode="legacy") as other:  # another Mcp-Session-Id
                        assert (await refused(other, uri))["reason"] == "not_found"

        anyio.run(main)
        scraped = metrics(metrics_port)
    assert sample(scraped, "mcp_token_spill_reads_total", side="proxy", tool="read_file", outcome="forbidden") == 1


# ---------------------------------------------------------------------------------------------- the TypeScript SDK


def ts_client(options: dict[str, Any]) -> dict[str, Any]:
    if not (NODE_MODULES / "@modelcontextprotocol" / "sdk" / "package.json").exists():
        _missing("@modelcontextprotocol/sdk (run scripts/npm-peers)")
    done = subprocess.run(["node", str(TS_CLIENT), json.dumps(options)], env={**node_env(), "NODE_PATH": str(
        NODE_MODULES)}, capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def assert_ts_read_back(out: dict[str, Any], text: str) -> None:
    assert out["resources"] and out["listing"] == []
    assert out["link"]["type"] == "resource_link" and out["link"]["uri"] in out["notice"]
    assert out["link"]["size"] == len(text.encode())
    assert out["sha256"] == hashlib.sha256(text.encode()).hexdigest() and out["length"] == len(text.encode())
    assert [p["page"] for p in out["pages"]] == list(range(1, len(out["pages"]) + 1)) and len(out["pages"]) >= 30
    assert all(p["tokens"] <= CAP for p in out["pages"])
    assert out["other"]["code"] == -32602 and out["other"]["data"]["reason"] == "not_found"


def test_the_typescript_sdk_through_the_stdio_proxy(tmp_path: Path) -> None:
    path, text = the_file(tmp_path)
    env = proxy_env(tmp_path)
    argv = proxy_argv("--name", "fs", "--", sys.executable, str(FS_SERVER))
    keep = ("PYTHONPATH", "MCP_TOKEN_OTEL_CONFIG", "OTEL_METRIC_EXPORT_INTERVAL")
    out = ts_client({"path": str(path), "command": argv[0], "args": argv[1:], "env": {k: env[k] for k in keep}})
    assert_ts_read_back(out, text)


def test_the_typescript_sdk_through_the_http_proxy(tmp_path: Path) -> None:
    """Sessions on the proxy's HTTP side, and conversations keyed by a header (budget.key): the second client
    sends another x-conversation-id and is told not_found."""
    path, text = the_file(tmp_path)
    env = proxy_env(tmp_path)
    config = json.loads(Path(env["MCP_TOKEN_OTEL_CONFIG"]).read_text())
    Path(env["MCP_TOKEN_OTEL_CONFIG"]).write_text(json.dumps({**config, "budget": {
        "key": ["header:x-conversation-id", "session"]}}))
    with fs_over_http() as upstream, http_proxy(upstream, env) as (url, _):
        out = ts_client({"path": str(path), "url": url, "headers": {"x-conversation-id": "conversation-a"},
                         "otherHeaders": {"x-conversation-id": "conversation-b"}})
    assert_ts_read_back(out, text)


# ---------------------------------------------------------------------------------------------- Go and Rust servers


@pytest.mark.parametrize("server", SERVERS)
def test_go_and_rust_servers_behind_the_stdio_proxy(request: pytest.FixtureRequest, server: str,
                                                    tmp_path: Path) -> None:
    """The official Go SDK's, mcp-go's and rmcp's servers speak 2026-07-28 with the mcp 2.x client: their long
    read_document result is cut, kept and read back whole through the proxy, which declares the resources they
    do not."""
    binary = peer_binary(request, server)
    env = proxy_env(tmp_path)

    async def main() -> None:
        with anyio.fail_after(WAIT):
            async with Client(stdio_params(env, free_port(), [binary]), mode="auto") as client:
                assert client.protocol_version == "2026-07-28"
                caps = client.server_capabilities
                assert caps is not None and caps.resources is not None
                uri = await cut_link(client, "read_document", {"lines": 5000})
                assert await read_every_page(client, uri) == document(5000)

    anyio.run(main)


# ---------------------------------------------------------------------------------------------- bad input


class Lines:
    """The stdio proxy spoken to in raw JSON-RPC lines; every wait bounded."""

    def __init__(self, env: dict[str, str], metrics_port: int) -> None:
        params = stdio_params(env, metrics_port)
        self.proc = subprocess.Popen([params.command, *params.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=params.env)
        self.next_id = 0

    def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.next_id += 1
        line = json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        assert answer["id"] == self.next_id
        return answer

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def test_bad_reads_through_the_proxy(tmp_path: Path) -> None:
    """Malformed URIs, pages out of range, a huge page number, a flood of unknown ids, a result larger than
    guard.spill_max_bytes: each a clear -32602 (or the plain cut, counted), nothing kept for a read."""
    path, _ = the_file(tmp_path)
    small, _ = tmp_path / "small.py", None
    small.write_text(source_file(9000), encoding="utf-8")
    port = free_port()
    lines = Lines(proxy_env(tmp_path, spill_max_bytes=200_000), port)
    try:
        lines.ask("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                 "clientInfo": {"name": "raw", "version": "0"}})
        kept = lines.ask("tools/call", {"name": "read_file", "arguments": {"path": str(small)}})["result"]
        uri = kept["content"][-1]["uri"]
        pages = kept["content"][-1]["_meta"][META_SPILL_KEY]["pages"]
        bad = {
            "mcp-token-otel://spill/not-an-id": "malformed",
            uri + "?page=1&page=2": "malformed",
            uri + "#frag": "malformed",
            "mcp-token-otel://spill/" + "a" * 5000: "malformed",
            uri + "?page=0": "page_out_of_range",
            f"{uri}?page={pages + 1}": "page_out_of_range",
            uri + "?page=" + "9" * 40: "page_out_of_range",  # a huge page number
            uri + "?page=" + "9" * 400: "malformed",  # past the longest spill URI: not read further
        }
        for bad_uri, reason in bad.items():
            error = lines.ask("resources/read", {"uri": bad_uri})["error"]
            assert error["code"] == -32602 and error["data"]["reason"] == reason, (bad_uri, error)
            assert len(json.dumps(error)) < 1000  # the error quotes a bounded uri
        for n in range(2000):  # a flood of reads for ids never kept
            error = lines.ask("resources/read", {"uri": f"mcp-token-otel://spill/{n:032x}"})["error"]
            assert error["code"] == -32602 and error["data"]["reason"] == "not_found"
        assert "contents" in lines.ask("resources/read", {"uri": uri})["result"]  # still served
        whole = lines.ask("tools/call", {"name": "read_file", "arguments": {"path": str(path)}})["result"]
        assert whole["content"][-1]["type"] == "text" and "response truncated" in whole["content"][-1]["text"]
        text = scrape(port)
    finally:
        lines.close()
    labels = {"side": "proxy", "server": "fs"}
    assert sample(text, "mcp_token_spill_reads_total", **labels, outcome="not_found") == 2000
    assert sample(text, "mcp_token_spill_reads_total", **labels, outcome="invalid") == len(bad)
    assert sample(text, "mcp_token_spills_refused_total", **labels, tool="read_file", reason="too_large") == 1
    assert sample(text, "mcp_token_instrumentation_errors_total") == 0


def test_the_proxy_keeps_nothing_for_the_client_side_of_a_read(tmp_path: Path) -> None:
    """A read of any other uri, and any other resources request, goes to the server unchanged (here: a server
    with no resources, which says so)."""
    port = free_port()
    lines = Lines(proxy_env(tmp_path), port)
    try:
        lines.ask("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                 "clientInfo": {"name": "raw", "version": "0"}})
        other = lines.ask("resources/read", {"uri": "file:///etc/hostname"})
        assert other["error"]["code"] == -32601  # the server's own answer: it has no resources
        subscribe = lines.ask("resources/subscribe", {"uri": "file:///etc/hostname"})
        assert subscribe["error"]["code"] == -32601
    finally:
        lines.close()
    _ = time.monotonic()
