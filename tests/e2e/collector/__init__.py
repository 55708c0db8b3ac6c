"""The Collector path: OTLP from instrumented services through the OpenTelemetry Collector that scripts/otelcol
builds, scraped by Prometheus with the shipped rules and routed by Alertmanager."""
