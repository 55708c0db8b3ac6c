"""Zero code change: ``opentelemetry-instrument python app.py`` loads the mcp_token_otel entry point.

With a configurator (opentelemetry-distro, the ``auto`` extra) an application with no OpenTelemetry code at
all is measured; without one, only an application that sets up its own providers is. A bad
``MCP_TOKEN_OTEL_*`` value is one log line and nothing instrumented.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# An application that knows nothing about mcp-token-otel: it only sets up OpenTelemetry and calls a tool.
APP = textwrap.dedent(
    """
    import json
    import anyio
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # no configurator (opentelemetry-distro) set one up
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    server = MCPServer("auto")

    @server.tool()
    def fetch(n: int) -> str:
        return "data " * n

    async def main():
        async with Client(server, mode="legacy") as client:
            await client.call_tool("fetch", {"n": 500})

    anyio.run(main)
    print(json.dumps([
        {"name": s.name, "kind": s.kind.name, "output": s.attributes.get("mcp_token.output_tokens")}
        for s in exporter.get_finished_spans()
    ]))
    """
)


# An application with no OpenTelemetry code at all: what "no code change" means for most users.
PLAIN_APP = textwrap.dedent(
    """
    import anyio
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("plain")

    @server.tool()
    def fetch(n: int) -> str:
        return "data " * n

    async def main():
        async with Client(server, mode="legacy") as client:
            await client.call_tool("fetch", {"n": 500})

    anyio.run(main)
    """
)


def launch(tmp_path: Path, source: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``source`` under the real ``opentelemetry-instrument`` launcher."""
    launcher = Path(sys.executable).with_name("opentelemetry-instrument")
    if not launcher.exists():
        pytest.skip("opentelemetry-instrument is not installed next to this interpreter")
    app = tmp_path / "app.py"
    app.write_text(source)
    full_env = {**os.environ, "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none",
                "OTEL_LOGS_EXPORTER": "none", **env}
    out = subprocess.run([str(launcher), sys.executable, str(app)], env=full_env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return out


def run_instrumented(tmp_path: Path, **env: str) -> list[dict]:
    """Run APP under ``opentelemetry-instrument``; the spans it printed."""
    return json.loads(launch(tmp_path, APP, **env).stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_opentelemetry_instrument_runs_the_shim_with_no_code_change(tmp_path: Path) -> None:
    spans = run_instrumented(tmp_path, MCP_TOKEN_OTEL_ESTIMATOR="chars/4")
    # The SDK's own spans, enriched: the client one keeps the SDK's name.
    measured = {(s["name"], s["kind"]): s["output"] for s in spans if s["name"].endswith("tools/call fetch")}
    assert set(measured) == {("MCP send tools/call fetch", "CLIENT"), ("tools/call fetch", "SERVER")}
    assert all(tokens >= 625 for tokens in measured.values())  # 2500 chars at chars/4


@pytest.mark.slow
def test_opentelemetry_instrument_can_disable_it(tmp_path: Path) -> None:
    spans = run_instrumented(tmp_path, OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="mcp_token_otel")
    assert spans and all(s["output"] is None for s in spans)  # the SDK's own spans, without our attributes


@pytest.mark.slow
def test_a_bad_configuration_is_one_log_line_and_nothing_instrumented(tmp_path: Path) -> None:
    out = launch(tmp_path, APP, MCP_TOKEN_OTEL_BUDGET_CONTEXT_WINDOW="lots",
                 MCP_TOKEN_OTEL_PROMETHEUS_BASIC_AUTH_USERNAME="u", MCP_TOKEN_OTEL_PROMETHEUS_BASIC_AUTH_PASSWORD="pw1")
    ours = [line for line in out.stderr.splitlines() if "mcp_token_otel" in line]
    assert ours == ["mcp_token_otel: not instrumenting, bad configuration: config key 'budget.context_window': "
                    "expected an integer, got 'lots' (str)"], out.stderr
    assert "Traceback" not in out.stderr and "pw1" not in out.stderr
    spans = json.loads(out.stdout.strip().splitlines()[-1])
    assert spans and all(s["output"] is None for s in spans)  # the app ran, unmeasured


def test_a_direct_instrument_call_raises_on_a_bad_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller of instrument() can fix its configuration: ConfigError names the key, nothing is patched."""
    from mcp.server.lowlevel.server import Server

    from mcp_token_otel.config import ConfigError
    from mcp_token_otel.instrumentation import instrument

    before = Server.__init__
    monkeypatch.setenv("MCP_TOKEN_OTEL_BUDGET_CONTEXT_WINDOW", "lots")
    with pytest.raises(ConfigError, match=r"'budget\.context_window': expected an integer"):
        instrument()
    assert Server.__init__ is before


@pytest.mark.slow
def test_with_opentelemetry_distro_an_app_without_otel_code_is_measured(tmp_path: Path) -> None:
    """The ``auto`` extra (opentelemetry-distro) is the configurator that makes the zero-code path work."""
    if importlib.util.find_spec("opentelemetry.distro") is None:
        if os.environ.get("CI"):
            pytest.fail("opentelemetry-distro is missing: scripts/bootstrap installs the auto extra")
        pytest.skip("opentelemetry-distro (pip install 'mcp-token-otel[auto]') not installed")
    out = launch(tmp_path, PLAIN_APP, OTEL_TRACES_EXPORTER="console", MCP_TOKEN_OTEL_ESTIMATOR="chars/4")
    spans = [json.loads(chunk) for chunk in _json_objects(out.stdout)]
    fetch = {s["kind"]: s["attributes"].get("mcp_token.output_tokens")
             for s in spans if s["name"].endswith("tools/call fetch")}
    assert set(fetch) == {"SpanKind.CLIENT", "SpanKind.SERVER"}, out.stdout[-2000:]
    assert all(tokens >= 625 for tokens in fetch.values())  # 2500 chars at chars/4


def _json_objects(text: str) -> list[str]:
    """The top-level JSON objects the console exporter printed one after another."""
    decoder = json.JSONDecoder()
    objects, index = [], 0
    while True:
        start = text.find("{", index)
        if start < 0:
            return objects
        _, end = decoder.raw_decode(text, start)
        objects.append(text[start:end])
        index = end
