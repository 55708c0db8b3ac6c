"""``python -m mcp_token_otel.cli``: the same as the ``mcp-token-otel`` command."""

import sys

from .main import main

sys.exit(main())
