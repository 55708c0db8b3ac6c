"""Bounded metric labels: tool, method and server names past their limits share an overflow value.

The ``server`` label of a series comes from, in order: ``metrics.server_name`` (one name for everything), the proxy's
``--name``, the adapter's own knowledge (the server side knows its name), what the session learnt (an initialize
result's ``serverInfo.name``, the serverInfo stamp of a 2026-07-28 result), then a fallback (the proxy's name from
its command line). A server's own name is normalized (:func:`~mcp_token_otel.core.labels.server_label_name`), a
name the user gave is taken as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..config import MetricsConfig
from ..core.labels import MAX_METHODS, SPEC_METHODS, UNKNOWN_SERVER, NameLimiter, server_label_name

if TYPE_CHECKING:
    from .ledger import SessionMeta


class LabelBounds:
    """The bounded tool, method and server labels of every metric point."""

    def __init__(self, config: MetricsConfig, default_server: str, fault: Callable[[str], None],
                 fallback_server: str = "") -> None:
        overflow = config.overflow_tool_name
        self.tool_names = NameLimiter(config.max_tool_names, overflow)
        self.server_names = NameLimiter(config.max_server_names, overflow)
        self.method_names = NameLimiter(MAX_METHODS + len(SPEC_METHODS), overflow)
        for spec_method in SPEC_METHODS:
            self.method_names(spec_method)
        #: metrics.server_name: one name for every series, whatever the sessions say.
        self.override = config.server_name or None
        #: A name the user gave (the proxy's --name): before anything the server says.
        self.default_server = default_server
        #: The name until a server names itself (a proxy's, from its command line; "_unknown" when it has none).
        self.fallback_server = fallback_server
        #: The first name a server gave itself in this process (a proxy fronts one server): for the series that
        #: belong to no session.
        self.learned: str | None = None
        self._normalized: dict[str, str] = {}
        self._fault = fault

    def own_name(self, name: str) -> str:
        """A server's own name as its label (normalized once per name)."""
        found = self._normalized.get(name)
        if found is None:
            if len(self._normalized) >= 1024:
                self._normalized.clear()
            found = self._normalized[name] = server_label_name(name)
        return found

    def learn(self, name: str) -> str:
        """A server named itself: its label (kept as this process's server for sessionless series the first time)."""
        label = self.own_name(name)
        if self.learned is None:
            self.learned = label
        return label

    def server(self, meta: SessionMeta | None, server: str | None = None) -> str:
        """The bounded ``server`` label: config override, the proxy's --name, the adapter's, the session's, the
        fallback."""
        name = self.override or self.default_server
        if not name:
            if server:
                name = self.own_name(server)
            elif meta is not None:
                # A proxy fronts one server: a session that has not named it (a 2026 request on its own) has the
                # name another session learnt.
                name = self.own_name(meta.server) if meta.server is not None else self._sessionless()
            else:
                name = self._sessionless()
        if not name:
            return UNKNOWN_SERVER
        try:
            return self.server_names(name) or UNKNOWN_SERVER
        except Exception:
            self._fault("metrics")
            return UNKNOWN_SERVER

    def _sessionless(self) -> str:
        """The name of what belongs to no session: a proxy's (it fronts one server, and has a fallback name) is
        the first name its server gave; a shim's, which may talk to many servers, none."""
        if self.fallback_server:
            return self.learned or self.fallback_server
        return ""

    def awaits_name(self, meta: SessionMeta | None, server: str | None) -> bool:
        """Whether a session's label waits for its server to name itself (nothing given names it yet); without
        a session, whether a proxy's does (no session has named it yet)."""
        if self.override or self.default_server or server:
            return False
        if meta is None:
            return bool(self.fallback_server) and self.learned is None
        return meta.server is None

    def fault_server(self) -> str:
        """The label of what belongs to no session (a fault, the configured budgets, the proxy's own counts): like
        :meth:`server` with no session, but never reports a fault, since its own faults would come back here."""
        try:
            name = self.override or self.default_server or self._sessionless()
            return (self.server_names(name) or UNKNOWN_SERVER) if name else UNKNOWN_SERVER
        except Exception:
            return UNKNOWN_SERVER
