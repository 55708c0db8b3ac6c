"""Serve a prometheus-client registry on ``/metrics``: a standalone server or an app to mount.

Standalone: ``MetricsServer.start(host, port, registry)`` (IPv4 or IPv6), optionally over TLS and behind
HTTP basic auth. Mounted: the WSGI and ASGI apps below, with the same optional basic auth. The content
type (Prometheus text or OpenMetrics, which carries exemplars) follows the scraper's ``Accept`` header.

The standalone server is built to stay cheap under load and abuse. One thread accepts connections and
reads request heads without blocking (a selector; heads parsed by llhttp, the ``httptools`` parser), so a
client that connects and drips its headers holds a socket, not a thread; a complete request head goes to a
fixed pool of worker threads that get the response and write it in one ``sendall``. A request body is never
read (a scrape has none): a client that dribbles one holds no worker, its answer is sent and the connection
closed. Every response closes its connection (``Connection: close``): a request pipelined behind the first
is not answered, and the client sends it again on a new connection. Renderings are shared (see
:class:`~.shared_renders.SingleFlight`): scrapes that arrive together share one, and while other clients
wait for an answer a rendering under ``render_max_age`` seconds old is reused, so 50 scrapers back to back
cost about two renderings a second, not one per scrape; a scrape on an otherwise idle server always renders
afresh. Every connection has a deadline for its TLS handshake and whole request head (``request_timeout``);
past ``max_connections`` open connections new ones get an immediate 503 and are closed; a malformed request
gets a 400, a head over 16 KiB a 431, and the server then reads and discards what the client still sends
until it closes or its deadline passes (closing at once would reset the connection before the client could
read the answer). The listen backlog is sized for bursts of scrapers. Threads: one plus ``workers``,
whatever the clients do.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import gzip
import hmac
import io
import os
import queue
import selectors
import socket
import ssl
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, make_asgi_app, make_wsgi_app

from .request_head import BAD_REQUEST, SERVER_ERROR, RequestHead, environ_from
from .shared_renders import SingleFlight, WsgiApp

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


#: What PrometheusMetrics.exposition renders (the classic text format).
_TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"


def _fast_text(app: WsgiApp, render: Callable[[], bytes]) -> WsgiApp:
    """Plain-text scrapes rendered by ``render`` (PrometheusMetrics.exposition: same samples, several times
    faster); OpenMetrics (exemplars) and ``name[]``-filtered scrapes keep prometheus-client's encoder."""

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        accept = environ.get("HTTP_ACCEPT", "")
        if (
            "application/openmetrics-text" in accept
            or "name[]" in environ.get("QUERY_STRING", "")
            or environ.get("REQUEST_METHOD", "GET") != "GET"  # prometheus-client answers the others (405...)
        ):
            return app(environ, start_response)
        body = render()
        headers = [("Content-Type", _TEXT_0_0_4)]
        if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
            body = gzip.compress(body, compresslevel=1)
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Content-Length", str(len(body))))
        start_response("200 OK", headers)
        return [body]

    return serve


def metrics_wsgi_app(
    registry: CollectorRegistry, auth: BasicAuth | None = None, render: Callable[[], bytes] | None = None
) -> WsgiApp:
    """A WSGI app serving ``registry``; with ``auth``, requests without the credentials get 401; with
    ``render``, plain-text scrapes are that function's bytes (see :func:`_fast_text`)."""
    app = make_wsgi_app(registry)
    if render is not None:
        app = _fast_text(app, render)
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


#: Seconds a client has for the TLS handshake and its whole request head (prometheus.request_timeout_seconds).
DEFAULT_REQUEST_TIMEOUT = 5.0
#: Open connections at most (prometheus.max_connections); beyond, new ones get a 503 at once.
DEFAULT_MAX_CONNECTIONS = 512
#: Threads answering complete requests. Scrapes that arrive while one renders wait for and share that
#: render (see SingleFlight), so a worker mostly waits; 16 let a burst of 50 scrapers share few renders.
DEFAULT_WORKERS = 16
#: Seconds a finished rendering may be reused by scrapes arriving while other clients wait for an answer
#: (prometheus.render_max_age_seconds). Prometheus scrapes every 15 s or so: a render under a second old is
#: current for it, and a burst of scrapers then costs one rendering a second instead of one per wave.
DEFAULT_RENDER_MAX_AGE = 1.0
#: Pending connections the kernel queues before accept(): the standard library's 5 overflowed under 50
#: parallel scrapers (each overflow costs the client a 1 s SYN retry).
LISTEN_BACKLOG = 1024
#: Bytes read and discarded after refusing a request, at most.
_MAX_DISCARD = 1 << 20
_REFUSAL = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"


