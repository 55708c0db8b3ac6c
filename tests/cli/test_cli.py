"""The command line, run as a user runs it: a real subprocess of the installed console script."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(
    *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    exe = shutil.which("mcp-token-otel", path=str(Path(sys.executable).parent))
    cmd = [exe] if exe else [sys.executable, "-m", "mcp_token_otel.cli"]
    return subprocess.run([*cmd, *args], input=stdin, capture_output=True, timeout=120, check=False,
                          env={**os.environ, **(env or {})})


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


# --- bad input: one line, exit 2, never a traceback ---------------------------------------------------------


def one_line_error(out: subprocess.CompletedProcess[bytes], *needles: bytes) -> None:
    assert out.returncode == 2, out.stderr
    assert b"Traceback" not in out.stderr and out.stderr.count(b"\n") == 1, out.stderr
    assert out.stderr.startswith(b"error: ")
    for needle in needles:
        assert needle in out.stderr, out.stderr


@pytest.mark.parametrize(
    ("content", "needle"),
    [(b"\xff\xfe budget: 1\n", b"not valid UTF-8"),
     (b"[" * 100_000, b"nested too deeply"),
     ("".join(" " * i + f"k{i}:\n" for i in range(5000)).encode(), b"nested too deeply"),
     (b'prometheus:\n  basic_auth_username: u\n  basic_auth_password: "hunter2-secret\n', b"not valid YAML")],
)
def test_hostile_config_files(tmp_path: Path, content: bytes, needle: bytes) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(content)
    out = run("--config", str(cfg), "config")
    one_line_error(out, needle)
    assert b"hunter2" not in out.stdout + out.stderr


def test_hostile_environment_value() -> None:
    out = run("config", env={"MCP_TOKEN_OTEL_BUDGET_CONTEXT_WINDOW": "[" * 100_000})
    one_line_error(out, b"budget.context_window")
    assert len(out.stderr) < 300


def test_set_up_variables_do_not_break_commands() -> None:
    out = run("config", env={"MCP_TOKEN_OTEL_PIN": "mcp<2", "MCP_TOKEN_OTEL_VENV": "/nowhere"})
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    "args",
    [("--context-window", "0"), ("--context-window", "-5"), ("--interval", "0"), ("--duration", "nan"),
     ("--duration", "inf"), ("--sessions", "0"), ("--rate", "0"), ("--metrics-port", "70000"), ("--sessions", "x")],
)
def test_demo_rejects_bad_options(args: tuple[str, str]) -> None:
    one_line_error(run("demo", *args), args[0].encode())


def test_demo_options_checked_for_library_callers_too() -> None:
    from mcp_token_otel.cli.demo import DemoOptions

    for bad in ({"interval": 0.0}, {"duration": float("nan")}, {"sessions": 0}, {"context_window": -5}):
        with pytest.raises(ValueError, match="demo option"):
            DemoOptions(**bad)


def test_demo_ctrl_c_prints_the_final_summary() -> None:
    cmd = [sys.executable, "-m", "mcp_token_otel.cli", "demo", "--duration", "0", "--metrics-port", "0", "--quiet"]
    # SIGINT at its default, even when this test itself runs in a background job that ignores it
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # printed once /metrics is up and sessions start
        assert b"metrics at" in first, proc.stderr.read() if proc.stderr else b""
        time.sleep(2)  # let a few calls happen (not an assertion on time)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert b"final summary" in out and b"sessions:" in out
    assert b"Traceback" not in err


def test_estimate_truncated_json_is_noted() -> None:
    out = run("estimate", "-", stdin=b'{"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "ab')
    assert out.returncode == 0, out.stderr
    assert b"note: input looks like JSON but does not parse" in out.stdout
    data = json.loads(run("estimate", "--json", "-", stdin=b'[{"jsonrpc": "2.0", "id": ').stdout)
    assert "does not parse" in data["input_note"]


def test_estimate_empty_input_is_a_note_not_an_advisory(tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    for source, stdin in ((str(empty), None), ("-", b"  \n")):
        out = run("estimate", source, stdin=stdin)
        assert out.returncode == 0 and out.stdout == b"note: input is empty: nothing to measure\n", out
    out = run("estimate", "--json", str(empty))
    assert out.returncode == 0 and json.loads(out.stdout) == [] and b"input is empty" in out.stderr


def test_estimate_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    blocks = [{"type": "text", "text": f"block {i}"} for i in range(20_000)]
    big.write_text(json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"content": blocks}}))
    exe = shutil.which("mcp-token-otel", path=str(Path(sys.executable).parent))
    cmd = [exe] if exe else [sys.executable, "-m", "mcp_token_otel.cli"]
    for extra in ((), ("--json",)):
        # the reader takes one line and closes the pipe, as `| head -1` does
        proc = subprocess.Popen([*cmd, "estimate", *extra, str(big)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=120) == 141  # 128 + SIGPIPE, what a standard tool reports
        assert err == b"", err
