"""``proxy --print-client-config``: the ``mcpServers`` entry that makes a stdio MCP client launch a server
through the proxy, so measuring the server an agent already runs is one copy and paste.

The entry works wherever and however the client launches it: it runs this interpreter by its absolute path
(``python -m mcp_token_otel proxy ...``); the server command is resolved to an absolute path (a bare name
through PATH, left bare only when PATH does not have it) and arguments naming files or directories here become
absolute; the configuration file and every ``MCP_TOKEN_OTEL_*`` and ``OTEL_*`` variable in force go into
``env``. No port: the proxy writes into the host store, served by ``mcp-token-otel serve`` on one fixed
address (unless ``--metrics-port`` asks for a /metrics of its own).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from ..config import Config

#: Variables whose values are paths, made absolute (the client starts the proxy from its own directory).
PATH_VARIABLES = ("MCP_TOKEN_OTEL_CONFIG", "MCP_TOKEN_OTEL_PROMETHEUS_STATE_DIR")
CARRIED_PREFIXES = ("MCP_TOKEN_OTEL_", "OTEL_")


def resolve_command(command: list[str]) -> tuple[list[str], list[str]]:
    """``command`` with its program as an absolute path and arguments that name existing files or directories
    here made absolute; and notes on what could not be resolved."""
    notes = []
    program = command[0]
    if os.sep in program or (os.altsep and os.altsep in program):
        program = os.path.abspath(program)
    else:
        found = shutil.which(program)
        if found:
            program = os.path.abspath(found)
        else:
            notes.append(f"{program!r} is not on this PATH: the client must find it on its own PATH")
    args = []
    for arg in command[1:]:
        looks_like_path = os.sep in arg or arg in (".", "..") or os.path.isfile(arg)
        if looks_like_path and not arg.startswith("-") and not os.path.isabs(arg) and os.path.exists(arg):
            arg = os.path.abspath(arg)
        args.append(arg)
    return [program, *args], notes


def carried_env(config_path: str | None) -> dict[str, str]:
    """The environment the entry needs to measure as this shell would: the configuration file, every
    ``MCP_TOKEN_OTEL_*`` and ``OTEL_*`` variable, ``XDG_STATE_HOME`` (the host store's place) and, when this
    package is found through ``PYTHONPATH`` (a checkout), the directory that holds it."""
    env = {name: value for name, value in os.environ.items() if name.startswith(CARRIED_PREFIXES)}
    if config_path:
        env["MCP_TOKEN_OTEL_CONFIG"] = config_path
    for name in PATH_VARIABLES:
        if env.get(name):
            env[name] = os.path.abspath(os.path.expanduser(env[name]))
    if os.path.isabs(os.environ.get("XDG_STATE_HOME", "")):
        env["XDG_STATE_HOME"] = os.environ["XDG_STATE_HOME"]
    root = str(Path(__file__).resolve().parent.parent.parent)
    entries = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if any(os.path.realpath(p) == root for p in entries):
        env["PYTHONPATH"] = root
    return dict(sorted(env.items()))


def client_config(args: argparse.Namespace, command: list[str], name: str) -> tuple[dict[str, Any], list[str]]:
    """``{"mcpServers": {name: {"command", "args", "env"}}}`` for ``command`` behind the proxy; and notes."""
    proxy_args = ["-m", "mcp_token_otel", "proxy"]
    if args.name:  # the user's name; else the server's own (serverInfo), as it says at its first answer
        proxy_args += ["--name", args.name]
    if args.metrics_port is not None:
        proxy_args += ["--metrics-port", str(args.metrics_port)]
    if args.metrics_host:
        proxy_args += ["--metrics-host", args.metrics_host]
    if args.metrics_required:
        proxy_args.append("--metrics-required")
    if args.inject_trace_context:
        proxy_args.append("--inject-trace-context")
    if args.shutdown_grace != 30.0:
        proxy_args += ["--shutdown-grace", f"{args.shutdown_grace:g}"]
    resolved, notes = resolve_command(command)
    env = carried_env(os.path.abspath(args.config) if args.config else None)
    entry = {"command": sys.executable, "args": [*proxy_args, "--", *resolved], "env": env}
    return {"mcpServers": {args.name or name: entry}}, notes


def print_client_config(args: argparse.Namespace, command: list[str], name: str, config: Config) -> int:
    """The entry on standard output (JSON only, to pipe into a file or a tool); where its figures will be, on
    standard error."""
    from ..emitters.host_store import serve_running, state_dir

    entry, notes = client_config(args, command, name)
    print(json.dumps(entry, indent=2))
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    (carried,) = (e["env"] for e in entry["mcpServers"].values())
    if carried:  # values may be credentials (OTEL_EXPORTER_OTLP_HEADERS): the names only, here
        print(f"env carries {', '.join(carried)} from this shell", file=sys.stderr)
    if args.metrics_port is not None:
        host = args.metrics_host or "127.0.0.1"
        shown = f"[{host}]" if ":" in host else host
        print(f"add this entry to your MCP client's configuration; /metrics will be at "
              f"http://{shown}:{args.metrics_port}/metrics", file=sys.stderr)
        return 0
    prom = config.prometheus
    path = state_dir(prom.state_dir)
    running = serve_running(path) if os.path.isdir(path) else None
    shown = f"[{prom.host}]" if ":" in prom.host else prom.host
    where = (running or {}).get("url") or f"http://{shown}:{prom.port}/metrics"
    status = "it runs" if running is not None else \
        "it is not running: start it (`mcp-token-otel serve`, or as a user service: docs/proxy.md)"
    print(f"add this entry to your MCP client's configuration; the proxy's metrics go to {path}, served by "
          f"`mcp-token-otel serve` at {where}; {status}", file=sys.stderr)
    return 0
