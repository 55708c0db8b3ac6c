"""The dashboards and the alerting and recording rules use only metric names the catalog declares."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mcp_token_otel.catalog import FAMILIES

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted([*ROOT.glob("dashboards/*.json"), *ROOT.glob("deploy/prometheus/rules/*.yml"),
                ROOT / "deploy/kubernetes/prometheusrule.yaml"])
#: A metric name of this project: not part of a longer name (a recording rule's ``job:..._tokens:rate5m`` is
#: not a family), not the package name.
NAME = re.compile(r"(?<![\w:])mcp_token_(?!otel\b)\w+(?![\w:])")


def served_names() -> set[str]:
    """Every name a scrape can carry: a gauge's, a counter's ``_total``, a histogram's and its series'."""
    names: set[str] = set()
    for family in FAMILIES:
        if not family.name:
            continue
        if family.kind == "counter":
            names.add(f"{family.name}_total")
        elif family.kind == "histogram":
            names |= {family.name, *(f"{family.name}_{suffix}" for suffix in ("bucket", "sum", "count"))}
        else:
            names.add(family.name)
    return names


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_metric_name_is_in_the_catalog(path: Path) -> None:
    used = set(NAME.findall(path.read_text(encoding="utf-8")))
    assert used, f"{path} names no metric: the pattern no longer matches how it names them"
    assert used - served_names() == set()
