"""One replica of a scaled-out MCP server: an MCPServer over streamable HTTP on 127.0.0.1, instrumented as a
deployment instruments it (``instrument()``; its configuration from the ``MCP_TOKEN_OTEL_*`` environment: the budget
store, /metrics, the guards).

    python tests/e2e/scaleout/replica_server.py PORT [--plain]

``--plain`` runs it uninstrumented (the upstream server behind the HTTP proxies). Its tool ``fetch`` answers ``n``
characters of a report (about 4 KB by default); ``--extra-tool`` lists one more tool (a replica whose tools/list
differs from the others', as during a rolling upgrade).
"""

from __future__ import annotations

import sys

#: What ``fetch`` answers: text as a report reads, ``n`` characters of it.
REPORT = " ".join(f"line {i} of the report" for i in range(2000))


def main() -> None:
    port = int(sys.argv[1])
    if "--plain" not in sys.argv:
        from mcp_token_otel.instrumentation import instrument

        if instrument() is None:
            raise SystemExit("instrument() did not instrument the MCP SDK")

    import uvicorn
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("scaleout")

    @server.tool()
    def fetch(n: int = 4000) -> str:
        """Return ``n`` characters of a report."""
        return REPORT[:n]

    if "--extra-tool" in sys.argv:

        @server.tool()
        def summary() -> str:
            """Return the report's first line."""
            return REPORT[:21]

    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
