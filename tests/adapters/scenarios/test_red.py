"""RED metrics through real sessions of either SDK major: the conventions' durations, errors by type, message
bytes, the server dimension, tool-definition tokens, and suppressed instrumentation. A tool's JSON-RPC error and
the SDK's wording of a failed tool (mcp 2.x only): tests/adapters/mcp_v2/test_v2_red.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.trace import SpanKind

from mcp_token_otel.catalog import DURATION_BUCKETS
from mcp_token_otel.core.profiles import tool_definition_tokens
from mcp_token_otel.instrumentation import instrument, uninstrument
from mcp_token_otel.recorder import TokenRecorder
from tests.helpers.support import Otel, make_config, named
from tests.helpers.support import scrape as scrape_recorder

from .sdk import Driver

SERVER = "red-demo"


def make_server(sdk: Driver, name: str = SERVER) -> Any:
    server = sdk.server(name)

    @server.tool()
    async def sleepy() -> str:
        """Sleep 50 ms."""
        await anyio.sleep(0.05)
        return "rested"

    @server.tool()
    def failing() -> str:
        """Always fails (an isError result)."""
        raise ValueError("tool failed")

    @server.tool()
    def rpc_error() -> str:
        """Answers with a JSON-RPC error."""
        raise sdk.rpc_error(-32042, "custom failure")

    @server.resource("res://one")
    def one() -> str:
        return "resource text"

    return server


@pytest.fixture
def red(otel: Otel) -> Iterator[TokenRecorder]:
    recorder = instrument(make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    assert recorder is not None
    yield recorder
    uninstrument()


def scrape(recorder: TokenRecorder) -> dict[str, list[tuple[dict[str, str], float]]]:
    return scrape_recorder(recorder).samples


def pick(found: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> list[tuple[dict, float]]:
    return [(lab, v) for lab, v in found.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]


def one(found: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    rows = pick(found, name, **labels)
    assert len(rows) == 1, (name, labels, rows)
    return rows[0][1]


async def script(sdk: Driver, client: Any) -> str:
    """The calls every RED test makes; returns the text of the failing tool's error result, as the client got it."""
    await client.list_tools()
    assert sdk.text(await client.call_tool("sleepy", {})) == "rested"
    result = await client.call_tool("failing", {})
    assert sdk.is_error(result)
    await client.read_resource("res://one")
    return sdk.text(result)


def run_script(sdk: Driver, server: Any = None) -> str:
    async def main() -> str:
        async with sdk.connect(server or make_server(sdk), sdk.jsonrpc_mode) as client:
            return await script(sdk, client)

    return anyio.run(main)


def test_operation_duration_in_the_conventions_buckets(otel: Otel, red: TokenRecorder, sdk: Driver) -> None:
    run_script(sdk)
    found = scrape(red)
    for side in ("client", "server"):
        labels = {"side": side, "server": SERVER, "method": "tools/call", "tool": "sleepy"}
        total = one(found, "mcp_token_operation_duration_seconds_sum", **labels)
        assert one(found, "mcp_token_operation_duration_seconds_count", **labels) == 1
        assert total >= 0.05  # the tool sleeps 50 ms
        # The one observation sits in the first bucket whose bound is >= its value, and in none below.
        buckets = {lab["le"]: v for lab, v in pick(found, "mcp_token_operation_duration_seconds_bucket", **labels)}
        assert set(buckets) == {*(str(b) for b in DURATION_BUCKETS), "+Inf"}
        for bound in DURATION_BUCKETS:
            assert buckets[str(bound)] == (1 if bound >= total else 0)
        assert buckets["0.02"] == 0 and buckets["+Inf"] == 1
        # The failing call: one error, by type.
        errors = pick(found, "mcp_token_call_errors_total", side=side, server=SERVER, tool="failing")
        assert [(lab["error_type"], v) for lab, v in errors] == [("tool_error", 1.0)]
    # The OTel path: the conventions' instruments, their attributes, the same value range.
    points = otel.metrics()
    server_points = [p for p in points["mcp.server.operation.duration"]
                     if p.attributes.get("gen_ai.tool.name") == "sleepy"]
    (point,) = server_points
    assert point.count == 1 and point.sum >= 0.05
    assert tuple(point.explicit_bounds) == DURATION_BUCKETS
    assert point.attributes["mcp.method.name"] == "tools/call"
    assert point.attributes["mcp_token.server.name"] == SERVER
    assert "error.type" not in point.attributes and "mcp.session.id" not in point.attributes
    (client_point,) = [p for p in points["mcp.client.operation.duration"]
                       if p.attributes.get("gen_ai.tool.name") == "sleepy"]
    assert client_point.sum >= point.sum  # the client's view includes the server's
    assert client_point.attributes["mcp_token.server.name"] == SERVER  # serverInfo.name from initialize
    assert client_point.attributes.get("mcp.protocol.version")
    # The resource read, on both sides, with its uri.
    reads = [s for s in otel.spans() if named(s, "resources/read")]
    assert {s.kind for s in reads} == {SpanKind.CLIENT, SpanKind.SERVER}
    assert all(s.attributes["mcp.resource.uri"] == "res://one" for s in reads)


