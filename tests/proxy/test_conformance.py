"""Transparency on a suite nobody here wrote: the MCP conformance suite gives the same result for every check of
every scenario against server-everything directly and through the HTTP proxy (scripts/conformance-proxy), with
and without context injection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.support import ROOT, npm_peer

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("options", [[], ["--inject-trace-context"]], ids=["default", "inject"])
def test_conformance_same_through_proxy(options: list[str]) -> None:
    npm_peer("conformance")
    npm_peer("mcp-server-everything")
    venv = Path(sys.executable).parent.parent
    done = subprocess.run([str(ROOT / "scripts" / "conformance-proxy"), *options], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "MCP_TOKEN_OTEL_VENV": str(venv)})
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["different"] == []
    assert summary["direct"] == summary["proxy"]
    assert summary["scenarios"] >= 20 and summary["direct"]["passed"] > 0
