"""The install a user does today: a wheel built by ``python -m build``, installed with its dependencies from the
package index into a clean virtualenv (no site packages, not this checkout), and the command line it brings."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*cmd: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                         check=False, env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    assert out.returncode == 0, f"{cmd}: {out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return out


@pytest.mark.slow
def test_a_built_wheel_installs_into_a_clean_venv_and_runs(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # sdist first, then the wheel from the unpacked sdist: what is missing from the sdist fails here too.
    _run(sys.executable, "-m", "build", "--outdir", dist, ROOT, cwd=tmp_path)
    wheels = list(dist.glob("mcp_token_otel-*.whl"))
    assert len(wheels) == 1 and list(dist.glob("mcp_token_otel-*.tar.gz")), list(dist.iterdir())
    with zipfile.ZipFile(wheels[0]) as wheel:  # the license travels with the wheel, named by its SPDX id
        names = wheel.namelist()
        metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        license_file = wheel.read(next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))).decode()
    assert "License-Expression: Apache-2.0" in metadata.splitlines(), metadata[:800]
    assert license_file == (ROOT / "LICENSE").read_text() and "Apache License" in license_file
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env)
    python = env / "bin" / "python"
    _run(python, "-m", "pip", "install", "--disable-pip-version-check", "-q", wheels[0], cwd=tmp_path)

    where = _run(python, "-c", "import mcp_token_otel; print(mcp_token_otel.__file__)", cwd=tmp_path).stdout
    assert where.strip().startswith(str(env)), where  # the installed copy, not this checkout
    assert "usage: mcp-token-otel" in _run(env / "bin" / "mcp-token-otel", "--help", cwd=tmp_path).stdout
    out = _run(env / "bin" / "mcp-token-otel", "estimate", "--json", ROOT / "examples" / "tools_call_response.json",
               cwd=tmp_path)
    data = json.loads(out.stdout)
    assert data["direction"] == "output" and data["total_tokens"] > 0 and data["estimator"] == "default"
