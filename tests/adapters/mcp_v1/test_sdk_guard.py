"""The one test of this directory that runs on every mcp major: it shows why the rest is skipped."""

from __future__ import annotations

import pytest

from mcp_token_otel.instrumentation import detect_adapter

from .conftest import IS_MCP_V2


def test_mcp1_adapter_selected() -> None:
    if IS_MCP_V2:
        pytest.skip("mcp 2.x is installed: the mcp 1.x adapter tests (tests/adapters/mcp_v1/test_v1_*.py) do not apply")
    assert detect_adapter() == "mcp_token_otel.adapters.mcp_v1"
