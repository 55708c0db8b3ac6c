"""mcp 1.x: budgets keyed by the conversation. Stateless streamable HTTP has no session, so the server keys its
budget by the ``gen_ai.conversation.id`` baggage entry that ``budget.propagate`` carries in ``_meta`` (1.x sends
no trace context to another process by default); stateful HTTP keeps the session. 20 calls of about 4 KB with a
15,000-token window: exhausted once, the hard limit refuses from then on; without a key the tokens count as
unbudgeted; no traffic is counted under ``server=""``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from mcp import ClientSession, types
from mcp.server.fastmcp import FastMCP
from opentelemetry import baggage, context

from mcp_token_otel.instrumentation import instrument, uninstrument
from mcp_token_otel.recorder import TokenRecorder
from tests.helpers.support import scrape

from .conftest import Otel, free_port, make_config, streamable_http_client
from .test_v1_transports import serve

PAYLOAD = " ".join(f"line {i} of the report" for i in range(200))[:4000]  # ~4 KB
CALLS = 20


def make_server(**settings: Any) -> FastMCP:
    server = FastMCP("keyed-test", **settings)

    @server.tool()
    def fetch() -> str:
        return PAYLOAD

    return server


@contextlib.contextmanager
def keyed(otel: Otel, **budget: Any) -> Iterator[TokenRecorder]:
    config = make_config(budget={"context_window": 15_000, **budget},
                         guard={"mode": "enforce", "session_hard_limit": True, "sides": ["server"]})
    recorder = instrument(config, tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    assert recorder is not None
    try:
        yield recorder
    finally:
        uninstrument()


def total(recorder: TokenRecorder, name: str, **labels: str) -> float:
    return scrape(recorder).value(name, **labels)


def assert_no_traffic_without_server(recorder: TokenRecorder) -> None:
    empty = {name for name, rows in scrape(recorder).samples.items()
             for labels, value in rows if labels.get("server") == "" and value}
    assert not empty, f"series with server=\"\": {sorted(empty)}"


def run(stateless: bool, conversation: str | None) -> list[types.CallToolResult]:
    port = free_port()
    app = make_server(stateless_http=stateless).streamable_http_app()
    results: list[types.CallToolResult] = []

    async def main() -> None:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                uv = await serve(tg, app, port)
                try:
                    async with streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write, _), \
                            ClientSession(read, write) as session:
                        await session.initialize()
                        token = context.attach(baggage.set_baggage("gen_ai.conversation.id", conversation)) \
                            if conversation else None
                        try:
                            for _ in range(CALLS):
                                results.append(await session.call_tool("fetch", {}))
                        finally:
                            if token is not None:
                                context.detach(token)
                finally:
                    uv.should_exit = True

    anyio.run(main)
    return results


def assert_exhausted_once_and_refused(recorder: TokenRecorder, results: list[types.CallToolResult]) -> None:
    assert total(recorder, "mcp_token_session_transitions_total", side="server", state="exhausted") == 1
    refused = [r for r in results if r.isError]
    assert refused and results[-1].isError
    assert not any(r.isError for r in results[: len(results) - len(refused)])


@pytest.mark.parametrize("stateless", [True, False], ids=["stateless", "stateful"])
def test_http_budget_follows_the_conversation(otel: Otel, stateless: bool) -> None:
    with keyed(otel, propagate=True) as recorder:
        results = run(stateless, "conversation-42")
        assert_exhausted_once_and_refused(recorder, results)
        # Stateless, only what carries no conversation has no key: initialize (before it) and the tools/list the
        # client sends to learn output schemas (a request without params, which the shim never gives params).
        keyless = sum(total(recorder, "mcp_token_tokens_total", side="server", method=m)
                      for m in ("initialize", "tools/list"))
        assert keyless and total(recorder, "mcp_token_unbudgeted_tokens_total", side="server") == (
            keyless if stateless else 0)
        assert_no_traffic_without_server(recorder)


def test_stateless_http_without_a_key_counts_unbudgeted(otel: Otel) -> None:
    with keyed(otel) as recorder:  # budget.propagate off: the conversation stays in the client
        results = run(True, "conversation-42")
        assert not any(r.isError for r in results)
        assert total(recorder, "mcp_token_session_transitions_total", side="server", state="exhausted") == 0
        served = total(recorder, "mcp_token_tokens_total", side="server", server="keyed-test")
        assert total(recorder, "mcp_token_unbudgeted_tokens_total", side="server", server="keyed-test") == served
        assert served > CALLS * 1000
        assert_no_traffic_without_server(recorder)
