"""Facts of the MCP protocol that every path (both SDK adapters, the proxy) needs, stated once.

What a 2026-07-28 message carries in its ``_meta``, which protocol versions are sessionless and shape their
results with a ``resultType``, the wire form of an SDK model and how a changed wire dict goes back into the
model the caller expects. Pure: no SDK import (models are handled by duck typing, as pydantic models).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Where a 2026-07-28 request names its protocol version (sessionless: no initialize tells it).
PROTOCOL_VERSION_META_KEY = "io.modelcontextprotocol/protocolVersion"
#: ... its client (what initialize's clientInfo told before).
CLIENT_INFO_META_KEY = "io.modelcontextprotocol/clientInfo"
#: Where a 2026-07-28 server stamps its identity on results (server/discover's first).
SERVER_INFO_META_KEY = "io.modelcontextprotocol/serverInfo"
#: The first protocol version: sessionless, every result carrying its ``resultType``. Versions are dates, so
#: they compare as strings; every later version keeps both properties.
MODERN_SINCE = "2026-07-28"


def is_modern(version: Any) -> bool:
    """Whether ``version`` is 2026-07-28 or later (no sessions; results carry ``resultType``)."""
    return isinstance(version, str) and version >= MODERN_SINCE


def meta_of(params: Any) -> Mapping[str, Any] | None:
    """A request's (or result's) ``_meta`` mapping, or None."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta if isinstance(meta, dict) else None


def request_version(params: Any) -> str | None:
    """The protocol version a 2026-07-28 request carries in its ``_meta`` (server/discover's before it is
    negotiated), else None."""
    meta = meta_of(params)
    version = meta.get(PROTOCOL_VERSION_META_KEY) if meta is not None else None
    return version if isinstance(version, str) else None


def shaped_result(result: dict[str, Any], version: Any) -> dict[str, Any]:
    """``result`` shaped as the negotiated protocol shapes a result: a 2026-era result carries its
    ``resultType``. For answers this project writes itself (a guard's refusal): the server would have added it."""
    if is_modern(version) and "resultType" not in result:
        return {**result, "resultType": "complete"}
    return result


def server_info_name(result: Any) -> str | None:
    """The server's name a result tells: ``serverInfo.name`` of an initialize result, else the serverInfo stamp
    in a 2026-07-28 result's ``_meta`` (wire dict or model)."""
    if isinstance(result, (dict, Mapping)):
        info = result.get("serverInfo")
        if info is None:
            meta = result.get("_meta")
            info = meta.get(SERVER_INFO_META_KEY) if isinstance(meta, (dict, Mapping)) else None
    else:
        info = getattr(result, "server_info", None)
    name = info.get("name") if isinstance(info, (dict, Mapping)) else getattr(info, "name", None)
    return name if isinstance(name, str) and name else None


def wire_dict(model: Any) -> Any:
    """The wire form of an SDK model (what the SDK itself serializes: camelCase, no None); other values as
    they are."""
    dump = getattr(model, "model_dump", None)
    return dump(by_alias=True, mode="json", exclude_none=True) if callable(dump) else model


def revalidated(original: Any, changed: Any) -> Any:
    """``changed`` (a wire dict a guard returned in place of ``original``'s) in the shape the caller expects:
    the dict itself when ``original`` was a dict, else validated into ``original``'s model type. A model that
    wraps a union (mcp 1.x's ``ServerResult(root=...)``) is validated into the member it already holds. Raises
    when the dict does not fit the model: the caller counts it and hands on ``original``."""
    if isinstance(original, (dict, Mapping)):
        return changed
    root = getattr(original, "root", None)
    if root is not None and callable(getattr(root, "model_validate", None)):
        return type(original)(type(root).model_validate(changed))
    return type(original).model_validate(changed, by_name=False)
