"""The names this project emits: span and metric attributes, events, histogram buckets, and the helpers that
build the OpenTelemetry MCP semantic-convention attributes of a message. One vocabulary for every emitter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SCOPE_NAME = "mcp_token_otel"

# Span attributes (OTel MCP semantic conventions, then this project's estimates).
A_METHOD = "mcp.method.name"
A_SESSION_ID = "mcp.session.id"
A_PROTOCOL = "mcp.protocol.version"
A_REQUEST_ID = "jsonrpc.request.id"
A_TOOL = "gen_ai.tool.name"
A_PROMPT = "gen_ai.prompt.name"
A_OPERATION = "gen_ai.operation.name"
A_TRANSPORT = "network.transport"
A_ERROR_TYPE = "error.type"
A_STATUS_CODE = "rpc.response.status_code"
A_ARGUMENTS = "gen_ai.tool.call.arguments"
A_RESULT = "gen_ai.tool.call.result"
A_INPUT_TOKENS = "mcp_token.input_tokens"
A_OUTPUT_TOKENS = "mcp_token.output_tokens"
A_OVERHEAD_TOKENS = "mcp_token.overhead_tokens"
A_OVERHEAD_RATIO = "mcp_token.overhead_ratio"
A_RISK_TIER = "mcp_token.risk_tier"
A_ESTIMATOR = "mcp_token.estimator"
A_SESSION_TOKENS = "mcp_token.session.tokens"
A_SESSION_UTILIZATION = "mcp_token.session.utilization"
A_SESSION_STATE = "mcp_token.session.state"
A_ADVISORY = "mcp_token.advisory"
# Metric attributes.
M_SIDE = "mcp_token.side"
M_DIRECTION = "mcp_token.direction"
M_STAGE = "mcp_token.stage"
M_SCOPE = "mcp_token.scope"
EVENT_RISK = "mcp_token.risk"
EVENT_BUDGET = "mcp_token.budget"

#: Powers of 4 from 16 to 4 Mi tokens: the GenAI token usage convention's boundaries without its ends (a
#: message under 16 tokens or over 4 Mi needs no finer bucket), which keeps /metrics small at 100 tools.
TOKEN_BUCKETS: tuple[float, ...] = tuple(float(4**i) for i in range(2, 12))
#: 0.3 is the default risk.max_overhead_ratio (the dashboards draw it as a threshold).
RATIO_BUCKETS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
UTILIZATION_BUCKETS: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.5, 2.0)


def span_name(method: str, params: Any) -> str:
    """``{mcp.method.name} {target}``: the tool or prompt name is the target (semconv)."""
    if method in ("tools/call", "prompts/get") and isinstance(params, Mapping):
        target = params.get("name")
        if isinstance(target, str):
            return f"{method} {target}"
    return method


def call_attributes(
    method: str,
    params: Any,
    *,
    session_id: str | None = None,
    request_id: Any = None,
    protocol_version: str | None = None,
    transport: str | None = None,
) -> dict[str, Any]:
    """The semantic-convention attributes of one MCP message (no estimates)."""
    attrs: dict[str, Any] = {A_METHOD: method}
    name = params.get("name") if isinstance(params, Mapping) else None
    if method == "tools/call":
        attrs[A_OPERATION] = "execute_tool"
        if isinstance(name, str):
            attrs[A_TOOL] = name
    elif method == "prompts/get" and isinstance(name, str):
        attrs[A_PROMPT] = name
    if session_id:
        attrs[A_SESSION_ID] = session_id
    if request_id is not None:
        attrs[A_REQUEST_ID] = str(request_id)
    if protocol_version:
        attrs[A_PROTOCOL] = protocol_version
    if transport:
        attrs[A_TRANSPORT] = transport
    return attrs
