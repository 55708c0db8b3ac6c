"""A 2026-07-28 MCPServer whose tools, prompt and resource ask the client before they answer (multi round-trip
requests), plus one task-augmented tool (the test tasks extension, tasks_extension.py) and plain tools.

Importable (``make_server()``) or run with ``sys.executable``: stdio by default, streamable HTTP on
127.0.0.1 with ``--http PORT``; ``--steady-seal`` seals every round's state to the same length (see
:class:`SteadySeal`); with ``MRTR_METRICS_FILE`` set, the shim instruments the server (configured by the
``MCP_TOKEN_OTEL_*`` variables) and the URL of its /metrics (on a free port) is written to that file. What each
tool does on the wire:

* ``delete_report(path)``: one elicitation (``Resolve`` + ``Elicit``), then a ~1,000-token report (chars/4):
  an ``input_required`` leg, then the final result.
* ``greet_twice()``: two dependent elicitations, one per round: two ``input_required`` legs.
* ``summarize(topic)``: one sampling request (``Sample``).
* ``confirm_plain(path)``: asks by returning an ``InputRequiredResult`` with no ``requestState`` (the retry
  carries only ``inputResponses``).
* ``wait_ready()``: answers a state-only ``InputRequiredResult`` (``requestState``, no question) once; the
  client retries with the state alone.
* ``big(n)``: n characters, no question (a plain call: its repeats are real repeats).
* ``slow_report(n)``: n characters as a task (``resultType: "task"``) when the client declares the tasks
  extension, else directly.
* prompt ``briefing(topic)`` and resource template ``notes://{name}``: ask by returning an
  ``InputRequiredResult`` themselves (the hand-rolled flow), then answer.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import Context, Elicit, MCPServer, Resolve, Sample
from mcp.server.request_state import AESGCMRequestStateCodec, RequestStateSecurity
from mcp.types import (
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    InputRequiredResult,
    SamplingMessage,
    TextContent,
)
from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tasks_extension import TASK_TOOLS, TasksExtension

#: The report delete_report returns: 4,000 characters, 1,000 tokens under chars/4.
REPORT = ("Deleted. Freed space by directory: " + "/var/data/archive/2019 12.4 GB; " * 200)[:4000]


class Confirm(BaseModel):
    ok: bool


class Name(BaseModel):
    name: str


def ask_confirm(path: str) -> Elicit[Confirm]:
    return Elicit(f"Delete {path}? This cannot be undone.", Confirm)


def ask_name() -> Elicit[Name]:
    return Elicit("Who is asking?", Name)


def ask_sure(who: Annotated[Name, Resolve(ask_name)]) -> Elicit[Confirm]:
    return Elicit(f"Greet {who.name} twice?", Confirm)


def ask_model(topic: str) -> Sample:
    message = SamplingMessage(role="user", content=TextContent(type="text", text=f"Three facts about {topic}."))
    return Sample([message], max_tokens=200)


def _question(key: str, message: str) -> InputRequiredResult:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    request = ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema))
    return InputRequiredResult(input_requests={key: request}, request_state=f"{key}:asked")


def _accepted(ctx: Context, key: str) -> bool | None:
    """The answer to the hand-rolled question ``key``: True/False, None when not answered yet."""
    answer = (ctx.input_responses or {}).get(key)
    if not isinstance(answer, ElicitResult) or ctx.request_state != f"{key}:asked":
        return None
    return answer.action == "accept" and bool((answer.content or {}).get("ok"))


class SteadySeal:
    """The SDK's AES-GCM sealing with the claims' times in whole seconds. The SDK writes ``iat`` and ``exp`` as
    floats, whose length varies from round to round, so a sealed state is a few characters longer or shorter on
    every run; in whole seconds every run of a scenario has the same bytes count, and the paths that measure it
    (the shim's sides, both proxies) can be compared exactly across runs. Expiry comes up to a second early."""

    def __init__(self) -> None:
        self.codec = AESGCMRequestStateCodec([os.urandom(32)])

    def seal(self, payload: bytes) -> str:
        claims = json.loads(payload)
        claims["iat"], claims["exp"] = int(claims["iat"]), int(claims["exp"])
        return self.codec.seal(json.dumps(claims, separators=(",", ":")).encode())

    def unseal(self, token: str) -> bytes:
        return self.codec.unseal(token)


def make_server(steady_seal: bool = False) -> MCPServer:
    security = RequestStateSecurity(codec=SteadySeal()) if steady_seal else None
    server = MCPServer("logical", extensions=[TasksExtension()], request_state_security=security)

    @server.tool()
    def delete_report(path: str, confirm: Annotated[Confirm, Resolve(ask_confirm)]) -> str:
        """Delete a report after the user confirms; returns what was freed."""
        return REPORT if confirm.ok else "Kept."

    @server.tool()
    def greet_twice(sure: Annotated[Confirm, Resolve(ask_sure)]) -> str:
        """Greet the user twice, after asking who they are and whether they are sure."""
        return "Hello! Hello!" if sure.ok else "No greeting."

    @server.tool()
    def summarize(topic: str, reply: Annotated[CreateMessageResult, Resolve(ask_model)]) -> str:
        """Ask the client's model about a topic."""
        content = reply.content
        return f"{topic}: {content.text if isinstance(content, TextContent) else ''}"

    @server.tool()
    def confirm_plain(path: str, ctx: Context) -> str | InputRequiredResult:
        """Archive a file after the user confirms (asked without any request state)."""
        answer = (ctx.input_responses or {}).get("archive")
        if not isinstance(answer, ElicitResult):
            question = _question("archive", f"Archive {path}?")
            return InputRequiredResult(input_requests=question.input_requests)
        return f"Archived {path}." if answer.action == "accept" else "Not archived."

    @server.tool()
    def wait_ready(ctx: Context) -> str | InputRequiredResult:
        """Wait until a resource is ready (one state-only round)."""
        if ctx.request_state != "warming":
            return InputRequiredResult(request_state="warming")
        return "ready"

    @server.tool()
    def big(n: int) -> str:
        """Return n characters of text."""
        return "x" * n

    @server.tool(name=TASK_TOOLS[0])
    def slow_report(n: int) -> str:
        """Return n characters of text, as a task when the client supports tasks."""
        return "y" * n

    @server.prompt()
    def briefing(topic: str, ctx: Context) -> str | InputRequiredResult:
        """A briefing on a topic, after the user confirms the topic."""
        ok = _accepted(ctx, "topic")
        if ok is None:
            return _question("topic", f"Brief on {topic}?")
        return f"Brief me on {topic}." if ok else "No briefing."

    @server.resource("notes://{name}")
    def notes(name: str, ctx: Context) -> str | InputRequiredResult:
        """Private notes, read after the user agrees."""
        ok = _accepted(ctx, "share")
        if ok is None:
            return _question("share", f"Share the notes {name}?")
        return f"notes of {name}: " + "n" * 400 if ok else "withheld"

    return server


#: Unused here: keeps the sampling request types importable for the clients that answer them.
__all__ = ["REPORT", "CreateMessageRequest", "CreateMessageRequestParams", "make_server"]


def _instrument(metrics_file: str) -> None:
    """The shim on this server (before it is built), its /metrics on a free port, the URL written to a file."""
    from mcp_token_otel.instrumentation import instrument, prometheus_service

    os.environ.setdefault("MCP_TOKEN_OTEL_PROMETHEUS_ENABLED", "true")
    os.environ.setdefault("MCP_TOKEN_OTEL_PROMETHEUS_PORT", "0")
    instrument()
    service = prometheus_service()
    Path(metrics_file).write_text(service.server.url if service and service.server else "", encoding="utf-8")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, metavar="PORT", help="streamable HTTP on 127.0.0.1:PORT (else stdio)")
    parser.add_argument("--steady-seal", action="store_true", help="seal every round's state to the same length")
    options = parser.parse_args()
    if os.environ.get("MRTR_METRICS_FILE"):
        _instrument(os.environ["MRTR_METRICS_FILE"])
    # Built from the module by its name, as an importer builds it: the sealed state names the resolvers by
    # module ("mrtr_server:ask_confirm", not "__main__:ask_confirm"), so its length is the same either way.
    from mrtr_server import make_server as make_named

    app = make_named(options.steady_seal)
    if options.http is not None:
        import uvicorn

        uvicorn.run(app.streamable_http_app(), host="127.0.0.1", port=options.http, log_level="warning")
    else:
        app.run()
