"""Where a recorder's metrics go, decided once: the storage of the aggregate and the OpenTelemetry instruments.

The storage follows prometheus-client's own switch: with ``PROMETHEUS_MULTIPROC_DIR`` set, the aggregate writes
the client's multiprocess files (every worker of a server, every stdio proxy of a host, into one directory);
otherwise it lives in this process. The OpenTelemetry instruments are made on the given MeterProvider (default:
the global one, whatever is set later) and read the same aggregate; with ``metrics.defer_otel`` their histogram
points are replayed off the call path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry import metrics

from ..config import Config
from .aggregate import Aggregate
from .deferred import DeferredPoints
from .otel_metrics import OtelMetrics
from .prometheus_multiprocess import SharedFilesAggregate, multiprocess_mode

#: The OpenTelemetry-only count of points the deferred replay dropped.
DROPPED = "mcp_token.instrumentation.dropped"


class Metrics:
    """A recorder's aggregate and its OpenTelemetry side."""

    def __init__(self, config: Config, meter_provider: metrics.MeterProvider | None, version: str,
                 server: str, on_error: Callable[[str], None]) -> None:
        input_histograms = config.metrics.input_histograms
        cls = SharedFilesAggregate if multiprocess_mode() else Aggregate
        self.aggregate: Aggregate = cls(input_histograms=input_histograms)
        self.otel = OtelMetrics(self.aggregate, meter_provider, version)
        points: Any = self.otel.points
        self.deferred: DeferredPoints | None = None
        if config.metrics.defer_otel:
            points = self.deferred = DeferredPoints(points, on_error=on_error)
        self.aggregate.points = points
        deferred = self.deferred
        self.aggregate.read_with(DROPPED, lambda: _dropped(deferred, server))

    def flush(self) -> None:
        """Replay the deferred OpenTelemetry points now (tests, shutdown)."""
        if self.deferred is not None:
            self.deferred.flush()

    def close(self) -> None:
        if self.deferred is not None:
            self.deferred.stop()
        self.otel.close()


def _dropped(deferred: DeferredPoints | None, server: str) -> list[tuple[tuple[str, ...], float]]:
    """The drop count, once what is queued has been replayed (read at collection: every export complete)."""
    if deferred is None:
        return [((server,), 0.0)]
    deferred.flush()
    return [((server,), float(deferred.dropped))]
