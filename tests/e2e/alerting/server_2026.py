"""An instrumented mcp 2.x server over streamable HTTP on 127.0.0.1, for the end-to-end alerting test.

    python tests/e2e/alerting/server_2026.py HTTP_PORT METRICS_PORT

Clients of mcp 2.x speak protocol 2026-07-28 to it (no ``Mcp-Session-Id``): its budgets are keyed by what the
requests carry (``budget.key``'s default: a ``gen_ai.conversation.id`` baggage entry). Context window 15,000
tokens; the tool ``page`` answers about 4 KB of text (about 1,000 tokens), so a conversation exhausts its
budget within 20 calls. /metrics is served on METRICS_PORT. No guards: every call is answered.
"""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent

from mcp_token_otel import instrumentation
from mcp_token_otel.config import config_from_dict

NAME = "alerting-2026"
PAGE_BYTES = 4096


def main(http_port: int, metrics_port: int) -> None:
    config = config_from_dict({
        "budget": {"context_window": 15_000},
        "prometheus": {"enabled": True, "host": "127.0.0.1", "port": metrics_port},
    })
    if instrumentation.instrument(config) is None or instrumentation.prometheus_service() is None:
        raise SystemExit("instrumentation or /metrics failed to start")
    server = MCPServer(NAME, log_level="WARNING")

    @server.tool()
    def page(number: int) -> CallToolResult:
        """One page of a long document (about 4 KB of text)."""
        line = f"page {number}: the quick brown fox jumps over the lazy dog, again and again. "
        text = (line * (PAGE_BYTES // len(line) + 1))[:PAGE_BYTES]
        return CallToolResult(content=[TextContent(type="text", text=text)])

    server.run("streamable-http", host="127.0.0.1", port=http_port)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
