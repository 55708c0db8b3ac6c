"""The command line, run as a user runs it: a real subprocess of the installed console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    exe = shutil.which("mcp-token-otel", path=str(Path(sys.executable).parent))
    cmd = [exe] if exe else [sys.executable, "-m", "mcp_token_otel.cli"]
    return subprocess.run([*cmd, *args], input=stdin, capture_output=True, timeout=120, check=False)


def test_estimate_example_file_human_and_json() -> None:
    out = run("estimate", str(EXAMPLES / "tools_call_response.json"))
    assert out.returncode == 0, out.stderr
    text = out.stdout.decode()
    assert "tools/call response (output)" in text and "risk tier:" in text and "structuredContent" in text
    out = run("estimate", "--json", str(EXAMPLES / "tools_call_response.json"))
    data = json.loads(out.stdout)
    assert data["direction"] == "output" and data["total_tokens"] == data["data_tokens"] + data["overhead_tokens"]
    assert {b["type"] for b in data["blocks"]} >= {"text", "structuredContent", "_meta"}
    assert 0 <= data["overhead_ratio"] <= 1 and data["estimator"] == "default"


def test_estimate_stdin_text_and_estimator_choice() -> None:
    out = run("estimate", "--json", "--estimator", "chars/4", "-", stdin=b"x" * 4001)
    data = json.loads(out.stdout)
    assert data["total_tokens"] >= 1001 and data["estimator"] == "chars/4"
    assert data["risk_tier"] == "medium"


def test_invalid_utf8_and_batch() -> None:
    out = run("estimate", "-", stdin=b"caf\xe9 \xff\xfe ok")
    assert out.returncode == 0 and b"not valid UTF-8" in out.stdout
    batch = [{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "a", "arguments": {}}},
             {"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "nope"}}]
    data = json.loads(run("estimate", "--json", "-", stdin=json.dumps(batch).encode()).stdout)
    assert [d["direction"] for d in data] == ["input", "output"] and data[1]["error_type"] == "-32601"


def test_bad_config_and_missing_file_are_clear(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("budget:\n  context_window: nope\n")
    out = run("--config", str(cfg), "estimate", "-", stdin=b"hi")
    assert out.returncode == 2 and b"'budget.context_window': expected an integer" in out.stderr
    out = run("estimate", str(tmp_path / "nothing.json"))
    assert out.returncode == 2 and b"No such file" in out.stderr


def test_profile_tools_list() -> None:
    out = run("profile", "--json", str(EXAMPLES / "tools_list_response.json"))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["overall_risk"] in ("low", "medium", "high", "critical")
    assert data["unbounded_tool_names"] and data["definition_tokens"] > 0


def test_config_prints_effective_values() -> None:
    out = run("config")
    assert out.returncode == 0 and b"context_window: 200000" in out.stdout


@pytest.mark.skipif(shutil.which("mcp-token-otel", path=str(Path(sys.executable).parent)) is None,
                    reason="console script not installed in this interpreter's bin")
def test_console_script_is_installed() -> None:
    assert run("--help").returncode == 0
