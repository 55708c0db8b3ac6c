"""An agent application for the end-to-end alerting test: one conversation of tool calls to an MCP server over
streamable HTTP, with the conversation named in OpenTelemetry baggage (the one line an agent framework adds).

    python tests/e2e/alerting/client_2026.py URL CONVERSATION_ID CALLS

Not instrumented: the server keys its budget by the ``gen_ai.conversation.id`` baggage entry that the SDK sends
in every request's ``_meta``. Prints the negotiated protocol version and how many calls were answered.
"""

from __future__ import annotations

import sys

import anyio
from mcp import Client
from opentelemetry import baggage, context


async def converse(url: str, conversation: str, calls: int) -> None:
    token = context.attach(baggage.set_baggage("gen_ai.conversation.id", conversation))
    try:
        async with Client(url, mode="auto") as client:
            answered = 0
            for number in range(calls):
                result = await client.call_tool("page", {"number": number})
                answered += not result.is_error
            print(f"protocol {client.protocol_version}; answered {answered} of {calls}", flush=True)
    finally:
        context.detach(token)


if __name__ == "__main__":
    anyio.run(converse, sys.argv[1], sys.argv[2], int(sys.argv[3]))
