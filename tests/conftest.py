"""Shared fixtures and helpers for the test suite."""

from __future__ import annotations

import math

import pytest

from mcp_token_otel.core.measure import Policy


def chars4(text: str) -> int:
    """A transparent estimator for arithmetic checks: ceil(len / 4)."""
    return math.ceil(len(text) / 4)


@pytest.fixture
def chars4_policy() -> Policy:
    return Policy(estimator=chars4, estimator_name="chars/4")
