"""The stdio proxy as a client starts it: a subprocess in front of a real server, driven by the mcp 2.x Client.

Results through the proxy equal results direct; the proxy's spans (OTLP to an in-test receiver) and /metrics
carry the figures with side="proxy".
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from .conftest import (
    TEST_SERVER,
    Receiver,
    everything,
    free_port,
    node_path_env,
    proxy_env,
    sample,
    scrape,
    stdio_proxy_args,
    wait_for,
)


def _scrape(port: int) -> str:
    """/metrics, or "" while it is not up yet: it comes with the measuring process, which the relay does not
    wait for."""
    try:
        return scrape(port)
    except OSError:
        return ""

def _proxied(command: list[str], *, name: str | None = None, metrics_port: int | None = None,
             otlp_port: int | None = None, extra_env: dict[str, str] | None = None) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=stdio_proxy_args(command, name=name, metrics_port=metrics_port),
        env={**proxy_env(otlp_port), **(extra_env or {})},
    )


def _direct(command: list[str], extra_env: dict[str, str] | None = None) -> StdioServerParameters:
    return StdioServerParameters(command=command[0], args=command[1:], env=extra_env)


def _dump(result: Any) -> Any:
    return result.model_dump(mode="json", exclude_none=True)


def _scrape_until(port: int, responses: int) -> str:
    def ready() -> str | None:
        text = _scrape(port)
        done = sample(text, "mcp_token_proxy_messages_total", direction="server_to_client", kind="response")
        return text if done >= responses else None

    return wait_for(ready, what="proxy metrics")


def _proxy_spans(receiver: Receiver) -> dict[str, list[tuple[Any, dict[str, Any]]]]:
    out: dict[str, list[tuple[Any, dict[str, Any]]]] = {}
    for _service, span, attrs in receiver.spans():
        out.setdefault(span.name, []).append((span, attrs))
    return out


def _spans_with(receiver: Receiver, name: str) -> dict[str, list[tuple[Any, dict[str, Any]]]]:
    def ready() -> dict[str, list[tuple[Any, dict[str, Any]]]] | None:
        spans = _proxy_spans(receiver)
        return spans if name in spans else None

    return wait_for(ready, what=f"span {name}")


def test_own_server_through_proxy(receiver: Receiver) -> None:
    """Same results as direct; spans and metrics carry the sizes, side="proxy", the server's name."""
    command = [sys.executable, str(TEST_SERVER)]
    port = free_port()
    scraped: dict[str, str] = {}

    async def session(params: StdioServerParameters, scrape_port: int | None) -> list[Any]:
        with anyio.fail_after(60):
            async with Client(params, mode="legacy") as client:
                out = [_dump(await client.list_tools())]
                out.append(_dump(await client.call_tool("big", {"n": 5000})))
                out.append(_dump(await client.call_tool("boom", {})))
                if scrape_port is not None:  # measured off the relay path: poll until it shows
                    scraped["text"] = await anyio.to_thread.run_sync(_scrape_until, scrape_port, 4)
                return out

    direct = anyio.run(session, _direct(command), None)
    proxied = anyio.run(session, _proxied(command, name="stdio-test", metrics_port=port, otlp_port=receiver.port),
                        port)
    assert proxied == direct
    text = scraped["text"]
    out_tokens = sample(text, "mcp_token_tokens_total", side="proxy", method="tools/call", tool="big",
                        direction="output")
    assert out_tokens >= 1250  # 5000 chars at chars/4 (twice: content and structuredContent)
    assert sample(text, "mcp_token_tokens_total", side="proxy", method="tools/call", direction="input") > 0
    # RED and the server dimension: the proxy's --name on every series, its calls timed and their errors typed.
    assert sample(text, "mcp_token_tokens_total", side="proxy", server="stdio-test", tool="big",
                  direction="output") == out_tokens
    assert sample(text, "mcp_token_call_errors_total", side="proxy", server="stdio-test", tool="boom",
                  error_type="tool_error") == 1
    assert sample(text, "mcp_token_call_errors_total", side="proxy", tool="big") == 0
    big_calls = {"side": "proxy", "server": "stdio-test", "tool": "big"}
    assert sample(text, "mcp_token_operation_duration_seconds_count", **big_calls) == 1
    assert sample(text, "mcp_token_operation_duration_seconds_bucket", **big_calls, le="+Inf") == 1
    assert sample(text, "mcp_token_bytes_total", side="proxy", tool="big", direction="output") >= 10_000
    assert sample(text, "mcp_token_tool_definitions_tokens", server="stdio-test") > 0
    # The proxy's transition series exist at 0 from the start (increase()-based alerts see the first event).
    assert any(line.startswith("mcp_token_session_transitions_total{") and 'side="proxy"' in line
               and 'server="stdio-test"' in line and 'state="exhausted"' in line and line.endswith(" 0.0")
               for line in text.splitlines())
    assert sample(text, "mcp_token_proxy_messages_total", server="stdio-test", kind="invalid") == 0
    assert sample(text, "mcp_token_proxy_messages_total", server="stdio-test", kind="unmatched") == 0
    assert sample(text, "mcp_token_proxy_messages_total", direction="client_to_server", kind="notification") >= 1
    spans = _spans_with(receiver, "tools/call boom")
    ((big, a),) = spans["tools/call big"]
    assert big.kind == big.SPAN_KIND_CLIENT
    assert a["mcp_token.output_tokens"] == out_tokens
    assert a["mcp_token.risk_tier"] == "medium"
    assert a["server.address"] == "stdio-test" and a["mcp_token.server.name"] == "stdio-test"
    assert a["network.transport"] == "pipe"
    assert a["mcp.protocol.version"] == "2025-11-25"
    assert a["gen_ai.tool.name"] == "big" and a["jsonrpc.request.id"]
    assert big.end_time_unix_nano >= big.start_time_unix_nano
    ((boom, b),) = spans["tools/call boom"]
    assert b["error.type"] == "tool_error" and boom.status.code == boom.status.STATUS_CODE_ERROR
    assert "initialize" in spans and "tools/list" in spans


