"""Bounded metric label values: the first names admitted keep their own label, later ones share an overflow
value, so a peer can never grow a metric's cardinality without bound. Pure: no I/O."""

from __future__ import annotations

import re
import threading

#: The ``server`` label when no name is known yet (a fault at start-up, a client before its server named itself):
#: never empty, so a dashboard's ``server=~".+"`` keeps the series; an underscore, like the overflow value.
UNKNOWN_SERVER = "_unknown"
#: Distinct method names kept as a metric label; a peer can send arbitrary methods.
MAX_METHODS = 64
#: Methods of the MCP specification: always metric labels (other methods need a successful response first).
SPEC_METHODS = (
    "initialize", "ping", "server/discover", "tools/list", "tools/call", "resources/list", "resources/read",
    "resources/templates/list", "resources/subscribe", "resources/unsubscribe", "prompts/list", "prompts/get",
    "completion/complete", "logging/setLevel", "sampling/createMessage", "elicitation/create", "roots/list",
    "subscriptions/listen", "notifications/initialized", "notifications/cancelled", "notifications/progress",
    "notifications/subscriptions/acknowledged", "notifications/message", "notifications/resources/updated",
    "notifications/resources/list_changed", "notifications/tools/list_changed", "notifications/prompts/list_changed",
    "notifications/roots/list_changed",
)


class NameLimiter:
    """Keeps the first ``limit`` distinct names admitted; other names map to ``overflow`` (bounded cardinality).

    Any name takes a free place while fewer than half are used. Past that, only ``admit=True`` lookups do:
    the recorder admits a name when a response to it succeeds or a server declares it, so a client calling
    tools that do not exist (agents invent tool names) can use up at most half of the places.
    """

    def __init__(self, limit: int, overflow: str) -> None:
        self.limit = limit
        self.overflow = overflow
        self._kept: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, name: str | None, admit: bool = True) -> str | None:
        if name is None or name in self._kept:
            return name
        with self._lock:
            if len(self._kept) < (self.limit if admit else self.limit // 2):
                self._kept.add(name)
                return name
        return self.overflow


#: A version at the end of a server's name: " v1.2.3", "@1.2.3", "-1.2.3-beta.1" (dotted, so "server-2" stays).
_VERSION_SUFFIX = re.compile(r"[\s@/_-]+v?\d+(?:\.\d+)+(?:[-+][0-9A-Za-z.-]+)?$")
_SPACES = re.compile(r"\s+")


def server_label_name(name: str) -> str:
    """The ``server`` label a server's own name (``serverInfo.name``) becomes: without a version suffix, spaces
    as hyphens, lower case, so every path that learns the name (the shim's client and server sides, the proxy,
    ``profile --observed``) labels one server alike whatever release it runs. ``"Everything Server 2.1.0"`` is
    ``everything-server``; a name that is only a version stays as it is."""
    stripped = name.strip()
    bare = _VERSION_SUFFIX.sub("", stripped) or stripped
    return _SPACES.sub("-", bare).lower()
