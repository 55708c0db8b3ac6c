"""The deploy bundle: docker compose stack, Grafana provisioning, Collector config, Kubernetes manifests.

No container runs here (the machine has no Docker engine): the files are parsed and cross-checked, so a port,
a path or a name that one file changes and another still uses fails a test. Prometheus configs go through
`promtool check config`; the generated Kubernetes files must be byte-identical to what scripts/gen-k8s makes.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from mcp_token_otel import semconv
from mcp_token_otel.cli.demo import DemoOptions
from mcp_token_otel.config import PrometheusConfig, config_from_dict

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
PROMETHEUS_COMPOSE = DEPLOY / "prometheus/prometheus.compose.yml"
PROMETHEUS_SINGLE = DEPLOY / "prometheus/prometheus.yml"
RULES = DEPLOY / "prometheus/rules/mcp-token-otel.rules.yml"
COLLECTOR = DEPLOY / "otel-collector/config.yaml"
DATASOURCES = DEPLOY / "grafana/provisioning/datasources/prometheus.yaml"
DASHBOARD_PROVIDER = DEPLOY / "grafana/provisioning/dashboards/mcp-token-otel.yaml"
TEMPO = DEPLOY / "tempo/tempo.yaml"
K8S = DEPLOY / "kubernetes"
DASHBOARDS = ROOT / "dashboards"
GEN_K8S = ROOT / "scripts/gen-k8s"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def compose() -> dict[str, Any]:
    return load(COMPOSE)


def service(name: str) -> dict[str, Any]:
    return compose()["services"][name]


def host_port(address: str) -> tuple[str, int]:
    """'demo:9464', 'http://prometheus:9090', '0.0.0.0:8889' -> (host, port)."""
    parsed = urlparse(address if "://" in address else f"//{address}")
    assert parsed.hostname and parsed.port, address
    return parsed.hostname, parsed.port


def container_ports(svc: dict[str, Any]) -> set[int]:
    """Container-side ports a compose service publishes ("host:container")."""
    return {int(str(p).split(":")[-1].split("/")[0]) for p in svc.get("ports", [])}


def mounts(svc: dict[str, Any]) -> dict[str, str]:
    """Container path -> repository path of each bind mount."""
    out = {}
    for volume in svc.get("volumes", []):
        source, target = volume.split(":")[:2]
        out[target] = source
    return out


def flag(svc: dict[str, Any], name: str) -> str | None:
    for arg in svc.get("command", []):
        if isinstance(arg, str) and arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    return None


def scrape_targets(config: dict[str, Any]) -> dict[str, list[str]]:
    return {
        job["job_name"]: [t for sc in job.get("static_configs", []) for t in sc["targets"]]
        for job in config["scrape_configs"]
    }


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{name} is missing: scripts/system-deps installs it")
    pytest.skip(f"{name} not installed")


# ---------------------------------------------------------------------------------------------------------
# docker compose


def test_compose_parses_and_runs_the_whole_stack() -> None:
    services = compose()["services"]
    assert {"demo", "collector", "prometheus", "alertmanager", "grafana", "tempo"} <= set(services)
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        for dependency in svc.get("depends_on", []):
            assert dependency in services, f"{name} depends on unknown {dependency}"


def test_everything_compose_mounts_or_builds_exists_in_the_repository() -> None:
    for name, svc in compose()["services"].items():
        for target, source in mounts(svc).items():
            assert source.startswith("."), f"{name}: {source} is not a bind mount of the repository"
            assert (DEPLOY / source).exists(), f"{name}: mounts {source} (-> {target}), which does not exist"
    build = service("demo")["build"]
    context = (DEPLOY / build["context"]).resolve()
    dockerfile = context / build["dockerfile"]
    assert context == ROOT and dockerfile.is_file()
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (context / source).exists(), f"Dockerfile copies missing {source}"
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore").read_text()
    for needed in ("pyproject.toml", "README.md", "mcp_token_otel/"):
        assert f"!{needed}" in ignore


def test_prometheus_service_uses_the_compose_config_with_exemplar_storage() -> None:
    prom = service("prometheus")
    assert "--enable-feature=exemplar-storage" in prom["command"]
    config_path = flag(prom, "--config.file")
    assert config_path == "/etc/prometheus/prometheus.compose.yml"
    mounted = mounts(prom)
    assert mounted["/etc/prometheus"] == "./prometheus"
    assert (DEPLOY / "prometheus" / Path(config_path).name).is_file()
    assert flag(prom, "--web.listen-address") is None and 9090 in container_ports(prom)


def test_prometheus_scrapes_the_demo_and_the_collector_on_their_ports() -> None:
    config = load(PROMETHEUS_COMPOSE)
    targets = scrape_targets(config)
    demo = service("demo")
    metrics_port = int(demo["command"][demo["command"].index("--metrics-port") + 1])
    assert "--metrics-host" in demo["command"] and demo["command"][demo["command"].index("--metrics-host") + 1] == (
        "0.0.0.0"), "the demo must listen beyond the container's loopback"
    assert targets["mcp-token-otel"] == [f"demo:{metrics_port}"]
    assert metrics_port in container_ports(demo)
    collector_port = host_port(load(COLLECTOR)["exporters"]["prometheus"]["endpoint"])[1]
    assert targets["otel-collector"] == [f"collector:{collector_port}"]
    assert collector_port in container_ports(service("collector"))
    collector_job = next(j for j in config["scrape_configs"] if j["job_name"] == "otel-collector")
    assert collector_job.get("honor_labels") is True, "keep the job/instance the exporter derives from resources"
    # Same rules as the single-host config, and the same job name (the dashboards' and alerts' job label).
    single = load(PROMETHEUS_SINGLE)
    assert config["rule_files"] == single["rule_files"]
    assert "mcp-token-otel" in scrape_targets(single)


def test_single_host_config_scrapes_the_default_metrics_port() -> None:
    targets = scrape_targets(load(PROMETHEUS_SINGLE))["mcp-token-otel"]
    assert targets == [f"127.0.0.1:{PrometheusConfig().port}"] == [f"127.0.0.1:{DemoOptions().metrics_port}"]


def test_alerting_goes_to_the_alertmanager_service() -> None:
    config = load(PROMETHEUS_COMPOSE)
    targets = [t for am in config["alerting"]["alertmanagers"] for sc in am["static_configs"] for t in sc["targets"]]
    assert len(targets) == 1
    host, port = host_port(targets[0])
    am = service(host)
    assert port == 9093 and port in container_ports(am) and flag(am, "--web.listen-address") is None
    assert mounts(am)["/etc/alertmanager/alertmanager.yml"] == "./alertmanager/alertmanager.yml"
    assert flag(am, "--config.file") == "/etc/alertmanager/alertmanager.yml"


def test_demo_exports_otlp_to_the_collector_receiver() -> None:
    env = service("demo")["environment"]
    host, port = host_port(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    receivers = load(COLLECTOR)["receivers"]["otlp"]["protocols"]
    assert host == "collector" and port == host_port(receivers["http"]["endpoint"])[1] == 4318
    assert host_port(receivers["grpc"]["endpoint"])[1] == 4317
    assert env["OTEL_SERVICE_NAME"] and env["MCP_TOKEN_OTEL_OTEL_CONFIGURE"] == "true"
    assert mounts(service("collector"))["/etc/otelcol-contrib/config.yaml"] == "./otel-collector/config.yaml"


@pytest.mark.parametrize("config", [PROMETHEUS_COMPOSE, PROMETHEUS_SINGLE], ids=lambda p: p.name)
def test_promtool_check_config(config: Path) -> None:
    promtool = _binary("promtool")
    result = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------------------------------------------------
# Grafana provisioning


def test_datasources_point_at_the_compose_services_and_link_exemplars_to_traces() -> None:
    provisioning = load(DATASOURCES)
    assert provisioning["apiVersion"] == 1
    by_uid = {ds["uid"]: ds for ds in provisioning["datasources"]}
    prom = by_uid["mcp-token-prometheus"]
    assert prom["type"] == "prometheus" and prom["isDefault"] is True
    host, port = host_port(prom["url"])
    assert host == "prometheus" and port in container_ports(service(host))
    # Grafana's rate interval follows the scrape interval.
    assert prom["jsonData"]["timeInterval"] == load(PROMETHEUS_COMPOSE)["global"]["scrape_interval"]
    [link] = prom["jsonData"]["exemplarTraceIdDestinations"]
    assert link["name"] == "trace_id", "the label the recorder attaches to exemplars (recorder/call.py)"
    tempo = by_uid[link["datasourceUid"]]
    assert tempo["type"] == "tempo"
    host, port = host_port(tempo["url"])
    assert host == "tempo" and port == load(TEMPO)["server"]["http_listen_port"] and port in container_ports(
        service("tempo"))
    am = next(ds for ds in provisioning["datasources"] if ds["type"] == "alertmanager")
    host, port = host_port(am["url"])
    assert host == "alertmanager" and port in container_ports(service(host))


def test_dashboard_provider_reads_the_mounted_dashboards_folder() -> None:
    provisioning = load(DASHBOARD_PROVIDER)
    assert provisioning["apiVersion"] == 1
    [provider] = provisioning["providers"]
    assert provider["type"] == "file"
    grafana_mounts = mounts(service("grafana"))
    assert grafana_mounts[provider["options"]["path"]] == "../dashboards"
    assert (DEPLOY / grafana_mounts["/etc/grafana/provisioning"]).resolve() == DATASOURCES.parent.parent
    assert sorted(p.name for p in DASHBOARDS.glob("*.json")) == [
        "mcp-token-overview.json", "mcp-token-sessions.json", "mcp-token-tools.json"]
    home = service("grafana")["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(provider["options"]["path"] + "/") and (DASHBOARDS / Path(home).name).is_file()


# ---------------------------------------------------------------------------------------------------------
# OpenTelemetry Collector


def test_collector_pipelines_reference_defined_components() -> None:
    config = load(COLLECTOR)
    pipelines = config["service"]["pipelines"]
    assert {"traces", "metrics"} <= set(pipelines)
    for name, pipeline in pipelines.items():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline[kind]:
                assert component in config[kind], f"pipeline {name}: {kind[:-1]} {component} is not defined"
        assert pipeline["processors"][0] == "memory_limiter", f"{name}: memory_limiter goes first"
        assert "batch" in pipeline["processors"], name
    for extension in config["service"].get("extensions", []):
        assert extension in config["extensions"]
    # Every defined component is used somewhere.
    used = {c for p in pipelines.values() for kind in ("receivers", "processors", "exporters") for c in p[kind]}
    defined = {c for kind in ("receivers", "processors", "exporters") for c in config[kind]}
    assert defined == used


def test_collector_exports_prometheus_with_exemplars_and_traces_to_tempo() -> None:
    config = load(COLLECTOR)
    exporter = config["exporters"]["prometheus"]
    assert exporter["enable_open_metrics"] is True
    assert exporter["resource_constant_labels"]["included"] == ["*"]
    assert "prometheus" in config["service"]["pipelines"]["metrics"]["exporters"]
    traces = config["service"]["pipelines"]["traces"]["exporters"]
    [otlp] = [e for e in traces if e.split("/")[0] == "otlp_grpc"]
    host, port = host_port(config["exporters"][otlp]["endpoint"])
    assert host == "tempo" and port == host_port(
        load(TEMPO)["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])[1]


def test_collector_renames_every_metric_attribute_to_the_prometheus_label() -> None:
    """The OTel attributes the recorder puts on metrics become the prometheus-client label names."""
    config = load(COLLECTOR)
    statements = "\n".join(
        s for name, p in config["processors"].items() if name.startswith("transform")
        for group in p["metric_statements"] for s in group["statements"]
    )
    renames = {
        semconv.M_SIDE: "side", semconv.A_METHOD: "method", semconv.A_TOOL: "tool",
        semconv.M_DIRECTION: "direction", semconv.A_RISK_TIER: "risk_tier", semconv.A_SESSION_STATE: "state",
        semconv.M_STAGE: "stage", semconv.M_SCOPE: "scope", semconv.M_GUARD_POLICY: "policy",
        semconv.M_GUARD_ACTION: "action", semconv.M_GUARD_ENFORCED: "enforced",
    }
    for attribute, label in renames.items():
        assert f'set(datapoint.attributes["{label}"], datapoint.attributes["{attribute}"])' in statements, attribute
        assert f'delete_key(datapoint.attributes, "{attribute}")' in statements, attribute
    assert ('set(metric.name, "mcp_token.session.utilization_ratio") where metric.name == '
            '"mcp_token.session.utilization"') in statements
    # The cost counter arrives as mcp_token_cost_usd_total (the rules' and dashboards' name), not ..._USD_total.
    assert 'set(metric.name, "mcp_token.cost_usd") where metric.name == "mcp_token.cost"' in statements
    assert 'set(metric.unit, "") where metric.name == "mcp_token.cost_usd"' in statements


# ---------------------------------------------------------------------------------------------------------
# Kubernetes


def _gen_k8s() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("gen_k8s", str(GEN_K8S))
    spec = importlib.util.spec_from_loader("gen_k8s", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_generated_kubernetes_files_are_up_to_date() -> None:
    rendered = _gen_k8s().render()
    assert set(rendered) == {K8S / "prometheusrule.yaml", K8S / "grafana-dashboards.yaml"}
    for path, content in rendered.items():
        assert path.read_bytes() == content.encode(), f"{path.name} is stale: run scripts/gen-k8s"
    result = subprocess.run([sys.executable, str(GEN_K8S), "--check"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert os.access(GEN_K8S, os.X_OK)


def test_prometheus_rule_holds_exactly_the_rules_file() -> None:
    [rule] = load_all(K8S / "prometheusrule.yaml")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == load(RULES)["groups"]
    labels = rule["metadata"]["labels"]
    assert "release" in labels and "prometheus" in labels


def test_dashboard_configmaps_hold_exactly_the_dashboards() -> None:
    maps = load_all(K8S / "grafana-dashboards.yaml")
    found = {}
    for cm in maps:
        assert cm["kind"] == "ConfigMap" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        for key, value in cm["data"].items():
            found[key] = value
            json.loads(value)
    assert found == {p.name: p.read_text() for p in DASHBOARDS.glob("*.json")}
    assert len({cm["metadata"]["name"] for cm in maps}) == len(maps)


def test_servicemonitor_selects_the_services_metrics_port() -> None:
    [monitor] = load_all(K8S / "servicemonitor.yaml")
    docs = load_all(K8S / "deployment.yaml")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    svc = next(d for d in docs if d["kind"] == "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "ServiceMonitor"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= svc["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    [svc_port] = [p for p in svc["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert endpoint["path"] == "/metrics"
    # The Service reaches the pods, and its port the container's named metrics port.
    pod = deployment["spec"]["template"]
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    [container] = pod["spec"]["containers"]
    [port] = [p for p in container["ports"] if p["name"] == svc_port["targetPort"]]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MCP_TOKEN_OTEL_PROMETHEUS_ENABLED"] == "true" and env["MCP_TOKEN_OTEL_PROMETHEUS_HOST"] == "0.0.0.0"
    assert int(env["MCP_TOKEN_OTEL_PROMETHEUS_PORT"]) == port["containerPort"] == svc_port["port"]
    args = container["args"]
    assert int(args[args.index("--metrics-port") + 1]) == port["containerPort"]
    assert container["image"] == service("demo")["image"]


def _budget_store_url(container: dict[str, Any]) -> str:
    [url] = [e["value"] for e in container.get("env", []) if e["name"] == "MCP_TOKEN_OTEL_BUDGET_STORE"]
    return url


def test_kubernetes_workloads_share_budgets_through_the_redis_service() -> None:
    """redis.yaml's Service reaches its pod's port; the workloads name that Service and port in the one variable
    that shares budgets, and the URL is one the configuration accepts."""
    docs = load_all(K8S / "redis.yaml")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    svc = next(d for d in docs if d["kind"] == "Service")
    pod = deployment["spec"]["template"]
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    [container] = pod["spec"]["containers"]
    [svc_port] = svc["spec"]["ports"]
    [port] = [p for p in container["ports"] if p["name"] == svc_port["targetPort"]]
    assert port["containerPort"] == 6379 and container["image"].startswith("redis:")
    args = container["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"  # full: refused and counted, not forgotten
    workloads = [d for name in ("deployment.yaml", "proxy-sidecar.yaml") for d in load_all(K8S / name)
                 if d["kind"] == "Deployment"]
    urls = [_budget_store_url(c) for w in workloads for c in w["spec"]["template"]["spec"]["containers"]
            if c["image"].startswith("mcp-token-otel:")]
    assert len(urls) == 2
    for url in urls:
        assert host_port(url) == (svc["metadata"]["name"], svc_port["port"])
        assert config_from_dict({"budget": {"store": url}}).budget.store == url


def test_compose_proxy_shares_budgets_through_the_redis_service() -> None:
    proxy, redis = service("everything-proxy"), service("budget-store")
    url = proxy["environment"]["MCP_TOKEN_OTEL_BUDGET_STORE"]
    assert host_port(url) == ("budget-store", 6379) and "budget-store" in proxy["depends_on"]
    assert redis["image"].startswith("redis:") and redis["command"][0] == "redis-server"
    assert config_from_dict({"budget": {"store": url}}).budget.store == url
    # The image the workloads run can talk to Redis: the redis extra is installed.
    assert 'pip install ".[redis]"' in (DEPLOY / "Dockerfile").read_text()


def test_every_kubernetes_manifest_parses() -> None:
    kinds = set()
    for path in sorted(K8S.glob("*.yaml")):
        for doc in load_all(path):
            assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], path.name
            kinds.add(doc["kind"])
    assert kinds == {"Deployment", "Service", "ServiceMonitor", "PrometheusRule", "ConfigMap"}


# ---------------------------------------------------------------------------------------------------------
# Documentation


def test_deploy_doc_covers_each_way_to_run() -> None:
    text = (ROOT / "docs/deploy.md").read_text()
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    for needed in ("Single process", "Local stack", "Collector", "Kubernetes"):
        assert any(needed.lower() in h.lower() for h in headings), needed
    for dashboard in DASHBOARDS.glob("*.json"):
        assert json.loads(dashboard.read_text())["title"] in text
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318", "OTEL_SERVICE_NAME",
                 "MCP_TOKEN_OTEL_OTEL_CONFIGURE=true", "scripts/gen-k8s"):
        assert name in text


def test_gen_k8s_runbook_base_rewrites_every_runbook_url() -> None:
    base = "https://git.example.com/team/mcp-token-otel/-/blob/main/docs/runbook.md"
    result = subprocess.run([sys.executable, str(GEN_K8S), "--runbook-base", base], capture_output=True, text=True,
                            timeout=60, check=True)
    [rule] = list(yaml.safe_load_all(result.stdout))
    urls = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert urls and all(url.startswith(base + "#mcptoken") for url in urls)
    shipped = [r["annotations"]["runbook_url"] for g in load(RULES)["groups"] for r in g["rules"] if "alert" in r]
    assert [url.split("#")[1] for url in urls] == [url.split("#")[1] for url in shipped]
    assert all(url.startswith("docs/runbook.md#") for url in shipped)  # the runbook shipped in the repository
