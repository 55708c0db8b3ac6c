"""``python -m mcp_token_otel``: the same as the ``mcp-token-otel`` command."""

import sys

from .cli.main import main

sys.exit(main())
