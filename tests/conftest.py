"""Shared fixtures and helpers for the test suite."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from mcp_token_otel.core.measure import Policy

from .support import fresh_otel_globals


def chars4(text: str) -> int:
    """A transparent estimator for arithmetic checks: ceil(len / 4)."""
    return math.ceil(len(text) / 4)


@pytest.fixture
def chars4_policy() -> Policy:
    return Policy(estimator=chars4, estimator_name="chars/4")


@pytest.fixture
def otel_globals() -> Iterator[None]:
    """Unset global tracer and meter providers for one test (restored after it): no fresh interpreter needed."""
    with fresh_otel_globals():
        yield
