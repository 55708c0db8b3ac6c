"""``proxy --print-client-config``: the ``mcpServers`` entry that makes a stdio MCP client launch a server
through the proxy, so measuring the server an agent already runs is one copy and paste.

The entry runs this interpreter (``python -m mcp_token_otel proxy ...``), so it works whatever PATH the client
launches it with, and serves /metrics on the given port or on one that is free now.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import Any


def free_port(host: str) -> int:
    """A TCP port nothing listens on now (the proxy only warns if it is taken by the time it starts)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def client_config(args: argparse.Namespace, command: list[str], name: str, port: int) -> dict[str, Any]:
    """``{"mcpServers": {name: {"command", "args", "env"}}}`` for ``command`` behind the proxy."""
    proxy_args = ["-m", "mcp_token_otel", "proxy", "--name", name, "--metrics-port", str(port)]
    if args.metrics_host:
        proxy_args += ["--metrics-host", args.metrics_host]
    if args.metrics_required:
        proxy_args.append("--metrics-required")
    if args.inject_trace_context:
        proxy_args.append("--inject-trace-context")
    if args.shutdown_grace != 30.0:
        proxy_args += ["--shutdown-grace", f"{args.shutdown_grace:g}"]
    env: dict[str, str] = {}
    if args.config:  # the client starts the proxy from its own directory: the file's absolute path
        env["MCP_TOKEN_OTEL_CONFIG"] = os.path.abspath(args.config)
    entry = {"command": sys.executable, "args": [*proxy_args, "--", *command], "env": env}
    return {"mcpServers": {name: entry}}


def print_client_config(args: argparse.Namespace, command: list[str], name: str) -> int:
    """The entry on standard output (JSON only, to pipe into a file or a tool); where /metrics will be, on
    standard error."""
    host = args.metrics_host or "127.0.0.1"
    port = args.metrics_port if args.metrics_port is not None else free_port(host)
    print(json.dumps(client_config(args, command, name, port), indent=2))
    shown = f"[{host}]" if ":" in host else host
    print(f"add this entry to your MCP client's configuration; /metrics will be at http://{shown}:{port}/metrics",
          file=sys.stderr)
    return 0
