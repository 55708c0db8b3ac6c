"""What the proxy checks before it relays anything, light enough to import before the server is started (the
server's start-up must not wait on the proxy's imports)."""

from __future__ import annotations

import socket


class StartupError(Exception):
    """A problem that stops the proxy before it relays anything: one line, exit status 2."""


def check_port_free(host: str, port: int, what: str) -> None:
    """Fail now, in one line, if ``host:port`` cannot be bound (the servers would only log it later)."""
    if not 0 <= port <= 65535:  # getaddrinfo would take 99999 and bind its low 16 bits
        raise StartupError(f"cannot listen for {what} on {host}:{port}: expected a port in 0-65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise StartupError(f"cannot listen for {what} on {host}:{port}: {exc.strerror or exc}") from None
    if port == 0:  # any free port: only the address needed checking
        return
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers themselves do
        try:
            sock.bind(address)
        except OSError as exc:
            raise StartupError(f"cannot listen for {what} on {host}:{port}: {exc.strerror or exc}") from None
