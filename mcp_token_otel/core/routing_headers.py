"""The streamable-HTTP request headers that mirror the body since protocol 2026-07-28: ``Mcp-Method`` (every
request), ``Mcp-Name`` (a ``tools/call`` or ``prompts/get`` name, a ``resources/read`` uri, a ``tasks/*`` task id)
and ``MCP-Protocol-Version``. They say what a request is before its body is read, and a request whose headers
disagree with its body is one a conforming server rejects (``-32020``, HeaderMismatch).

A value that is not plain printable ASCII travels as ``=?base64?<UTF-8 in base64>?=``; a malformed one decodes
to nothing, so it never matches. Only a tool or prompt name may become a label (:attr:`Routing.label_name`):
a uri or a task id is unbounded, and a task id may be a bearer token.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MCP_METHOD, MCP_NAME, MCP_PROTOCOL_VERSION = "mcp-method", "mcp-name", "mcp-protocol-version"
#: The headers compared with the body, in the order they are checked.
ROUTING_HEADERS = (MCP_PROTOCOL_VERSION, MCP_METHOD, MCP_NAME)
#: The body parameter ``Mcp-Name`` mirrors, per method (the tasks extension requires it for its requests).
NAME_PARAMS: dict[str, str] = {
    "tools/call": "name", "prompts/get": "name", "resources/read": "uri",
    "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId",
}
#: Methods whose Mcp-Name is a bounded kind of name (a tool's, a prompt's): the only ones usable as a label.
LABEL_METHODS = frozenset({"tools/call", "prompts/get"})
#: The first protocol version that requires the headers (versions are dates: they compare as strings).
HEADERS_SINCE = "2026-07-28"
PROTOCOL_META_KEY = "io.modelcontextprotocol/protocolVersion"

_SENTINEL = re.compile(r"=\?base64\?(.*)\?=")


def decode_header_value(value: str | None) -> str | None:
    """A header value as sent: plain, or the base64 sentinel decoded; None when absent or malformed (not
    canonical base64, not UTF-8)."""
    if value is None:
        return None
    match = _SENTINEL.fullmatch(value)
    if match is None:
        return value
    payload = match.group(1)
    try:
        raw = base64.b64decode(payload, validate=True)
        if base64.b64encode(raw).decode("ascii") != payload:  # only the canonical form a client writes
            return None
        return raw.decode("utf-8")
    except (binascii.Error, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class Routing:
    """What a request's headers say (lower-case header names in, values as sent)."""

    method: str | None
    #: Mcp-Name decoded; None when absent or malformed.
    name: str | None
    protocol_version: str | None
    #: An Mcp-Name was sent but does not decode.
    malformed_name: bool = False

    @property
    def present(self) -> bool:
        return self.method is not None or self.name is not None or self.protocol_version is not None

    @property
    def label_name(self) -> str | None:
        """The tool or prompt the headers name (a label before the body is read); None for any other method."""
        return self.name if self.method in LABEL_METHODS else None


def routing(headers: Mapping[str, str]) -> Routing:
    """The routing headers of a request (``headers`` keyed by lower-case name)."""
    raw_name = headers.get(MCP_NAME)
    name = decode_header_value(raw_name)
    return Routing(headers.get(MCP_METHOD), name, headers.get(MCP_PROTOCOL_VERSION),
                   raw_name is not None and name is None)


def mismatches(route: Routing, message: Any) -> tuple[str, ...]:
    """The headers that disagree with a JSON-RPC request's body, as a conforming 2026-07-28 server checks them:
    the protocol version against ``_meta``'s, ``Mcp-Method`` against ``method`` (required), ``Mcp-Name`` against
    the parameter it mirrors (required when the body has it). Nothing is checked for a request of an earlier
    protocol, a notification, or what is not a request."""
    if not isinstance(message, Mapping) or "id" not in message or not isinstance(message.get("method"), str):
        return ()
    method: str = message["method"]
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    body_version = meta.get(PROTOCOL_META_KEY) if isinstance(meta, Mapping) else None
    version = body_version if isinstance(body_version, str) else route.protocol_version
    if not isinstance(version, str) or version < HEADERS_SINCE:
        return ()
    found: list[str] = []
    if isinstance(body_version, str) and route.protocol_version != body_version:
        found.append(MCP_PROTOCOL_VERSION)
    if route.method != method:
        found.append(MCP_METHOD)
    key = NAME_PARAMS.get(method)
    value = params.get(key) if key is not None and isinstance(params, Mapping) else None
    if value is not None and (route.malformed_name or route.name != value):
        found.append(MCP_NAME)
    return tuple(found)
