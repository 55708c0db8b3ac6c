"""An mcp 1.x FastMCP server with guards on its own side, for the stdio and streamable HTTP guard tests.

Run with ``sys.executable`` it serves stdio; ``MCP_TOKEN_TEST_CONFIG`` (JSON) is the config it instruments
itself with (estimator chars/4 added), and ``MCP_TOKEN_TEST_SPANS`` names a JSON-lines file that receives every
finished span with its events. The ``calls`` tool says how many times each tool ran (refused calls never run).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

from mcp.server.fastmcp import FastMCP
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from pydantic import BaseModel, Field


class Item(BaseModel):
    id: int
    name: str


class Page(BaseModel):
    items: list[Item] = Field(min_length=1)
    total: int


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as out:
            for span in spans:
                record = {
                    "name": span.name,
                    "kind": span.kind.name,
                    "attributes": dict(span.attributes or {}),
                    "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events],
                }
                out.write(json.dumps(record) + "\n")
        return SpanExportResult.SUCCESS


def words(n: int) -> str:
    """n different words: text no padding check flags (no long repeats, no tiny alphabet)."""
    return " ".join(f"word{i}" for i in range(n))


def make_server(calls: Counter[str], host: str = "127.0.0.1", port: int = 8000) -> FastMCP:
    server = FastMCP("guarded", host=host, port=port)

    @server.tool()
    def text(n: int) -> str:
        """n words of text."""
        calls["text"] += 1
        return words(n)

    @server.tool()
    def items(n: int, offset: int = 0) -> Page:
        """A page of n items starting at offset."""
        calls["items"] += 1
        return Page(items=[Item(id=offset + i, name=f"item number {offset + i}") for i in range(n)], total=10_000)

    @server.tool()
    def count() -> str:
        """How many times each tool ran."""
        return json.dumps(dict(calls))

    return server


if __name__ == "__main__":
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["MCP_TOKEN_TEST_SPANS"])))
    from mcp_token_otel.config import config_from_dict
    from mcp_token_otel.instrumentation import instrument

    config: dict[str, Any] = {"estimator": "chars/4", **json.loads(os.environ.get("MCP_TOKEN_TEST_CONFIG", "{}"))}
    instrument(config_from_dict(config), tracer_provider=provider)
    make_server(Counter()).run("stdio")
