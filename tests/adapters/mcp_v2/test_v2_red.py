"""RED metrics through real mcp 2.x sessions: the conventions' durations, the error dimension, message bytes,
the server dimension, tool-definition tokens, and the span attributes issue 11 adds."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.trace import SpanKind, StatusCode

from mcp_token_otel.catalog import DURATION_BUCKETS
from mcp_token_otel.core.profiles import tool_definition_tokens
from mcp_token_otel.instrumentation import instrument, uninstrument
from mcp_token_otel.recorder import TokenRecorder
from mcp_token_otel.semconv import SCHEMA_URL
from tests.helpers.support import mcp_version
from tests.helpers.support import scrape as scrape_recorder

from .conftest import Otel, make_config, named

SERVER = "red-demo"


def make_server(name: str = SERVER) -> MCPServer:
    server = MCPServer(name)

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
        raise MCPError(code=-32042, message="custom failure")

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


async def script(client: Client) -> str:
    """The calls every RED test makes; returns the text of the failing tool's error result, as the client got it."""
    await client.list_tools()
    assert (await client.call_tool("sleepy", {})).content[0].text == "rested"
    result = await client.call_tool("failing", {})
    assert result.is_error
    with pytest.raises(MCPError):
        await client.call_tool("rpc_error", {})
    await client.read_resource("res://one")
    return str(result.content[0].text)


def run_script(server: MCPServer | None = None) -> str:
    async def main() -> str:
        async with Client(server or make_server(), mode="legacy") as client:
            return await script(client)

    return anyio.run(main)


def test_operation_duration_in_the_conventions_buckets(otel: Otel, red: TokenRecorder) -> None:
    run_script()
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


def test_errors_by_type_per_method_and_tool(otel: Otel, red: TokenRecorder) -> None:
    run_script()
    found = scrape(red)
    for side in ("client", "server"):
        base = {"side": side, "server": SERVER, "method": "tools/call"}
        assert one(found, "mcp_token_call_errors_total", **base, tool="failing", error_type="tool_error") == 1
        assert one(found, "mcp_token_call_errors_total", **base, tool="rpc_error", error_type="-32042") == 1
        assert not pick(found, "mcp_token_call_errors_total", **base, tool="sleepy")
        # The failed calls are timed too, in the tool's one duration series (no error_type label).
        ((labels, count),) = pick(found, "mcp_token_operation_duration_seconds_count", **base, tool="failing")
        assert count == 1 and "error_type" not in labels
    points = otel.metrics()
    errors = {(p.attributes["mcp_token.side"], p.attributes.get("gen_ai.tool.name"), p.attributes["error.type"]):
              p.value for p in points["mcp_token.call.errors"]}
    assert errors[("server", "failing", "tool_error")] == 1
    assert errors[("client", "rpc_error", "-32042")] == 1
    (failed,) = [p for p in points["mcp.server.operation.duration"]
                 if p.attributes.get("gen_ai.tool.name") == "failing"]
    assert failed.attributes["error.type"] == "tool_error"


def test_bytes_beside_tokens(otel: Otel, red: TokenRecorder) -> None:
    big = MCPServer(SERVER)

    @big.tool()
    def text(n: int) -> str:
        return "é" * n  # two UTF-8 bytes a character

    async def main() -> None:
        async with Client(big, mode="legacy") as client:
            await client.call_tool("text", {"n": 5000})

    anyio.run(main)
    found = scrape(red)
    labels = {"side": "server", "server": SERVER, "method": "tools/call", "tool": "text", "direction": "output"}
    size = one(found, "mcp_token_bytes_total", **labels)
    # 5000 two-byte characters, twice (content and MCPServer's structuredContent), plus the framing.
    assert 20_000 <= size < 20_400
    assert one(found, "mcp_token_message_tokens_count", **labels) == 1  # bytes per response: this over that
    # Requests: their bytes are summed too.
    assert one(found, "mcp_token_bytes_total", **{**labels, "direction": "input"}) > 0
    (otel_bytes,) = [p for p in otel.metrics()["mcp_token.bytes"]
                     if p.attributes.get("gen_ai.tool.name") == "text"
                     and p.attributes["mcp_token.direction"] == "output" and p.attributes["mcp_token.side"] == "server"]
    assert otel_bytes.value == size


def test_session_duration_and_server_labels(otel: Otel, red: TokenRecorder) -> None:

    async def main() -> None:
        async with Client(make_server(), mode="legacy") as client:
            await client.call_tool("sleepy", {})
            await client.call_tool("sleepy", {})

    anyio.run(main)
    found = scrape(red)
    client_sessions = one(found, "mcp_token_session_duration_seconds_count", side="client", server=SERVER)
    assert client_sessions == 1
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


def test_server_name_override_and_bound(otel: Otel) -> None:
    recorder = instrument(make_config(metrics={"server_name": "fleet-a"}), tracer_provider=otel.tracer_provider,
                          meter_provider=otel.meter_provider)
    assert recorder is not None
    try:
        run_script()
    finally:
        uninstrument()
    found = scrape(recorder)
    assert {lab["server"] for lab, _ in found["mcp_token_message_tokens_count"]} == {"fleet-a"}
    # Server names are bounded like tool names.
    bounded = TokenRecorder(make_config(metrics={"max_server_names": 2}), otel.tracer_provider, otel.meter_provider)
    names = [bounded.server_label(f"server-{i}") for i in range(5)]
    assert names[:2] == ["server-0", "server-1"] and set(names[2:]) == {"_other"}


