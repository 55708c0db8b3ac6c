"""Renderings of /metrics shared between scrapes (the standalone server's middleware; see metrics_server.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from email.utils import formatdate
from typing import Any

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class Response:
    """A finished rendering: what the WSGI app answered, and the same as HTTP/1.1 bytes ready to send."""

    __slots__ = ("_wire", "body", "headers", "status")

    def __init__(self, status: str, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body
        self._wire: bytes | None = None

    def wire(self, with_body: bool = True) -> bytes:
        """The response as sent on a connection that closes after it (built once; shared by every scrape
        that shares the rendering, so each costs one ``sendall``)."""
        if not with_body:
            return self._head()
        if self._wire is None:  # two threads may build it at once: same bytes, no harm
            self._wire = self._head() + self.body
        return self._wire

    def _head(self) -> bytes:
        lines = [f"HTTP/1.1 {self.status}"]
        lines += [f"{name}: {value}" for name, value in self.headers
                  if name.lower() not in ("content-length", "connection", "date")]
        lines += [f"Content-Length: {len(self.body)}", f"Date: {formatdate(usegmt=True)}", "Connection: close"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _Flight:
    def __init__(self, started: float) -> None:
        self.started = started  # monotonic time the rendering began: its data is at least this fresh
        self.done = threading.Event()
        self.result: Response | None = None


#: Request fields that select what a scrape returns: requests equal in these may share one rendering.
#: The credentials are among them, so an unauthorised request never receives an authorised body.
FLIGHT_KEY = (
    "REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "HTTP_ACCEPT", "HTTP_ACCEPT_ENCODING", "HTTP_AUTHORIZATION",
)
#: Finished renderings kept for reuse, at most (one per distinct request shape; a client varying its
#: headers cannot grow this past the bound).
KEPT_RENDERS = 16


class SingleFlight:
    """WSGI middleware sharing renderings between scrapes.

    * A request that arrives while an identical one is being rendered waits for that rendering and gets the
      same bytes (headers and gzip included), instead of rendering the registry again.
    * A request that arrives while other clients wait for an answer (``busy()``) may get the last
      finished rendering if that began at most ``max_age`` seconds before the request arrived; past half that
      age one such request renders anew meanwhile, so the others never wait for a rendering. Under a burst of
      scrapers the cost is about one rendering per ``max_age / 2``, not one per request or per wave; the data
      is never more than ``max_age`` older than the request.
    * A request on an otherwise idle server always gets a rendering that began after it arrived (or joins one in
      progress), so a scrape made after recording something sees it.
    """

    def __init__(
        self,
        app: WsgiApp,
        max_age: float = 0.0,
        busy: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._app = app
        self._max_age = max_age
        self._busy = busy or (lambda: False)
        self._clock = clock
        self._lock = threading.Lock()
        self._flights: dict[tuple[str, ...], _Flight] = {}
        self._finished: dict[tuple[str, ...], _Flight] = {}  # the last finished rendering per request shape
        #: Renderings made (for tests and troubleshooting).
        self.renders = 0

    def _render(self, environ: dict[str, Any]) -> Response:
        started: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            started[:] = [status, headers]
            return lambda data: None

        self.renders += 1
        chunks = self._app(environ, start_response)
        try:
            body = b"".join(chunks)
        finally:
            close = getattr(chunks, "close", None)
            if callable(close):
                close()
        return Response(started[0], list(started[1]), body)

    def _keep(self, key: tuple[str, ...], flight: _Flight) -> None:
        """Remember a finished rendering (under the lock); drop the stale ones and keep the bound."""
        if self._max_age <= 0 or flight.result is None:
            return
        self._finished.pop(key, None)
        self._finished[key] = flight
        oldest = flight.started - self._max_age
        for stale in [k for k, f in self._finished.items() if f.started < oldest]:
            del self._finished[stale]
        while len(self._finished) > KEPT_RENDERS:
            del self._finished[next(iter(self._finished))]

    def respond(self, environ: dict[str, Any]) -> Response:
        """The response for this request: shared, kept, or rendered now (see the class)."""
        key = tuple(str(environ.get(name, "")) for name in FLIGHT_KEY)
        arrived = self._clock()
        with self._lock:
            flight = self._flights.get(key)
            recent = self._finished.get(key)
            age = arrived - recent.started if recent is not None else self._max_age + 1
            # Reuse a recent rendering on a busy server; past half its age the first request renders anew
            # while the others keep getting it.
            fresh_enough = age <= self._max_age and (flight is not None or age <= self._max_age / 2)
            if recent is not None and recent.result is not None and fresh_enough and self._busy():
                return recent.result
            if flight is not None:
                leader = False
            else:
                leader, flight = True, _Flight(arrived)
                self._flights[key] = flight
        if leader:
            try:
                result = flight.result = self._render(environ)
            finally:
                with self._lock:
                    del self._flights[key]
                    self._keep(key, flight)
                flight.done.set()
            return result
        flight.done.wait(60)
        return flight.result if flight.result is not None else self._render(environ)  # the leader failed

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        response = self.respond(environ)
        start_response(response.status, response.headers)
        return [response.body]
