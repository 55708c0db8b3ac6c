"""An mcp release the adapters do not support is one warning line and nothing instrumented, whichever entry point
instruments: ``mcp_token_otel.instrument()``, ``McpTokenInstrumentor().instrument()`` or ``opentelemetry-instrument``.

The release is made unsupported for real: a subprocess whose ``sys.path`` starts with a directory holding an
``mcp`` dist-info that claims another version (the SDK's code stays the installed one), or an SDK attribute an
adapter hooks deleted. Runs on either SDK major (``.venv-mcp1`` covers the 1.x adapter).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import mcp_token_otel
from mcp_token_otel.adapters import supported
from mcp_token_otel.instrumentation import McpTokenInstrumentor, detect_adapter
from tests.helpers.support import make_config

ROOT = Path(__file__).resolve().parents[2]

# Prints (not instrumented, the adapter's first hook point hooked) after the entry point under test ran.
PROBE = """
import importlib
from mcp_token_otel.adapters.supported import adapter_named
from mcp_token_otel.instrumentation import McpTokenInstrumentor, detect_adapter
module, _, attribute = adapter_named(detect_adapter()).hook_points[0].partition(":")
owner = importlib.import_module(module)
*path, name = attribute.split(".")
for part in path:
    owner = getattr(owner, part)
print(McpTokenInstrumentor().recorder is None, hasattr(vars(owner)[name], "__wrapped__"))
"""
ENTRY_POINTS = {
    "function": "import mcp_token_otel\nmcp_token_otel.instrument()\n",
    "class": "from mcp_token_otel.instrumentation import McpTokenInstrumentor\nMcpTokenInstrumentor().instrument()\n",
}


def fake_release(tmp_path: Path, version: str | None) -> Path:
    """A directory whose ``mcp`` dist-info claims ``version`` (None: an empty directory, the real release)."""
    where = tmp_path / "site"
    where.mkdir()
    if version is not None:
        info = where / f"mcp-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: mcp\nVersion: {version}\n")
    return where


def run(tmp_path: Path, version: str | None, entry: str) -> subprocess.CompletedProcess[str]:
    site = fake_release(tmp_path, version)
    python_path = [str(site), str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(python_path), "OTEL_TRACES_EXPORTER": "none",
           "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none", "MCP_TOKEN_OTEL_ESTIMATOR": "chars/4"}
    app = tmp_path / "app.py"
    if entry == "opentelemetry-instrument":
        launcher = Path(sys.executable).with_name("opentelemetry-instrument")
        if not launcher.exists():
            pytest.skip("opentelemetry-instrument is not installed next to this interpreter")
        app.write_text(PROBE)
        cmd = [str(launcher), sys.executable, str(app)]
    else:
        app.write_text(ENTRY_POINTS[entry] + PROBE)
        cmd = [sys.executable, str(app)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return out


def ours(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "mcp_token_otel" in line or "McpTokenInstrumentor" in line]


def supported_line(version: str) -> str:
    return (f"mcp_token_otel: mcp {version} is not supported (supported: mcp >= 1.20, < 2 or mcp >= 2.0, < 3); "
            "nothing instrumented")


@pytest.mark.parametrize("version", ["3.0.0", "1.19.0"])
def test_an_unsupported_release_is_one_warning_through_instrument(tmp_path: Path, version: str) -> None:
    out = run(tmp_path, version, "function")
    assert ours(out.stderr) == [supported_line(version)], out.stderr
    assert "Traceback" not in out.stderr
    assert out.stdout.split() == ["True", "False"]  # no recorder, nothing hooked


@pytest.mark.parametrize("version", ["3.0.0", "1.19.0"])
def test_an_unsupported_release_is_one_line_through_the_instrumentor_class(tmp_path: Path, version: str) -> None:
    # BaseInstrumentor's own dependency check reads instrumentation_dependencies(): the adapter's range.
    required = "mcp >= 1.20, < 2" if version.startswith("1.") else "mcp >= 2.0, < 3"
    out = run(tmp_path, version, "class")
    assert ours(out.stderr) == [f'McpTokenInstrumentor only instruments "{required}", but currently installed '
                                f'version ("mcp {version}") falls outside of that range, so nothing can be '
                                "instrumented."], out.stderr
    assert "Traceback" not in out.stderr
    assert out.stdout.split() == ["True", "False"]


@pytest.mark.slow  # the real launcher, twice
@pytest.mark.parametrize("version", ["3.0.0", None])
def test_opentelemetry_instrument_refuses_an_unsupported_release_in_one_line(
    tmp_path: Path, version: str | None
) -> None:
    out = run(tmp_path, version, "opentelemetry-instrument")
    if version is None:  # the installed release: instrumented, silently
        assert ours(out.stderr) == [] and out.stdout.split() == ["False", "True"], out.stderr
        return
    assert ours(out.stderr) == [supported_line(version)], out.stderr
    assert "Traceback" not in out.stderr
    assert out.stdout.split() == ["True", "False"]


def test_the_installed_release_is_instrumented(tmp_path: Path) -> None:
    """The same run with the installed release's own metadata: the check above is what refused."""
    out = run(tmp_path, None, "function")
    assert ours(out.stderr) == [] and out.stdout.split() == ["False", "True"], out.stderr


