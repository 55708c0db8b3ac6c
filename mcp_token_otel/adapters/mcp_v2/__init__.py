"""mcp 2.x hooks (verified against mcp 2.0-2.3; see docs/instrumentation.md).

- ``server``: a middleware appended to every ``Server.middleware`` list (``Server.__init__`` is wrapped, and
  ``instrument_server`` covers servers built earlier), and the requests a server sends;
- ``client``: each ``ClientSession``'s dispatcher behind a proxy;
- ``sessions``: who a served request's client is (its budget key);
- ``context``: what the hooks pass along in the running task;
- ``hooks``: the patches and their removal.
Every path measures through the recorder's :class:`~mcp_token_otel.recorder.Call`.
"""

from ...recorder import TokenRecorder
from .._common import installed
from .client import DispatcherProxy
from .hooks import V2Shim
from .server import TokenMiddleware


def install(recorder: TokenRecorder) -> V2Shim:
    """Hook mcp 2.x for ``recorder``; all or nothing. The caller owns the shim: its ``uninstall()`` restores the
    SDK, its ``instrument_server(server)`` adds a server built earlier."""
    return installed(V2Shim(recorder))


__all__ = ["DispatcherProxy", "TokenMiddleware", "V2Shim", "install"]
