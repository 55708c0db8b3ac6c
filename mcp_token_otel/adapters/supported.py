"""Which mcp SDK releases the adapters support, checked before an adapter is imported or anything is hooked.

An adapter is chosen by feature detection (a module only its SDK major has). The installed release must also lie
in that adapter's range and have every SDK attribute the adapter hooks; otherwise nothing is instrumented and one
line says why, naming the installed release and the supported ranges. A release the package metadata does not
name (an SDK copied in without its dist-info) is judged by its hook points alone.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass
from typing import Any

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version


@dataclass(frozen=True, slots=True)
class AdapterSupport:
    """One adapter: its module, the mcp releases it supports and what it needs of them."""

    module: str
    #: The supported releases as a requirement string (``BaseInstrumentor``'s dependency check reads it).
    requirement: str
    #: A module only this SDK major has: the feature detection that picks the adapter.
    marker: str
    #: ``module:attribute`` of every SDK attribute the adapter hooks unconditionally.
    hook_points: tuple[str, ...]


V2 = AdapterSupport(
    module="mcp_token_otel.adapters.mcp_v2",
    requirement="mcp >= 2.0, < 3",
    marker="mcp.shared.dispatcher",
    hook_points=(
        "mcp.server.lowlevel.server:Server.__init__",
        "mcp.client.session:ClientSession.__init__",
        "mcp.client.streamable_http:StreamableHTTPTransport.__init__",
        "mcp.shared.jsonrpc_dispatcher:otel_span",
        "mcp.server.session:ServerSession.send_request",
        "mcp.server.connection:Connection.send_raw_request",
        "mcp.client.stdio:_create_platform_compatible_process",
        "mcp.server.stdio:stdio_server",
        "mcp.server._streamable_http_modern:_tool_input_schema",
        "mcp.shared.jsonrpc_dispatcher:JSONRPCDispatcher._fan_out_closed",
        "mcp.shared.direct_dispatcher:DirectDispatcher.close",
    ),
)

V1 = AdapterSupport(
    module="mcp_token_otel.adapters.mcp_v1",
    requirement="mcp >= 1.20, < 2",
    marker="mcp.shared.session",
    hook_points=(
        "mcp.shared.session:BaseSession.__init__",
        "mcp.shared.session:BaseSession.__aexit__",
        "mcp.shared.session:BaseSession.send_request",
        "mcp.shared.session:BaseSession.send_notification",
        "mcp.shared.session:RequestResponder.__init__",
        "mcp.shared.session:RequestResponder.__enter__",
        "mcp.shared.session:RequestResponder.__exit__",
        "mcp.shared.session:RequestResponder.respond",
        "mcp.server.lowlevel.server:Server._handle_request",
        "mcp.client.streamable_http:StreamableHTTPTransport.__init__",
        "mcp.client.stdio:_create_platform_compatible_process",
        "mcp.server.streamable_http:StreamableHTTPServerTransport.connect",
        "mcp.server.sse:SseServerTransport.connect_sse",
        "mcp.server.stdio:stdio_server",
        "mcp.shared.memory:create_client_server_memory_streams",
    ),
)

#: In the order feature detection tries them.
ADAPTERS = (V2, V1)
#: Every supported release, for messages.
SUPPORTED = " or ".join(adapter.requirement for adapter in reversed(ADAPTERS))
#: What BaseInstrumentor checks when the release is unknown: any supported one.
_ANY_SUPPORTED = "mcp >= 1.20, < 3"


def installed_version() -> str | None:
    """The installed mcp release, from its package metadata; None when there is none."""
    try:
        return importlib.metadata.version("mcp")
    except Exception:  # not installed, or metadata that cannot be read
        return None


def requirement_for(version: str | None) -> str:
    """The range ``BaseInstrumentor`` is to check for this release: that of the adapter for its major (it
    requires every string it is given, so the two ranges cannot both be handed over)."""
    try:
        major = Version(version).major if version is not None else None
    except InvalidVersion:
        major = None
    if major is None:
        return _ANY_SUPPORTED
    return V1.requirement if major < 2 else V2.requirement


def adapter_named(module: str) -> AdapterSupport | None:
    return next((adapter for adapter in ADAPTERS if adapter.module == module), None)


def unsupported(module: str | None, version: str | None) -> str | None:
    """Why the SDK cannot be instrumented by the adapter ``module`` (None: no adapter detected), or None when
    it can."""
    release = f"mcp {version}" if version is not None else "the installed mcp"
    if module is None:
        if version is None:
            return f"no mcp SDK found (supported: {SUPPORTED})"
        return f"{release} is not supported (supported: {SUPPORTED})"
    adapter = adapter_named(module)
    if adapter is None:
        return None
    if version is not None and not _in_range(version, adapter.requirement):
        return f"{release} is not supported (supported: {SUPPORTED})"
    for point in adapter.hook_points:
        missing = _missing(point)
        if missing is not None:
            return f"{release} has no {missing}, which the adapter hooks (supported: {SUPPORTED})"
    return None


def cannot_load(version: str | None, exc: BaseException) -> str:
    """The adapter module failed to import: the SDK lacks a name it imports."""
    release = f"mcp {version}" if version is not None else "the installed mcp"
    detail = f"{type(exc).__name__}: {str(exc).splitlines()[0]}" if str(exc) else type(exc).__name__
    return f"{release} is not supported: the adapter cannot load ({detail}) (supported: {SUPPORTED})"


def _in_range(version: str, requirement: str) -> bool:
    """Pre-releases inside the range count as supported (``< 3`` still excludes 3.0's own pre-releases)."""
    specifier = Requirement(requirement).specifier
    try:
        return specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def _missing(point: str) -> str | None:
    """``point`` as a dotted name when the SDK does not have it, else None."""
    module_name, _, attribute = point.partition(":")
    dotted = f"{module_name}.{attribute}"
    try:
        owner: Any = importlib.import_module(module_name)
    except Exception:
        return module_name
    for part in attribute.split("."):
        try:
            owner = getattr(owner, part)
        except AttributeError:
            return dotted
    return None
