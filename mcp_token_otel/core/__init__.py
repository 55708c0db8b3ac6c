"""The pure core: estimation, estimators, payload sizing, measurement of MCP messages, risk tiers, static
profiles, session budgets and bounded label values.

Pure means: no I/O, no MCP SDK, no OpenTelemetry, no prometheus-client, no YAML (a test enforces it).
Adapters feed it wire dicts; emitters read the :class:`Measurement` and :class:`BudgetUpdate` it returns.
"""

from .budget import BudgetUpdate, SessionBudget, SessionRegistry
from .estimation import estimate_tokens
from .estimators import ESTIMATOR_NAMES, EstimatorUnavailable, get_estimator
from .labels import NameLimiter
from .measure import Block, Measurement, Policy, measure_error, measure_message, measure_request, measure_result
from .profiles import (
    AggregateProfile,
    StaticProfile,
    aggregate_profiles,
    compute_static_profile,
    profile_tool_definition,
)
from .risk import RISK_TIERS, RiskThresholds, classify_risk

__all__ = [
    "ESTIMATOR_NAMES",
    "RISK_TIERS",
    "AggregateProfile",
    "Block",
    "BudgetUpdate",
    "EstimatorUnavailable",
    "Measurement",
    "NameLimiter",
    "Policy",
    "RiskThresholds",
    "SessionBudget",
    "SessionRegistry",
    "StaticProfile",
    "aggregate_profiles",
    "classify_risk",
    "compute_static_profile",
    "estimate_tokens",
    "get_estimator",
    "measure_error",
    "measure_message",
    "measure_request",
    "measure_result",
    "profile_tool_definition",
]
