"""A fault on the metrics path never holds up an MCP call, under either SDK major. Fault injection over every
transport, with each SDK's own script of results and errors: tests/adapters/mcp_v2/test_v2_faults.py and
tests/adapters/mcp_v1/test_v1_lifecycle.py."""

from __future__ import annotations

from typing import Any

import anyio

from mcp_token_otel.instrumentation import instrument, uninstrument
from tests.helpers.faults import BlockingMeterProvider
from tests.helpers.support import Otel, make_config

from .sdk import Driver


def make_server(sdk: Driver) -> Any:
    """The fault servers' text tool (servers/fault_server.py of each adapter's suite)."""
    server = sdk.server("faults")

    @server.tool()
    def text(n: int) -> str:
        return "abc " * n

    return server


def test_a_blocking_metrics_path_does_not_block_the_call(otel: Otel, sdk: Driver) -> None:
    """With ``metrics.defer_otel`` the OpenTelemetry points are recorded off the call path: a point stuck in its
    instrument (a meter on a contended lock) holds up no MCP call."""
    provider = BlockingMeterProvider(limit=5.0)
    config = make_config(metrics={"defer_otel": True})
    recorder = instrument(config, tracer_provider=otel.tracer_provider, meter_provider=provider)
    assert recorder is not None
    try:

        async def main() -> list[str]:
            async with sdk.connect(make_server(sdk), sdk.jsonrpc_mode) as client:
                first = await client.call_tool("text", {"n": 3})
                # The replay of the first call's points is now stuck in the instrument...
                assert await anyio.to_thread.run_sync(provider.entered.wait, 5.0)
                second = await client.call_tool("text", {"n": 2})  # ...and this call goes through meanwhile
                provider.release.set()
                return [sdk.text(first), sdk.text(second)]

        assert anyio.run(main) == ["abc abc abc ", "abc abc "]
    finally:
        provider.release.set()
        uninstrument()
    assert not provider.blocked_the_call  # the second call finished while the point was still stuck
    assert not recorder.error_counts
    provider.shutdown()
