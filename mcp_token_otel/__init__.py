"""mcp-token-otel: token economics of MCP tool calls as OpenTelemetry spans and Prometheus metrics.

The pure core (no I/O, no SDK import): estimation, measurement of MCP messages, risk tiers, static
profiles and session budgets. Adapters feed it; emitters read it.
"""

from .budget import BudgetUpdate, SessionBudget, SessionRegistry
from .config import Config, ConfigError, build_policy, load_config
from .estimation import estimate_tokens
from .estimators import ESTIMATOR_NAMES, EstimatorUnavailable, get_estimator
from .measure import (
    Block,
    Measurement,
    Policy,
    measure_error,
    measure_message,
    measure_request,
    measure_result,
)
from .profiles import (
    AggregateProfile,
    StaticProfile,
    aggregate_profiles,
    compute_static_profile,
    profile_tool_definition,
)
from .risk import RISK_TIERS, RiskThresholds, classify_risk

__version__ = "0.1.0"

__all__ = [
    "ESTIMATOR_NAMES",
    "RISK_TIERS",
    "AggregateProfile",
    "Block",
    "BudgetUpdate",
    "Config",
    "ConfigError",
    "EstimatorUnavailable",
    "Measurement",
    "Policy",
    "RiskThresholds",
    "SessionBudget",
    "SessionRegistry",
    "StaticProfile",
    "__version__",
    "aggregate_profiles",
    "build_policy",
    "classify_risk",
    "compute_static_profile",
    "estimate_tokens",
    "get_estimator",
    "load_config",
    "measure_error",
    "measure_message",
    "measure_request",
    "measure_result",
    "profile_tool_definition",
]
