"""List what a live MCP server offers, with the official SDK client: tools, resources, resource templates
and prompts (every page), as the wire dicts the server sent.

Used by the ``profile``, ``lock`` and ``check`` commands. mcp 2.x goes through ``mcp.Client`` (initialize
handshake, or the 2026 discovery where the server speaks it: :mod:`.v2`); mcp 1.x through ``ClientSession``
(:mod:`.v1`). Results are read as raw dicts, not SDK models, so fields an SDK version does not model are kept.

Every failure becomes a :class:`DiscoveryError` with a one-line message (the last line the server wrote
on stderr, for a stdio server that died); the whole exchange runs under one timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tempfile
from contextlib import AsyncExitStack
from typing import Any, TextIO

import anyio

from ...core.redact import scrub
from .target import Discovery, DiscoveryError, Fetch, Notes, Target
from .v1 import open_v1
from .v2 import open_v2

__all__ = ["DEFAULT_TIMEOUT", "MAX_PAGES", "Discovery", "DiscoveryError", "Target", "discover"]

logger = logging.getLogger(__name__)

#: More pages than this for one list is taken as a server looping on its cursor.
MAX_PAGES = 1000
DEFAULT_TIMEOUT = 30.0


# (method, key of the items in its result, capability that announces it)
_LISTS = (
    ("tools/list", "tools", "tools"),
    ("resources/list", "resources", "resources"),
    ("resources/templates/list", "resourceTemplates", "resources"),
    ("prompts/list", "prompts", "prompts"),
)
_METHOD_NOT_FOUND = -32601


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
            opener = open_v2 if modern else open_v1
            info, capabilities, fetch = await opener(stack, target, errlog, notes)
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
