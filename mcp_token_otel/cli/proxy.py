"""``mcp-token-otel proxy``: measure any MCP server with no code change (stdio child or streamable-HTTP upstream).

    mcp-token-otel proxy [--name NAME] [--metrics-port PORT] -- COMMAND [ARGS...]
    mcp-token-otel proxy --listen 127.0.0.1:PORT --upstream URL
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..config import Config
from ..core.labels import UNKNOWN_SERVER
from ..core.measure import Policy
from .options import host_port, port

if TYPE_CHECKING:
    from ..proxy.transport import Transport

PREFIX = "mcp-token-otel proxy"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "proxy",
        help="transparent proxy that measures any MCP server (stdio: -- COMMAND; HTTP: --listen --upstream)",
        description="Relay MCP traffic unchanged and measure every message (spans, metrics, budgets).",
    )
    p.add_argument("--name", help="the server's name on spans and metrics (default: the name the server gives "
                                  "itself in its first answer)")
    p.add_argument("--metrics-port", type=port, default=None, metavar="PORT",
                   help="serve Prometheus /metrics of this proxy's own on this port (0: any free port, whose URL "
                        "is printed on stderr); stdio default: none, the metrics go to the host store that "
                        "`mcp-token-otel serve` serves")
    p.add_argument("--metrics-host", default=None, metavar="HOST",
                   help="address for /metrics (default: prometheus.host, 127.0.0.1)")
    p.add_argument("--metrics-required", action="store_true",
                   help="exit when /metrics cannot be served (default: warn on stderr and relay without it)")
    p.add_argument("--listen", type=host_port, metavar="HOST:PORT", help="HTTP mode: HOST:PORT to listen on")
    p.add_argument("--upstream", metavar="URL", help="HTTP mode: the streamable-HTTP MCP endpoint URL to forward to")
    p.add_argument("--inject-trace-context", action="store_true",
                   help="write the proxy span's W3C traceparent into params._meta of requests that carry none, "
                        "so the server's spans become its children (off: messages are never rewritten)")
    p.add_argument("--max-connections", type=_positive_int, default=None, metavar="N",
                   help="HTTP: open client connections at most; beyond, new ones are answered 503 (default 1024)")
    p.add_argument("--peer-share", type=_share, default=None, metavar="FRACTION",
                   help="HTTP: the share of --max-connections one client address may hold, above 0 and at most 1 "
                        "(default 0.5), so one client's stuck connections cannot lock the others out")
    p.add_argument("--body-timeout", type=_positive_seconds, default=None, metavar="SECONDS",
                   help="HTTP: how long a client has to send a whole request body (default 60)")
    p.add_argument("--shutdown-grace", type=_seconds, default=30.0, metavar="SECONDS",
                   help="stdio: after the client closes its input, how long the server has to answer the calls "
                        "in flight and exit before it is stopped (default 30)")
    p.add_argument("--print-client-config", action="store_true",
                   help="stdio: print the mcpServers JSON entry (command, args, env) that makes an MCP client "
                        "launch COMMAND through this proxy from any directory (absolute paths; the config file "
                        "and MCP_TOKEN_OTEL_*/OTEL_* variables carried in env), and exit")
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"),
                   help="proxy log level on stderr (default warning)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]",
                   help="stdio mode: the server command")
    p.set_defaults(func=run, estimator=None)


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds, 0 or more, got {value!r}")
    return seconds


def _positive_seconds(value: str) -> float:
    seconds = _seconds(value)
    if seconds == 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {value!r}")
    return seconds


def _positive_int(value: str) -> int:
    if not value.strip().isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number, 1 or more, got {value!r}")
    return int(value)


def _share(value: str) -> float:
    try:
        share = float(value)
    except ValueError:
        share = -1.0
    if not 0 < share <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction above 0 and at most 1, got {value!r}")
    return share


def _fail(message: str) -> int:
    print(f"{PREFIX}: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace, config: Config, policy: Policy) -> int:
    from ..proxy.startup import StartupError

    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format="%(message)s")
    # The relay threads (stdio: two copiers and the queue's writer) hand the GIL over every 200 us when they
    # compete, not every 5 ms (which would be added to a chunk that arrives meanwhile).
    sys.setswitchinterval(0.0002)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    http_mode = args.listen is not None or args.upstream is not None
    if http_mode and command:
        return _fail("give either -- COMMAND (stdio) or --listen/--upstream (HTTP), not both")
    if http_mode and not (args.listen and args.upstream):
        return _fail("HTTP mode needs both --listen HOST:PORT and --upstream URL")
    if not http_mode and not command:
        return _fail("nothing to proxy: give -- COMMAND [ARGS...] or --listen HOST:PORT --upstream URL")
    http_only = [flag for flag, value in (("--max-connections", args.max_connections),
                                          ("--peer-share", args.peer_share), ("--body-timeout", args.body_timeout))
                 if value is not None]
    if http_only and not http_mode:
        return _fail(f"{', '.join(http_only)}: for the HTTP proxy (--listen/--upstream), not for -- COMMAND")
    if args.print_client_config:
        if http_mode:
            return _fail("--print-client-config is for stdio servers (-- COMMAND); an HTTP client points at "
                         "--listen instead")
        from ..proxy.stdio import default_name
        from .client_config import print_client_config

        return print_client_config(args, command, default_name(command), config)
    try:
        if http_mode:
            return _run_http(args, config)
        return _run_stdio(args, config, command)
    except StartupError as exc:
        return _fail(str(exc))


def _run_stdio(args: argparse.Namespace, config: Config, command: list[str]) -> int:
    from ..proxy.stdio import StdioProxy, default_name

    fallback = default_name(command)  # until the server names itself (serverInfo), unless --name names it
    name = args.name or fallback
    # prometheus.host:port belongs to `mcp-token-otel serve`: a stdio proxy serves /metrics of its own only
    # with --metrics-port, and otherwise writes into the host store that serve reads.
    metrics = _metrics_servable(args, config, config_enables=False)
    proxy = StdioProxy(command, name=name, inject=args.inject_trace_context, shutdown_grace=args.shutdown_grace,
                       named=bool(args.name))
    proxy.start()  # the server boots while the measuring process starts
    try:
        store = None if metrics else _host_store(config)
        telemetry = _telemetry(args, config, fallback, metrics=metrics, host_store=store)
    except BaseException:
        assert proxy.proc is not None
        proxy.proc.kill()
        proxy.proc.wait()
        raise
    return _relay(proxy, telemetry)


def _relay(proxy: Transport, telemetry: Any) -> int:
    """Either transport, until it is done; the measuring side is flushed and closed whatever happens."""
    try:
        return proxy.run(telemetry)
    finally:
        telemetry.close()


def _metrics_servable(args: argparse.Namespace, config: Config, *, config_enables: bool = True) -> bool:
    """Whether /metrics is to be served (``--metrics-port``, or prometheus.enabled when ``config_enables``) and
    can be, checked now. Measuring never stops serving: a port that cannot be bound is one warning and no
    /metrics, unless ``--metrics-required`` makes it the error it was."""
    from ..proxy.telemetry import StartupError, check_port_free

    if args.metrics_port is None and not (config_enables and config.prometheus.enabled):
        return False
    port = config.prometheus.port if args.metrics_port is None else args.metrics_port
    try:
        check_port_free(args.metrics_host or config.prometheus.host, port, "/metrics")
    except StartupError as exc:
        if args.metrics_required:
            raise
        print(f"{PREFIX}: warning: {exc}; relaying without /metrics (--metrics-required: exit instead)",
              file=sys.stderr)
        return False
    return True


def _host_store(config: Config) -> str | None:
    """The host store directory this proxy writes into (see docs/proxy.md), or None when it cannot be used.
    When nothing will read its figures (no ``serve`` running, no OTLP endpoint), one line on stderr says so."""
    from ..emitters.host_store import serve_running, state_dir, usable

    path = state_dir(config.prometheus.state_dir)
    problem = usable(path)
    if problem is not None:
        print(f"{PREFIX}: warning: {problem}; this proxy's metrics go nowhere (set prometheus.state_dir to a "
              "directory of yours, or give --metrics-port PORT)", file=sys.stderr)
        return None
    otlp = any(os.environ.get(v) for v in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"))
    if serve_running(path) is None and not (otlp or config.otel.configure):
        print(f"{PREFIX}: note: nothing reads this proxy's metrics: no `mcp-token-otel serve` runs for {path} "
              "(start it, as a user service: docs/proxy.md; the figures wait there until it does), "
              "or give --metrics-port PORT, or set OTEL_EXPORTER_OTLP_ENDPOINT", file=sys.stderr)
    return path


def _telemetry(args: argparse.Namespace, config: Config, fallback: str, *, metrics: bool,
               host_store: str | None = None) -> Any:
    """The measuring side, in its own process (its CPU time never holds the relay's GIL); with guards on
    (guard.mode, guard.sides), in this process: guards act on the relay path and need the measurements.
    Without ``metrics``, no /metrics whatever the configuration says; with ``host_store``, the metrics go
    into that directory for ``mcp-token-otel serve``. The ``server`` label: ``--name`` when given, else the name
    the server gives itself, ``fallback`` until it does."""
    from ..proxy.guard import proxy_guarded
    from ..proxy.measure_process import RemoteTelemetry

    port = args.metrics_port if metrics else None
    if not metrics:
        config = dataclasses.replace(config, prometheus=dataclasses.replace(config.prometheus, enabled=False))
    if proxy_guarded(config):
        from ..proxy.telemetry import Telemetry

        return Telemetry(config, args.name, metrics_host=args.metrics_host, metrics_port=port, guard=True,
                         host_store=host_store, fallback=fallback)
    with _environment(None if metrics else {PROMETHEUS_ENABLED: "false"}):  # the measuring process reads it
        return RemoteTelemetry(args.config, args.name, args.metrics_host, port, host_store, fallback)


#: The variable that turns /metrics off in the measuring process, which loads the configuration itself.
PROMETHEUS_ENABLED = "MCP_TOKEN_OTEL_PROMETHEUS_ENABLED"


@contextlib.contextmanager
def _environment(values: dict[str, str] | None) -> Iterator[None]:
    """``values`` in this process's environment while a child is started (the server has started already)."""
    saved = {name: os.environ.get(name) for name in values or {}}
    os.environ.update(values or {})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _run_http(args: argparse.Namespace, config: Config) -> int:
    from ..proxy.http import HttpProxy, parse_listen

    host, port = parse_listen(args.listen)
    limits = {key: value for key, value in (("max_connections", args.max_connections),
                                            ("peer_share", args.peer_share), ("body_timeout", args.body_timeout))
              if value is not None}  # unset: the proxy's own defaults
    proxy = HttpProxy(args.upstream, host, port, name=args.name, inject=args.inject_trace_context, **limits)
    proxy.check()  # bad URL, port in use, upstream unreachable: StartupError before anything else starts
    metrics = _metrics_servable(args, config)
    return _relay(proxy, _telemetry(args, config, UNKNOWN_SERVER, metrics=metrics))
