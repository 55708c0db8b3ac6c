"""Optional OTLP setup from the standard OTEL_* variables, for apps that configure nothing themselves.

``configure_otel()`` installs an SDK TracerProvider (BatchSpanProcessor + OTLP span exporter) and an SDK
MeterProvider (PeriodicExportingMetricReader + OTLP metric exporter) only where the global provider is
still the API default. Protocol: ``OTEL_EXPORTER_OTLP_{TRACES,METRICS}_PROTOCOL``, then
``OTEL_EXPORTER_OTLP_PROTOCOL``, default ``http/protobuf``; ``grpc`` needs the grpc exporter package.
Endpoints, headers, timeouts and the export interval are read by the SDK classes from their own
variables (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_METRIC_EXPORT_INTERVAL``...). The resource comes from
``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``; a ``service_name`` argument overrides both.

Exit is bounded. Each export request is bounded by the exporters' own ``OTEL_EXPORTER_OTLP_TIMEOUT``
(``..._TRACES_TIMEOUT``, ``..._METRICS_TIMEOUT``; seconds in the Python exporters, default 10) and retried
with backoff within it, so a dead endpoint used to hold the process 10-30 s at exit. The providers built
here do not register the SDK's unbounded exit hook; ``shutdown_otel`` (run at exit) flushes and shuts them
down in parallel and gives up after ``shutdown_timeout`` seconds (``otel.shutdown_timeout_seconds``,
default 3): what is not sent by then is dropped, with one warning.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from opentelemetry import metrics, trace

logger = logging.getLogger(__name__)

DEFAULT_PROTOCOL = "http/protobuf"
#: Seconds the exit hook waits for the last spans and metrics to be exported (otel.shutdown_timeout_seconds).
DEFAULT_SHUTDOWN_TIMEOUT = 3.0


def _protocol(signal: str) -> str:
    value = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL"
    )
    return (value or DEFAULT_PROTOCOL).strip().lower()


def _tracing_unconfigured() -> bool:
    return isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def _metrics_unconfigured() -> bool:
    from opentelemetry.metrics import NoOpMeterProvider

    provider = metrics.get_meter_provider()
    # The API's proxy class is private; recognise it by name rather than importing it.
    return isinstance(provider, NoOpMeterProvider) or type(provider).__name__ == "_ProxyMeterProvider"


def span_exporter() -> Any:
    if _protocol("TRACES") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # type: ignore[assignment]
    return OTLPSpanExporter()


def metric_exporter() -> Any:
    if _protocol("METRICS") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # type: ignore[assignment]
            OTLPMetricExporter,
        )
    return OTLPMetricExporter()


def shutdown_otel(providers: Iterable[Any], timeout: float = DEFAULT_SHUTDOWN_TIMEOUT) -> bool:
    """Shut ``providers`` down (flushing what they hold) in parallel, waiting at most ``timeout`` seconds.

    True when all finished in time. A provider still exporting after the limit is left to its daemon thread
    (it stops with the process) and one warning says so; nothing here raises.
    """
    threads = []
    for provider in providers:

        def run(provider: Any = provider) -> None:
            try:
                provider.shutdown()
            except Exception:  # an exporter's fault at exit is not the application's problem
                logger.debug("mcp_token_otel: %s shutdown failed", type(provider).__name__, exc_info=True)

        thread = threading.Thread(target=run, name="mcp-token-otel-otel-shutdown", daemon=True)
        thread.start()
        threads.append(thread)
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    late = sum(thread.is_alive() for thread in threads)
    if late:
        logger.warning(
            "mcp_token_otel: OpenTelemetry export did not finish within %gs at shutdown "
            "(otel.shutdown_timeout_seconds); unsent spans and metrics are dropped",
            timeout,
        )
    return not late


def configure_otel(service_name: str | None = None, *, shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT) -> bool:
    """Install OTLP-exporting SDK providers where none is configured; True if anything was installed.

    A provider the application already set is left alone (that signal is skipped). At exit the providers
    installed here are shut down within ``shutdown_timeout`` seconds (see the module docstring).
    """
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    resource = Resource.create({SERVICE_NAME: service_name} if service_name else {})
    installed: list[Any] = []
    if _tracing_unconfigured():
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter()))
        trace.set_tracer_provider(tracer_provider)
        installed.append(tracer_provider)
    else:
        logger.debug("mcp_token_otel: tracer provider already configured; left alone")
    if _metrics_unconfigured():
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        reader = PeriodicExportingMetricReader(metric_exporter())
        meter_provider = MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)
        metrics.set_meter_provider(meter_provider)
        installed.append(meter_provider)
    else:
        logger.debug("mcp_token_otel: meter provider already configured; left alone")
    if installed:
        atexit.register(shutdown_otel, installed, shutdown_timeout)
    return bool(installed)
