"""Emitters: what the recorder's measurements become. ``semconv`` (the names), ``otel_metrics`` (OpenTelemetry
instruments), ``deferred`` (metric points recorded off the call path), ``prometheus_metrics`` (client_python
families), ``metrics_server`` and ``prometheus_service`` (/metrics), ``otel_setup`` (exporters from OTEL_*)."""
