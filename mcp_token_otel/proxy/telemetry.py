"""The proxy's measuring side, set up once per process: recorder, OTLP (from OTEL_*), /metrics, its own counts."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from collections.abc import Iterable, Iterator
from typing import Any

from opentelemetry import metrics, trace

from ..config import Config
from ..recorder import TokenRecorder
from ..semconv import SCOPE_NAME
from .jsonrpc import Measurer, ProxyStats

logger = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "mcp-token-otel-proxy"


class StartupError(Exception):
    """A problem that stops the proxy before it relays anything: one line, exit status 2."""


def check_port_free(host: str, port: int, what: str) -> None:
    """Fail now, in one line, if ``host:port`` cannot be bound (the servers would only log it later)."""
    if not 0 <= port <= 65535:  # getaddrinfo would take 99999 and bind its low 16 bits
        raise StartupError(f"cannot listen for {what} on {host}:{port}: expected a port in 0-65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise StartupError(f"cannot listen for {what} on {host}:{port}: {exc.strerror or exc}") from None
    if port == 0:  # any free port: only the address needed checking
        return
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers themselves do
        try:
            sock.bind(address)
        except OSError as exc:
            raise StartupError(f"cannot listen for {what} on {host}:{port}: {exc.strerror or exc}") from None


class _StatsCollector:
    """``mcp_token_proxy_*`` families read from :class:`ProxyStats` at scrape time (nothing on the relay path)."""

    def __init__(self, stats: ProxyStats) -> None:
        self.stats = stats

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        s = self.stats
        messages = CounterMetricFamily(
            "mcp_token_proxy_messages", "JSON-RPC messages the proxy relayed and measured, by kind.",
            labels=["server", "direction", "kind"],
        )
        for (direction, kind), value in sorted(s.messages.items()):
            messages.add_metric([s.server_name, direction, kind], value)
        yield messages
        chunks, size = s.dropped()
        dropped = CounterMetricFamily(
            "mcp_token_proxy_measurement_dropped_bytes",
            "Bytes relayed but not measured because the measuring queue was full.", labels=["server"],
        )
        dropped.add_metric([s.server_name], size)
        yield dropped
        dropped_chunks = CounterMetricFamily(
            "mcp_token_proxy_measurement_dropped_chunks",
            "Relayed chunks not measured because the measuring queue was full.", labels=["server"],
        )
        dropped_chunks.add_metric([s.server_name], chunks)
        yield dropped_chunks
        oversize = CounterMetricFamily(
            "mcp_token_proxy_oversize_messages",
            "Messages relayed but not measured because they exceed the measuring size limit.", labels=["server"],
        )
        oversize.add_metric([s.server_name], s.oversize)
        yield oversize


def _otel_counters(stats: ProxyStats) -> None:
    meter = metrics.get_meter(SCOPE_NAME)
    server = {"mcp_token.server.name": stats.server_name}

    def messages(_options: Any) -> Iterable[metrics.Observation]:
        for (direction, kind), value in list(stats.messages.items()):
            yield metrics.Observation(value, {**server, "mcp_token.proxy.direction": direction,
                                              "mcp_token.proxy.kind": kind})

    def dropped(_options: Any) -> Iterable[metrics.Observation]:
        yield metrics.Observation(stats.dropped()[1], server)

    meter.create_observable_counter("mcp_token.proxy.messages", [messages], unit="{message}",
                                    description="JSON-RPC messages the proxy relayed and measured, by kind.")
    meter.create_observable_counter("mcp_token.proxy.measurement.dropped", [dropped], unit="By",
                                    description="Bytes relayed but not measured because the queue was full.")


class Telemetry:
    """Everything measuring needs, and its orderly shutdown (flush spans and metrics before exit)."""

    def __init__(self, config: Config, server_name: str, *, metrics_host: str | None, metrics_port: int | None,
                 guard: bool = False):
        self.configured = False
        if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") \
                or config.otel.configure:
            from ..emitters.otel_setup import configure_otel

            self.configured = configure_otel(os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME)
        self.recorder = TokenRecorder(config, server_name=server_name)
        self.stats = ProxyStats(server_name)
        self.prometheus: Any = None
        if metrics_port is not None or config.prometheus.enabled:
            from ..emitters.prometheus_service import start_prometheus

            prom = config.prometheus
            prom = dataclasses.replace(prom, host=metrics_host or prom.host,
                                       port=prom.port if metrics_port is None else metrics_port)
            check_port_free(prom.host, prom.port, "/metrics")
            self.prometheus = start_prometheus(self.recorder, prom)
            if self.prometheus.server is None:
                raise StartupError(f"cannot serve /metrics on {prom.host}:{prom.port} (port in use?)")
            self.prometheus.registry.register(_StatsCollector(self.stats))
        try:
            _otel_counters(self.stats)
        except Exception:
            logger.debug("mcp_token_otel proxy: no OTel proxy counters", exc_info=True)
        if guard:  # guards act on the relay path: measured there, at once (guard.py)
            from .guard import GuardMeasurer

            self.measurer: Any = GuardMeasurer(self.recorder, self.stats)
        else:
            self.measurer = Measurer(self.recorder, self.stats)

    @property
    def metrics_port(self) -> int | None:
        server = self.prometheus.server if self.prometheus is not None else None
        return getattr(server, "port", None)

    def close(self, timeout: float = 5.0) -> None:
        self.measurer.close(timeout)
        self.recorder.close()
        if self.prometheus is not None:
            self.prometheus.close()
        for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
            shutdown = getattr(provider, "shutdown", None)
            if self.configured and callable(shutdown):
                try:
                    shutdown()
                except Exception:
                    logger.debug("mcp_token_otel proxy: provider shutdown failed", exc_info=True)
