"""Zero code change: ``opentelemetry-instrument python app.py`` loads the mcp_token_otel entry point."""

from __future__ import annotations

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
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

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


def run_instrumented(tmp_path: Path, **env: str) -> list[dict]:
    """Run APP under the real ``opentelemetry-instrument`` launcher; the spans it printed."""
    launcher = Path(sys.executable).with_name("opentelemetry-instrument")
    if not launcher.exists():
        pytest.skip("opentelemetry-instrument is not installed next to this interpreter")
    app = tmp_path / "app.py"
    app.write_text(APP)
    full_env = {**os.environ, "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none",
                "OTEL_LOGS_EXPORTER": "none", **env}
    out = subprocess.run([str(launcher), sys.executable, str(app)], env=full_env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_opentelemetry_instrument_runs_the_shim_with_no_code_change(tmp_path: Path) -> None:
    spans = run_instrumented(tmp_path, MCP_TOKEN_OTEL_ESTIMATOR="chars/4")
    measured = {(s["name"], s["kind"]): s["output"] for s in spans if s["name"] == "tools/call fetch"}
    assert set(measured) == {("tools/call fetch", "CLIENT"), ("tools/call fetch", "SERVER")}
    assert all(tokens >= 625 for tokens in measured.values())  # 2500 chars at chars/4


def test_opentelemetry_instrument_can_disable_it(tmp_path: Path) -> None:
    spans = run_instrumented(tmp_path, OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="mcp_token_otel")
    assert spans and all(s["output"] is None for s in spans)  # the SDK's own spans, without our attributes
