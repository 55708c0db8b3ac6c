"""The Grafana dashboards (dashboards/*.json): the JSON model follows the project's conventions, every panel
charts a metric the service really emits, and every panel query returns data from a real Prometheus that
scraped the real demo workload with the shipped rules loaded.

The static checks encode grafana/dashboard-linter's rules as the conventions note lists them; the live
checks share ONE module-scoped fixture (demo + Prometheus), so the suite waits for data once.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from mcp_token_otel.catalog import BY_NAME, prometheus_families
from mcp_token_otel.config import Config
from tests.helpers.support import free_port, require_binary

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = ROOT / "dashboards"
RULES = ROOT / "deploy/prometheus/rules/mcp-token-otel.rules.yml"
DS = {"type": "prometheus", "uid": "${datasource}"}
#: The selector of the responses in a breach tier (high or critical).
BREACH_TIERS_MATCHER = 'risk_tier=~"high|critical"'
#: File name -> stable uid. Changing a uid breaks every link and bookmark to the dashboard.
UIDS = {
    "mcp-token-overview.json": "mcp-token-overview",
    "mcp-token-tools.json": "mcp-token-tools",
    "mcp-token-sessions.json": "mcp-token-sessions",
}
#: Dashboards with a `tool` variable.
WITH_TOOL = {"mcp-token-overview.json", "mcp-token-tools.json"}
#: Grafana unit ids used here (all from grafana-data's valueFormats categories).
VALID_UNITS = {"short", "none", "percentunit", "percent", "cps", "reqps", "ops", "s", "ms", "bytes", "Bps",
               "currencyUSD"}
COUNTER_SUFFIXES = ("_total", "_bucket", "_count", "_sum")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
_RANGE = re.compile(r"\[([^\]]*)\]")
_QUANTILE = re.compile(r"histogram_quantile\(\s*(0?\.\d+|1(?:\.0)?)\s*,\s*sum by \(le(?:,\s*\w+)*\)\s*\(\s*rate\(")
#: A metric name (series, recording rule or ALERTS) and its label matchers.
_SELECTOR = re.compile(r"\b(mcp_token_\w+|[a-z_]+:mcp_token_[a-z0-9_:]+|ALERTS)\b(?:\{([^}]*)\})?")
_LABEL_VALUES = re.compile(r"^label_values\((?:(.*),\s*)?(\w+)\)$")


# ---------------------------------------------------------------------------------------------------------
# Helpers over the JSON model.


def dashboards() -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARD_DIR.glob("*.json"))}


def walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including rows and the panels nested in (collapsed) rows."""
    for panel in panels:
        yield panel
        yield from walk_panels(panel.get("panels", []))


