"""The zero-code proxy: relays MCP traffic unchanged (stdio child or streamable-HTTP upstream) and measures every
message off the relay path, feeding the shim's recorder with ``side="proxy"``. See docs/proxy.md."""
