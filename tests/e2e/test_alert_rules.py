"""The Prometheus rules, their promtool unit tests, and the Prometheus / Alertmanager configs.

promtool and amtool come with the Debian packages ``prometheus`` and ``prometheus-alertmanager``
(``scripts/system-deps``). Without them the tool-based tests skip, except under CI (``CI`` set), where
they fail. The structural tests only need PyYAML.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from mcp_token_otel.catalog import DEFINITION_PARTS, WASTE_KINDS
from mcp_token_otel.core.guard import ACTIONS, POLICIES
from mcp_token_otel.core.spill import READ_OUTCOMES

REPO = Path(__file__).resolve().parents[2]
PROM_DIR = REPO / "deploy" / "prometheus"
RULES = PROM_DIR / "rules" / "mcp-token-otel.rules.yml"
RULE_TESTS = sorted((PROM_DIR / "rules" / "tests").glob("*.test.yml"))
PROM_CONFIG = PROM_DIR / "prometheus.yml"
AM_CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
RUNBOOK = REPO / "docs" / "runbook.md"
#: The rules' runbook_url base: the runbook shipped in the repository (scripts/gen-k8s --runbook-base and the
#: documented substitution in docs/runbook.md replace it with where a team hosts it).
RUNBOOK_URL = "docs/runbook.md"

#: The metric families the service exposes, with their labels (every series also gets job/instance).
HISTOGRAMS: dict[str, set[str]] = {
    "mcp_token_message_tokens": {"side", "server", "method", "tool", "direction"},
    "mcp_token_operation_duration_seconds": {"side", "server", "method", "tool"},
    "mcp_token_logical_call_duration_seconds": {"side", "server", "method", "tool"},
    "mcp_token_session_utilization_ratio": {"side", "server"},
    "mcp_token_session_duration_seconds": {"side", "server"},
}
SIMPLE: dict[str, set[str]] = {
    "mcp_token_tokens_total": {"side", "server", "method", "tool", "direction"},
    "mcp_token_bytes_total": {"side", "server", "method", "tool", "direction"},
    "mcp_token_responses_total": {"side", "server", "method", "tool", "risk_tier"},
    "mcp_token_overhead_tokens_total": {"side", "server", "method", "tool"},
    "mcp_token_call_errors_total": {"side", "server", "method", "tool", "error_type"},
    "mcp_token_sessions": {"side", "server", "state"},
    "mcp_token_session_transitions_total": {"side", "server", "state"},
    "mcp_token_tool_definitions_tokens": {"server"},
    "mcp_token_tool_definition_tokens": {"server", "tool"},
    "mcp_token_instrumentation_errors_total": {"stage", "server"},
    "mcp_token_output_rate_budget_tokens_per_second": {"scope", "server"},
    # Guards (issue 13, names pinned by the shared contract).
    "mcp_token_guard_actions_total": {"side", "server", "policy", "action", "enforced", "tool"},
    "mcp_token_cost_usd_total": {"side", "server", "tool"},
    "mcp_token_unbudgeted_tokens_total": {"side", "server"},
    "mcp_token_tool_definitions_part_tokens": {"server", "part"},
    "mcp_token_tool_static_max_tokens": {"server", "tool"},
    "mcp_token_prompt_cache_invalidations_total": {"side", "server"},
    "mcp_token_prompt_cache_resent_tokens_total": {"side", "server"},
    "mcp_token_wasted_tokens_total": {"side", "server", "tool", "kind"},
    # With a shared budget store only (budget.store: a Redis URL).
    "mcp_token_budget_store_errors_total": {"server", "op"},
    # With guard.spill on.
    "mcp_token_spilled_tokens_total": {"side", "server", "tool"},
    "mcp_token_spill_read_tokens_total": {"side", "server", "tool"},
    "mcp_token_spill_reads_total": {"side", "server", "tool", "outcome"},
    "mcp_token_spills_refused_total": {"side", "server", "tool", "reason"},
    "mcp_token_spill_evictions_total": {"side", "server"},
}
#: Series Prometheus itself writes for every target.
BUILTIN: dict[str, set[str]] = {"up": set()}
SCRAPE_LABELS = {"job", "instance"}
#: Closed label value sets (a typo in a matcher would silently match nothing).
LABEL_VALUES: dict[str, set[str]] = {
    "side": {"client", "server", "proxy"},
    "direction": {"input", "output", "input_required", "input_response", "task"},
    "risk_tier": {"low", "medium", "high", "critical"},
    "state": {"ok", "warning", "exhausted"},
    "scope": {"tool", "service"},
    "policy": set(POLICIES),  # the guard engine's own lists: a renamed policy breaks the rules' matchers here
    "action": set(ACTIONS),
    "enforced": {"true", "false"},
    "part": set(DEFINITION_PARTS),
    "kind": set(WASTE_KINDS),
    "op": {"add", "peek", "rate", "end", "flush", "probe", "spill_put", "spill_get"},
    "outcome": set(READ_OUTCOMES),
    "reason": {"no_owner", "too_large", "too_many_pages", "empty", "store"},
}


def _families() -> dict[str, set[str]]:
    names = dict(SIMPLE)
    for base, labels in HISTOGRAMS.items():
        names[base + "_bucket"] = labels | {"le"}
        names[base + "_count"] = labels
        names[base + "_sum"] = labels
    names.update(BUILTIN)
    return names


FAMILIES = _families()


# ---------------------------------------------------------------------------------------------- helpers


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"{name} not found (Debian: prometheus / prometheus-alertmanager packages)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)


def _assert_success(proc: subprocess.CompletedProcess[str]) -> str:
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(proc.args)} exited {proc.returncode}:\n{output}"
    assert "SUCCESS" in output, f"{' '.join(proc.args)}: no SUCCESS in the output:\n{output}"
    return output


def _load(path: Path) -> Any:
    with path.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _rules() -> list[dict[str, Any]]:
    return [rule for group in _load(RULES)["groups"] for rule in group["rules"]]


def _alerts() -> list[dict[str, Any]]:
    return [r for r in _rules() if "alert" in r]


def _records() -> set[str]:
    return {r["record"] for r in _rules() if "record" in r}


_KEYWORDS = {"and", "or", "unless", "bool", "inf", "nan"}
_MODIFIERS = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"
_IDENT = r"(?<![\w.:])[A-Za-z_:][A-Za-z0-9_:]*"


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, labels and durations removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(_MODIFIERS, " ", text)
    text = re.sub(r"\boffset\s+-?[0-9a-z]+", " ", text)
    names = set()
    for match in re.finditer(_IDENT, text):
        token = match.group(0)
        if text[match.end() :].lstrip().startswith("(") or token.lower() in _KEYWORDS:
            continue  # a function or an aggregation, or a binary operator
        names.add(token)
    return names


def selectors(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """(metric, [(label, op, value)]) for every ``name{matchers}`` in an expression."""
    found = []
    for match in re.finditer(_IDENT + r"\s*\{([^}]*)\}", expr):
        name = match.group(0).split("{")[0].strip()
        matchers = re.findall(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"', match.group(1))
        found.append((name, matchers))
    return found


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _runbook_anchors() -> set[str]:
    text = re.sub(r"^```.*?^```", "", RUNBOOK.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", text, re.MULTILINE)}


def _runbook_queries() -> list[str]:
    """The PromQL of the runbook's ```promql blocks: a query per unindented line plus its indented ones."""
    queries: list[str] = []
    text = RUNBOOK.read_text(encoding="utf-8")
    for block in re.findall(r"^```promql\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
        for line in block.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if line[0].isspace() and queries:
                queries[-1] += "\n" + line
            else:
                queries.append(line)
    return queries


# ---------------------------------------------------------------------------------------------- promtool


def test_promtool_check_rules() -> None:
    output = _assert_success(_run(_tool("promtool"), "check", "rules", RULES))
    assert re.search(r"SUCCESS: \d+ rules found", output), output


def test_rule_test_files_exist() -> None:
    assert RULE_TESTS, "no *.test.yml under deploy/prometheus/rules/tests"


@pytest.mark.parametrize("test_file", RULE_TESTS, ids=[p.name for p in RULE_TESTS])
@pytest.mark.slow
def test_promtool_test_rules(test_file: Path) -> None:
    _assert_success(_run(_tool("promtool"), "test", "rules", test_file))


def test_promtool_check_config() -> None:
    output = _assert_success(_run(_tool("promtool"), "check", "config", PROM_CONFIG))
    # rule_files resolve relative to the config: the glob must reach the rules file.
    assert "1 rule files found" in output, output
    assert RULES.name in output, output


# ---------------------------------------------------------------------------------------------- amtool


def test_amtool_check_config() -> None:
    _assert_success(_run(_tool("amtool"), "check-config", AM_CONFIG))


@pytest.mark.parametrize(
    ("severity", "receiver"), [("critical", "pager"), ("warning", "ticket"), ("info", "info")],
    ids=["critical", "warning", "info"],
)
def test_amtool_routes(severity: str, receiver: str) -> None:
    proc = _run(
        _tool("amtool"),
        "config",
        "routes",
        "test",
        f"--config.file={AM_CONFIG}",
        f"--verify.receivers={receiver}",
        f"severity={severity}",
        "alertname=McpTokenToolResponseTierBreach",
        "job=mcp-token-otel",
        "tool=search",
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert proc.stdout.strip() == receiver, output


def test_alertmanager_structure() -> None:
    config = _load(AM_CONFIG)
    route = config["route"]
    assert route["group_by"] == ["alertname", "job", "server", "tool"]
    for key in ("group_wait", "group_interval", "repeat_interval"):
        assert key in route
    inhibit = config["inhibit_rules"]
    assert any(
        r.get("source_matchers") == ['severity="critical"']
        and r.get("target_matchers") == ['severity="warning"']
        and r.get("equal") == ["alertname", "job", "server", "tool"]
        for r in inhibit
    ), inhibit
    urls = {r["name"]: [w["url"] for w in r.get("webhook_configs", [])] for r in config["receivers"]}
    assert urls == {"pager": ["http://127.0.0.1:9099/pager"], "ticket": ["http://127.0.0.1:9099/ticket"], "info": []}


def test_prometheus_config_structure() -> None:
    config = _load(PROM_CONFIG)
    assert config["rule_files"] == ["rules/*.rules.yml"]
    assert config["global"]["scrape_interval"] == "15s"
    assert config["global"]["evaluation_interval"] == "15s"
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "mcp-token-otel"
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert job["static_configs"][0]["targets"] == ["127.0.0.1:9464"]
    targets = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert targets == ["127.0.0.1:9093"]
    assert "--enable-feature=exemplar-storage" in PROM_CONFIG.read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------- structure


def test_alert_conventions() -> None:
    alerts = _alerts()
    assert alerts
    anchors = _runbook_anchors()
    for rule in alerts:
        name = rule["alert"]
        assert re.fullmatch(r"McpToken(?:[A-Z][a-z0-9]+)+", name), f"{name}: not CamelCase with McpToken"
        labels = rule.get("labels", {})
        # info: context, routed to no one by default (monitoring-mixins' third severity).
        assert labels.get("severity") in {"info", "warning", "critical"}, f"{name}: severity {labels.get('severity')}"
        assert "risk_tier" not in labels, f"{name}: risk_tier is the metric's label, not an alert label"
        ann = rule.get("annotations", {})
        summary = ann.get("summary", "")
        assert summary.endswith("."), f"{name}: summary must end with a period"
        assert "{{" not in summary, f"{name}: summary must be static"
        description = ann.get("description", "")
        assert "{{" in description and "$labels" in description, f"{name}: description not templated"
        assert re.search(r"\$value \| (humanize|humanizePercentage)\b", description), name
        assert ann.get("runbook_url") == f"{RUNBOOK_URL}#{name.lower()}", f"{name}: runbook_url"
        assert name.lower() in anchors, f"{name}: no '## {name}' section in docs/runbook.md"


def test_alert_severities_are_distinct_rules() -> None:
    """An alert name used twice must be split by severity (and scope), never duplicated."""
    seen: set[tuple[str, ...]] = set()
    for rule in _alerts():
        labels = rule.get("labels", {})
        key = (rule["alert"], labels.get("severity", ""), labels.get("scope", ""))
        assert key not in seen, f"duplicate alert rule {key}"
        seen.add(key)


def test_recording_rule_names() -> None:
    for name in _records():
        assert re.fullmatch(r"[a-z_]+:mcp_token_[a-z0-9_]+:[a-z0-9_]+", name), f"{name}: not level:metric:operations"


def test_metric_name_extraction() -> None:
    expr = (
        'sum by (job) (rate(foo_total{a="b:c", d=~"x|y"}[5m])) / on (job) group_left () bar:baz:max '
        "offset 5m > 1e3 and on (job) (up == 1) unless ignoring (x) count(qux)"
    )
    assert metric_names(expr) == {"foo_total", "bar:baz:max", "up", "qux"}


def test_exprs_only_name_exposed_metrics_or_recording_rules() -> None:
    known = set(FAMILIES) | _records()
    for rule in _rules():
        what = rule.get("alert") or rule.get("record")
        names = metric_names(rule["expr"])
        assert names, f"{what}: no metric found in {rule['expr']!r}"
        unknown = names - known
        assert not unknown, f"{what}: unknown metrics {sorted(unknown)} (not exposed, not recorded)"


def test_selector_labels_and_values_exist() -> None:
    for rule in _rules():
        what = rule.get("alert") or rule.get("record")
        for name, matchers in selectors(rule["expr"]):
            if name not in FAMILIES:
                continue  # recording rules: their labels are checked by the unit tests
            allowed = FAMILIES[name] | SCRAPE_LABELS
            for label, op, value in matchers:
                assert label in allowed, f"{what}: {name} has no label {label!r}"
                if op == "=" and label in LABEL_VALUES and value:
                    assert value in LABEL_VALUES[label], f"{what}: {label}={value!r} never exported"


def _tested_alerts() -> tuple[set[tuple[str, str]], set[str]]:
    """(alertname, severity) pairs expected to fire somewhere in the unit tests, and exprs tested."""
    fired: set[tuple[str, str]] = set()
    exprs: set[str] = set()
    for path in RULE_TESTS:
        for case in _load(path)["tests"]:
            for art in case.get("alert_rule_test", []):
                for exp in art.get("exp_alerts") or []:
                    fired.add((art["alertname"], exp["exp_labels"]["severity"]))
                    assert "exp_annotations" in exp, f"{path.name}: {art['alertname']} without annotations"
            exprs.update(t["expr"] for t in case.get("promql_expr_test", []))
    return fired, exprs


def test_every_alert_and_recording_rule_is_unit_tested() -> None:
    fired, exprs = _tested_alerts()
    for rule in _alerts():
        key = (rule["alert"], rule["labels"]["severity"])
        assert key in fired, f"{key}: no promtool unit test expects it to fire"
    tested = " ".join(exprs)
    for record in _records():
        assert record in tested, f"{record}: no promql_expr_test"


def test_runbook_internal_links_resolve() -> None:
    anchors = _runbook_anchors()
    for link in re.findall(r"\]\(#([^)]+)\)", RUNBOOK.read_text(encoding="utf-8")):
        assert link in anchors, f"docs/runbook.md links to a missing #{link}"


def test_runbook_queries_name_known_metrics() -> None:
    queries = _runbook_queries()
    assert len(queries) >= 10
    known = set(FAMILIES) | _records()
    for query in queries:
        unknown = metric_names(query) - known
        assert not unknown, f"docs/runbook.md query names unknown metrics {sorted(unknown)}: {query}"


def test_runbook_queries_parse(tmp_path: Path) -> None:
    """Every runbook query is valid PromQL (checked as a recording rule by promtool)."""
    promtool = _tool("promtool")
    rules = [{"record": f"runbook:query_{i}:check", "expr": q} for i, q in enumerate(_runbook_queries())]
    path = tmp_path / "runbook.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "runbook", "rules": rules}]}), encoding="utf-8")
    _assert_success(_run(promtool, "check", "rules", path))