def all_targets(dash: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in walk_panels(dash["panels"]):
        for target in panel.get("targets", []):
            yield panel, target


def variables(dash: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dash["templating"]["list"]}


def variable_query(var: dict[str, Any]) -> str:
    query = var["query"]
    return query["query"] if isinstance(query, dict) else query


def strip_strings(expr: str) -> str:
    """The expression with string literals (label values) blanked, so only identifiers remain."""
    return _QUOTED.sub('""', expr)


def metric_names(expr: str) -> set[str]:
    """Metric names an expression reads: mcp_token_* families, recording rules (level:metric:ops), ALERTS, up."""
    names = set()
    for ident in _IDENT.findall(strip_strings(expr)):
        if ident.startswith("mcp_token_") or ":" in ident or ident in {"ALERTS", "up"}:
            names.add(ident)
    return names


_GROUPING = re.compile(r"(?:by|without)\s*\([^)]*\)")


def _skip_spaces(text: str, i: int) -> int:
    while i < len(text) and text[i] == " ":
        i += 1
    return i


def enclosing_functions(expr: str) -> list[tuple[str, list[str]]]:
    """(identifier, stack of the functions whose parentheses enclose it, innermost last) for each identifier."""
    text = strip_strings(expr)
    out: list[tuple[str, list[str]]] = []
    stack: list[str] = []
    i = 0
    while i < len(text):
        match = _IDENT.match(text, i)
        if match:
            ident = match.group(0)
            j = _skip_spaces(text, match.end())
            grouping = _GROUPING.match(text, j)
            if grouping:  # `sum by (le) (...)`: the aggregation encloses what follows its label list
                j = _skip_spaces(text, grouping.end())
            if j < len(text) and text[j] == "(":
                stack.append(ident)
                i = j + 1
                continue
            out.append((ident, list(stack)))
            i = match.end()
            continue
        if text[i] == "(":
            stack.append("")  # grouping, or the label list of `by (...)`
        elif text[i] == ")" and stack:
            stack.pop()
        elif text[i] == "[":
            i = text.index("]", i) + 1
            continue
        i += 1
    return out


def rules() -> dict[str, Any]:
    return yaml.safe_load(RULES.read_text())


def rule_list() -> list[dict[str, Any]]:
    return [rule for group in rules()["groups"] for rule in group["rules"]]


def recording_rules() -> set[str]:
    return {rule["record"] for rule in rule_list() if "record" in rule}


def threshold_values(panel: dict[str, Any]) -> set[float]:
    steps = panel["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", [])
    return {step["value"] for step in steps if step["value"] is not None}


# ---------------------------------------------------------------------------------------------------------
# Static checks of the JSON model.


def test_the_three_dashboards_exist_with_stable_unique_uids() -> None:
    found = dashboards()
    assert set(found) == set(UIDS)
    assert {name: d["uid"] for name, d in found.items()} == UIDS
    assert len({d["title"] for d in found.values()}) == len(found)


@pytest.mark.parametrize("name", sorted(UIDS))
def test_json_model_is_file_provisionable(name: str) -> None:
    text = (DASHBOARD_DIR / name).read_text()
    dash = json.loads(text)
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert 36 <= dash["schemaVersion"] <= 41
    assert "__inputs" not in dash and "__requires" not in dash
    assert "${DS_" not in text and "$DS_" not in text, "import-style datasource inputs break file provisioning"
    assert dash.get("id") is None, "a fixed numeric id collides across Grafana instances"
    assert dash["title"] and dash["description"] and "mcp-token-otel" in dash["tags"]
    panels = list(walk_panels(dash["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]


@pytest.mark.parametrize("name", sorted(UIDS))
def test_template_variables(name: str) -> None:
    dash = dashboards()[name]
    vars_ = variables(dash)
    assert vars_["datasource"]["type"] == "datasource" and vars_["datasource"]["query"] == "prometheus"
    expected = {"job", "instance", "server"} | ({"tool"} if name in WITH_TOOL else set())
    assert expected <= set(vars_)
    for var in vars_.values():
        if var["type"] != "query":
            continue
        assert var["datasource"] == DS, var["name"]
        assert _LABEL_VALUES.match(variable_query(var)), var["name"]
        assert var["multi"] and var["includeAll"], f"{var['name']}: multi-value with All"
        assert var.get("allValue") == ".+", f"{var['name']}: All is .+ (dashboard-linter)"
    # instance narrows by job; tool by job and instance.
    assert '$job' in variable_query(vars_["instance"])
    if "tool" in vars_:
        assert '$job' in variable_query(vars_["tool"]) and '$instance' in variable_query(vars_["tool"])


@pytest.mark.parametrize("name", sorted(UIDS))
def test_every_panel_and_target_uses_the_datasource_variable(name: str) -> None:
    dash = dashboards()[name]
    for panel in walk_panels(dash["panels"]):
        assert panel.get("datasource") == DS, panel["title"]
        for target in panel.get("targets", []):
            assert target.get("datasource") == DS, f"{panel['title']} {target['refId']}"


@pytest.mark.parametrize("name", sorted(UIDS))
def test_every_panel_has_a_unit_and_a_description(name: str) -> None:
    for panel in walk_panels(dashboards()[name]["panels"]):
        if panel["type"] == "row":
            continue
        assert panel.get("description", "").strip(), f"{panel['title']}: no description"
        unit = panel["fieldConfig"]["defaults"].get("unit")
        assert unit in VALID_UNITS, f"{panel['title']}: unit {unit!r}"
        assert panel.get("targets"), f"{panel['title']}: no query"


@pytest.mark.parametrize("name", sorted(UIDS))
def test_ranges_use_grafana_intervals(name: str) -> None:
    for panel, target in all_targets(dashboards()[name]):
        expr = target["expr"]
        where = f"{panel['title']} {target['refId']}: {expr}"
        for window in _RANGE.findall(strip_strings(expr)):
            assert window in {"$__rate_interval", "$__range"}, where
            if window == "$__range":
                assert target.get("instant"), f"$__range is for instant totals: {where}"
        for fn in ("rate(", "increase(", "irate(", "delta("):
            count = expr.count(fn)
            if fn in ("irate(", "delta("):
                assert count == 0, where
            assert count <= len(_RANGE.findall(expr)), where
        for selector in _SELECTOR.finditer(expr):
            name, matchers = selector.groups()
            if matchers is None:
                raise AssertionError(f"{where}: {name} without a label selector")
            assert 'job=~"$job"' in matchers, f"{where}: {name} must filter by $job"
            if name.startswith("mcp_token_"):  # recording rules and ALERTS are aggregated per job
                assert 'instance=~"$instance"' in matchers, f"{where}: {name} must filter by $instance"


@pytest.mark.parametrize("name", sorted(UIDS))
def test_counters_are_only_read_through_rate_or_increase(name: str) -> None:
    for panel, target in all_targets(dashboards()[name]):
        for ident, stack in enclosing_functions(target["expr"]):
            if ident.startswith("mcp_token_") and ident.endswith(COUNTER_SUFFIXES):
                assert stack and stack[-1] in {"rate", "increase"}, (
                    f"{panel['title']} {target['refId']}: {ident} outside rate()/increase()"
                )


@pytest.mark.parametrize("name", sorted(UIDS))
def test_histogram_quantiles_aggregate_buckets_by_le(name: str) -> None:
    seen = 0
    for panel, target in all_targets(dashboards()[name]):
        expr = target["expr"]
        count = expr.count("histogram_quantile(")
        seen += count
        assert len(_QUANTILE.findall(expr)) == count, f"{panel['title']}: {expr}"
        for ident, stack in enclosing_functions(expr):
            if ident.endswith("_bucket"):
                assert "sum" in stack, f"{panel['title']}: buckets are summed by le: {expr}"
    assert seen, "every dashboard shows some quantile"


@pytest.mark.parametrize("name", sorted(UIDS))
def test_histogram_targets_have_exemplars_and_heatmaps_use_buckets(name: str) -> None:
    heatmaps = 0
    for panel in walk_panels(dashboards()[name]["panels"]):
        for target in panel.get("targets", []):
            if "_bucket" in target["expr"] and not target.get("instant"):
                assert target.get("exemplar") is True, f"{panel['title']} {target['refId']}"
        if panel["type"] == "heatmap":
            heatmaps += 1
            assert panel["options"]["calculate"] is False, "buckets come pre-computed from Prometheus"
            for target in panel["targets"]:
                assert target["format"] == "heatmap" and "_bucket" in target["expr"], panel["title"]
                assert "sum by (le) (rate(" in target["expr"] and target["legendFormat"] == "{{le}}"
    if name != "mcp-token-overview.json":
        assert heatmaps, "the drill-down dashboards show a distribution"


def test_thresholds_match_the_alert_rules_and_configuration() -> None:
    config = Config()
    tiers = {config.risk.thresholds.low, config.risk.thresholds.medium, config.risk.thresholds.high}
    utilization = {config.budget.warning_ratio, config.budget.exhaustion_ratio}
    shares = {
        float(m) for rule in rule_list() if rule.get("alert") == "McpTokenToolResponseTierBreach"
        for m in re.findall(r"ratio10m > ([0-9.]+)", rule["expr"])
    }
    assert tiers == {1000, 4000, 8000} and utilization == {0.75, 0.9} and shares == {0.05, 0.10}
    checked = {"tiers": 0, "shares": 0, "utilization": 0}
    for name, dash in dashboards().items():
        for panel in walk_panels(dash["panels"]):
            exprs = " ".join(t["expr"] for t in panel.get("targets", []))
            where = f"{name}: {panel['title']}"
            if panel["type"] == "timeseries" and "histogram_quantile" in exprs and "message_tokens_bucket" in exprs:
                assert threshold_values(panel) == tiers, where
                assert panel["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] != "off", where
                checked["tiers"] += 1
            if panel["type"] == "timeseries" and ("responses:ratio10m" in exprs or (
                    BREACH_TIERS_MATCHER in exprs and "/" in exprs)):
                assert threshold_values(panel) == shares, where
                assert panel["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] != "off", where
                checked["shares"] += 1
            if panel["type"] == "stat" and BREACH_TIERS_MATCHER in exprs and "/" in exprs:
                assert threshold_values(panel) and threshold_values(panel) <= shares, where
                checked["shares"] += 1
            if panel["type"] == "timeseries" and "histogram_quantile" in exprs and "utilization" in exprs:
                assert threshold_values(panel) == utilization, where
                checked["utilization"] += 1
    assert all(checked.values()), checked


def test_tools_dashboard_repeats_a_row_per_tool() -> None:
    dash = dashboards()["mcp-token-tools.json"]
    rows = [p for p in dash["panels"] if p["type"] == "row" and p.get("repeat") == "tool"]
    assert len(rows) == 1 and "$tool" in rows[0]["title"]


def test_firing_alerts_panels_select_this_projects_alerts() -> None:
    exprs = [t["expr"] for d in dashboards().values() for _, t in all_targets(d) if "ALERTS" in t["expr"]]
    assert 'ALERTS{alertname=~"McpToken.*", alertstate="firing", job=~"$job"}' in exprs


# ---------------------------------------------------------------------------------------------------------
# Live: the demo workload scraped by a real Prometheus with the shipped rules.


def _get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def _api(base: str, path: str, **params: str | list[str]) -> Any:
    query = urllib.parse.urlencode(params, doseq=True)
    try:
        body = json.loads(_get(f"{base}{path}?{query}"))
    except urllib.error.HTTPError as exc:  # 400/422: a bad query; say which and why
        raise AssertionError(f"{path} {params}: HTTP {exc.code}: {exc.read().decode(errors='replace')}") from None
    assert body["status"] == "success", body
    return body["data"]


def _wait(what: str, check: Any, timeout: float, procs: list[subprocess.Popen]) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"{proc.args!r} exited ({proc.returncode}) while waiting for {what}")
        try:
            result = check()
        except OSError:
            result = None
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(1)


@dataclass
class Live:
    prometheus: str  # base URL
    metrics_url: str  # the demo's /metrics
    instance: str


DEMO_SECONDS = 240  # an upper bound only: the fixture stops the demo when the module is done
SCRAPE_SECONDS = 45  # how much data Prometheus collects before the queries run


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    prometheus_bin = require_binary("prometheus")
    tmp = tmp_path_factory.mktemp("live")
    procs: list[subprocess.Popen] = []
    try:
        demo_out = tmp / "demo.out"
        with demo_out.open("w") as out:
            demo = subprocess.Popen(
                [sys.executable, "-m", "mcp_token_otel.cli", "demo", "--metrics-port", "0",
                 "--duration", str(DEMO_SECONDS), "--rate", "10", "--quiet"],
                stdout=out, stderr=subprocess.STDOUT, cwd=tmp,
            )
        procs.append(demo)
        url_re = re.compile(r"metrics at (http://127\.0\.0\.1:(\d+)/metrics)")
        match = _wait("the demo's metrics URL", lambda: url_re.search(demo_out.read_text()), 60, procs)
        metrics_url, instance = match.group(1), f"127.0.0.1:{match.group(2)}"

        port = free_port()
        config = tmp / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "mcp-token-otel", "static_configs": [{"targets": [instance]}]}],
        }))
        with (tmp / "prometheus.log").open("w") as log:
            prometheus = subprocess.Popen(
                [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--enable-feature=exemplar-storage",
                 "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, cwd=tmp,
            )
        procs.append(prometheus)
        base = f"http://127.0.0.1:{port}"
        _wait("Prometheus to be ready", lambda: _get(f"{base}/-/ready", 2), 60, procs)
        _wait("the first scrape", lambda: _api(base, "/api/v1/query", query="mcp_token_sessions")["result"], 60, procs)
        started = time.monotonic()

        def enough() -> bool:
            firing = _api(base, "/api/v1/query", query='ALERTS{alertstate="firing"}')["result"]
            return time.monotonic() - started >= SCRAPE_SECONDS and bool(firing)

        try:
            _wait("data and a firing alert", enough, SCRAPE_SECONDS + 45, procs)
        except AssertionError:
            if any(p.poll() is not None for p in procs):
                raise
            # No alert fired in time: the ALERTS panels test says so; every other panel is still checked.
        yield Live(base, metrics_url, instance)
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=15)


