"""List what a live MCP server offers, with the official SDK client: tools, resources, resource templates
and prompts (every page), as the wire dicts the server sent.

Used by the ``profile``, ``lock`` and ``check`` commands. mcp 2.x goes through ``mcp.Client`` (initialize
handshake, or the 2026 discovery where the server speaks it); mcp 1.x through ``ClientSession``. Results
are read as raw dicts, not SDK models, so fields an SDK version does not model are kept.

Every failure becomes a :class:`DiscoveryError` with a one-line message (the last line the server wrote
on stderr, for a stdio server that died); the whole exchange runs under one timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, TextIO

import anyio

from ..core.redact import header_secrets, redact_url, scrub, secrets_in_text

logger = logging.getLogger(__name__)

#: More pages than this for one list is taken as a server looping on its cursor.
MAX_PAGES = 1000
DEFAULT_TIMEOUT = 30.0


class DiscoveryError(RuntimeError):
    """Connecting to a server or listing what it offers failed; the message is one line."""


@dataclass(frozen=True, slots=True)
class Target:
    """A server to connect to: a streamable HTTP ``url`` (with ``headers``) or a stdio ``command``."""

    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    command: Sequence[str] = ()
    #: Environment of a stdio server; None inherits this process's environment, as a shell would.
    env: Mapping[str, str] | None = None
    cwd: str | None = None

    def __post_init__(self) -> None:
        if (self.url is None) == (not self.command):
            raise ValueError("a target is either a url or a stdio command")

    @property
    def label(self) -> str:
        """The target in messages: a URL without its credentials, or the command line."""
        return redact_url(self.url) if self.url is not None else " ".join(self.command)

    def secrets(self) -> set[str]:
        """What must never be shown: the URL's credentials, credential headers' values (and the command's URLs')."""
        found = secrets_in_text(self.url or " ".join(self.command))
        for name, value in self.headers.items():
            found |= header_secrets(f"{name}: {value}")
        return found


@dataclass(frozen=True, slots=True)
class Discovery:
    """What one server lists, in the order it listed it."""

    server_name: str
    server_version: str
    protocol_version: str
    tools: tuple[dict[str, Any], ...] = ()
    resources: tuple[dict[str, Any], ...] = ()
    resource_templates: tuple[dict[str, Any], ...] = ()
    prompts: tuple[dict[str, Any], ...] = ()


# (method, key of the items in its result, capability that announces it)
_LISTS = (
    ("tools/list", "tools", "tools"),
    ("resources/list", "resources", "resources"),
    ("resources/templates/list", "resourceTemplates", "resources"),
    ("prompts/list", "prompts", "prompts"),
)
_METHOD_NOT_FOUND = -32601

@dataclass(slots=True)
class Notes:
    """What the transports saw that the SDK's errors leave out: the last HTTP error status."""

    http_status: int | None = None

    async def on_response(self, response: Any) -> None:  # an httpx event hook
        if response.status_code >= 400:
            self.http_status = response.status_code


#: A page fetcher: (method, cursor) -> the raw result dict.
Fetch = Callable[[str, str | None], Awaitable[dict[str, Any]]]


def discover(target: Target, *, timeout: float = DEFAULT_TIMEOUT) -> Discovery:
    """Connect, handshake, list everything (following pagination) and disconnect."""
    if not timeout > 0:
        raise DiscoveryError(f"timeout must be a positive number of seconds, got {timeout!r}")
    notes = Notes()
    stdout_lines = StrayLines()
    sdk_logger = logging.getLogger("mcp.client.stdio")
    sdk_logger.addFilter(stdout_lines)
    try:
        with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as errlog:
            try:
                found = anyio.run(_discover, target, timeout, errlog, notes)
            except DiscoveryError as exc:
                raise DiscoveryError(scrub(str(exc), target.secrets())) from None
            except BaseException as exc:  # every failure becomes one line
                if isinstance(exc, KeyboardInterrupt | SystemExit):
                    raise
                message = _describe(exc, target, timeout, errlog, notes) + stdout_lines.describe(" (", ")")
                raise DiscoveryError(scrub(message, target.secrets())) from None
    finally:
        sdk_logger.removeFilter(stdout_lines)
    if stdout_lines.first is not None:
        logger.warning("warning: %s%s", target.label, stdout_lines.describe(": ", "; ignored"))
    return found


class StrayLines(logging.Filter):
    """Lines a stdio server wrote on stdout that are not JSON-RPC (a banner, a print): the SDK logs a traceback
    for each and goes on; kept here instead, the first named in one line."""

    def __init__(self) -> None:
        super().__init__()
        self.first: str | None = None
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not record.getMessage().startswith("Failed to parse JSONRPC message") or error is None:
            return True
        self.count += 1
        if self.first is None:
            self.first = _offending_line(error)
        return False

    def describe(self, before: str, after: str) -> str:
        if self.first is None:
            return ""
        more = f" (and {self.count - 1} more)" if self.count > 1 else ""
        return f"{before}the server wrote a line that is not JSON-RPC on stdout: {self.first!r}{more}{after}"


def _offending_line(error: BaseException) -> str:
    """The line the SDK could not parse, from its pydantic error (the input it was given), cut to 120 chars."""
    errors = getattr(error, "errors", None)
    line: Any = None
    with contextlib.suppress(Exception):
        line = errors()[0].get("input") if callable(errors) else None
    text = line if isinstance(line, str) else json.dumps(line) if line is not None else str(error)
    text = text.strip().splitlines()[0] if text.strip() else text
    return text if len(text) <= 120 else text[:120] + "..."


