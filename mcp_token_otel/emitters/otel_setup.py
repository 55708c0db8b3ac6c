"""Optional OTLP setup from the standard OTEL_* variables, for apps that configure nothing themselves.

``configure_otel()`` installs an SDK TracerProvider (BatchSpanProcessor + OTLP span exporter) and an SDK
MeterProvider (PeriodicExportingMetricReader + OTLP metric exporter) only where the global provider is
still the API default. Protocol: ``OTEL_EXPORTER_OTLP_{TRACES,METRICS}_PROTOCOL``, then
``OTEL_EXPORTER_OTLP_PROTOCOL``, default ``http/protobuf``; ``grpc`` needs the grpc exporter package.
Endpoints, headers, timeouts and the export interval are read by the SDK classes from their own
variables (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_METRIC_EXPORT_INTERVAL``...). The resource comes from
``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``; a ``service_name`` argument overrides both.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from opentelemetry import metrics, trace

logger = logging.getLogger(__name__)

DEFAULT_PROTOCOL = "http/protobuf"


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


def configure_otel(service_name: str | None = None) -> bool:
    """Install OTLP-exporting SDK providers where none is configured; True if anything was installed.

    A provider the application already set is left alone (that signal is skipped).
    """
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    resource = Resource.create({SERVICE_NAME: service_name} if service_name else {})
    configured = False
    if _tracing_unconfigured():
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter()))
        trace.set_tracer_provider(tracer_provider)
        configured = True
    else:
        logger.debug("mcp_token_otel: tracer provider already configured; left alone")
    if _metrics_unconfigured():
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        reader = PeriodicExportingMetricReader(metric_exporter())
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[reader]))
        configured = True
    else:
        logger.debug("mcp_token_otel: meter provider already configured; left alone")
    return configured
