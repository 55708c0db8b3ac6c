"""Bounded metric labels: tool, method and server names past their limits share an overflow value.

The ``server`` label of a series comes from, in order: ``metrics.server_name`` (one name for everything), the
adapter's own knowledge (the server side knows its name), the proxy's ``--name``, then what the session learnt
(an initialize result's ``serverInfo.name``, the serverInfo stamp of a 2026-07-28 result).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..config import MetricsConfig
from ..core.labels import MAX_METHODS, SPEC_METHODS, UNKNOWN_SERVER, NameLimiter

if TYPE_CHECKING:
    from .ledger import SessionMeta


class LabelBounds:
    """The bounded tool, method and server labels of every metric point."""

    def __init__(self, config: MetricsConfig, default_server: str, fault: Callable[[str], None]) -> None:
        overflow = config.overflow_tool_name
        self.tool_names = NameLimiter(config.max_tool_names, overflow)
        self.server_names = NameLimiter(config.max_server_names, overflow)
        self.method_names = NameLimiter(MAX_METHODS + len(SPEC_METHODS), overflow)
        for spec_method in SPEC_METHODS:
            self.method_names(spec_method)
        #: metrics.server_name: one name for every series, whatever the sessions say.
        self.override = config.server_name or None
        #: The name when nothing more specific is known (the proxy's --name).
        self.default_server = default_server
        self._fault = fault

    def server(self, meta: SessionMeta | None, server: str | None = None) -> str:
        """The bounded ``server`` label: config override, then the adapter's, the proxy's --name, the session's."""
        name = self.override or server or self.default_server or (meta.server if meta is not None else None)
        if not name:
            return UNKNOWN_SERVER
        try:
            return self.server_names(name) or UNKNOWN_SERVER
        except Exception:
            self._fault("metrics")
            return UNKNOWN_SERVER

    def fault_server(self) -> str:
        """The label a fault carries (it has no session): like :meth:`server` but never reports a fault, since
        its own faults would come back here."""
        try:
            name = self.override or self.default_server
            return (self.server_names(name) or UNKNOWN_SERVER) if name else UNKNOWN_SERVER
        except Exception:
            return UNKNOWN_SERVER
