"""What a new user meets first, run as they run it (real subprocesses, real ports): the version, port options
checked alike by every command, one error line for a busy port, a hint for ``profile -- cmd``, and where the
HTTP proxy listens."""

from __future__ import annotations

import importlib.metadata
import socket
import sys

import pytest

import mcp_token_otel

from .test_cli import one_line_error, run


def test_version_prints_the_package_version() -> None:
    out = run("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode() == f"mcp-token-otel {mcp_token_otel.__version__}\n"
    # the version the package metadata was built with is the same declaration
    assert importlib.metadata.version("mcp-token-otel") == mcp_token_otel.__version__


# --- ports: one validation for every command ------------------------------------------------------------------


@pytest.mark.parametrize("value", ["70000", "-1", "99999", "80x"])
@pytest.mark.parametrize("command", [("demo",), ("proxy", "--metrics-required")])
def test_every_command_refuses_a_bad_port_alike(command: tuple[str, ...], value: str) -> None:
    # the proxy's child would be this interpreter doing nothing: the refusal comes before anything starts
    out = run(*command, "--metrics-port", value, "--", sys.executable, "-c", "pass") if command[0] == "proxy" \
        else run(*command, "--metrics-port", value)
    one_line_error(out, b"argument --metrics-port: expected a port number from 0 to 65535", repr(value).encode())


@pytest.mark.parametrize("listen", ["127.0.0.1:70000", "127.0.0.1:-1", "nowhere"])
def test_the_http_proxy_refuses_a_bad_listen_port_alike(listen: str) -> None:
    one_line_error(run("proxy", "--listen", listen, "--upstream", "http://127.0.0.1:1/mcp"),
                   b"argument --listen: expected HOST:PORT")


def test_the_demo_on_a_busy_port_is_one_error_with_the_way_out() -> None:
    with socket.socket() as busy:  # a real listener holds the port for the whole run
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = run("demo", "--metrics-port", str(port), "--duration", "1", "--quiet")
    one_line_error(out, f"cannot listen for /metrics on 127.0.0.1:{port}".encode(), b"--metrics-port 0")
    assert out.stdout == b""  # nothing started, nothing printed


# --- profile, lock, check: a server's command without --stdio ------------------------------------------------


@pytest.mark.parametrize("command", ["profile", "lock", "check"])
def test_a_server_command_without_stdio_says_to_add_it(command: str) -> None:
    out = run(command, "--", sys.executable, "-m", "mcp_server_time")
    one_line_error(out, b"add --stdio before '--'", f"mcp-token-otel {command} [OPTIONS] --stdio -- COMMAND".encode())
