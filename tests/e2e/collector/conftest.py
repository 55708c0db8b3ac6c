"""The Collector binary: built (once per manifest, then cached) by scripts/otelcol."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.helpers.support import ROOT

OTELCOL_SCRIPT = ROOT / "scripts/otelcol"
#: A first build downloads and compiles the Collector's modules (minutes on two cores); later calls are instant.
BUILD_TIMEOUT = 3600


@pytest.fixture(scope="session")
def otelcol() -> str:
    """The path of the Collector binary; when it is not built yet and Go is missing, this fails under CI and skips
    elsewhere."""
    build = subprocess.run([str(OTELCOL_SCRIPT)], capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False)
    if build.returncode != 0 and shutil.which("go") is None:
        if os.environ.get("CI"):
            pytest.fail("Go is missing: scripts/otelcol builds the Collector from Go modules")
        pytest.skip("Go not installed (scripts/otelcol builds the Collector from Go modules)")
    assert build.returncode == 0, f"scripts/otelcol failed:\n{build.stderr[-4000:]}"
    return build.stdout.strip()