def _scrape(url: str) -> dict[str, set[str]]:
    """Emitted mcp_token_* families -> their sample names (without _created)."""
    families: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(_get(url).decode()):
        # The text format's parser reports `_created` samples as families of their own: not families.
        if family.name.startswith("mcp_token_") and not family.name.endswith("_created"):
            families[family.name] = {s.name for s in family.samples if not s.name.endswith("_created")}
    return families


def _catalog_samples(name: str) -> set[str]:
    family = BY_NAME[name]
    if family.kind == "histogram":
        return {f"{name}_{suffix}" for suffix in ("bucket", "count", "sum")}
    return {family.sample_name}


@pytest.mark.slow
def test_dashboards_and_rules_chart_exactly_what_the_service_emits(live: Live) -> None:
    # A family declared with no series yet (no session evicted so far) stands for the samples it will have.
    families = {name: samples or _catalog_samples(name) for name, samples in _scrape(live.metrics_url).items()}
    emitted = set().union(*families.values())
    # Every family of the catalog's recorder, no other (the demo's guards produce the guard families; its client
    # over streamable HTTP, which sends no conversation key, the unbudgeted tokens).
    assert set(families) == {f.name for f in prometheus_families("recorder")}, sorted(families)
    records = recording_rules()
    charted: set[str] = set()
    for name, dash in dashboards().items():
        for panel, target in all_targets(dash):
            names = metric_names(target["expr"])
            unknown = names - emitted - records - {"ALERTS"}
            assert not unknown, f"{name}: {panel['title']} reads metrics nobody emits: {unknown}"
            charted |= names
        for var in variables(dash).values():
            if var["type"] == "query":
                assert not metric_names(variable_query(var)) - emitted, var["name"]
    uncharted = {family for family, samples in families.items() if not samples & charted}
    assert not uncharted, f"emitted but on no dashboard: {uncharted}"
    for rule in rule_list():
        unknown = metric_names(rule["expr"]) - emitted - records - {"up"}
        assert not unknown, f"rule {rule.get('record') or rule.get('alert')} reads {unknown}"


