module mcp-token-otel.test/peers/tools

go 1.26
