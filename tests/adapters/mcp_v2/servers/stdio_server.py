"""A small MCPServer for stdio tests, run with ``sys.executable``.

With ``MCP_TOKEN_TEST_INSTRUMENT=1`` it calls instrument() (estimator chars/4) and appends every finished
span as one JSON line to the file named by ``MCP_TOKEN_TEST_SPANS``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as out:
            for span in spans:
                parent = span.parent
                record = {
                    "name": span.name,
                    "kind": span.kind.name,
                    "trace_id": f"{span.context.trace_id:032x}",
                    "span_id": f"{span.context.span_id:016x}",
                    "parent_id": f"{parent.span_id:016x}" if parent else None,
                    "status": span.status.status_code.name,
                    "attributes": dict(span.attributes or {}),
                    "events": [e.name for e in span.events],
                }
                out.write(json.dumps(record) + "\n")
        return SpanExportResult.SUCCESS


if os.environ.get("MCP_TOKEN_TEST_INSTRUMENT") == "1":
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["MCP_TOKEN_TEST_SPANS"])))
    trace.set_tracer_provider(provider)
    from mcp_token_otel.config import config_from_dict
    from mcp_token_otel.instrumentation import instrument

    instrument(config_from_dict({"estimator": "chars/4"}))

from mcp.server.mcpserver import MCPServer  # noqa: E402

server = MCPServer("stdio-test")


@server.tool()
def big(n: int) -> str:
    """Return n characters of text."""
    return "x" * n


@server.tool()
def boom() -> str:
    raise ValueError("tool failed")


if __name__ == "__main__":
    server.run("stdio")
