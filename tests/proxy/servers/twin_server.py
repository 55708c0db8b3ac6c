"""The Python twin of the Go test servers (tests/peers/go): the same four tools with the same results, on the
mcp 2.x MCPServer, so that a token figure measured for a Go server can be compared with the Python SDK's.

    python twin_server.py                        # stdio
    python twin_server.py --http 127.0.0.1:PORT  # streamable HTTP at /mcp
"""

from __future__ import annotations

import argparse
import json
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, ImageContent, TextContent
from pydantic import BaseModel, Field

# The constants of tests/peers/go/tools/tools.go.
DEFAULT_LINES = 600
HEADING = "# Field report <draft> & notes, café №7"
WEATHER = {"city": "Paris", "conditions": ["sunny", "windy"], "humidity": 40, "temperature": 21.5}
FAIL_TEXT = "quota exceeded for <tenant> & retry later"
IMAGE_PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAABAAAAAQCAIAAACQkWg2AAAB9UlEQVR42g3KkaLsQAwA0ODFwcXBxWAxWAwWg8VgMVgMFoPF4OLg4uDi4MP5hNf"
    "DBwCgwF+FgvAiqAxvAVRYDMhhDeCErYF02AfohOPpf6WUWl5YKpU3F5SyaCErqxeOsmWRVvZedJRjFgOoT3/VWrG+qSLXRSppXa2y1y2qZN1b1V6P"
    "UW3WEwBfBZ/+RkTChZEEV0U23BwlcE/UhkdHG3hOdACqhd6Vnr4QEdMqxEqbkTjtQZp0NLJO5yCfdAHwuzBWXpCfvjKz8KYsxruzBh/J1vjs7IOvyQ"
    "EgWGSpQigrydM3EVHZTdTlCLGUs4l3uYbElBtAl6JUdUVl0o316buqmh6uFnqmetOrawy9pyaAUbG1GqNtZMK2iz39MDO3M8zTrmbR7R6W0z4Avh"
    "bn6hu6kO/sKn6oP/109/ArPZrf3XP4Z3oDCC6x1RCMnUI5DgnTOC2efkVExt0ie3xGtBlfgNxKSs0dUykPTpM8Nd3y8nz6nZktPz3byO/MDtCktL0"
    "2xXZQM26nNNd2WQtvd7Snf1prvX1H67P9APpeutZ+YDfqJ3eXfmkP67f3jP7J/vRv73303+wDYGgZRx2G46ThPC4ZoeO2kT4+MVqObxtP/40x5vgHM"
    "I8yrc4Tp9O8eIbMW2fa/PhsMb85e5u/Pp/+b875H8VBaBARf9KJAAAAAElFTkSuQmCC"
)
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo")


def line(i: int) -> str:
    return f"{i:05d}" + "".join(f" {WORDS[(i * 7 + k * 3) % len(WORDS)]}{(i * k) % 97}" for k in range(8))


def document(lines: int) -> str:
    return "\n".join([HEADING, *(line(i) for i in range(lines))])


class Weather(BaseModel):
    city: str
    conditions: list[str] = Field(max_length=8)
    humidity: int
    temperature: float


def result(content: list[TextContent | ImageContent], structured: object = None, *,
           error: bool = False) -> CallToolResult:
    """A result with isError only when true, as the Go SDKs write it (the Python SDK's model writes isError
    false by default): the twin's result is then the same JSON value as theirs. Unset fields are None, which
    the SDK leaves out."""
    return CallToolResult.model_construct(content=content, structured_content=structured, is_error=error or None)


def make_server() -> MCPServer:
    server = MCPServer("python-twin")

    @server.tool()
    def read_document(lines: Annotated[int, Field(ge=1, le=5000)] = DEFAULT_LINES) -> CallToolResult:
        """A long field report, line by line."""
        return result([TextContent(type="text", text=document(lines))])

    @server.tool()
    def weather() -> Annotated[CallToolResult, Weather]:
        """Today's weather in Paris."""
        text = json.dumps(WEATHER, separators=(",", ":"))
        return result([TextContent(type="text", text=text)], WEATHER)

    @server.tool()
    def fail() -> CallToolResult:
        """Always fails."""
        return result([TextContent(type="text", text=FAIL_TEXT)], error=True)

    @server.tool()
    def image() -> CallToolResult:
        """A small PNG."""
        return result([ImageContent(type="image", data=IMAGE_PNG, mime_type="image/png")])

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", metavar="HOST:PORT", help="serve streamable HTTP at /mcp instead of stdio")
    args = parser.parse_args()
    server = make_server()
    if not args.http:
        server.run("stdio")
        return
    import uvicorn

    host, _, port = args.http.rpartition(":")
    uvicorn.run(server.streamable_http_app(), host=host, port=int(port), log_level="warning")


if __name__ == "__main__":
    main()
