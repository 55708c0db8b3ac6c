"""``OTEL_TRACES_EXPORTER=console`` under ``opentelemetry-instrument`` on a stdio server: the protocol stream stays
clean (every standard output line is a JSON-RPC message) and the spans go to standard error; a process that
serves no stdio keeps its console output on standard output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = ROOT / "tests" / "adapters"
SERVERS = {  # the installed mcp major, and the other one's venv when it is there
    "mcp2": (Path(sys.executable), ADAPTERS / "mcp_v2" / "servers" / "stdio_server.py"),
    "mcp1": (ROOT / ".venv-mcp1" / "bin" / "python", ADAPTERS / "mcp_v1" / "servers" / "stdio_server.py"),
}
MESSAGES = [
    {"jsonrpc": "2.0", "id": 1, "method": "initialize",
     "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "big", "arguments": {"n": 100}}},
]


def _environment() -> dict[str, str]:
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "console",
           "OTEL_LOGS_EXPORTER": "none", "MCP_TOKEN_OTEL_ESTIMATOR": "chars/4"}
    env.pop("MCP_TOKEN_TEST_INSTRUMENT", None)
    return env


def _launcher(python: Path) -> Path:
    launcher = python.with_name("opentelemetry-instrument")
    if not python.exists() or not launcher.exists():
        pytest.skip(f"no opentelemetry-instrument next to {python}")
    probe = subprocess.run([str(python), "-c", "import opentelemetry.distro"], capture_output=True, check=False)
    if probe.returncode:
        pytest.skip("opentelemetry-distro (the auto extra) is not installed")
    return launcher


@pytest.mark.slow
@pytest.mark.parametrize("major", sorted(SERVERS))
def test_console_spans_of_a_stdio_server_go_to_stderr(major: str) -> None:
    python, server = SERVERS[major]
    proc = subprocess.Popen([str(_launcher(python)), str(python), str(server)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_environment())
    assert proc.stdin is not None and proc.stdout is not None
    lines = []
    try:
        proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in MESSAGES))
        proc.stdin.flush()
        while not any(json.loads(line).get("id") == 2 for line in lines if line.startswith(b"{")):
            line = proc.stdout.readline()
            assert line, "the server closed its stdout before answering tools/call"
            lines.append(line)
    except BaseException:
        proc.kill()
        raise
    rest, err = proc.communicate(timeout=60)  # closes stdin: the server exits, exporting what it still holds
    assert proc.returncode == 0, err.decode()[-2000:]
    stream = [line for line in b"".join(lines).decode().splitlines() + rest.decode().splitlines() if line.strip()]
    assert all(json.loads(line).get("jsonrpc") == "2.0" for line in stream), stream[:5]
    answer = json.loads(stream[-1])
    assert answer["id"] == 2 and "result" in answer
    spans = err.decode()
    assert '"name": "tools/call big"' in spans and '"mcp_token.output_tokens": ' in spans, spans[-2000:]
    assert '"resource_metrics"' in spans  # the console metric exporter's output too


APP = textwrap.dedent(
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
            await client.call_tool("fetch", {"n": 5})

    anyio.run(main)
    """
)


@pytest.mark.slow
def test_a_process_serving_no_stdio_keeps_console_output_on_stdout(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(APP)
    out = subprocess.run([str(_launcher(Path(sys.executable))), sys.executable, str(app)], capture_output=True,
                         env=_environment(), timeout=120, check=False)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert b'"name": "tools/call fetch"' in out.stdout and b"tools/call fetch" not in out.stderr
