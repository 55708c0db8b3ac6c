"""mcp 2.x: the shim is transparent to the application, and enriches the SDK's spans instead of replacing them.

Each scenario runs in its own process (servers/transparency_app.py), since the global tracer provider can be set
only once: no provider, a global one, a private one given to ``instrument()``, or both; shim on or off; in process
(direct "auto" and JSON-RPC "legacy") and over streamable HTTP. What the application's code receives (the raw
request params at the server, the tool handler's ``ctx.meta``, the sampling and elicitation callbacks' params)
must be the same with and without the shim.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.support import ROOT

from .conftest import UNTRACED_META

pytestmark = pytest.mark.slow

APP = Path(__file__).parent / "servers" / "transparency_app.py"
TRANSPORTS = ["auto", "legacy", "http"]
SDK, OURS = "mcp-python-sdk", "mcp_token_otel"


@functools.cache
def scenario(provider: str, shim: str, transport: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for name in [k for k in env if k.startswith(("OTEL_", "MCP_TOKEN_OTEL_"))]:
        del env[name]
    done = subprocess.run(
        [sys.executable, str(APP), provider, shim, transport], env=env, capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def spans(run: dict[str, Any], exporter: str, name: str, kind: str) -> list[dict[str, Any]]:
    return [s for s in run["spans"][exporter] if s["name"] == name and s["kind"] == kind]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_no_tracing_configured_nothing_added(transport: str) -> None:
    """No provider anywhere, or only a private one given to instrument(): the SDK propagates nothing, nor may
    the shim: every request, ``ctx.meta`` and callback sees exactly what it sees without the shim."""
    baseline = scenario("none", "off", transport)["seen"]
    assert "<traceparent>" not in json.dumps(baseline)
    assert baseline["handler"][1]["example.com/trace"] == "abc-123"
    if transport != "auto":
        assert len(baseline["sampling"]) == len(baseline["elicitation"]) == 1
        # A list request without params stays without (mcp < 2.3: with only its empty _meta).
        assert ["tools/list", None if UNTRACED_META is None else {"_meta": UNTRACED_META}] in baseline["requests"]
    assert scenario("none", "on", transport)["seen"] == baseline
    assert scenario("private", "on", transport)["seen"] == baseline


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_global_tracing_the_sdk_propagates_as_without_the_shim(transport: str) -> None:
    """With a global provider the SDK itself injects ``traceparent`` (JSON-RPC): the shim changes nothing of it."""
    baseline = scenario("global", "off", transport)["seen"]
    assert ("<traceparent>" in json.dumps(baseline)) == (transport != "auto")  # direct mode injects nothing
    assert scenario("global", "on", transport)["seen"] == baseline
    assert scenario("both", "on", transport)["seen"] == baseline


@pytest.mark.parametrize("provider", ["global", "both"])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sdk_spans_are_enriched_never_duplicated(transport: str, provider: str) -> None:
    run = scenario(provider, "on", transport)
    plain = scenario(provider, "off", transport)
    sdk_client = transport != "auto"  # JSON-RPC: the SDK opens the client span; direct mode opens none
    client_exporter = "global" if sdk_client or provider == "global" else "private"
    name = "MCP send tools/call greet" if sdk_client else "tools/call greet"
    clients = spans(run, client_exporter, name, "CLIENT")
    assert len(clients) == 2
    assert {s["scope"] for s in clients} == {SDK if sdk_client else OURS}
    # No second client span anywhere: the same CLIENT spans as without the shim, plus ours only in direct mode.
    for exporter in ("global", "private"):
        names = sorted(s["name"] for s in run["spans"][exporter] if s["kind"] == "CLIENT")
        expected = sorted(s["name"] for s in plain["spans"][exporter] if s["kind"] == "CLIENT")
        if not sdk_client and exporter == client_exporter:
            expected = sorted(expected + [s["name"] for s in clients] + ["server/discover", "tools/list"])
        assert names == expected, (exporter, names)
    servers = spans(run, "global", "tools/call greet", "SERVER")
    assert len(servers) == 2 and {s["scope"] for s in servers} == {SDK}
    for client, server in zip(clients, servers, strict=True):
        assert client["attributes"]["gen_ai.tool.name"] == "greet"
        assert client["attributes"]["mcp_token.input_tokens"] > 0
        assert client["attributes"]["mcp_token.output_tokens"] > 0
        assert server["attributes"]["mcp_token.output_tokens"] == client["attributes"]["mcp_token.output_tokens"]
        assert server["trace"] == client["trace"] and server["parent"] == client["span"]
    if sdk_client:  # the SDK spans every call; only the client's handling of server->client requests is ours
        assert {(s["name"], s["kind"]) for s in run["spans"]["private"]} <= {
            ("sampling/createMessage", "SERVER"),
            ("elicitation/create", "SERVER"),
        }


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_private_provider_only_gets_the_shims_own_spans(transport: str) -> None:
    """No global provider: the SDK's spans do not record, so the shim opens its own (scope mcp_token_otel) on the
    private provider, and never injects them; over JSON-RPC client and server spans are therefore separate
    traces (nothing the application configured propagates), in process they are parent and child."""
    run = scenario("private", "on", transport)
    assert not run["spans"]["global"]
    (client, _) = spans(run, "private", "tools/call greet", "CLIENT")
    (server, _) = spans(run, "private", "tools/call greet", "SERVER")
    for span in (client, server):
        assert span["scope"] == OURS and span["attributes"]["mcp_token.output_tokens"] > 0
    if transport == "auto":
        assert server["trace"] == client["trace"] and server["parent"] == client["span"]
    else:
        assert server["trace"] != client["trace"]


@pytest.mark.parametrize("provider", ["global", "private"])
@pytest.mark.parametrize("transport", ["legacy", "http"])
def test_requests_a_server_sends_are_measured(transport: str, provider: str) -> None:
    run = scenario(provider, "on", transport)
    for method in ("sampling/createMessage", "elicitation/create"):
        points = [p for p in run["points"] if p["mcp.method.name"] == method]
        assert {(p["mcp_token.side"], p["mcp_token.direction"]) for p in points} == {
            ("server", "output"), ("client", "output")}  # requests have no histogram by default
        sums = [p for p in run["sums"] if p["mcp.method.name"] == method and p["value"] > 0]
        sides = {(p["mcp_token.side"], p["mcp_token.direction"]) for p in sums}
        assert sides == {("server", "input"), ("server", "output"), ("client", "input"), ("client", "output")}
        name = f"MCP send {method}" if provider == "global" else method
        (sent,) = spans(run, provider, name, "CLIENT")
        assert sent["scope"] == (SDK if provider == "global" else OURS)
        assert sent["attributes"]["mcp_token.input_tokens"] > 0 and sent["attributes"]["mcp_token.output_tokens"] > 0
        (tool,) = spans(run, provider, "tools/call ask", "SERVER")
        assert sent["parent"] == tool["span"]  # sent from the tool handler
        (handled,) = spans(run, provider, method, "SERVER")  # the client's handling of it
        if provider == "global":  # the SDK carried the context in _meta
            assert handled["parent"] == sent["span"]
    sampled = [p for p in run["points"] if p["mcp.method.name"] == "sampling/createMessage"]
    assert all(p["count"] == 1 for p in sampled)
