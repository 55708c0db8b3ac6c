"""Credentials out of what the command line prints: URLs, HTTP headers and configured secrets.

Pure functions: :func:`redact_url` shows a URL without its password (or a lone user name, often a token) and
without the values of credential-like query parameters; :func:`secrets_in_args` collects every credential a
command line carries (URL user info, credential headers such as ``Authorization``, ``Cookie``, ``X-Api-Key``)
so that :func:`scrub` can mask them in any text, and :class:`ScrubbedStream` in everything written to a stream
(errors, log records, tracebacks of libraries that quote a URL as given).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, TextIO
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

MASK = "****"
#: Shorter secrets are masked where they are known (a URL's user info), not searched for in free text: "ab"
#: would mask every "ab" of a message.
MIN_SCRUBBED = 4

#: Header and query parameter names whose values are credentials: exact names, then parts of a name.
_SECRET_NAMES = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie", "sig", "signature"})
_SECRET_PARTS = ("auth", "token", "secret", "key", "password", "passwd", "session", "cookie", "credential")
# scheme://user[:password]@ anywhere in a string (a URL inside an argument or a message).
_URL_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://([^\s/?#@]+)@")


def is_secret_name(name: str) -> bool:
    """Whether a header or query parameter named ``name`` carries a credential."""
    lowered = name.strip().lower()
    return lowered in _SECRET_NAMES or any(part in lowered for part in _SECRET_PARTS)


def redact_url(url: str) -> str:
    """``url`` without credentials: the password (or a user name given alone) and secret query values masked."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return scrub(url, secrets_in_text(url))
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{host}" if colon else f"{MASK}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, _redact_query(parts.query), parts.fragment))


def _redact_query(query: str) -> str:
    pieces = []
    for piece in query.split("&") if query else ():
        name = piece.partition("=")[0]
        pieces.append(f"{name}={MASK}" if is_secret_name(unquote(name)) else piece)
    return "&".join(pieces)


def secrets_in_text(text: str) -> set[str]:
    """The credentials of every URL in ``text``: its password, or its user name when given alone, and the values
    of secret query parameters; each raw and percent-decoded."""
    found: set[str] = set()
    for match in _URL_USERINFO.finditer(text):
        user, colon, password = match.group(1).partition(":")
        found.add(password if colon else user)
    for url in re.findall(r"[A-Za-z][A-Za-z0-9+.-]*://\S+", text):
        try:
            query = urlsplit(url).query
        except ValueError:
            continue
        found.update(value for name, value in parse_qsl(query) if is_secret_name(name))
    return {form for secret in found if secret for form in (secret, unquote(secret))}


def header_secrets(header: str) -> set[str]:
    """The credential in a ``NAME: VALUE`` header (the value, and its last word: ``Bearer <token>``); a header
    written without its colon (``Authorization Bearer <token>``) too."""
    name, sep, value = header.partition(":")
    if not sep:
        name, _, value = header.strip().partition(" ")
    value = value.strip()
    if not value or not is_secret_name(name):
        return set()
    return {value, value.split()[-1]}


def secrets_in_args(argv: Sequence[str]) -> set[str]:
    """Every credential a command line carries: in URLs anywhere on it and in ``--header`` values."""
    found: set[str] = set()
    for index, arg in enumerate(argv):
        found |= secrets_in_text(arg)
        if arg.startswith("--header="):
            found |= header_secrets(arg.removeprefix("--header="))
        elif index and argv[index - 1] == "--header":
            found |= header_secrets(arg)
    return found


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret (the longest first, at least :data:`MIN_SCRUBBED` characters) masked."""
    for secret in sorted((s for s in secrets if len(s) >= MIN_SCRUBBED), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


class ScrubbedStream:
    """A text stream that masks ``secrets`` in everything written to it; anything else goes to ``stream``."""

    def __init__(self, stream: TextIO, secrets: Iterable[str]) -> None:
        self._stream = stream
        self._secrets = frozenset(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        """Mask these too (the configuration's, once it is read)."""
        self._secrets |= frozenset(secrets)

    def write(self, text: str) -> int:
        self._stream.write(scrub(text, self._secrets))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, buffer...
        return getattr(self._stream, name)
