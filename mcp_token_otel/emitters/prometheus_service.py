"""Serve a recorder's aggregate on /metrics: what ``instrument()``, the proxy and the demo call."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry

from ..config import Config, PrometheusConfig
from .aggregate import Aggregate
from .metrics_server import AsgiApp, BasicAuth, MetricsServer, WsgiApp, metrics_asgi_app, metrics_wsgi_app
from .prometheus_collector import PrometheusCollector
from .prometheus_multiprocess import SharedFilesAggregate, multiprocess_registry

logger = logging.getLogger(__name__)


class Recorder(Protocol):
    """What the Prometheus service needs of the recorder it serves (emitters import no recorder)."""

    @property
    def config(self) -> Config: ...

    @property
    def aggregate(self) -> Aggregate: ...


@dataclass
class PrometheusService:
    """The registry to serve (the aggregate's collector, or the multiprocess files merged) and the running
    server (if any)."""

    registry: CollectorRegistry
    auth: BasicAuth | None
    collector: PrometheusCollector | None = None
    server: MetricsServer | None = None

    def _render(self) -> Callable[[], bytes] | None:
        # The fast renderer draws the aggregate's collector; multiprocess mode serves the merged files instead.
        collector, registry = self.collector, self.registry
        if collector is None:
            return None
        return lambda: collector.exposition(registry)

    def exposition(self) -> bytes:
        """What /metrics serves in the Prometheus text format."""
        render = self._render()
        if render is not None:
            return render()
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

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
    """Serve ``recorder``'s aggregate; with ``serve``, listen on config.host:port.

    In multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set) the served registry merges every process's files.
    A server that cannot start (port taken, unreadable TLS file) is logged, and the registry still feeds
    ``metrics_app()``.
    """
    auth = BasicAuth(config.basic_auth_username, config.basic_auth_password) if config.basic_auth_username else None
    if isinstance(recorder.aggregate, SharedFilesAggregate):
        service = PrometheusService(multiprocess_registry(), auth)
    else:
        registry = CollectorRegistry()
        collector = PrometheusCollector(recorder.aggregate, created_series=config.created_series)
        registry.register(collector)
        service = PrometheusService(registry, auth, collector)
    if serve:
        try:
            service.server = MetricsServer.start(
                config.host,
                config.port,
                service.registry,
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
