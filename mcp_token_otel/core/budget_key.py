"""Which budget a message counts toward: the conversation, named by an ordered list of key sources.

The 2026-07-28 protocol has no sessions: remote traffic carries no ``Mcp-Session-Id`` and every request may
arrive on a new connection. A budget is therefore keyed by the first source present in ``budget.key``:

- ``session``: the protocol's session (``Mcp-Session-Id``) or the stream/connection on stdio and in-memory;
- ``baggage:<name>``: a W3C baggage entry (``params._meta.baggage`` or the ``baggage`` HTTP header);
- ``meta:<key>``: a ``params._meta`` key;
- ``header:<name>``: an HTTP request header;
- ``principal``: the authenticated subject, where the server has authentication;
- ``client``: the client's name and version plus its peer address (coarse: every conversation of one client
  program on one host shares it; opt in).

Values come from peers: a long one is replaced by its digest, so a key stays short whatever is sent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote

#: The OpenTelemetry GenAI attribute that names a conversation (a W3C baggage entry by this name keys it).
CONVERSATION_ID = "gen_ai.conversation.id"
SOURCE_KINDS = ("session", "baggage", "meta", "header", "principal", "client")
_NAMED = frozenset({"baggage", "meta", "header"})
DEFAULT_BUDGET_KEY: tuple[str, ...] = ("session", f"baggage:{CONVERSATION_ID}", "principal")
#: Longer values are replaced by their digest (a key is held per live budget and may reach a span).
MAX_KEY_VALUE_CHARS = 128


@dataclass(frozen=True, slots=True)
class KeySource:
    """One entry of ``budget.key``: a kind and, for baggage, meta and header, the name it reads."""

    kind: str
    name: str = ""

    @property
    def spec(self) -> str:
        return f"{self.kind}:{self.name}" if self.name else self.kind


def parse_key_sources(specs: Sequence[str], key: str = "budget.key") -> tuple[KeySource, ...]:
    """The sources of ``specs`` in order; ValueError naming ``key`` and the entry for anything else."""
    if isinstance(specs, str) or not isinstance(specs, Sequence):
        raise ValueError(f"{key}: expected a list of key sources such as {list(DEFAULT_BUDGET_KEY)}, got {specs!r}")
    sources: list[KeySource] = []
    for index, spec in enumerate(specs):
        where = f"{key}[{index}]"
        if not isinstance(spec, str) or not spec.strip():
            raise ValueError(f"{where}: expected a key source (one of {', '.join(SOURCE_KINDS)}), got {spec!r}")
        kind, sep, name = spec.strip().partition(":")
        kind, name = kind.strip().lower(), name.strip()
        if kind not in SOURCE_KINDS:
            raise ValueError(f"{where}: unknown key source {spec!r}; expected one of {', '.join(SOURCE_KINDS)}")
        if kind in _NAMED and not name:
            raise ValueError(f"{where}: {kind} needs a name, as in '{kind}:{_EXAMPLES[kind]}'")
        if kind not in _NAMED and sep:
            raise ValueError(f"{where}: {kind} takes no name, got {spec!r}")
        source = KeySource(kind, name.lower() if kind == "header" else name)
        if source not in sources:
            sources.append(source)
    return tuple(sources)


_EXAMPLES = {"baggage": CONVERSATION_ID, "meta": "conversationId", "header": "x-conversation-id"}


class KeyFacts(Protocol):
    """What the code that saw a message can tell about it; each answer is None when it does not know."""

    def session(self) -> str | None: ...
    def baggage(self, name: str) -> str | None: ...
    def meta(self, key: str) -> str | None: ...
    def header(self, name: str) -> str | None: ...
    def principal(self) -> str | None: ...
    def client(self) -> str | None: ...


def choose_budget_key(sources: Sequence[KeySource], facts: KeyFacts) -> str | None:
    """The budget key of the first source present, or None (the message counts as unbudgeted).

    A session key is the session's own id (the one its end is reported with); any other key names its source,
    so two sources never share a budget by accident."""
    for source in sources:
        kind = source.kind
        if kind == "session":
            value = facts.session()
        elif kind == "baggage":
            value = facts.baggage(source.name)
        elif kind == "meta":
            value = facts.meta(source.name)
        elif kind == "header":
            value = facts.header(source.name)
        elif kind == "principal":
            value = facts.principal()
        else:
            value = facts.client()
        if value:
            return value if kind == "session" else f"{source.spec}={bounded_key_value(value)}"
    return None


def bounded_key_value(value: str) -> str:
    """``value`` itself when short, else a digest of it."""
    if len(value) <= MAX_KEY_VALUE_CHARS:
        return value
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


#: The W3C Baggage limits (the OpenTelemetry propagator's too): longer values are not read at all.
MAX_BAGGAGE_CHARS = 8192
MAX_BAGGAGE_MEMBERS = 180


def parse_baggage(header: str) -> Mapping[str, object]:
    """The entries of a W3C ``baggage`` value: ``name=value`` members separated by commas, properties after
    ``;`` ignored, percent-decoded, malformed members skipped. Not OpenTelemetry's propagator: it logs a peer's
    raw header at WARNING for every malformed member, which would put payload in logs and flood them."""
    if len(header) > MAX_BAGGAGE_CHARS:
        return {}
    entries: dict[str, object] = {}
    for member in header.split(",", MAX_BAGGAGE_MEMBERS)[:MAX_BAGGAGE_MEMBERS]:
        name, sep, value = member.partition(";")[0].partition("=")
        name, value = name.strip(" \t"), value.strip(" \t")
        if sep and name and value:
            entries.setdefault(unquote(name), unquote(value))
    return entries


def _scalar(value: Any) -> str | None:
    if isinstance(value, str):
        return value or None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


class MessageFacts:
    """KeyFacts of one message. ``headers``: any mapping with lower-case lookups (a plain dict with lower-case
    names, or a case-insensitive headers object)."""

    __slots__ = ("_baggage", "_client", "_headers", "_params", "_principal", "_session")

    def __init__(
        self,
        *,
        session: str | None = None,
        params: Any = None,
        headers: Mapping[str, str] | None = None,
        principal: str | None = None,
        client: str | None = None,
    ) -> None:
        self._session = session
        self._params = params
        self._headers = headers
        self._principal = principal
        self._client = client
        self._baggage: Mapping[str, object] | None = None

    def session(self) -> str | None:
        return self._session

    def _meta(self) -> Mapping[str, Any] | None:
        meta = self._params.get("_meta") if isinstance(self._params, Mapping) else None
        return meta if isinstance(meta, Mapping) else None

    def meta(self, key: str) -> str | None:
        meta = self._meta()
        return _scalar(meta.get(key)) if meta is not None else None

    def baggage(self, name: str) -> str | None:
        if self._baggage is None:
            meta = self._meta()
            header = meta.get("baggage") if meta is not None else None
            if not isinstance(header, str) and self._headers is not None:
                header = self._headers.get("baggage")
            self._baggage = parse_baggage(header) if isinstance(header, str) and header else {}
        return _scalar(self._baggage.get(name))

    def header(self, name: str) -> str | None:
        if self._headers is None:
            return None
        return _scalar(self._headers.get(name))

    def principal(self) -> str | None:
        return self._principal

    def client(self) -> str | None:
        return self._client


def client_identity(client_info: Any, peer: str | None) -> str | None:
    """``name/version@peer`` from an initialize request's clientInfo (wire dict or model) and the peer address;
    None when neither is known."""
    name = version = None
    if isinstance(client_info, Mapping):
        name, version = client_info.get("name"), client_info.get("version")
    elif client_info is not None:
        name, version = getattr(client_info, "name", None), getattr(client_info, "version", None)
    if not isinstance(name, str) and not peer:
        return None
    who = f"{name or '?'}/{version}" if isinstance(version, str) and version else (name or "?")
    return f"{who}@{peer}" if peer else who
