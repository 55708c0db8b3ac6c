"""Emitters: what the recorder's measurements become. ``sink`` (the one sink protocol), ``aggregate``
(pre-aggregated series), ``otel_metrics`` (OpenTelemetry instruments), ``deferred`` (metric points recorded off
the call path), ``prometheus_metrics``, ``prometheus_text`` and ``prometheus_multiprocess`` (client_python
families and their text), ``metrics_server`` and ``prometheus_service`` (/metrics), ``otel_setup`` (exporters
from OTEL_*). Every metric family is declared in :mod:`mcp_token_otel.catalog`."""
