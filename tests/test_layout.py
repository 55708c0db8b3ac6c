"""The architecture holds: the core is pure, the package imports only the core, the public entry points work."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mcp_token_otel

HEAVY = ("opentelemetry", "mcp", "prometheus_client", "yaml", "pydantic", "anyio", "httpx")
CORE = Path(mcp_token_otel.__file__).parent / "core"


def _imported_after(code: str) -> list[str]:
    probe = code + (
        "\nimport json, sys\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(HEAVY)!r}))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_core_imports_no_sdk_no_otel_no_prometheus_no_yaml() -> None:
    modules = [
        "mcp_token_otel.core." + ".".join(p.relative_to(CORE).with_suffix("").parts)
        for p in sorted(CORE.rglob("*.py"))
        if p.stem != "__init__"
    ]
    assert len(modules) >= 8  # estimation, estimators, payload, measure, risk, profiles, budget, labels
    assert _imported_after("\n".join(f"import {m}" for m in modules)) == []


def test_core_modules_name_no_outside_package() -> None:
    # Statically too: a lazy import inside a function would slip past the runtime check above.
    for path in CORE.rglob("*.py"):
        text = path.read_text()
        for heavy in HEAVY:
            assert not re.search(rf"^\s*(import|from) {heavy}\b", text, re.M), (path.name, heavy)
        depth = len(path.relative_to(CORE).parts) - 1  # 0 for core/x.py, 1 for core/guard/x.py
        for dots in re.findall(r"^\s*from (\.+)", text, re.M):
            assert len(dots) <= depth + 1, f"{path.name} reaches outside the core"


def test_import_package_is_light_and_instrument_is_an_attribute() -> None:
    assert _imported_after("import mcp_token_otel") == []
    # The attribute resolves on first use (this is what loads OpenTelemetry and the adapters).
    assert _imported_after("import mcp_token_otel\nassert callable(mcp_token_otel.instrument)") != []


@pytest.mark.parametrize(
    "code",
    [
        "import mcp_token_otel as m\nassert m.instrument.__module__ == 'mcp_token_otel.instrumentation'",
        "from mcp_token_otel import instrument, uninstrument, metrics_app, instrument_server",
        "from mcp_token_otel.instrumentation import instrument, uninstrument, McpTokenInstrumentor",
    ],
)
def test_public_entry_points_resolve(code: str) -> None:
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_mcp_token_otel_instrument_instruments_and_uninstrument_restores() -> None:
    code = """
import mcp_token_otel
from mcp.client.session import ClientSession
before = ClientSession.__init__
recorder = mcp_token_otel.instrument()
assert recorder is not None and ClientSession.__init__ is not before
assert mcp_token_otel.instrument() is recorder  # idempotent
mcp_token_otel.uninstrument()
assert ClientSession.__init__ is before
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
