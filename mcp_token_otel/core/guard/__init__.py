"""Guardrails: opt-in policies over MCP messages (response cap, session hard limit and warning note, rate and
chain-depth limits, padding detection, token annotation, cost), one pure implementation for the shim adapters
and the proxy. Entry point: :class:`GuardEngine` (``on_request`` / ``on_result``); docs/guardrails.md.
"""

from .annotate import META_GUARD_KEY, META_PREFIX, META_TOKENS_KEY, annotate
from .cap import cap_result
from .cost import cost_usd
from .engine import (
    ACTIONS,
    ALLOW,
    ANNOTATE,
    CHAIN_DEPTH,
    PADDING,
    POLICIES,
    RATE_LIMIT,
    RESPONSE_CAP,
    SESSION_LIMIT,
    SESSION_WARNING,
    BudgetView,
    Decision,
    GuardAction,
    GuardEngine,
    GuardOutcome,
    ToolInfo,
    tool_error,
)
from .json_cut import cut_json
from .limits import CHAINED_METHODS, META_DEPTH_KEY, RateLimiter, chain_depth, deeper, with_depth
from .padding import PaddingFinding, scan_text, strip_invisible
from .pagination import Pagination
from .report import CapReport
from .settings import DEFAULT_PRICING, GUARD_MODES, GuardSettings, PaddingSettings, ToolGuard, ToolPolicy
from .text_cut import cut_text, safe_boundary

__all__ = [
    "ACTIONS", "ALLOW", "ANNOTATE", "CHAINED_METHODS", "CHAIN_DEPTH", "DEFAULT_PRICING", "GUARD_MODES",
    "META_DEPTH_KEY", "META_GUARD_KEY", "META_PREFIX", "META_TOKENS_KEY", "PADDING", "POLICIES", "RATE_LIMIT",
    "RESPONSE_CAP", "SESSION_LIMIT", "SESSION_WARNING", "BudgetView", "CapReport", "Decision", "GuardAction",
    "GuardEngine", "GuardOutcome", "GuardSettings", "PaddingFinding", "PaddingSettings", "Pagination", "RateLimiter",
    "ToolGuard", "ToolInfo", "ToolPolicy", "annotate", "cap_result", "chain_depth", "cost_usd", "cut_json",
    "cut_text", "deeper", "safe_boundary", "scan_text", "strip_invisible", "tool_error", "with_depth",
]