def test_bytes_beside_tokens(otel: Otel, red: TokenRecorder, sdk: Driver) -> None:
    big = sdk.server(SERVER)

    @big.tool()
    def text(n: int) -> str:
        return "é" * n  # two UTF-8 bytes a character

    async def main() -> None:
        async with sdk.connect(big, sdk.jsonrpc_mode) as client:
            await client.call_tool("text", {"n": 5000})

    anyio.run(main)
    found = scrape(red)
    labels = {"side": "server", "server": SERVER, "method": "tools/call", "tool": "text", "direction": "output"}
    size = one(found, "mcp_token_bytes_total", **labels)
    # 5000 two-byte characters, twice (content and the structuredContent the server adds), plus the framing.
    assert 20_000 <= size < 20_400
    assert one(found, "mcp_token_message_tokens_count", **labels) == 1  # bytes per response: this over that
    # Requests: their bytes are summed too.
    assert one(found, "mcp_token_bytes_total", **{**labels, "direction": "input"}) > 0
    (otel_bytes,) = [p for p in otel.metrics()["mcp_token.bytes"]
                     if p.attributes.get("gen_ai.tool.name") == "text"
                     and p.attributes["mcp_token.direction"] == "output" and p.attributes["mcp_token.side"] == "server"]
    assert otel_bytes.value == size


def test_session_duration_and_server_labels(otel: Otel, red: TokenRecorder, sdk: Driver) -> None:

    async def main() -> None:
        async with sdk.connect(make_server(sdk), sdk.jsonrpc_mode) as client:
            await client.call_tool("sleepy", {})
            await client.call_tool("sleepy", {})

    anyio.run(main)
    found = scrape(red)
    for side in ("client", "server"):
        assert one(found, "mcp_token_session_duration_seconds_count", side=side, server=SERVER) == 1
    assert one(found, "mcp_token_session_duration_seconds_sum", side="client", server=SERVER) >= 0.1
    assert one(found, "mcp_token_session_utilization_ratio_count", side="client", server=SERVER) == 1
    # Every call's series carry the server's name: its own on the server side, serverInfo.name on the client
    # (known from the initialize result on: the client's initialize request itself has none yet).
    for name in ("mcp_token_message_tokens_count", "mcp_token_responses_total", "mcp_token_bytes_total"):
        rows = [lab for lab, _ in found[name] if lab["method"] == "tools/call"]
        assert {lab["server"] for lab in rows} == {SERVER} and {lab["side"] for lab in rows} == {"client", "server"}
    assert {lab["server"] for lab, _ in found["mcp_token_message_tokens_count"] if lab["side"] == "server"} == {SERVER}
    points = otel.metrics()
    (session_point,) = points["mcp.client.session.duration"]
    assert session_point.sum >= 0.1 and session_point.attributes["mcp_token.server.name"] == SERVER
    assert tuple(session_point.explicit_bounds) == DURATION_BUCKETS


def test_server_name_override_and_bound(otel: Otel, sdk: Driver) -> None:
    recorder = instrument(make_config(metrics={"server_name": "fleet-a"}), tracer_provider=otel.tracer_provider,
                          meter_provider=otel.meter_provider)
    assert recorder is not None
    try:
        run_script(sdk)
    finally:
        uninstrument()
    found = scrape(recorder)
    assert {lab["server"] for lab, _ in found["mcp_token_message_tokens_count"]} == {"fleet-a"}
    # Server names are bounded like tool names.
    bounded = TokenRecorder(make_config(metrics={"max_server_names": 2}), otel.tracer_provider, otel.meter_provider)
    names = [bounded.server_label(f"server-{i}") for i in range(5)]
    assert names[:2] == ["server-0", "server-1"] and set(names[2:]) == {"_other"}


def test_tool_definition_tokens_per_server(otel: Otel, red: TokenRecorder, sdk: Driver) -> None:
    listed: list[dict[str, Any]] = []

    async def main() -> None:
        async with sdk.connect(make_server(sdk), sdk.jsonrpc_mode) as client:
            result = await client.list_tools()
            listed.extend(t.model_dump(by_alias=True, exclude_none=True) for t in result.tools)

    anyio.run(main)
    expected = {t["name"]: tool_definition_tokens(t, red.policy.estimator) for t in listed}
    assert len(expected) == 3
    found = scrape(red)
    assert one(found, "mcp_token_tool_definitions_tokens", server=SERVER) == sum(expected.values())
    for name, tokens in expected.items():
        assert one(found, "mcp_token_tool_definition_tokens", server=SERVER, tool=name) == tokens
    spans = [s for s in otel.spans() if named(s, "tools/list")]
    assert {s.kind for s in spans} == {SpanKind.CLIENT, SpanKind.SERVER}
    for span in spans:
        assert span.attributes["mcp_token.tool_definitions.tokens"] == sum(expected.values())
    points = otel.metrics()["mcp_token.tool_definitions.tokens"]
    totals = {p.attributes["mcp_token.server.name"]: p.value for p in points}
    assert totals == {SERVER: sum(expected.values())}


def test_suppressed_instrumentation_records_nothing(otel: Otel, red: TokenRecorder, sdk: Driver) -> None:

    async def main() -> None:
        async with sdk.connect(make_server(sdk), sdk.jsonrpc_mode) as client:
            with suppress_instrumentation():
                await client.call_tool("sleepy", {})

    anyio.run(main)
    found = scrape(red)
    assert not pick(found, "mcp_token_message_tokens_count", side="client", method="tools/call")
    assert not [s for s in otel.spans() if s.name == "tools/call sleepy" and s.kind is SpanKind.CLIENT
                and s.instrumentation_scope.name == "mcp_token_otel"]
