"""Argparse types every command shares, so an option means the same and is refused the same way everywhere:
a bad value is one ``error:`` line naming the option, exit status 2, before anything starts."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

PORT_WORDS = "a port number from 0 to 65535"


def number(kind: type, low: float, *, inclusive: bool, words: str) -> Callable[[str], Any]:
    """An argparse type: a finite ``kind`` above ``low`` (or at it, with ``inclusive``)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {words}, got {text!r}") from None
        if not math.isfinite(value) or value < low or (value == low and not inclusive):
            raise argparse.ArgumentTypeError(f"expected {words}, got {text!r}")
        return value

    return parse


def port(text: str) -> int:
    """A TCP port, 0 (any free port) to 65535: every ``--...-port`` option of every command."""
    value = number(int, 0, inclusive=True, words=PORT_WORDS)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected {PORT_WORDS}, got {text!r}")
    return int(value)


def host_port(text: str) -> str:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6; no host: 127.0.0.1), its port checked as :func:`port` checks one."""
    _, sep, port_text = text.rpartition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. 127.0.0.1:8080), got {text!r}")
    try:
        port(port_text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with {PORT_WORDS}, got {text!r}") from None
    return text
