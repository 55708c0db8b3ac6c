"""The recorder: MCP messages -> token estimates on spans, session budgets, guard actions and metrics."""

from .facade import CAPTURE_ENV, SIDES, Side, TokenRecorder, capture_from_env

__all__ = ["CAPTURE_ENV", "SIDES", "Side", "TokenRecorder", "capture_from_env"]
