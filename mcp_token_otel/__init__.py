"""mcp-token-otel: token economics of MCP tool calls as OpenTelemetry spans and Prometheus metrics.

The package is laid out as its architecture: ``core`` (pure: estimation, measurement, risk, profiles,
budgets), ``adapters`` (the only code that knows an MCP SDK or the wire), ``recorder`` (the orchestrator
adapters feed), ``emitters`` (OpenTelemetry spans and metrics, Prometheus) and ``cli``.

``import mcp_token_otel`` loads the core only. ``instrument()``, ``uninstrument()`` and the configuration
names are attributes resolved on first use, so importing the package never imports the MCP SDK,
OpenTelemetry or PyYAML.
"""

from __future__ import annotations

import importlib
from typing import Any

from .core import (
    ESTIMATOR_NAMES,
    RISK_TIERS,
    AggregateProfile,
    Block,
    BudgetUpdate,
    EstimatorUnavailable,
    Measurement,
    Policy,
    RiskThresholds,
    SessionBudget,
    SessionRegistry,
    StaticProfile,
    aggregate_profiles,
    classify_risk,
    compute_static_profile,
    estimate_tokens,
    get_estimator,
    measure_error,
    measure_message,
    measure_request,
    measure_result,
    profile_tool_definition,
)

__version__ = "0.1.0"

#: Public names that live outside the core: (module, attribute), imported when first asked for.
_LAZY = {
    "instrument": ("mcp_token_otel.instrumentation", "instrument"),
    "uninstrument": ("mcp_token_otel.instrumentation", "uninstrument"),
    "instrument_server": ("mcp_token_otel.instrumentation", "instrument_server"),
    "metrics_app": ("mcp_token_otel.instrumentation", "metrics_app"),
    "prometheus_service": ("mcp_token_otel.instrumentation", "prometheus_service"),
    "McpTokenInstrumentor": ("mcp_token_otel.instrumentation", "McpTokenInstrumentor"),
    "TokenRecorder": ("mcp_token_otel.recorder", "TokenRecorder"),
    "Config": ("mcp_token_otel.config", "Config"),
    "ConfigError": ("mcp_token_otel.config", "ConfigError"),
    "build_policy": ("mcp_token_otel.config", "build_policy"),
    "load_config": ("mcp_token_otel.config", "load_config"),
}


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'mcp_token_otel' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ESTIMATOR_NAMES",
    "RISK_TIERS",
    "AggregateProfile",
    "Block",
    "BudgetUpdate",
    "Config",
    "ConfigError",
    "EstimatorUnavailable",
    "McpTokenInstrumentor",
    "Measurement",
    "Policy",
    "RiskThresholds",
    "SessionBudget",
    "SessionRegistry",
    "StaticProfile",
    "TokenRecorder",
    "__version__",
    "aggregate_profiles",
    "build_policy",
    "classify_risk",
    "compute_static_profile",
    "estimate_tokens",
    "get_estimator",
    "instrument",
    "instrument_server",
    "load_config",
    "measure_error",
    "measure_message",
    "measure_request",
    "measure_result",
    "metrics_app",
    "profile_tool_definition",
    "prometheus_service",
    "uninstrument",
]
