"""Where a recorder's metrics go, decided once: the storage of the aggregate and the OpenTelemetry instruments.

The storage follows prometheus-client's own switch: with ``PROMETHEUS_MULTIPROC_DIR`` set, the aggregate writes
the client's multiprocess files (every worker of a server, every stdio proxy of a host, into one directory);
otherwise it lives in this process. The OpenTelemetry instruments are made on the given MeterProvider (default:
the global one, whatever is set later) and read the same aggregate; with ``metrics.defer_otel`` their histogram
points are replayed off the call path.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from opentelemetry import metrics

from ..config import Config
from .aggregate import Aggregate
from .deferred import DeferredPoints
from .otel_metrics import OtelMetrics
from .prometheus_multiprocess import SharedFilesAggregate, multiprocess_mode

logger = logging.getLogger(__name__)

#: The OpenTelemetry-only count of points the deferred replay dropped.
DROPPED = "mcp_token.instrumentation.dropped"


class Metrics:
    """A recorder's aggregate and its OpenTelemetry side."""

    def __init__(self, config: Config, meter_provider: metrics.MeterProvider | None, version: str,
                 server: str, on_error: Callable[[str], None]) -> None:
        input_histograms = config.metrics.input_histograms
        self.aggregate: Aggregate = (SharedFilesAggregate if _shared_files() else Aggregate)(
            input_histograms=input_histograms)
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


def _shared_files() -> bool:
    """Whether this process keeps its metrics in prometheus-client's multiprocess files: the directory is set and
    exists (a missing one is said once; the metrics then stay in this process's memory)."""
    if not multiprocess_mode():
        return False
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
    if os.path.isdir(directory):
        return True
    logger.error("mcp_token_otel: PROMETHEUS_MULTIPROC_DIR=%r is not a directory: this process's metrics stay in "
                 "memory (create the directory, or unset the variable)", directory)
    return False


def _dropped(deferred: DeferredPoints | None, server: str) -> list[tuple[tuple[str, ...], float]]:
    """The drop count, once what is queued has been replayed (read at collection: every export complete)."""
    if deferred is None:
        return [((server,), 0.0)]
    deferred.flush()
    return [((server,), float(deferred.dropped))]
