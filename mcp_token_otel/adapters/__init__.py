"""Adapters: one module per MCP SDK major version, all feeding :class:`mcp_token_otel.recorder.TokenRecorder`.

``mcp_v2`` hooks mcp 2.x (dispatcher proxy + server middleware); ``mcp_v1`` hooks mcp 1.x
(``BaseSession`` / ``RequestResponder``). Import them lazily: each imports its own SDK major.
"""
