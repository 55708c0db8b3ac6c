"""RED metrics where mcp 2.x has the case: a tool's JSON-RPC error (``MCPError``, which FastMCP 1.x turns into an
isError result) and the SDK's wording of a failed tool on the span; and the recorder's RED figures without an SDK.
The scenarios both majors share (durations, bytes, server labels, tool definitions, suppression):
tests/adapters/scenarios/test_red.py."""

from __future__ import annotations

import math
from collections.abc import Iterator

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from opentelemetry.trace import SpanKind, StatusCode

from mcp_token_otel.core.profiles import tool_definition_tokens
from mcp_token_otel.instrumentation import instrument, uninstrument
from mcp_token_otel.recorder import TokenRecorder
from mcp_token_otel.semconv import SCHEMA_URL
from tests.adapters.scenarios.sdk import SDK
from tests.adapters.scenarios.test_red import SERVER, make_server, one, pick, scrape
from tests.helpers.support import mcp_version

from .conftest import Otel, make_config, named


@pytest.fixture
def red(otel: Otel) -> Iterator[TokenRecorder]:
    recorder = instrument(make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    assert recorder is not None
    yield recorder
    uninstrument()


def run_script() -> str:
    """The shared RED calls plus a tool's JSON-RPC error; returns the failing tool's error text."""
    async def main() -> str:
        async with Client(make_server(SDK), mode="legacy") as client:
            await client.list_tools()
            assert (await client.call_tool("sleepy", {})).content[0].text == "rested"
            result = await client.call_tool("failing", {})
            assert result.is_error
            with pytest.raises(MCPError):
                await client.call_tool("rpc_error", {})
            await client.read_resource("res://one")
            return str(result.content[0].text)

    return anyio.run(main)


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