def tls_context(cert_file: str, key_file: str | None) -> ssl.SSLContext:
    """A server TLS context; errors name the file that could not be read or used."""
    key_path = key_file or cert_file
    texts = {}
    for what, path in (("certificate", cert_file), ("key", key_path)):
        try:
            with open(path, "rb") as f:
                texts[what] = f.read(1 << 20)
        except OSError as exc:
            raise ValueError(f"cannot read TLS {what} file {path!r}: {exc.strerror or exc}") from None
    if b"-----BEGIN CERTIFICATE-----" not in texts["certificate"]:
        raise ValueError(f"TLS certificate file {cert_file!r} holds no PEM certificate")
    if b"PRIVATE KEY-----" not in texts["key"]:
        raise ValueError(f"TLS key file {key_path!r} holds no PEM private key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file, password=lambda: b"")  # an encrypted key fails, not prompts
    except ssl.SSLError as exc:
        raise ValueError(
            f"cannot use TLS certificate file {cert_file!r} with key file {key_path!r}: {exc.reason or exc} "
            "(expected a certificate and its matching unencrypted private key)"
        ) from None
    return context


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    address: Any
    deadline: float
    handshaking: bool
    head: RequestHead = field(default_factory=RequestHead)
    done: bool = False  # dispatched to a worker or dropped
    settled: bool = False  # its response is decided (being written) or it is closed
    draining: bool = False  # refused: what the client still sends is read and discarded until it closes


class MetricsServer:
    """A running ``/metrics`` server; ``close()`` stops it. ``start()`` builds one."""

    def __init__(
        self,
        listener: socket.socket,
        app: WsgiApp,
        scheme: str,
        context: ssl.SSLContext | None,
        *,
        max_connections: int,
        request_timeout: float,
        workers: int,
        render_max_age: float = DEFAULT_RENDER_MAX_AGE,
    ) -> None:
        self._listener = listener
        # Busy: another client is waiting for an answer. A connection stops counting once its response is
        # decided, before any of it is sent, so a client that scrapes again after reading its answer never
        # finds its own previous connection counted.
        self._app = SingleFlight(app, render_max_age, busy=lambda: self._unsettled > 1)
        self._context = context
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.host, self.port = listener.getsockname()[:2]
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"{scheme}://{shown}:{self.port}/metrics"
        self.base_environ = {
            "SERVER_NAME": self.host, "SERVER_PORT": str(self.port), "GATEWAY_INTERFACE": "CGI/1.1",
            "REMOTE_HOST": "", "CONTENT_LENGTH": "", "SCRIPT_NAME": "", "SERVER_SOFTWARE": "mcp-token-otel",
            "wsgi.version": (1, 0), "wsgi.url_scheme": scheme, "wsgi.errors": sys.stderr,
            "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False,
            **({"HTTPS": "on"} if context is not None else {}),
        }
        #: Counters for tests and troubleshooting.
        self.refused = 0
        self.timed_out = 0
        self.served = 0
        self._open = 0  # connections accepted and not yet closed
        self._unsettled = 0  # connections accepted whose response is not decided yet
        self._lock = threading.Lock()
        self._stopping = False
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._reading: collections.deque[_Connection] = collections.deque()  # in deadline order
        self._jobs: queue.SimpleQueue[_Connection | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._loop, name="mcp-token-otel-http", daemon=True)]
        self._threads += [
            threading.Thread(target=self._work, name=f"mcp-token-otel-http-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

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
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        workers: int = DEFAULT_WORKERS,
        render: Callable[[], bytes] | None = None,
        render_max_age: float = DEFAULT_RENDER_MAX_AGE,
    ) -> MetricsServer:
        """Listen on host:port (0 picks a free port; an IPv6 address such as ``::1`` works too). ``render``:
        the plain-text exposition of ``registry``, faster than prometheus-client's (OpenMetrics keeps it).
        ``render_max_age``: how old a finished rendering may be when a scrape arriving on a busy server reuses
        it (0: share only renderings in progress); see :class:`~.shared_renders.SingleFlight`."""
        context = tls_context(tls_cert_file, tls_key_file) if tls_cert_file else None  # before binding
        listener = _listen(host, port)
        return cls(
            listener, metrics_wsgi_app(registry, auth, render), "https" if context else "http", context,
            max_connections=max_connections, request_timeout=request_timeout, workers=max(1, workers),
            render_max_age=max(0.0, render_max_age),
        )

    @property
    def open_connections(self) -> int:
        return self._open

    @property
    def renders(self) -> int:
        """Renderings made so far (scrapes that shared one do not count)."""
        return self._app.renders

    # -- the selector thread: accept, handshake, read request heads, enforce deadlines -----------------

    def _loop(self) -> None:
        while not self._stopping:
            timeout = 1.0
            if self._reading:
                timeout = min(timeout, max(0.0, self._reading[0].deadline - time.monotonic()))
            for key, _ in self._selector.select(timeout):
                if key.data is None:
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(64)
                else:
                    self._readable(key.data)
            self._expire()
        for conn in list(self._reading):
            self._drop(conn)

    def _accept(self) -> None:
        for _ in range(64):  # a burst, then back to the readers
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. out of file descriptors: try again on the next wake-up
                return
            if self._open >= self.max_connections:
                self.refused += 1
                with contextlib.suppress(OSError):
                    sock.setblocking(False)
                    if self._context is None:
                        sock.send(_REFUSAL)
                sock.close()
                continue
            sock.setblocking(False)
            handshaking = False
            if self._context is not None:
                try:
                    sock = self._context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (OSError, ValueError):
                    sock.close()
                    continue
                handshaking = True
            conn = _Connection(sock, address, time.monotonic() + self.request_timeout, handshaking)
            with self._lock:
                self._open += 1
                self._unsettled += 1
            self._reading.append(conn)
            self._selector.register(sock, selectors.EVENT_READ, conn)
            self._readable(conn)  # a scraper's request often arrives with its connection: no wait for select

    def _readable(self, conn: _Connection) -> None:
        sock = conn.sock
        try:
            if conn.handshaking:
                try:
                    sock.do_handshake()  # type: ignore[attr-defined]
                except ssl.SSLWantReadError:
                    return
                except ssl.SSLWantWriteError:
                    self._selector.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
                    return
                conn.handshaking = False
                self._selector.modify(sock, selectors.EVENT_READ, conn)
            while True:  # drain what the kernel (and TLS) holds
                try:
                    data = sock.recv(65536)
                except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    return
                if not data:  # the client went away (before finishing its request, or after a refusal)
                    self._drop(conn)
                    return
                if conn.draining:  # discarded, up to a bound (then closed: a client that keeps sending is reset)
                    conn.head.size += len(data)
                    if conn.head.size > _MAX_DISCARD:
                        self._drop(conn)
                        return
                    continue
                answer = conn.head.feed(data)
                if answer == b"":
                    self._dispatch(conn)
                    return
                if answer is not None:
                    self._refuse(conn, answer)
                    return
        except (OSError, ValueError):  # reset, failed handshake...: the client's problem
            self._drop(conn)

    def _refuse(self, conn: _Connection, answer: bytes) -> None:
        """A malformed or oversized head: answered here, then what the client still sends is discarded until
        it closes or its deadline passes (closing with unread input would reset the connection)."""
        self._settle(conn)
        try:
            conn.sock.send(answer)  # a few bytes into an empty socket buffer: never blocks
            if self._context is not None:  # TLS: no half-close; the answer and the close go together
                self._drop(conn)
                return
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._drop(conn)
            return
        conn.draining = True
        self._readable(conn)

    def _dispatch(self, conn: _Connection) -> None:
        conn.done = True
        self._selector.unregister(conn.sock)
        self._jobs.put(conn)

    def _drop(self, conn: _Connection) -> None:
        if conn.done:
            return
        conn.done = True
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(conn.sock)
        self._close(conn)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._reading and (self._reading[0].done or self._reading[0].deadline <= now):
            conn = self._reading.popleft()
            if not conn.done:
                self.timed_out += not conn.draining
                self._drop(conn)

    def _settle(self, conn: _Connection) -> None:
        with self._lock:
            if not conn.settled:
                conn.settled = True
                self._unsettled -= 1

    def _close(self, conn: _Connection) -> None:
        self._settle(conn)
        with contextlib.suppress(OSError):
            conn.sock.close()
        with self._lock:
            self._open -= 1

    # -- workers: render and write -------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            conn = self._jobs.get()
            if conn is None:
                return
            try:
                conn.sock.setblocking(True)
                conn.sock.settimeout(self.request_timeout)  # bounds writing to a client that does not read
                self._answer(conn)
                with self._lock:
                    self.served += 1
            except Exception:  # a client that hangs up mid-response is its own problem
                pass
            finally:
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)
                self._close(conn)

    def _answer(self, conn: _Connection) -> None:
        """Parse the request head, get the (usually shared) response and send it in one ``sendall``."""
        environ = dict(self.base_environ)
        environ["REMOTE_ADDR"] = str(conn.address[0]) if isinstance(conn.address, tuple) else ""
        environ["wsgi.input"] = io.BytesIO()
        if not environ_from(conn.head, environ):
            self._settle(conn)
            conn.sock.sendall(BAD_REQUEST)
            return
        try:
            response = self._app.respond(environ)
        except Exception:
            self._settle(conn)
            conn.sock.sendall(SERVER_ERROR)
            raise
        self._settle(conn)
        conn.sock.sendall(response.wire(with_body=environ["REQUEST_METHOD"] != "HEAD"))

    def close(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._threads[0].join(timeout=5)
        for _ in self._threads[1:]:
            self._jobs.put(None)
        for thread in self._threads[1:]:
            thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self._selector.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                sock.close()


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket for host:port in the address's own family (IPv6 addresses included)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        if os.name == "posix":  # restart on the same port at once (not on Windows: there it allows hijacking)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