@pytest.mark.slow
def test_mcp_server_time_through_proxy(receiver: Receiver) -> None:
    """A third-party PyPI server: identical answers for a deterministic conversion."""
    command = [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]
    args = {"source_timezone": "Europe/Paris", "time": "16:30", "target_timezone": "Asia/Tokyo"}

    async def session(params: StdioServerParameters) -> list[Any]:
        with anyio.fail_after(60):
            async with Client(params, mode="legacy") as client:
                return [_dump(await client.list_tools()), _dump(await client.call_tool("convert_time", args))]

    direct = anyio.run(session, _direct(command))
    proxied = anyio.run(session, _proxied(command, otlp_port=receiver.port))
    assert proxied == direct
    spans = _spans_with(receiver, "tools/call convert_time")
    ((_, a),) = spans["tools/call convert_time"]
    assert a["server.address"] == "mcp_server_time"  # -m: the module's name, until the server names itself
    assert a["mcp_token.server.name"] == "mcp-time"  # its serverInfo name: no --name given
    assert a["mcp_token.output_tokens"] > 0 and a["mcp_token.input_tokens"] > 0


@pytest.mark.slow
def test_server_everything_stdio_through_proxy(receiver: Receiver) -> None:
    """The reference TypeScript server over stdio, including a server-to-client request (sampling)."""
    command = [everything(), "stdio"]
    env = node_path_env()

    async def sampling(_ctx: Any, params: Any) -> Any:
        from mcp.types import CreateMessageResult, TextContent

        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="sampled!"),
                                   model="test-model")

    async def session(params: StdioServerParameters) -> list[Any]:
        with anyio.fail_after(60):
            async with Client(params, mode="legacy", sampling_callback=sampling) as client:
                tools = await client.list_tools()
                names = {t.name for t in tools.tools}
                out = [sorted(names), _dump(await client.call_tool("echo", {"message": "hello proxy"})),
                       _dump(await client.call_tool("get-sum", {"a": 2, "b": 40})),
                       _dump(await client.list_resources()), _dump(await client.list_prompts())]
                sampler = next((n for n in names if "sampling" in n), None)
                if sampler:
                    out.append(_dump(await client.call_tool(sampler, {"prompt": "hi", "maxTokens": 20})))
                return out

    direct = anyio.run(session, _direct(command, env))
    proxied = anyio.run(session, _proxied(command, name="everything", otlp_port=receiver.port, extra_env=env))
    assert proxied == direct
    assert any("sampling" in n for n in direct[0]), "server-everything offers sampling to a sampling client"
    spans = _spans_with(receiver, "sampling/createMessage")
    ((sampled, a),) = spans["sampling/createMessage"]
    assert sampled.kind == sampled.SPAN_KIND_SERVER  # a server-to-client request, paired with its response
    assert a["mcp_token.output_tokens"] > 0 and a["server.address"] == "everything"
    ((_, echo),) = spans["tools/call echo"]
    assert echo["mcp_token.output_tokens"] > 0
