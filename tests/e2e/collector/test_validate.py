"""The shipped Collector config loads in the Collector that scripts/otelcol builds."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.support import ROOT

CONFIG = ROOT / "deploy/otel-collector/config.yaml"


@pytest.mark.slow
def test_the_shipped_config_validates(otelcol: str) -> None:
    result = subprocess.run([otelcol, "validate", f"--config={CONFIG}"], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_validate_rejects_a_broken_config(otelcol: str, tmp_path: Path) -> None:
    """validate really checks the transform statements (so the test above can fail)."""
    broken = tmp_path / "config.yaml"
    typo = CONFIG.read_text().replace("delete_key(datapoint.attributes,", "delete_key(datapoint.attributes_typo,", 1)
    broken.write_text(typo)
    result = subprocess.run([otelcol, "validate", f"--config={broken}"], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode != 0 and "attributes_typo" in result.stderr, result.stderr
