"""The names this project emits: span and metric attributes, events, and the helpers that build the OpenTelemetry
MCP semantic-convention attributes of a message. One vocabulary for every emitter (the metric families
themselves, with their buckets, are in :mod:`mcp_token_otel.catalog`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.semconv.attributes.network_attributes import (
    NETWORK_PROTOCOL_NAME,
    NETWORK_PROTOCOL_VERSION,
    NETWORK_TRANSPORT,
)
from opentelemetry.semconv.attributes.server_attributes import SERVER_ADDRESS, SERVER_PORT

from .core.spill.uri import span_uri

SCOPE_NAME = "mcp_token_otel"

# Names the installed opentelemetry-semantic-conventions package defines are taken from it; an older package
# without the MCP conventions (they are incubating) falls back to the same strings.
try:
    from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
        GEN_AI_OPERATION_NAME,
        GEN_AI_PROMPT_NAME,
        GEN_AI_TOOL_CALL_ARGUMENTS,
        GEN_AI_TOOL_CALL_RESULT,
        GEN_AI_TOOL_NAME,
    )
    from opentelemetry.semconv._incubating.attributes.jsonrpc_attributes import JSONRPC_REQUEST_ID
    from opentelemetry.semconv._incubating.attributes.mcp_attributes import (
        MCP_METHOD_NAME,
        MCP_PROTOCOL_VERSION,
        MCP_RESOURCE_URI,
        MCP_SESSION_ID,
    )
    from opentelemetry.semconv._incubating.attributes.rpc_attributes import RPC_RESPONSE_STATUS_CODE
    from opentelemetry.semconv._incubating.metrics.mcp_metrics import (
        MCP_CLIENT_OPERATION_DURATION,
        MCP_CLIENT_SESSION_DURATION,
        MCP_SERVER_OPERATION_DURATION,
        MCP_SERVER_SESSION_DURATION,
    )
except ImportError:  # pragma: no cover - opentelemetry-semantic-conventions before the MCP conventions
    GEN_AI_OPERATION_NAME = "gen_ai.operation.name"  # type: ignore[misc]
    GEN_AI_PROMPT_NAME = "gen_ai.prompt.name"  # type: ignore[misc]
    GEN_AI_TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"  # type: ignore[misc]
    GEN_AI_TOOL_CALL_RESULT = "gen_ai.tool.call.result"  # type: ignore[misc]
    GEN_AI_TOOL_NAME = "gen_ai.tool.name"  # type: ignore[misc]
    JSONRPC_REQUEST_ID = "jsonrpc.request.id"  # type: ignore[misc]
    MCP_METHOD_NAME = "mcp.method.name"  # type: ignore[misc]
    MCP_PROTOCOL_VERSION = "mcp.protocol.version"  # type: ignore[misc]
    MCP_RESOURCE_URI = "mcp.resource.uri"  # type: ignore[misc]
    MCP_SESSION_ID = "mcp.session.id"  # type: ignore[misc]
    RPC_RESPONSE_STATUS_CODE = "rpc.response.status_code"  # type: ignore[misc]
    MCP_CLIENT_OPERATION_DURATION = "mcp.client.operation.duration"  # type: ignore[misc]
    MCP_CLIENT_SESSION_DURATION = "mcp.client.session.duration"  # type: ignore[misc]
    MCP_SERVER_OPERATION_DURATION = "mcp.server.operation.duration"  # type: ignore[misc]
    MCP_SERVER_SESSION_DURATION = "mcp.server.session.duration"  # type: ignore[misc]

try:
    from opentelemetry.semconv.schemas import Schemas

    SCHEMA_URL: str | None = list(Schemas)[-1].value  # the newest schema the installed conventions know
except Exception:  # pragma: no cover
    SCHEMA_URL = None

# Span attributes (OTel MCP semantic conventions, then this project's estimates).
A_METHOD = MCP_METHOD_NAME
A_SESSION_ID = MCP_SESSION_ID
A_PROTOCOL = MCP_PROTOCOL_VERSION
A_REQUEST_ID = JSONRPC_REQUEST_ID
A_RESOURCE_URI = MCP_RESOURCE_URI
A_TOOL = GEN_AI_TOOL_NAME
A_PROMPT = GEN_AI_PROMPT_NAME
A_OPERATION = GEN_AI_OPERATION_NAME
A_TRANSPORT = NETWORK_TRANSPORT
A_PROTOCOL_NAME = NETWORK_PROTOCOL_NAME
A_PROTOCOL_VERSION = NETWORK_PROTOCOL_VERSION
A_SERVER_ADDRESS = SERVER_ADDRESS
A_SERVER_PORT = SERVER_PORT
A_ERROR_TYPE = ERROR_TYPE
A_STATUS_CODE = RPC_RESPONSE_STATUS_CODE
A_ARGUMENTS = GEN_AI_TOOL_CALL_ARGUMENTS
A_RESULT = GEN_AI_TOOL_CALL_RESULT
#: The MCP server's name (its own, the client's serverInfo.name, or the proxy's --name); no convention has one.
A_SERVER_NAME = "mcp_token.server.name"
#: Total definition tokens of a tools/list result (name + description + schemas of every tool listed).
A_TOOL_DEFINITION_TOKENS = "mcp_token.tool_definitions.tokens"
A_INPUT_TOKENS = "mcp_token.input_tokens"
A_OUTPUT_TOKENS = "mcp_token.output_tokens"
A_OVERHEAD_TOKENS = "mcp_token.overhead_tokens"
A_OVERHEAD_RATIO = "mcp_token.overhead_ratio"
A_RISK_TIER = "mcp_token.risk_tier"
A_ESTIMATOR = "mcp_token.estimator"
A_SESSION_TOKENS = "mcp_token.session.tokens"
A_SESSION_UTILIZATION = "mcp_token.session.utilization"
A_SESSION_STATE = "mcp_token.session.state"
#: With a shared budget store: what the session figures (and a guard's decision) were decided on, ``shared`` (the
#: store) or ``local`` (this replica's own count, the store unreachable).
A_BUDGET_SOURCE = "mcp_token.budget.source"
A_GUARD_BUDGET_SOURCE = "mcp_token.guard.budget_source"
A_ADVISORY = "mcp_token.advisory"
#: Estimated USD of the response entering the context (guard.model's price; absent without a model).
A_COST_USD = "mcp_token.cost_usd"
# Metric attributes.
M_SIDE = "mcp_token.side"
M_DIRECTION = "mcp_token.direction"
M_STAGE = "mcp_token.stage"
M_SCOPE = "mcp_token.scope"
EVENT_RISK = "mcp_token.risk"
EVENT_BUDGET = "mcp_token.budget"
#: One event per guard action, with GuardAction.attributes() (mcp_token.guard.policy, .action, .enforced, ...).
EVENT_GUARD = "mcp_token.guard"
M_GUARD_POLICY = "mcp_token.guard.policy"
M_GUARD_ACTION = "mcp_token.guard.action"
M_GUARD_ENFORCED = "mcp_token.guard.enforced"
#: The family an overflow count is about (mcp_token.series.overflow).
M_FAMILY = "mcp_token.family"
#: A read of a kept result (guard.spill): served, expired, not_found, forbidden or invalid, and the page served. The
#: spill's id and uri never go on a span (the id is the only secret that guards it).
A_SPILL_OUTCOME = "mcp_token.spill.outcome"
A_SPILL_PAGE = "mcp_token.spill.page"
#: Why a cut result was not kept (the spills-refused counter).
M_SPILL_REASON = "mcp_token.spill.reason"


def http_attributes(url: Any = None, http_version: Any = None) -> dict[str, Any]:
    """``server.address``/``server.port`` and ``network.protocol.name``/``.version`` of an HTTP transport, from
    its URL (a string or an object with ``hostname``/``port``/``scheme``) and the request's HTTP version."""
    attrs: dict[str, Any] = {}
    try:
        if isinstance(url, str):
            from urllib.parse import urlsplit

            url = urlsplit(url)
        host = getattr(url, "hostname", None)
        if host:
            attrs[A_SERVER_ADDRESS] = host
            port = getattr(url, "port", None) or {"http": 80, "https": 443}.get(getattr(url, "scheme", ""))
            if port:
                attrs[A_SERVER_PORT] = int(port)
            attrs[A_PROTOCOL_NAME] = "http"
        if isinstance(http_version, str) and http_version:
            attrs[A_PROTOCOL_NAME] = "http"
            attrs[A_PROTOCOL_VERSION] = http_version
    except (ValueError, TypeError):  # a malformed URL or port: no attributes rather than a fault
        return {}
    return attrs


def span_name(method: str, params: Any) -> str:
    """``{mcp.method.name} {target}``: the tool or prompt name is the target (semconv)."""
    if method in ("tools/call", "prompts/get") and isinstance(params, (dict, Mapping)):
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
    name = params.get("name") if isinstance(params, (dict, Mapping)) else None
    if method == "tools/call":
        attrs[A_OPERATION] = "execute_tool"
        if isinstance(name, str):
            attrs[A_TOOL] = name
    elif method == "prompts/get" and isinstance(name, str):
        attrs[A_PROMPT] = name
    elif method.startswith("resources/") and isinstance(params, (dict, Mapping)):
        uri = params.get("uri")  # conditionally required on resources/read, subscribe, unsubscribe
        if isinstance(uri, str):
            attrs[A_RESOURCE_URI] = span_uri(uri)  # a kept result's id is a secret: hidden
    if session_id:
        attrs[A_SESSION_ID] = session_id
    if request_id is not None:
        attrs[A_REQUEST_ID] = str(request_id)
    if protocol_version:
        attrs[A_PROTOCOL] = protocol_version
    if transport:
        attrs[A_TRANSPORT] = transport
    return attrs
