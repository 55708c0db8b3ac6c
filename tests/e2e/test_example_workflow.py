"""The CI example installs mcp-token-otel the way it can be installed: from its Git repository (no package index
serves it). The workflow's own install line runs, with this checkout standing in for the repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import mcp_token_otel

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "examples" / "github-workflow-token-check.yml"


def _install_line() -> str:
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["token-check"]["steps"]
    lines = [line.strip() for step in steps for line in step.get("run", "").splitlines()]
    [line] = [line for line in lines if line.startswith("pip install") and "mcp-token-otel" in line]
    return line


def test_the_workflow_installs_from_the_repository_not_an_index() -> None:
    line = _install_line()
    assert "@ git+${MCP_TOKEN_OTEL_GIT}@${MCP_TOKEN_OTEL_REF}" in line, line
    env = yaml.safe_load(WORKFLOW.read_text())["env"]
    assert env["MCP_TOKEN_OTEL_GIT"].startswith("https://") and env["MCP_TOKEN_OTEL_REF"]
    assert "Git repository" in WORKFLOW.read_text()  # and it says so where the variables are set


@pytest.mark.slow
def test_the_workflow_install_line_resolves_to_this_package(tmp_path: Path) -> None:
    """pip, as the workflow runs it (a shell, the line verbatim), with this checkout's HEAD as the repository;
    a dry run (flags added at the end) reports what it would install."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "pip").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m pip "$@"\n')
    (shim / "pip").chmod(0o755)
    report = tmp_path / "report.json"
    repo = f"file://localhost{ROOT}"  # pip 23's URL check refuses an empty host (file:///...)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "MCP_TOKEN_OTEL_GIT": repo,
           "MCP_TOKEN_OTEL_REF": head.stdout.strip(), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    # flags, not PIP_* variables: those would reach the pip that fills the build environment too; whatever this
    # interpreter has installed already, the line is resolved from the repository
    line = f"{_install_line()} --dry-run --no-deps --ignore-installed --quiet --report {report}"
    out = subprocess.run(["bash", "-euc", line], env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    [item] = json.loads(report.read_text())["install"]
    assert item["metadata"]["name"] == "mcp-token-otel"
    assert item["metadata"]["version"] == mcp_token_otel.__version__
    assert item["requested_extras"] == ["exact"] and item["download_info"]["url"] == repo
