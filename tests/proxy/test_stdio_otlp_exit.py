"""A stdio proxy with OTLP on exits quietly: its spans and metrics reach the receiver and stderr carries no
OpenTelemetry complaint (the meter provider was shut down twice: "shutdown can only be called once"). A real
proxy subprocess, a real server behind it, an OTLP/HTTP receiver on 127.0.0.1; measuring in its own process
(no guard) and in the proxy's (a guard on)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import TEST_SERVER, Receiver, proxy_argv, proxy_env

MESSAGES = [
    {"jsonrpc": "2.0", "id": 1, "method": "initialize",
     "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "big", "arguments": {"n": 100}}},
]


@pytest.mark.parametrize("guard", [{}, {"MCP_TOKEN_OTEL_GUARD_MODE": "enforce",
                                         "MCP_TOKEN_OTEL_GUARD_MAX_RESPONSE_TOKENS": "10000"}],
                         ids=["measuring-process", "guarded-in-process"])
def test_otlp_on_the_proxy_exits_without_a_second_shutdown(receiver: Receiver, guard: dict[str, str]) -> None:
    proc = subprocess.Popen(proxy_argv("--name", "otlp-exit", "--", sys.executable, str(TEST_SERVER)),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **proxy_env(receiver.port), **guard})
    assert proc.stdin is not None and proc.stdout is not None
    answers = []
    for message in MESSAGES:
        proc.stdin.write((json.dumps(message) + "\n").encode())
        proc.stdin.flush()
        if "id" in message:
            answers.append(json.loads(proc.stdout.readline()))
    _, err = proc.communicate(timeout=60)  # stdin closed: the server exits, then the proxy
    assert proc.returncode == 0, err
    assert answers[1]["id"] == 2 and answers[1]["result"]["content"][0]["text"] == "x" * 100
    stderr = err.decode()
    assert "shutdown can only be called once" not in stderr and "Traceback" not in stderr, stderr
    # the exit hook still flushed: the call's span and the token metrics were exported
    names = {span.name for _, span, _ in receiver.spans()}
    assert "tools/call big" in names, names
    points = receiver.metrics()
    assert "mcp_token.tokens" in points and "mcp_token.responses" in points, sorted(points)
