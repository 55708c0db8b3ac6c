"""What a new user meets first, run as they run it (real subprocesses, real ports): the version, port options
checked alike by every command, one error line for a busy port, a hint for ``profile -- cmd``, and where the
HTTP proxy listens."""

from __future__ import annotations

import importlib.metadata

import mcp_token_otel

from .test_cli import run


def test_version_prints_the_package_version() -> None:
    out = run("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode() == f"mcp-token-otel {mcp_token_otel.__version__}\n"
    # the version the package metadata was built with is the same declaration
    assert importlib.metadata.version("mcp-token-otel") == mcp_token_otel.__version__
