"""``mcp-token-otel serve``: one /metrics for every stdio proxy of this user on this host.

    mcp-token-otel serve [--host HOST] [--port PORT] [--state-dir DIR]

Serves the merged figures of the host store (every proxy that runs or ran, see docs/proxy.md) on
``prometheus.host:port`` (127.0.0.1:9464) with the /metrics server's TLS, basic auth and limits, and compacts
the files of proxies that ended. One ``serve`` per store: a second one says which is running and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from typing import Any

from ..config import Config
from ..core.measure import Policy
from .options import number, port

PREFIX = "mcp-token-otel serve"
#: Seconds between compactions when nobody scrapes (each scrape compacts too).
COMPACT_INTERVAL = 30.0
#: Threads answering scrapes: a host has a Prometheus or two, and scrapes share renderings (each thread that
#: ever renders keeps a malloc arena of its own, so fewer threads also mean a smaller resident size).
SERVE_WORKERS = 4


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="serve one /metrics for every stdio proxy of this user (run it as a user service)",
        description="Serve the figures every stdio proxy of this user keeps in the host store, on one fixed "
                    "address, and compact the files of proxies that ended.",
    )
    p.add_argument("--host", default=None, help="address to listen on (default: prometheus.host, 127.0.0.1)")
    p.add_argument("--port", type=port, default=None, help="port (default: prometheus.port, 9464)")
    p.add_argument("--state-dir", default=None, metavar="DIR",
                   help="the host store (default: prometheus.state_dir, else "
                        "$XDG_STATE_HOME/mcp-token-otel/metrics or ~/.local/state/mcp-token-otel/metrics)")
    p.add_argument("--compact-interval", type=number(float, 0, inclusive=False, words="a number of seconds above 0"),
                   default=COMPACT_INTERVAL, metavar="SECONDS",
                   help=f"compact ended proxies' files this often when nobody scrapes (default {COMPACT_INTERVAL:g})")
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=run, estimator=None)


def _fail(message: str) -> int:
    print(f"{PREFIX}: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace, config: Config, policy: Policy) -> int:
    from ..emitters.host_collector import HostCollector
    from ..emitters.host_store import SERVE_LOCK, StoreError, prepare, serve_running, state_dir
    from ..emitters.metrics_server import BasicAuth, MetricsServer
    from ..proxy.startup import StartupError, check_port_free

    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format="%(message)s")
    prom = config.prometheus
    host = args.host or prom.host
    port = prom.port if args.port is None else args.port
    try:
        path = prepare(state_dir(args.state_dir or prom.state_dir))
    except StoreError as exc:
        return _fail(str(exc))
    os.umask(0o077)  # the archive and the lock files: this user's alone
    lock = _ServeLock.take(os.path.join(path, SERVE_LOCK))
    if lock is None:
        running = serve_running(path) or {}
        where = f" (pid {running.get('pid')}, {running.get('url')})" if running.get("url") else ""
        return _fail(f"{path} is served already{where}")
    try:
        check_port_free(host, port, "/metrics")
    except StartupError as exc:
        return _fail(str(exc))
    from prometheus_client import CollectorRegistry

    collector = HostCollector(path)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    auth = BasicAuth(prom.basic_auth_username, prom.basic_auth_password) if prom.basic_auth_username else None
    try:
        server = MetricsServer.start(
            host, port, registry, auth=auth, tls_cert_file=prom.tls_cert_file or None,
            tls_key_file=prom.tls_key_file or None, max_connections=prom.max_connections,
            request_timeout=prom.request_timeout_seconds, render_max_age=prom.render_max_age_seconds,
            workers=SERVE_WORKERS,
        )
    except (OSError, ValueError) as exc:
        return _fail(f"cannot listen for /metrics on {host}:{port}: {getattr(exc, 'strerror', None) or exc}")
    lock.describe({"pid": os.getpid(), "url": server.url})
    print(f"{PREFIX}: /metrics at {server.url} for the proxies writing to {path}", file=sys.stderr, flush=True)
    stop = threading.Event()

    def _stop(_signum: int, _frame: Any) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stop)
    try:
        while True:
            try:
                collector.compact()
            except Exception:  # a full disk, say: scrapes still serve what is there
                logging.getLogger(__name__).warning("%s: compaction failed", PREFIX, exc_info=True)
            if stop.wait(args.compact_interval):
                break
    finally:
        server.close()
        with contextlib.suppress(Exception):
            collector.compact()
        lock.release()
    return 0


class _ServeLock:
    """The lock that says a ``serve`` runs for a store (proxies check it), with its pid and URL inside."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def take(cls, path: str) -> _ServeLock | None:
        import fcntl
        import time

        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        deadline = time.monotonic() + 2.0  # a proxy checking for us holds it shared for a moment
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return cls(fd)
            except OSError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return None
                time.sleep(0.05)

    def describe(self, info: dict[str, Any]) -> None:
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(info).encode(), 0)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)
        os.close(self.fd)
