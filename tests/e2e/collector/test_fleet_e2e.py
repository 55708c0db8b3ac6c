"""End to end on the Collector path, with the direct path's checks: every dashboard panel query returns data, and
the threshold, exhaustion, sustained-usage and guard alerts reach the webhook, for a demo exporting OTLP over
HTTP and one exporting over gRPC (one fleet runs both: each is its own `job`). Where the two paths differ, the
Collector config is what gets fixed; the names it produced are recorded for the docs' mapping table.
"""

from __future__ import annotations

import functools
import json
import os
import re
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..test_alerting_e2e import EXPECTED, query, wait_for
from ..test_dashboards import Live, _expand, _has_data, _run_target, all_targets, dashboards, metric_names
from . import mapping
from .fleet import DEMO_SERVER, PROTOCOLS, Fleet, instance, job, running_fleet

pytestmark = pytest.mark.slow
#: Families on /metrics that do not come through the Collector (none: both sinks create the series that alerts
#: and panels take increase() of at 0, so a panel has data before the first event on either path).
NOT_THROUGH_COLLECTOR: set[str] = set()
#: Seconds an alert may take to reach the webhook (the direct path's bound; the sustained-usage windows are the
#: longest).
ALERT_TIMEOUT = 180


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, otelcol: str) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("fleet"), otelcol) as running:
        for protocol in PROTOCOLS:
            data = f'count(mcp_token_sessions{{job="{job(protocol)}"}})'
            wait_for(f"data over {protocol}", functools.partial(query, running.prometheus, data), 90, running.procs)
        yield running


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_alerts_reach_the_webhook(fleet: Fleet, protocol: str) -> None:
    service = job(protocol)
    for labels, receiver in EXPECTED:
        found = functools.partial(fleet.webhook.first, "firing", job=service, **labels)
        path, alert = wait_for(f"firing {labels} of {service}", found, ALERT_TIMEOUT, fleet.procs)
        assert path == receiver, (labels, path)
        assert alert["annotations"]["description"] and "{{" not in alert["annotations"]["description"]
    # Alertmanager's inhibition works on these labels too: the critical breach of export_table hides its warning.
    assert not fleet.webhook.find("firing", alertname="McpTokenToolResponseTierBreach", severity="warning",
                                  tool="export_table", job=service)
    assert all("session_id" not in a["labels"] for _, a in fleet.webhook.notifications)


def _reads_only_missing_families(expr: str) -> bool:
    families = {re.sub(r"_(bucket|count|sum)$", "", name) for name in metric_names(expr)}
    return bool(families) and families <= NOT_THROUGH_COLLECTOR


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_panel_query_returns_data(fleet: Fleet, protocol: str) -> None:
    service = job(protocol)
    firing = f'count(ALERTS{{alertstate="firing", job="{service}"}})'
    wait_for(f"a firing alert of {service}", functools.partial(query, fleet.prometheus, firing), ALERT_TIMEOUT,
             fleet.procs)
    live = Live(fleet.prometheus, fleet.exporter, instance(protocol))
    everything = {"job": service, "instance": ".+", "server": ".+", "side": ".+", "tool": ".+"}
    # Grafana escapes regex metacharacters of a selected value, then backslashes for the PromQL string.
    concrete = {"job": service, "instance": re.escape(live.instance).replace("\\", "\\\\"), "server": DEMO_SERVER,
                "side": "server", "tool": "export_table"}
    ran, empty, missing = 0, list[str](), list[str]()
    for name, dash in dashboards().items():
        for panel, target in all_targets(dash):
            for values in (everything, concrete):
                expr = _expand(target["expr"], values)
                ran += 1
                if not _has_data(_run_target(live, target, expr)):
                    where = f"{name}: {panel['title']}: {expr}"
                    (missing if _reads_only_missing_families(expr) else empty).append(where)
    print(f"\n{ran} panel queries; without data: {len(empty)}, and {len(missing)} on {NOT_THROUGH_COLLECTOR}")
    assert ran >= 100
    assert not empty, f"{len(empty)} of {ran} panel queries without data:\n" + "\n".join(empty)


def test_the_collector_produces_the_metrics_names_and_labels(fleet: Fleet) -> None:
    """Every family with samples on the demo's own /metrics arrives through the Collector under its name with its
    labels; what the Collector produced is what the docs' table was generated from (RECORD_COLLECTOR_MAPPING=1
    records it)."""
    with urllib.request.urlopen(fleet.exporter, timeout=10) as response:
        observed = mapping.observe(response.read().decode())
    if os.environ.get("RECORD_COLLECTOR_MAPPING"):
        mapping.RECORDED.write_text(json.dumps({"families": observed}, indent=2) + "\n")
    for url in fleet.direct.values():
        with urllib.request.urlopen(url, timeout=10) as response:
            direct = mapping.observe(response.read().decode())
        assert set(direct) - set(observed) == NOT_THROUGH_COLLECTOR, "only on /metrics"
        differ = {name: (seen["labels"], observed[name]["labels"]) for name, seen in direct.items()
                  if name in observed and seen["labels"] != observed[name]["labels"]}
        assert not differ, f"labels on /metrics and through the Collector: {differ}"
    assert mapping.recorded()["families"] == observed, "run with RECORD_COLLECTOR_MAPPING=1, then regenerate"


def _duration_counts(exposition: str) -> tuple[dict[tuple[str, ...], float], dict[tuple[str, ...], float], int]:
    """Calls per (job, side, server, method, tool): the copy mcp_token_operation_duration_seconds, and the
    conventions' instruments summed over what the copy leaves out (error type, transport, protocol); and how many
    of the conventions' series carry an error_type."""
    copy: dict[tuple[str, ...], float] = {}
    summed: dict[tuple[str, ...], float] = {}
    errors = 0
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            labels = s.labels
            if s.name == "mcp_token_operation_duration_seconds_count":
                key = (labels["job"], labels["side"], labels["server"], labels["method"], labels.get("tool", ""))
                copy[key] = copy.get(key, 0) + s.value
            elif match := re.fullmatch(r"mcp_(client|server)_operation_duration_seconds_count", s.name):
                key = (labels["job"], match.group(1), labels["server"], labels["mcp_method_name"],
                       labels.get("gen_ai_tool_name", ""))
                summed[key] = summed.get(key, 0) + s.value
                errors += "error_type" in labels
    return copy, summed, errors


def test_the_operation_duration_copy_sums_the_failed_and_successful_calls(fleet: Fleet) -> None:
    """The copy drops error_type (as /metrics does) by summing a tool's points, failed and successful: each label set
    counts every call, not one of the points that share it."""

    def agree() -> tuple[dict[tuple[str, ...], float], int] | None:
        with urllib.request.urlopen(fleet.exporter, timeout=10) as response:
            copy, summed, errors = _duration_counts(response.read().decode())
        return (copy, errors) if copy and copy == summed and errors else None

    # The two come from one export each time; a scrape between the exporter's updates of them is retried.
    copy, errors = wait_for("the copy's counts to equal the conventions' sums over error_type", agree, 60,
                            fleet.procs)
    assert errors > 0 and all(value > 0 for value in copy.values())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_traces_reach_the_trace_backend(fleet: Fleet, protocol: str) -> None:
    service = job(protocol)
    assert fleet.traces.spans[service] > 0, dict(fleet.traces.spans)
    assert "mcp_token.output_tokens" in fleet.traces.attributes[service]
