"""``instrumentation.sides``: the shim instruments only the sides an operator owns.

A real client and server session of the installed SDK (mcp 2.x ``Client(server)`` in both modes, mcp 1.x the
in-memory session pair), instrumented with one side: that side's spans carry the shim's attributes and its
metric points exist; the other side has neither.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import anyio
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from mcp_token_otel.config import config_from_dict
from mcp_token_otel.instrumentation import instrument, uninstrument
from tests.helpers.support import global_tracer_provider

IS_MCP_V2 = importlib.util.find_spec("mcp.shared.dispatcher") is not None
KIND = {"client": SpanKind.CLIENT, "server": SpanKind.SERVER}
#: mcp 2.x: direct dispatch and JSON-RPC over memory streams; mcp 1.x has one in-memory pair.
MODES = ("auto", "legacy") if IS_MCP_V2 else ("memory",)


EXPORTER = InMemorySpanExporter()
#: The SDK's own spans, which the shim enriches, go to the global tracer provider: read there.
TRACER_PROVIDER = global_tracer_provider(EXPORTER)


class Seen:
    """The providers one test instruments with, and what the shim emitted through them, by side."""

    def __init__(self) -> None:
        EXPORTER.clear()
        self.exporter, self.reader = EXPORTER, InMemoryMetricReader()
        self.tracer_provider = TRACER_PROVIDER
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def instrument(self, sides: list[str]) -> None:
        config = config_from_dict({"estimator": "chars/4", "instrumentation": {"sides": sides}})
        recorder = instrument(config, tracer_provider=self.tracer_provider, meter_provider=self.meter_provider)
        assert recorder is not None

    def metric_sides(self) -> set[str]:
        data = self.reader.get_metrics_data()
        sides: set[str] = set()
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    sides.update(str(p.attributes["mcp_token.side"]) for p in metric.data.data_points
                                 if p.attributes and "mcp_token.side" in p.attributes)
        return sides

    def measured_span_kinds(self) -> set[SpanKind]:
        """Kinds of the spans that carry the shim's token attributes."""
        return {span.kind for span in self.exporter.get_finished_spans()
                if any(key.startswith("mcp_token.") for key in (span.attributes or {}))}


@pytest.fixture
def seen() -> Iterator[Seen]:
    seen = Seen()
    yield seen
    uninstrument()
    seen.meter_provider.shutdown()


async def _one_call(mode: str) -> str:
    """One tools/call through a real client and server session; the text the client received."""
    return await (_call_v2(mode) if IS_MCP_V2 else _call_v1())


def _echo(text: str) -> str:
    return text * 50


async def _call_v2(mode: str) -> str:
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("sides")
    server.tool()(_echo)
    async with Client(server, mode=mode) as client:
        result = await client.call_tool("_echo", {"text": "side "})
    return str(getattr(result.content[0], "text", ""))


async def _call_v1() -> str:
    # mcp 1.x names, run only under it (mypy checks the tests against the mcp 2.x stubs).
    from mcp.server.fastmcp import FastMCP  # type: ignore[attr-defined,unused-ignore]
    from mcp.shared.memory import create_connected_server_and_client_session  # type: ignore[attr-defined,unused-ignore]

    server = FastMCP("sides")
    server.tool()(_echo)
    async with create_connected_server_and_client_session(server._mcp_server) as session:
        result = await session.call_tool("_echo", {"text": "side "})
    return str(getattr(result.content[0], "text", ""))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("owned", "other"), [("server", "client"), ("client", "server")])
def test_only_the_configured_side_is_instrumented(seen: Seen, mode: str, owned: str, other: str) -> None:
    seen.instrument([owned])
    assert anyio.run(_one_call, mode) == "side " * 50  # the call itself is untouched
    assert seen.metric_sides() == {owned}
    kinds = seen.measured_span_kinds()
    assert KIND[owned] in kinds and KIND[other] not in kinds


@pytest.mark.parametrize("mode", MODES)
def test_both_sides_by_default(seen: Seen, mode: str) -> None:
    seen.instrument(["client", "server"])
    anyio.run(_one_call, mode)
    assert seen.metric_sides() == {"client", "server"}
    assert seen.measured_span_kinds() >= {SpanKind.CLIENT, SpanKind.SERVER}
