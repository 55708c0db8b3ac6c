"""The ``resources`` capability a server must declare for clients to read spills, added where it lacks one.

A client reads a kept result with ``resources/read``, which a client only sends to a server that declared the
``resources`` capability (in its ``initialize`` or ``server/discover`` result). Whoever answers spill reads (the
server-side shim, a proxy) adds an empty ``resources`` capability when the server declared none; it then also
answers the listing requests such a client may send on seeing it, with empty lists, since the server behind it
has no resources to list.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..protocol import is_modern

#: Results that carry a server's capabilities.
CAPABILITY_METHODS = frozenset({"initialize", "server/discover"})
#: The listing requests answered (empty) for a server that declared no resources, and the key of their list.
LISTINGS: Mapping[str, str] = {"resources/list": "resources", "resources/templates/list": "resourceTemplates"}


def with_resources_capability(result: Any) -> tuple[Any, bool]:
    """``result`` (an initialize or server/discover result) with ``capabilities.resources`` added when absent:
    (the result, whether it was added). Anything without a capabilities object is returned as it is."""
    if not isinstance(result, Mapping):
        return result, False
    capabilities = result.get("capabilities")
    if not isinstance(capabilities, Mapping) or "resources" in capabilities:
        return result, False
    return {**result, "capabilities": {**capabilities, "resources": {}}}, True


def empty_listing(method: str, protocol_version: str | None = None) -> dict[str, Any] | None:
    """The answer to a listing request for a server that declared no resources (None: not a listing), shaped for
    ``protocol_version`` (2026-07-28 listings say how they may be cached: this one, for this client alone)."""
    key = LISTINGS.get(method)
    if key is None:
        return None
    if is_modern(protocol_version):
        return {key: [], "resultType": "complete", "cacheScope": "private", "ttlMs": 0}
    return {key: []}