def _expand(expr: str, values: dict[str, str]) -> str:
    expr = expr.replace("$__rate_interval", "15s").replace("$__range", "5m").replace("$__interval", "5s")
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    assert "$" not in expr, f"unexpanded variable in {expr}"
    return expr


def _has_data(result: list[dict[str, Any]]) -> bool:
    def finite(v: str) -> bool:
        return not math.isnan(float(v))

    for series in result:
        if "value" in series and finite(series["value"][1]):
            return True
        if any(finite(v) for _, v in series.get("values", [])):
            return True
    return False


def _run_target(live: Live, target: dict[str, Any], expr: str) -> list[dict[str, Any]]:
    now = time.time()
    if target.get("instant"):
        return _api(live.prometheus, "/api/v1/query", query=expr, time=f"{now:.3f}")["result"]
    return _api(live.prometheus, "/api/v1/query_range", query=expr, start=f"{now - 30:.3f}", end=f"{now:.3f}",
                step="5")["result"]


@pytest.mark.slow
def test_every_panel_query_returns_data(live: Live) -> None:
    all_values = {"job": ".+", "instance": ".+", "server": ".+", "side": ".+", "tool": ".+"}
    tools = _api(live.prometheus, "/api/v1/label/tool/values")
    assert "export_table" in tools
    # One concrete selection too, as a user clicking through would make it (the critical-tier tool, so its
    # breach panels have something to show).
    # Grafana escapes regex metacharacters of a selected value, then backslashes for the PromQL string.
    concrete = {"job": "mcp-token-otel", "instance": re.escape(live.instance).replace("\\", "\\\\"),
                "server": "mcp-token-otel-demo", "side": "server", "tool": "export_table"}
    ran, empty, alerts_only = 0, list[str](), list[str]()
    for name, dash in dashboards().items():
        for panel, target in all_targets(dash):
            for values in (all_values, concrete):
                expr = _expand(target["expr"], values)
                result = _run_target(live, target, expr)
                ran += 1
                if not _has_data(result):
                    (alerts_only if "ALERTS" in expr else empty).append(f"{name}: {panel['title']}: {expr}")
    print(f"\n{ran} panel queries ran against Prometheus; {ran - len(empty) - len(alerts_only)} returned data")
    assert ran >= 100
    assert not empty, "panels without data:\n" + "\n".join(empty)
    # McpTokenSessionExhausted has `for: 0m`: the demo exhausts sessions within seconds, so the firing-alerts
    # panels are not exempt.
    assert not alerts_only, "no firing alert to show:\n" + "\n".join(alerts_only)


