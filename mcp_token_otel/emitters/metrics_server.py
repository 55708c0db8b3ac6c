"""Serve a prometheus-client registry on ``/metrics``: a standalone server or an app to mount.

Standalone: ``MetricsServer.start(host, port, registry)``, a daemon-thread WSGI server (threaded, so a
slow scrape never blocks another), optionally over TLS and behind HTTP basic auth. Mounted: the WSGI
and ASGI apps below, with the same optional basic auth. The content type (Prometheus text or
OpenMetrics, which carries exemplars) follows the scraper's ``Accept`` header.
"""

from __future__ import annotations

import base64
import hmac
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_asgi_app, make_wsgi_app

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
AsgiApp = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]

_CHALLENGE = b'Basic realm="mcp-token-otel metrics"'


@dataclass(frozen=True)
class BasicAuth:
    username: str
    password: str

    def allows(self, header: str | None) -> bool:
        """True when an ``Authorization`` header carries these credentials (constant-time compare)."""
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        user_ok = hmac.compare_digest(user.encode(), self.username.encode())
        return hmac.compare_digest(password.encode(), self.password.encode()) and user_ok


def metrics_wsgi_app(registry: CollectorRegistry, auth: BasicAuth | None = None) -> WsgiApp:
    """A WSGI app serving ``registry``; with ``auth``, requests without the credentials get 401."""
    app = make_wsgi_app(registry)
    if auth is None:
        return app

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if not auth.allows(environ.get("HTTP_AUTHORIZATION")):
            start_response("401 Unauthorized", [("WWW-Authenticate", _CHALLENGE.decode())])
            return [b"unauthorized\n"]
        return app(environ, start_response)

    return guarded


def metrics_asgi_app(registry: CollectorRegistry, auth: BasicAuth | None = None) -> AsgiApp:
    """An ASGI app serving ``registry`` (mount it at /metrics in Starlette, FastAPI...)."""
    app = make_asgi_app(registry)
    if auth is None:
        return app

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            headers = dict(scope.get("headers") or [])
            header = headers.get(b"authorization")
            if not auth.allows(header.decode("latin-1") if header else None):
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"www-authenticate", _CHALLENGE)]})
                await send({"type": "http.response.body", "body": b"unauthorized\n"})
                return
        await app(scope, receive, send)

    return guarded


#: Seconds a client may take for the TLS handshake or to send its request.
CLIENT_TIMEOUT = 10.0


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def finish_request(self, request: Any, client_address: Any) -> None:
        # Runs in the connection's own thread: a TLS handshake here (not in accept()) cannot stall other
        # scrapes, and the timeout bounds a client that connects and never speaks.
        request.settimeout(CLIENT_TIMEOUT)
        if isinstance(request, ssl.SSLSocket):
            request.do_handshake()
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hangs up or fails the handshake is its own problem, not worth a traceback


class _QuietHandler(WSGIRequestHandler):
    timeout = CLIENT_TIMEOUT

    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not worth a log line each
        pass


class MetricsServer:
    """A running ``/metrics`` server; ``close()`` stops it."""

    def __init__(self, httpd: WSGIServer, thread: threading.Thread, scheme: str) -> None:
        self._httpd = httpd
        self._thread = thread
        self.host, self.port = httpd.server_address[:2]
        self.url = f"{scheme}://{self.host}:{self.port}/metrics"

    @classmethod
    def start(
        cls,
        host: str,
        port: int,
        registry: CollectorRegistry,
        *,
        auth: BasicAuth | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
    ) -> MetricsServer:
        """Listen on host:port (0 picks a free port) in a daemon thread."""
        httpd = make_server(host, port, metrics_wsgi_app(registry, auth), _ThreadingServer, _QuietHandler)
        scheme = "http"
        if tls_cert_file:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(tls_cert_file, tls_key_file)
            httpd.socket = context.wrap_socket(httpd.socket, server_side=True, do_handshake_on_connect=False)
            scheme = "https"
        thread = threading.Thread(target=httpd.serve_forever, name="mcp-token-otel-metrics", daemon=True)
        thread.start()
        return cls(httpd, thread, scheme)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
