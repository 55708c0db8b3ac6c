"""The command line as a new user meets it: ``--config`` anywhere, numbers as YAML writes them, errors and endless
input read sensibly, a busy /metrics port that does not stop the proxy, a server's stdout banner in one line,
and credentials never printed."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_token_otel.config import ConfigError, config_from_dict, load_config
from mcp_token_otel.core.redact import redact_url, scrub, secrets_in_args

from .test_cli import run

ROOT = Path(__file__).resolve().parents[2]
STDIO_SERVER = ROOT / "tests" / "adapters" / "mcp_v2" / "servers" / "stdio_server.py"

# --- --config after the subcommand ---------------------------------------------------------------------------


def test_config_is_accepted_after_the_subcommand(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("budget:\n  context_window: 12345\n")
    out = run("config", "--config", str(cfg))
    assert out.returncode == 0 and b"context_window: 12345" in out.stdout, out.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("budget:\n  context_window: nope\n")
    out = run("estimate", "-", "--config", str(bad), stdin=b"hi")
    assert out.returncode == 2 and b"'budget.context_window': expected an integer" in out.stderr
    out = run("--config", str(bad), "config", "--config", str(cfg))  # the later one wins
    assert out.returncode == 0 and b"context_window: 12345" in out.stdout, out.stderr


# --- numbers as YAML writes them ------------------------------------------------------------------------------


def test_an_exponent_is_a_number_in_every_numeric_key(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("budget:\n  context_window: 1e9\n  idle_timeout: 1.5e3\nprometheus:\n  port: 9.464E3\n")
    config = load_config(cfg, env={})
    assert config.budget.context_window == 1_000_000_000 and isinstance(config.budget.context_window, int)
    assert config.budget.idle_timeout == 1500.0 and config.prometheus.port == 9464
    env = load_config(env={"MCP_TOKEN_OTEL_BUDGET_CONTEXT_WINDOW": "2e5", "MCP_TOKEN_OTEL_BUDGET_IDLE_TIMEOUT": "5e-1"})
    assert env.budget.context_window == 200_000 and env.budget.idle_timeout == 0.5
    assert config_from_dict({"budget": {"context_window": 2e5}}).budget.context_window == 200_000


@pytest.mark.parametrize("value", ["1.5e0", 1.5, "12", True, "1e9x"])
def test_an_integer_key_takes_only_whole_numbers(value: object) -> None:
    with pytest.raises(ConfigError, match=r"'budget\.context_window': expected an integer"):
        config_from_dict({"budget": {"context_window": value}})


def test_a_string_key_keeps_an_exponent_as_text() -> None:
    assert config_from_dict({"metrics": {"server_name": "1e9"}}).metrics.server_name == "1e9"


# --- estimate: JSON-RPC errors and endless input ----------------------------------------------------------------


def test_estimate_says_what_a_jsonrpc_error_is() -> None:
    message = {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "Invalid params: n"}}
    out = run("estimate", "-", stdin=json.dumps(message).encode())
    assert out.returncode == 0, out.stderr
    text = out.stdout.decode()
    assert "JSON-RPC error response (output)" in text
    assert "error: JSON-RPC error -32602: Invalid params: n" in text.splitlines()
    data = json.loads(run("estimate", "--json", "-", stdin=json.dumps(message).encode()).stdout)
    assert data["direction"] == "output" and data["error_message"] == "JSON-RPC error -32602: Invalid params: n"


def test_estimate_of_endless_input_reads_the_maximum_and_says_so() -> None:
    out = run("estimate", "/dev/zero")
    assert out.returncode == 0, out.stderr[-500:]
    assert b"note: input is larger than 128 MiB (--max-bytes): measured its first 128 MiB only" in out.stdout
    out = run("estimate", "--json", "--max-bytes", "1000", "-", stdin=b"x" * 5000)
    data = json.loads(out.stdout)
    assert data["bytes"] < 1100 and "larger than 1,000 bytes" in data["input_note"]


def test_estimate_cut_inside_a_character_is_no_encoding_error() -> None:
    out = run("estimate", "--max-bytes", "4", "-", stdin="café!".encode())
    assert out.returncode == 0 and b"not valid UTF-8" not in out.stdout, out.stdout


def test_estimate_of_input_it_cannot_read_fails() -> None:
    out = run("estimate", "/nonexistent/input.json")
    assert out.returncode == 2 and out.stderr.startswith(b"error: ")


# --- the proxy with a busy /metrics port -----------------------------------------------------------------------

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "t", "version": "1"}}}
CALL = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "big", "arguments": {"n": 10}}}


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _proxy(*args: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "mcp_token_otel.cli", "proxy", *args, "--", sys.executable, str(STDIO_SERVER)]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_a_busy_metrics_port_is_a_warning_and_the_proxy_serves(busy_port: int) -> None:
    proc = _proxy("--metrics-port", str(busy_port))
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        for message in (INITIALIZE, {"jsonrpc": "2.0", "method": "notifications/initialized"}, CALL):
            proc.stdin.write(json.dumps(message).encode() + b"\n")
        proc.stdin.flush()
        answers = [json.loads(proc.stdout.readline()) for _ in range(2)]
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    assert [a.get("id") for a in answers] == [1, 2] and "result" in answers[1], answers
    warning = proc.stderr.read().decode()
    assert f"warning: cannot listen for /metrics on 127.0.0.1:{busy_port}" in warning
    assert "relaying without /metrics" in warning and "Traceback" not in warning


@pytest.mark.slow
def test_metrics_required_makes_a_busy_port_an_error(busy_port: int) -> None:
    proc = _proxy("--metrics-port", str(busy_port), "--metrics-required")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.decode().strip() == ("mcp-token-otel proxy: error: cannot listen for /metrics on "
                                    f"127.0.0.1:{busy_port}: Address already in use")


# --- a server's banner on stdout --------------------------------------------------------------------------------

BANNER_SERVER = textwrap.dedent(
    """
    print("Welcome to the weather server v2 -- ready", flush=True)
    print("second banner line", flush=True)
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("banner")

    @server.tool()
    def hi() -> str:
        return "hi"

    server.run("stdio")
    """
)


@pytest.mark.slow
def test_profile_names_the_first_non_json_line_once(tmp_path: Path) -> None:
    script = tmp_path / "banner.py"
    script.write_text(BANNER_SERVER)
    out = run("profile", "--json", "--stdio", "--", sys.executable, str(script))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["server"]["name"] == "banner"
    lines = out.stderr.decode().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr.decode(), out.stderr
    assert "not JSON-RPC on stdout: 'Welcome to the weather server v2 -- ready' (and 1 more)" in lines[0]


@pytest.mark.slow
def test_lock_of_a_server_that_only_talks_names_its_line(tmp_path: Path) -> None:
    script = tmp_path / "talker.py"
    script.write_text("print('Starting up: config missing', flush=True)\nimport sys\nsys.exit(3)\n")
    out = run("lock", "-o", str(tmp_path / "x.lock.json"), "--timeout", "20", "--stdio", "--", sys.executable,
              str(script))
    assert out.returncode == 2 and out.stderr.count(b"\n") == 1 and b"Traceback" not in out.stderr, out.stderr
    assert b"not JSON-RPC on stdout: 'Starting up: config missing'" in out.stderr


# --- credentials --------------------------------------------------------------------------------------------------

SECRETS = ("s3cret-pw", "tok-abcdef123", "key-987654", "hunter2-cfg")


def test_redaction_helpers() -> None:
    assert redact_url("http://user:s3cret-pw@host:8/mcp?api_key=k1&x=1") == "http://user:****@host:8/mcp?api_key=****&x=1"
    assert redact_url("https://tok-abcdef123@host/") == "https://****@host/"
    assert redact_url("http://host/mcp") == "http://host/mcp"
    found = secrets_in_args(["--url", "http://u:p%40ss-word@h/", "--header", "Authorization: Bearer tok-abcdef123",
                             "--header=Cookie: sid=abcd1234", "--header", "Accept: text/plain"])
    assert {"p%40ss-word", "p@ss-word", "tok-abcdef123", "sid=abcd1234"} <= found and "text/plain" not in found
    assert scrub("Bearer tok-abcdef123 at http://u:p@ss-word@h", found) == "**** at http://u:****@h"


class _Refusing(http.server.BaseHTTPRequestHandler):
    """An MCP endpoint that refuses everyone, quoting back what it was sent (as some servers do)."""

    def do_POST(self) -> None:
        body = json.dumps({"error": f"unauthorized: {self.headers.get('Authorization')} {self.path}"}).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def refusing_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _assert_no_secret(out: subprocess.CompletedProcess[bytes]) -> None:
    assert out.returncode == 2, out.stderr
    shown = out.stdout + out.stderr
    for secret in SECRETS:
        assert secret.encode() not in shown, shown.decode(errors="replace")


@pytest.mark.slow  # a live server over stdio, in a subprocess
@pytest.mark.parametrize("command", ["profile", "lock", "check"])
def test_failing_governance_commands_never_print_credentials(command: str, tmp_path: Path,
                                                              refusing_server: int) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("prometheus:\n  basic_auth_username: u\n  basic_auth_password: hunter2-cfg\n")
    headers = ("--header", "Authorization: Bearer tok-abcdef123", "--header", "X-Api-Key: key-987654")
    lock = tmp_path / "server.lock.json"
    assert run("lock", "-o", str(lock), str(ROOT / "examples" / "tools_list_response.json")).returncode == 0
    extra = {"lock": ("-o", str(tmp_path / "out.json")), "check": ("--lock", str(lock))}.get(command, ())
    for port in (refusing_server, _closed_port()):
        url = f"http://user:s3cret-pw@127.0.0.1:{port}/mcp?api_key=key-987654"
        out = run("--config", str(cfg), command, *extra, "--timeout", "20", "--url", url, *headers)
        _assert_no_secret(out)
        assert b"127.0.0.1" in out.stderr  # the target is still named, without its credentials
    out = run(command, "--url", "http://user:s3cret-pw@127.0.0.1:1/", "--header", "Authorization Bearer tok-abcdef123")
    _assert_no_secret(out)  # a malformed header is echoed without its credential


@pytest.mark.parametrize("upstream", ["http://user:s3cret-pw@127.0.0.1:99999/mcp",
                                      "ftp://user:s3cret-pw@127.0.0.1/mcp"])
def test_proxy_errors_never_print_the_upstream_password(upstream: str) -> None:
    out = run("proxy", "--log-level", "debug", "--listen", f"127.0.0.1:{_closed_port()}", "--upstream", upstream)
    _assert_no_secret(out)
    assert b"user:****@127.0.0.1" in out.stderr, out.stderr


def test_proxy_debug_lines_never_print_the_upstream_password() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        listen = f"127.0.0.1:{busy.getsockname()[1]}"
        out = run("proxy", "--log-level", "debug", "--listen", listen, "--upstream",
                  f"http://user:s3cret-pw@127.0.0.1:{_closed_port()}/mcp")
    _assert_no_secret(out)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