async def _discover(target: Target, timeout: float, errlog: TextIO, notes: Notes) -> Discovery:
    with anyio.fail_after(timeout):
        async with AsyncExitStack() as stack:
            try:
                import mcp

                modern = hasattr(mcp, "Client")
            except ImportError as exc:  # pragma: no cover - mcp is a dependency
                raise DiscoveryError(f"the mcp package is not installed: {exc}") from None
            if modern:
                info, capabilities, fetch = await _open_v2(stack, target, errlog, notes)
            else:
                from .discovery_v1 import open_v1

                info, capabilities, fetch = await open_v1(stack, target, errlog, notes)
            lists: dict[str, tuple[dict[str, Any], ...]] = {}
            for method, key, capability in _LISTS:
                announced = capabilities.get(capability) is not None
                lists[key] = tuple(await _list_all(fetch, method, key)) if announced else ()
            return Discovery(
                server_name=str(info.get("name", "")),
                server_version=str(info.get("version", "")),
                protocol_version=str(info.get("protocolVersion", "")),
                tools=lists["tools"],
                resources=lists["resources"],
                resource_templates=lists["resourceTemplates"],
                prompts=lists["prompts"],
            )


async def _list_all(fetch: Fetch, method: str, key: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    seen: set[str] = set()
    for _ in range(MAX_PAGES):
        try:
            page = await fetch(method, cursor)
        except Exception as exc:
            if getattr(getattr(exc, "error", None), "code", getattr(exc, "code", None)) == _METHOD_NOT_FOUND:
                return items  # announced but not served: nothing to list
            raise
        batch = page.get(key)
        if not isinstance(batch, list):
            raise DiscoveryError(f"{method}: the result has no '{key}' array")
        items.extend(item for item in batch if isinstance(item, dict))
        cursor = page.get("nextCursor")
        if not cursor:
            return items
        if cursor in seen:
            raise DiscoveryError(f"{method}: the server repeated the cursor {cursor!r}")
        seen.add(cursor)
    raise DiscoveryError(f"{method}: more than {MAX_PAGES} pages")


def stdio_params(params_type: Any, target: Target) -> Any:
    command, *args = target.command
    env = dict(os.environ) if target.env is None else dict(target.env)
    return params_type(command=command, args=list(args), env=env, cwd=target.cwd)


async def _open_v2(
    stack: AsyncExitStack, target: Target, errlog: TextIO, notes: Notes
) -> tuple[dict[str, Any], dict[str, Any], Fetch]:
    from mcp import Client, types
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    from pydantic import TypeAdapter

    if target.url is not None:
        http = await stack.enter_async_context(create_mcp_http_client(headers=dict(target.headers)))
        http.event_hooks["response"].append(notes.on_response)
        transport: Any = streamable_http_client(target.url, http_client=http)
    else:
        transport = stdio_client(stdio_params(StdioServerParameters, target), errlog=errlog)
    # No response cache: every page comes from the server.
    client = await stack.enter_async_context(Client(transport, cache=None))
    # Every field the server sent, as a plain dict (the SDK's annotation asks for a model; any type validates).
    raw: TypeAdapter[Any] = TypeAdapter(dict[str, Any])
    requests = {
        "tools/list": types.ListToolsRequest,
        "resources/list": types.ListResourcesRequest,
        "resources/templates/list": types.ListResourceTemplatesRequest,
        "prompts/list": types.ListPromptsRequest,
    }

    async def fetch(method: str, cursor: str | None) -> dict[str, Any]:
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        return await client.session.send_request(requests[method](params=params), raw)

    info = client.server_info
    server = info.model_dump(by_alias=True, exclude_none=True) if info is not None else {}
    server["protocolVersion"] = client.protocol_version
    caps = client.server_capabilities.model_dump(by_alias=True, exclude_none=True)
    return server, caps, fetch


def _leaves(exc: BaseException) -> list[BaseException]:
    subs = getattr(exc, "exceptions", None)  # an exception group (builtin on 3.11+, a backport on 3.10)
    if isinstance(subs, tuple | list) and subs and all(isinstance(e, BaseException) for e in subs):
        return [leaf for sub in subs for leaf in _leaves(sub)]
    return [exc]


def _describe(exc: BaseException, target: Target, timeout: float, errlog: TextIO, notes: Notes) -> str:
    leaves = [e for e in _leaves(exc) if not isinstance(e, asyncio.CancelledError)] or _leaves(exc)
    leaf = next((e for e in leaves if isinstance(e, DiscoveryError)), leaves[0])
    if isinstance(leaf, TimeoutError):
        message = f"no complete answer from {target.label} within {timeout:g} s"
    elif isinstance(leaf, FileNotFoundError | PermissionError) and target.command:
        message = f"cannot start {target.command[0]!r}: {leaf.strerror or leaf}"
    else:
        text = str(leaf).strip() or type(leaf).__name__
        message = f"{target.label}: {text.splitlines()[0]}"
        code = getattr(getattr(leaf, "error", None), "code", None)
        if isinstance(code, int):
            message += f" (error {code})"
    if notes.http_status is not None:
        message += f" (HTTP {notes.http_status})"
    tail = _stderr_tail(errlog)
    if tail:
        message += f" (server stderr: {tail})"
    return message


def _stderr_tail(errlog: TextIO, limit: int = 200) -> str:
    try:
        errlog.flush()
        errlog.seek(0)
        lines = [line.strip() for line in errlog.read()[-8192:].splitlines() if line.strip()]
    except (OSError, ValueError):
        return ""
    return lines[-1][:limit] if lines else ""
