"""The stdio proxy at its client's EOF: the server's stdin is closed, the calls in flight are answered through
the proxy, and the proxy exits with the server's status (no signal while the server is still answering)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import proxy_argv, proxy_env

SERVER = Path(__file__).parent / "servers" / "drain_server.py"


@pytest.mark.slow
def test_call_in_flight_at_client_eof_is_answered() -> None:
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "slow", "arguments": {}}},
    ]
    proc = subprocess.Popen(proxy_argv("--", sys.executable, str(SERVER), "3", "7"), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **proxy_env()})
    out, err = proc.communicate(b"".join(json.dumps(m).encode() + b"\n" for m in messages), timeout=60)
    answers = {json.loads(line)["id"]: json.loads(line) for line in out.splitlines()}
    assert answers[2]["result"]["content"][0]["text"] == "done", err
    assert sorted(answers) == [1, 2]
    assert proc.returncode == 7, err  # the server's status, not a signal's
