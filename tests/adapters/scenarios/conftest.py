"""The shared scenarios run under whichever SDK major is installed: ``sdk`` is its driver (sdk.py).

``otel`` and ``instrumented`` are tests/conftest.py's (the global tracer provider, which the mcp 2.x SDK's own spans
use; mcp 1.x makes none).
"""

from __future__ import annotations

import pytest

from .sdk import SDK, Driver


@pytest.fixture
def sdk() -> Driver:
    return SDK