def test_tool_definition_tokens_per_server(otel: Otel, red: TokenRecorder) -> None:
    listed: list[dict[str, Any]] = []

    async def main() -> None:
        async with Client(make_server(), mode="legacy") as client:
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


def test_per_tool_definitions_only_within_the_tool_bound(otel: Otel) -> None:
    rec = TokenRecorder(make_config(metrics={"max_tool_names": 2}), otel.tracer_provider, otel.meter_provider)
    tools = [{"name": f"t{i}", "description": "d" * 40 * (i + 1), "inputSchema": {"type": "object"}} for i in range(4)]
    call = rec.begin("client", "tools/list", {}, "s", server="many")
    call.open()
    call.result({"tools": tools})
    call.close()
    found = scrape(rec)
    total = sum(tool_definition_tokens(t, rec.policy.estimator) for t in tools)
    assert one(found, "mcp_token_tool_definitions_tokens", server="many") == total  # the total counts every tool
    assert {lab["tool"] for lab, _ in found["mcp_token_tool_definition_tokens"]} == {"t0", "t1"}


def test_span_attributes_resource_uri_and_error_descriptions(otel: Otel, red: TokenRecorder) -> None:
    error_text = run_script()
    # The SDK's wording: mcp 2.0 appends the exception's message, 2.1 and later do not.
    assert error_text == "Error executing tool failing" + (": tool failed" if mcp_version() < (2, 1) else "")
    spans = otel.spans()
    reads = [s for s in spans if named(s, "resources/read")]
    assert {s.kind for s in reads} == {SpanKind.CLIENT, SpanKind.SERVER}
    for span in reads:
        assert span.attributes["mcp.resource.uri"] == "res://one"
    (failing,) = [s for s in spans if named(s, "tools/call failing") and s.kind is SpanKind.CLIENT]
    assert failing.status.status_code is StatusCode.ERROR
    assert failing.status.description and failing.status.description.startswith("tool_error")
    assert failing.status.description == f"tool_error: {error_text}"  # the result's first text, as the SDK wrote it
    (rpc,) = [s for s in spans if named(s, "tools/call rpc_error") and s.kind is SpanKind.CLIENT]
    assert rpc.status.description and "custom failure" in rpc.status.description  # ours or the SDK's own
    # The schema URL is set on the shim's own tracer (the SDK's spans, which the shim enriches, keep the SDK's).
    red.end_span(red.start_span("probe", SpanKind.INTERNAL))
    (probe,) = [s for s in otel.spans() if s.name == "probe"]
    assert probe.instrumentation_scope.name == "mcp_token_otel"
    assert probe.instrumentation_scope.schema_url == SCHEMA_URL
    assert SCHEMA_URL and SCHEMA_URL.startswith("https://opentelemetry.io/schemas/")


def test_suppressed_instrumentation_records_nothing(otel: Otel, red: TokenRecorder) -> None:

    async def main() -> None:
        async with Client(make_server(), mode="legacy") as client:
            with suppress_instrumentation():
                await client.call_tool("sleepy", {})

    anyio.run(main)
    found = scrape(red)
    assert not pick(found, "mcp_token_message_tokens_count", side="client", method="tools/call")
    assert not [s for s in otel.spans() if s.name == "tools/call sleepy" and s.kind is SpanKind.CLIENT
                and s.instrumentation_scope.name == "mcp_token_otel"]


def test_genai_capture_environment_variable(otel: Otel, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    rec = TokenRecorder(make_config(), otel.tracer_provider, otel.meter_provider)
    span = rec.start_span("tools/call t", SpanKind.CLIENT)
    call = rec.begin("client", "tools/call", {"name": "t", "arguments": {"q": "hello"}}, "s")
    call.open(span)
    call.result({"content": [{"type": "text", "text": "hi"}]})
    call.close()
    rec.end_span(span)
    (done,) = otel.spans()
    assert done.attributes["gen_ai.tool.call.arguments"] == '{"q": "hello"}'
    assert "hi" in done.attributes["gen_ai.tool.call.result"]
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "false")
    assert not TokenRecorder(make_config(), otel.tracer_provider, otel.meter_provider).capture_content


def test_duration_from_the_callers_clock(otel: Otel) -> None:
    rec = TokenRecorder(make_config(), otel.tracer_provider, otel.meter_provider)
    call = rec.begin("proxy", "tools/call", {"name": "t"}, "s")
    call.open(started=100.0)  # the caller's own clock (the proxy's), for the request and the answer
    call.result({"content": []}, at=101.5)
    call.close()
    found = scrape(rec)
    assert one(found, "mcp_token_operation_duration_seconds_sum", side="proxy", tool="t") == 1.5
    assert one(found, "mcp_token_operation_duration_seconds_bucket", side="proxy", tool="t", le="1.0") == 0
    assert one(found, "mcp_token_operation_duration_seconds_bucket", side="proxy", tool="t", le="2.0") == 1
    assert not math.isnan(one(found, "mcp_token_session_transitions_total", side="proxy", state="exhausted"))


def test_http_attributes_from_urls() -> None:
    from mcp_token_otel.semconv import http_attributes

    assert http_attributes("https://mcp.example.com/mcp") == {
        "server.address": "mcp.example.com", "server.port": 443, "network.protocol.name": "http"}
    assert http_attributes("http://[::1]:8000/mcp", "2") == {
        "server.address": "::1", "server.port": 8000, "network.protocol.name": "http",
        "network.protocol.version": "2"}
    assert http_attributes("not a url") == {} and http_attributes(None) == {}
    assert http_attributes("http://host:99999/") == {}  # a port out of range: nothing rather than a fault
