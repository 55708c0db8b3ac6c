"""Budgets keyed by the conversation through both proxies, on the sessionless 2026-07-28 protocol and on
2025-11-25: a ``gen_ai.conversation.id`` baggage entry set by the client application keys the proxy's budget,
which accumulates across calls until it is exhausted (window 15,000, 20 calls of about 4 KB); without any key,
2026 HTTP tokens count as unbudgeted; a legacy HTTP client session is one proxy session, ended once."""

from __future__ import annotations

import sys
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from opentelemetry import baggage, context

from mcp_token_otel.core.budget_key import CONVERSATION_ID

from .conftest import TEST_SERVER, free_port, proxy_env, sample, scrape, stdio_proxy_args, wait_for
from .test_http import _own_server, _serve, http_proxy

WINDOW = {"MCP_TOKEN_OTEL_BUDGET_CONTEXT_WINDOW": "15000"}
CALLS = 20
MODES = {"2026-07-28": "auto", "2025-11-25": "legacy"}


async def _calls(target: Any, mode: str, conversation: str | None, calls: int = CALLS,
                 metrics_port: int | None = None) -> str | None:
    """``calls`` tools/call of about 4 KB each, in one client session, with the conversation in the context;
    with ``metrics_port``, the proxy's metrics once they show the calls (read before the session ends)."""
    token = context.attach(baggage.set_baggage(CONVERSATION_ID, conversation)) if conversation else None
    try:
        with anyio.fail_after(120):
            async with Client(target, mode=mode) as client:
                for _ in range(calls):
                    result = await client.call_tool("big", {"n": 4000})
                    assert not result.is_error
                if metrics_port is not None:
                    return await anyio.to_thread.run_sync(_exhausted, metrics_port, calls)
                return None
    finally:
        if token is not None:
            context.detach(token)


def _exhausted(port: int, calls: int = CALLS) -> str:
    def done() -> str | None:
        text = scrape(port)
        answered = sample(text, "mcp_token_tokens_total", side="proxy", tool="big", direction="output") > 0 and \
            sample(text, "mcp_token_operation_duration_seconds_count", side="proxy", tool="big") >= calls
        return text if answered else None

    return wait_for(done, what="the calls measured")


@pytest.mark.slow
@pytest.mark.parametrize("protocol", list(MODES))
def test_stdio_proxy_budget_accumulates(protocol: str) -> None:
    port = free_port()
    params = StdioServerParameters(command=sys.executable, args=stdio_proxy_args(
        [sys.executable, str(TEST_SERVER)], name="keyed", metrics_port=port), env=proxy_env(None, **WINDOW))
    metrics = anyio.run(_calls, params, MODES[protocol], "conv-stdio", CALLS, port)
    assert metrics is not None
    assert sample(metrics, "mcp_token_session_transitions_total", side="proxy", state="exhausted") == 1
    assert sample(metrics, "mcp_token_unbudgeted_tokens_total", side="proxy") == 0


@pytest.mark.slow
@pytest.mark.parametrize("protocol", list(MODES))
def test_http_proxy_budget_keyed_by_conversation(protocol: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in WINDOW.items():
        monkeypatch.setenv(name, value)
    with _serve(_own_server().streamable_http_app()) as upstream, \
            http_proxy(f"http://127.0.0.1:{upstream}/mcp") as (base, mport):
        anyio.run(_calls, base + "/mcp", MODES[protocol], "conv-http")
        metrics = _exhausted(mport)
    assert sample(metrics, "mcp_token_session_transitions_total", side="proxy", state="exhausted") == 1
    assert sample(metrics, "mcp_token_unbudgeted_tokens_total", side="proxy") == 0


@pytest.mark.slow
def test_http_2026_without_key_is_unbudgeted() -> None:
    with _serve(_own_server().streamable_http_app()) as upstream, \
            http_proxy(f"http://127.0.0.1:{upstream}/mcp") as (base, mport):
        anyio.run(_calls, base + "/mcp", "auto", None, 3)
        metrics = _exhausted(mport, 3)
    output = sample(metrics, "mcp_token_tokens_total", side="proxy", tool="big", direction="output")
    assert sample(metrics, "mcp_token_unbudgeted_tokens_total", side="proxy") >= output > 0
    assert sample(metrics, "mcp_token_session_transitions_total", side="proxy", state="exhausted") == 0


@pytest.mark.slow
def test_http_legacy_one_proxy_session_per_client_session() -> None:
    """The exchange that creates a session (initialize) counts toward it; each session ends once, at DELETE."""
    clients = 3
    with _serve(_own_server().streamable_http_app()) as upstream, \
            http_proxy(f"http://127.0.0.1:{upstream}/mcp") as (base, mport):
        for _ in range(clients):
            anyio.run(_calls, base + "/mcp", "legacy", None, 2)

        def settled() -> str | None:
            text = scrape(mport)
            live = sample(text, "mcp_token_sessions", side="proxy")
            return text if sample(text, "mcp_token_session_utilization_ratio_count", side="proxy") >= clients \
                and live == 0 else None

        metrics = wait_for(settled, what="the client sessions ended")
    assert sample(metrics, "mcp_token_session_utilization_ratio_count", side="proxy") == clients
    assert sample(metrics, "mcp_token_unbudgeted_tokens_total", side="proxy") == 0
