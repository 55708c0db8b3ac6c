"""The proxy's measuring side, set up once per process: recorder, OTLP (from OTEL_*), /metrics, its own counts."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from .. import catalog
from ..config import Config
from ..recorder import TokenRecorder
from .jsonrpc import Measurer, ProxyStats
from .startup import StartupError, check_port_free

logger = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "mcp-token-otel-proxy"


def _stats_rows(stats: ProxyStats, server_label: Callable[[], str]) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """Each proxy family's (label values, value) rows, read from ``stats`` (catalog: emitter "proxy"), labelled
    with the server's name as the recorder knows it (``--name``, else the one the server gave itself)."""
    chunks, size = stats.dropped()
    server = server_label()
    return {
        "mcp_token_proxy_messages": [((server, direction, kind), value)
                                     for (direction, kind), value in sorted(list(stats.messages.items()))],
        "mcp_token_proxy_measurement_dropped_bytes": [((server,), size)],
        "mcp_token_proxy_measurement_dropped_chunks": [((server,), chunks)],
        "mcp_token_proxy_oversize_messages": [((server,), stats.oversize)],
    }


#: The catalog's families the proxy reports itself (read from its ProxyStats).
_PROXY_FAMILIES = tuple(family.key for family in catalog.FAMILIES if family.emitter == "proxy")


def _read_stats(recorder: TokenRecorder, stats: ProxyStats) -> None:
    """The catalog's proxy families, read from ``stats`` at collection (nothing on the relay path)."""
    def reader(name: str) -> Callable[[], list[tuple[tuple[str, ...], float]]]:
        return lambda: _stats_rows(stats, recorder.server_label)[name]

    for key in _PROXY_FAMILIES:
        recorder.aggregate.read_with(key, reader(key))


def _attach(path: str, server_name: str) -> Any:
    """This process's share of the host store, or None (said once on stderr) when it cannot be used."""
    from ..emitters.host_store import StoreError, Writer

    try:
        return Writer.attach(path, server_name)
    except (StoreError, OSError) as exc:
        print(f"mcp-token-otel proxy: warning: {exc}; this proxy's metrics go nowhere (give --metrics-port PORT, "
              "or set prometheus.state_dir to a directory of yours)", file=sys.stderr, flush=True)
        return None


class _CountsToFiles:
    """The proxy's own counts written into the host store's files as soon as a measured record changes them
    (the aggregate writes the families it reads once a second, and at close), so a measuring process killed
    at any moment loses none of what it counted. A handful of values: cheap next to measuring a message."""

    def __init__(self, aggregate: Any, stats: ProxyStats, server_label: Callable[[], str]) -> None:
        self.aggregate = aggregate
        self.stats = stats
        self.server_label = server_label
        self.last: Any = None

    def sync(self) -> None:
        stats = self.stats
        server = self.server_label()
        now = (server, tuple(stats.messages.values()), stats.oversize, stats.dropped())
        if now == self.last:
            return
        self.last = now
        self.aggregate.write_readers(_PROXY_FAMILIES)


class Telemetry:
    """Everything measuring needs, and its orderly shutdown (flush spans and metrics before exit).

    ``host_store``: a directory (see :mod:`~mcp_token_otel.emitters.host_store`) where this process writes its
    metrics for ``mcp-token-otel serve`` to serve, instead of serving /metrics itself."""

    def __init__(self, config: Config, server_name: str | None, *, metrics_host: str | None,
                 metrics_port: int | None, guard: bool = False, host_store: str | None = None,
                 fallback: str | None = None):
        """``server_name``: the ``server`` label the user gave (``--name``); without it, the name the server
        gives itself in its first answer, ``fallback`` until then."""
        self.configured = False
        # Before the recorder: its metrics go into the store's files when PROMETHEUS_MULTIPROC_DIR is set.
        self.writer: Any = _attach(host_store, server_name or fallback or "") if host_store is not None else None
        self._counts: _CountsToFiles | None = None
        if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") \
                or config.otel.configure:
            from ..emitters.otel_setup import configure_otel

            self.configured = configure_otel(os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME,
                                             shutdown_timeout=config.otel.shutdown_timeout_seconds)
        self.recorder = TokenRecorder(config, server_name=server_name, fallback_server=fallback)
        self.stats = ProxyStats()
        _read_stats(self.recorder, self.stats)
        self.prometheus: Any = None
        if self.writer is not None and callable(getattr(self.recorder.aggregate, "child", None)):
            self._counts = _CountsToFiles(self.recorder.aggregate, self.stats, self.recorder.server_label)
        elif metrics_port is not None or config.prometheus.enabled:
            from ..emitters.prometheus_service import start_prometheus

            prom = config.prometheus
            prom = dataclasses.replace(prom, host=metrics_host or prom.host,
                                       port=prom.port if metrics_port is None else metrics_port)
            check_port_free(prom.host, prom.port, "/metrics")
            self.prometheus = start_prometheus(self.recorder, prom)
            if self.prometheus.server is None:
                raise StartupError(f"cannot serve /metrics on {prom.host}:{prom.port} (port in use?)")
            where = f"mcp-token-otel proxy: /metrics at {self.prometheus.server.url}"
            if prom.port == 0:  # any free port: the port taken is the only way to find /metrics
                print(where, file=sys.stderr, flush=True)
            else:
                logger.info(where)
        if guard:  # guards act on the relay path: measured there, at once (guard.py)
            from .guard import GuardMeasurer

            self.measurer: Any = GuardMeasurer(self.recorder, self.stats)
        else:
            self.measurer = Measurer(self.recorder, self.stats)

    def sync_stats(self) -> None:
        """A record was measured: the proxy's counts into the host store now, when it writes there."""
        if self._counts is not None:
            try:
                self._counts.sync()
            except Exception:  # the recorder writes them again at close
                logger.debug("mcp_token_otel proxy: writing the proxy's counts failed", exc_info=True)

    @property
    def metrics_port(self) -> int | None:
        server = self.prometheus.server if self.prometheus is not None else None
        return getattr(server, "port", None)

    def close(self, timeout: float = 5.0) -> None:
        """Measure what is left and stop serving. The OTLP providers are not shut down here: configure_otel's
        exit hook does it, once (a second shutdown is an SDK warning on stderr), within
        ``otel.shutdown_timeout_seconds``, flushing the spans and metrics the recorder has just ended."""
        self.measurer.close(timeout)
        self.recorder.close()  # writes the read families (the proxy's counts, live sessions) a last time
        if self.prometheus is not None:
            self.prometheus.close()
        if self.writer is not None:
            self.writer.close()  # this process's figures into the store's archive
