"""Attach the Prometheus sink to a recorder and serve it: what ``instrument()`` and the demo call."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from ..config import Config, PrometheusConfig
from .metrics_server import AsgiApp, BasicAuth, MetricsServer, WsgiApp, metrics_asgi_app, metrics_wsgi_app
from .prometheus_metrics import PrometheusMetrics, multiprocess_mode, multiprocess_registry
from .sink import MetricsSink

logger = logging.getLogger(__name__)


class Recorder(Protocol):
    """What the Prometheus service needs of the recorder it feeds from (emitters import no recorder)."""

    @property
    def config(self) -> Config: ...

    def session_states(self) -> Mapping[Any, Mapping[str, int]]: ...

    def server_label(self) -> str: ...

    def add_sink(self, sink: MetricsSink, *, inline: bool = False) -> None: ...


@dataclass
class PrometheusService:
    """The sink feeding a recorder, the registry to serve, and the running server (if any)."""

    metrics: PrometheusMetrics
    registry: CollectorRegistry
    auth: BasicAuth | None
    server: MetricsServer | None = None

    def _render(self) -> Any:
        # The fast renderer draws this sink's registry; multiprocess mode serves the merged one instead.
        return self.metrics.exposition if self.registry is self.metrics.registry else None

    def wsgi_app(self) -> WsgiApp:
        """/metrics as a WSGI app, to mount in an existing web server."""
        return metrics_wsgi_app(self.registry, self.auth, self._render())

    def asgi_app(self) -> AsgiApp:
        """/metrics as an ASGI app (Starlette, FastAPI...), e.g. next to an MCP streamable-HTTP app."""
        return metrics_asgi_app(self.registry, self.auth)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def start_prometheus(recorder: Recorder, config: PrometheusConfig, *, serve: bool = True) -> PrometheusService:
    """Feed ``recorder`` into prometheus-client families; with ``serve``, listen on config.host:port.

    In multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set) the served registry merges every worker.
    Building the sink can raise (a multiprocess directory that does not exist): then nothing was attached.
    A server that cannot start (port taken, unreadable TLS file) is logged, and the sink still feeds
    ``metrics_app()``.
    """
    metrics = PrometheusMetrics(
        states=recorder.session_states,
        tool_output_rate_budget=config.tool_output_rate_budget,
        service_output_rate_budget=config.service_output_rate_budget,
        created_series=config.created_series,
        server=recorder.server_label(),
        input_histograms=recorder.config.metrics.input_histograms,
    )
    registry = multiprocess_registry() if multiprocess_mode() else metrics.registry
    recorder.add_sink(metrics, inline=True)  # a dict increment a message; only once everything that can fail is built
    auth = BasicAuth(config.basic_auth_username, config.basic_auth_password) if config.basic_auth_username else None
    service = PrometheusService(metrics, registry, auth)
    if serve:
        try:
            service.server = MetricsServer.start(
                config.host,
                config.port,
                registry,
                auth=auth,
                tls_cert_file=config.tls_cert_file or None,
                tls_key_file=config.tls_key_file or None,
                max_connections=config.max_connections,
                request_timeout=config.request_timeout_seconds,
                render_max_age=config.render_max_age_seconds,
                render=service._render(),
            )
        except Exception as exc:  # port taken, unreadable certificate...: say so, keep instrumenting
            logger.error("mcp_token_otel: cannot serve /metrics on %s:%s: %s", config.host, config.port, exc)
    return service