@pytest.mark.slow
def test_the_demo_has_unbudgeted_tokens(live: Live) -> None:
    """The unbudgeted panels show tokens, not only the zero every side's series starts at: the demo's client
    over streamable HTTP (protocol 2026-07-28, no conversation key) reaches the server with no budget key."""
    query = 'sum by (server) (mcp_token_unbudgeted_tokens_total{side="server"}) > 0'
    result = _api(live.prometheus, "/api/v1/query", query=query)["result"]
    assert [series["metric"].get("server") for series in result] == ["mcp-token-otel-demo"], result


@pytest.mark.slow
def test_every_template_variable_has_values(live: Live) -> None:
    now = time.time()
    for name, dash in dashboards().items():
        for var in variables(dash).values():
            if var["type"] != "query":
                continue
            match = _LABEL_VALUES.match(variable_query(var))
            assert match, var["name"]
            selector, label = match.groups()
            params: dict[str, Any] = {"start": f"{now - 60:.3f}", "end": f"{now:.3f}"}
            if selector:
                everything = {"job": ".+", "instance": ".+", "server": ".+", "side": ".+", "tool": ".+"}
                params["match[]"] = _expand(selector, everything)
            values = _api(live.prometheus, f"/api/v1/label/{label}/values", **params)
            assert values, f"{name}: variable {var['name']} has no values"


@pytest.mark.slow
def test_histogram_panels_carry_exemplars(live: Live) -> None:
    """Exemplars (trace ids) reach Prometheus, so the histogram panels can link to traces."""
    now = time.time()
    data = _api(live.prometheus, "/api/v1/query_exemplars", query="mcp_token_message_tokens_bucket",
                start=f"{now - 120:.3f}", end=f"{now:.3f}")
    labels = [e["labels"] for series in data for e in series["exemplars"]]
    assert labels and all(re.fullmatch(r"[0-9a-f]{32}", lab["trace_id"]) for lab in labels)
