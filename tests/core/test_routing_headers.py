"""The 2026-07-28 routing headers (core/routing_headers.py): every request mcp 2.3 sent in the captured HTTP
exchanges agrees with its body; the raw request the server rejected with -32020 does not; the sentinel encoding."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from mcp_token_otel.core.routing_headers import (
    MCP_METHOD,
    MCP_NAME,
    MCP_PROTOCOL_VERSION,
    Routing,
    decode_header_value,
    mismatches,
    routing,
)
from tests.helpers.replay import load, names

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


def requests(name: str) -> list[tuple[dict[str, str], dict[str, Any]]]:
    return [(e["http"]["headers"], e["message"]) for e in load(name)["messages"]
            if e["direction"] == "client_to_server" and "http" in e]


@pytest.mark.parametrize("name", [n for n in names("*.http") if n != "header_mismatch.http"]
                         + ["mrtr_spec.spec", "tasks_spec.spec"])
def test_what_the_sdk_and_the_specifications_send_agrees(name: str) -> None:
    sent = requests(name)
    assert sent
    for headers, message in sent:
        route = routing(headers)
        assert route.method == message["method"]
        assert mismatches(route, message) == (), (headers, message["method"])


def test_the_request_the_server_rejected_is_a_name_mismatch() -> None:
    fixture = load("header_mismatch.http")
    (headers, message), = requests("header_mismatch.http")
    route = routing(headers)
    assert mismatches(route, message) == (MCP_NAME,)
    assert route.label_name == "delete_report" and message["params"]["name"] == "big"
    assert fixture["messages"][1]["message"]["error"]["code"] == -32020


def test_the_tool_name_is_known_before_the_body_and_only_names_become_labels() -> None:
    (headers, _), = [r for r in requests("elicit_once.http") if r[1]["method"] == "tools/call"][:1]
    assert routing(headers).label_name == "delete_report"
    task_poll = next(h for h, m in requests("task.http") if m["method"] == "tasks/get")
    route = routing(task_poll)
    assert route.name is not None and route.label_name is None  # a task id: never a label
    assert routing({"mcp-method": "resources/read", "mcp-name": "file:///a"}).label_name is None
    assert not routing({}).present and routing({"mcp-method": "tools/list"}).present


def sentinel(text: str) -> str:
    return f"=?base64?{base64.b64encode(text.encode()).decode()}?="


def test_sentinel_values() -> None:
    assert decode_header_value("plain") == "plain" and decode_header_value(None) is None
    assert decode_header_value(sentinel("Hello, 世界")) == "Hello, 世界"
    assert decode_header_value(sentinel(" padded ")) == " padded "
    assert decode_header_value("=?base64?not base64!?=") is None
    assert decode_header_value("=?base64?SGk=x?=") is None
    assert decode_header_value("=?base64?SGl=?=") is None  # not the canonical encoding of "Hi" (SGk=)
    not_utf8 = base64.b64encode(bytes([0xFF])).decode()
    assert decode_header_value(f"=?base64?{not_utf8}?=") is None


def call(name: Any = "t", method: str = "tools/call", meta: Any = META) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": {}}
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


def headers(**values: str) -> Routing:
    return routing({k.replace("_", "-"): v for k, v in values.items()})


def test_every_kind_of_disagreement() -> None:
    good = {"mcp_protocol_version": "2026-07-28", "mcp_method": "tools/call", "mcp_name": "t"}
    assert mismatches(headers(**good), call()) == ()
    assert mismatches(headers(**{**good, "mcp_name": sentinel("日本")}), call("日本")) == ()
    assert mismatches(headers(**{**good, "mcp_name": "=?base64?@@?="}), call()) == (MCP_NAME,)
    assert mismatches(headers(**{**good, "mcp_method": "tools/list"}), call()) == (MCP_METHOD,)
    assert mismatches(headers(**{**good, "mcp_protocol_version": "2026-08-01"}), call()) == (MCP_PROTOCOL_VERSION,)
    missing = {"mcp_protocol_version": "2026-07-28"}
    assert mismatches(headers(**missing), call()) == (MCP_METHOD, MCP_NAME)  # both are required
    assert mismatches(headers(), call()) == (MCP_PROTOCOL_VERSION, MCP_METHOD, MCP_NAME)
    # The name is compared only where the body has the parameter it mirrors.
    assert mismatches(headers(mcp_protocol_version="2026-07-28", mcp_method="tools/call"), call(None)) == ()
    task = {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"taskId": "abc", "_meta": META}}
    assert mismatches(headers(mcp_protocol_version="2026-07-28", mcp_method="tasks/get", mcp_name="abc"), task) == ()
    assert mismatches(headers(mcp_protocol_version="2026-07-28", mcp_method="tasks/get"), task) == (MCP_NAME,)


def test_nothing_is_checked_before_2026_or_for_what_is_not_a_request() -> None:
    assert mismatches(headers(mcp_protocol_version="2025-11-25"), call(meta=None)) == ()
    assert mismatches(headers(), call(meta=None)) == ()
    # A body without the _meta version, sent with the 2026 header: the header's version decides.
    assert mismatches(headers(mcp_protocol_version="2026-07-28"), call(meta=None)) == (MCP_METHOD, MCP_NAME)
    notification = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"_meta": META}}
    assert mismatches(headers(), notification) == ()
    assert mismatches(headers(), {"jsonrpc": "2.0", "id": 1, "result": {}}) == ()
    assert mismatches(headers(), [call()]) == () and mismatches(headers(), None) == ()
