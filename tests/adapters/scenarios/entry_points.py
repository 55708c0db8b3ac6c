"""The instrumentation's two entry points and what "hooked" means, for the installed SDK major: used by the shared
test_instrumentor.py and by each adapter's own instrumentor tests (tests/adapters/mcp_v2/test_instrumentor.py,
tests/adapters/mcp_v1/test_v1_instrumentor.py)."""

from __future__ import annotations

from typing import Any

import anyio
from opentelemetry.trace import SpanKind

import mcp_token_otel
from mcp_token_otel.instrumentation import McpTokenInstrumentor
from tests.helpers.support import Otel, make_config, named

from .sdk import SDK

#: What the SDK attributes the adapter hooks were before any instrument() (this module is imported uninstrumented).
ORIGINAL = [vars(owner)[name] for owner, name in SDK.hooked]


def on(entry: str, otel: Otel) -> Any:
    """Instrument through ``entry``: "function" (``mcp_token_otel.instrument``) or "class" (the instrumentor)."""
    providers = {"tracer_provider": otel.tracer_provider, "meter_provider": otel.meter_provider}
    if entry == "function":
        return mcp_token_otel.instrument(make_config(), **providers)
    return McpTokenInstrumentor().instrument(config=make_config(), **providers)


def off(entry: str) -> None:
    if entry == "function":
        mcp_token_otel.uninstrument()
    else:
        McpTokenInstrumentor().uninstrument()


def measured(otel: Otel) -> bool:
    """One real in-memory call (JSON-RPC): whether its client and server spans carry our estimate (mcp 1.x has no
    spans of its own: ours or none; mcp 2.x's own spans are there either way, enriched or not)."""
    server = SDK.server("order")

    @server.tool()
    def echo(text: str) -> str:
        return text * 40

    async def main() -> None:
        async with SDK.connect(server, SDK.jsonrpc_mode) as client:
            result = await client.call_tool("echo", {"text": "abc"})
            assert not SDK.is_error(result) and SDK.text(result) == "abc" * 40

    before = len(otel.spans())
    anyio.run(main)
    new = [s for s in otel.spans()[before:] if named(s, "tools/call echo")]
    if not new:
        return False
    assert sorted(s.kind.name for s in new) == [SpanKind.CLIENT.name, SpanKind.SERVER.name], new
    sides = {"mcp_token.output_tokens" in s.attributes for s in new}
    assert len(sides) == 1, "client and server disagree"
    if not sides.pop():
        return False
    assert all(s.attributes["mcp_token.output_tokens"] > 0 for s in new)
    return True


def assert_hooked(otel: Otel) -> None:
    assert McpTokenInstrumentor().is_instrumented_by_opentelemetry
    assert McpTokenInstrumentor().recorder is not None
    now = [vars(owner)[name] for owner, name in SDK.hooked]
    assert all(a is not b for a, b in zip(now, ORIGINAL, strict=True))
    assert measured(otel)


def assert_restored(otel: Otel) -> None:
    assert not McpTokenInstrumentor().is_instrumented_by_opentelemetry
    assert McpTokenInstrumentor().recorder is None
    now = [vars(owner)[name] for owner, name in SDK.hooked]
    assert all(a is b for a, b in zip(now, ORIGINAL, strict=True)), [
        f"{getattr(o, '__name__', o)}.{n}" for (o, n), a, b in zip(SDK.hooked, now, ORIGINAL, strict=True)
        if a is not b
    ]
    assert not measured(otel)
