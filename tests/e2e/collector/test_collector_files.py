"""Fast checks that keep the Collector files and docs true to the catalog and to what the Collector produced:
the docs' mapping table is the recorded observation, the observation covers every instrument, the config renames
every attribute, and the build manifest holds exactly the config's components at one release."""

from __future__ import annotations

import re
from typing import Any

import yaml

from mcp_token_otel.catalog import BY_NAME, FAMILIES, LABEL_ATTRIBUTES
from tests.helpers.support import ROOT

from . import mapping

CONFIG = ROOT / "deploy/otel-collector/config.yaml"
MANIFEST = ROOT / "deploy/otel-collector/builder-config.yaml"
DEPLOY_DOC = ROOT / "docs/deploy.md"
#: In the build for troubleshooting (swap it into a pipeline to print what arrives); the shipped config has none.
EXTRA_COMPONENTS = {("exporters", "debug")}
_KINDS = {"receivers": "receiver", "processors": "processor", "exporters": "exporter", "extensions": "extension"}
#: Component type names the config uses that are not their module's name: the OTLP exporter's gRPC spelling.
_TYPE_MODULES = {"otlp_grpc": "otlp"}


def statements() -> list[str]:
    config = yaml.safe_load(CONFIG.read_text())
    processor = config["processors"]["transform/mcp_token_prometheus_names"]
    return [s for group in processor["metric_statements"] for s in group["statements"]]


def test_the_docs_table_is_the_recorded_observation() -> None:
    doc = DEPLOY_DOC.read_text()
    start, end = doc.index(mapping.TABLE_BEGIN), doc.index(mapping.TABLE_END) + len(mapping.TABLE_END)
    assert doc[start:end] == mapping.markdown_table(mapping.recorded()), (
        "stale: python -m tests.e2e.collector.mapping docs/deploy.md")


def test_every_recorded_family_is_a_catalog_family() -> None:
    """A renamed instrument, a changed help or label needs a new observation: run the fleet end-to-end test with
    RECORD_COLLECTOR_MAPPING=1."""
    observed = mapping.recorded()["families"]
    claimed = {name for f in FAMILIES if f.emitter == "recorder" for name in mapping.through_collector(f, observed)}
    assert set(observed) == claimed, set(observed) ^ claimed
    for family in FAMILIES:
        if family.emitter == "recorder" and family.name and family.sample_name in observed:
            assert observed[family.sample_name]["labels"] == sorted(family.labels), family.name


def test_the_config_renames_every_attribute_of_a_metrics_family() -> None:
    text = "\n".join(statements())
    for family in FAMILIES:
        if not (family.name and family.otel_name):
            continue
        for label, attribute in zip(family.labels, family.attributes(), strict=True):
            if label != attribute:
                assert f'set(datapoint.attributes["{label}"], datapoint.attributes["{attribute}"])' in text, \
                    (family.name, attribute)
                assert f'delete_key(datapoint.attributes, "{attribute}")' in text, (family.name, attribute)
    assert set(LABEL_ATTRIBUTES) >= {"side", "server", "tool"}


def test_the_duration_copies_carry_the_metrics_help() -> None:
    copies = dict(re.findall(r'copy_metric\(name="([^"]+)", description="([^"]+)"\)', "\n".join(statements())))
    assert copies == {
        "mcp_token.operation.duration": BY_NAME["mcp_token_operation_duration_seconds"].help,
        "mcp_token.session.duration": BY_NAME["mcp_token_session_duration_seconds"].help,
    }


def _manifest_modules(manifest: dict[str, Any]) -> dict[str, str]:
    """Go module path -> version, over the components, providers and telemetry of the manifest."""
    entries = [m["gomod"] for kind in (*_KINDS, "providers") for m in manifest.get(kind, [])]
    entries.append(manifest["telemetry"]["gomod"])
    return dict(entry.split() for entry in entries)


def test_the_build_manifest_has_the_configs_components_at_one_release() -> None:
    config, manifest = yaml.safe_load(CONFIG.read_text()), yaml.safe_load(MANIFEST.read_text())
    named = {(kind, _TYPE_MODULES.get(name, name))
             for kind in _KINDS for name in (key.split("/")[0] for key in config.get(kind, {}))}
    built = {(kind, m["gomod"].split()[0].rsplit("/", 1)[1].removesuffix(suffix))
             for kind, suffix in _KINDS.items() for m in manifest.get(kind, [])}
    assert built == {(kind, name.replace("_", "")) for kind, name in named} | EXTRA_COMPONENTS
    release = manifest["dist"]["version"]
    versions = _manifest_modules(manifest)
    assert {v for v in versions.values() if v.startswith("v0.")} == {f"v{release}"}, versions
    assert len({v for v in versions.values() if v.startswith("v1.")}) == 1, versions


def test_the_docs_name_the_build_the_tests_ran() -> None:
    manifest = yaml.safe_load(MANIFEST.read_text())
    doc = DEPLOY_DOC.read_text()
    assert f"v{manifest['dist']['version']}" in doc and "scripts/otelcol" in doc
    stable = {v for v in _manifest_modules(manifest).values() if v.startswith("v1.")}
    assert all(v in doc for v in stable)