def _adapter() -> supported.AdapterSupport:
    module = detect_adapter()
    adapter = supported.adapter_named(module) if module is not None else None
    assert adapter is not None
    return adapter


def _owner_and_name(point: str) -> tuple[Any, str]:
    module_name, _, attribute = point.partition(":")
    owner: Any = __import__(module_name, fromlist=["_"])
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name


@pytest.mark.parametrize("entry", ["function", "class"])
def test_a_missing_hook_point_is_one_warning_and_nothing_hooked(
    monkeypatch: pytest.MonkeyPatch, caplog: Any, entry: str
) -> None:
    adapter = _adapter()
    first_owner, first_name = _owner_and_name(adapter.hook_points[0])
    before = vars(first_owner)[first_name]
    point = next(p for p in adapter.hook_points if not p.endswith("__init__"))
    owner, name = _owner_and_name(point)
    monkeypatch.delattr(owner, name)  # as if a release renamed it
    caplog.set_level(logging.WARNING)
    try:
        if entry == "function":
            assert mcp_token_otel.instrument(make_config()) is None
        else:
            McpTokenInstrumentor().instrument(config=make_config())
        assert McpTokenInstrumentor().recorder is None
        assert not McpTokenInstrumentor().is_instrumented_by_opentelemetry
    finally:
        mcp_token_otel.uninstrument()
    assert vars(first_owner)[first_name] is before  # nothing was hooked, so nothing had to be undone
    records = [r for r in caplog.records if r.name.startswith("mcp_token_otel") or "McpTokenInstrumentor" in
               r.getMessage()]
    dotted = point.replace(":", ".")
    version = supported.installed_version()
    assert [r.getMessage() for r in records] == [
        f"mcp_token_otel: mcp {version} has no {dotted}, which the adapter hooks (supported: mcp >= 1.20, < 2 or "
        "mcp >= 2.0, < 3); nothing instrumented"]
    assert records[0].levelno == logging.WARNING and records[0].exc_info is None  # one line, no traceback


def test_every_sdk_attribute_an_adapter_hooks_is_a_declared_hook_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table the check reads holds what the installed adapter really wraps (its conditional hooks aside)."""
    import importlib

    from mcp_token_otel.adapters import _common

    wrapped: list[str] = []
    original = _common.Hooks.wrap

    def recording(self: Any, owner: Any, name: str, wrapper: Any) -> None:
        where = owner.__name__ if isinstance(owner, type(sys)) else f"{owner.__module__}:{owner.__qualname__}"
        wrapped.append(f"{where}:{name}" if isinstance(owner, type(sys)) else f"{where}.{name}")
        original(self, owner, name, wrapper)

    monkeypatch.setattr(_common.Hooks, "wrap", recording)
    adapter = _adapter()
    recorder = mcp_token_otel.TokenRecorder(make_config())
    shim = importlib.import_module(adapter.module).install(recorder)
    shim.uninstall()
    recorder.close()
    sdk = {point for point in wrapped if point.startswith("mcp.")}
    assert set(adapter.hook_points) <= sdk
    conditional = {"mcp.server.mcpserver.server:stdio_server", "mcp.server.fastmcp.server:stdio_server",
                   "mcp.client.session:ClientSession._received_notification",
                   "mcp.server.session:ServerSession._received_notification"}
    assert sdk - set(adapter.hook_points) <= conditional, sdk - set(adapter.hook_points)
