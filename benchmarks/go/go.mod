module mcp-token-otel.bench/go

go 1.22
