"""What discovery reads and from where: the :class:`Target` server, the :class:`Discovery` it lists, the
:class:`DiscoveryError` every failure becomes, and what both SDK majors' openers share."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...core.redact import header_secrets, redact_url, secrets_in_text


class DiscoveryError(RuntimeError):
    """Connecting to a server or listing what it offers failed; the message is one line."""


@dataclass(frozen=True, slots=True)
class Target:
    """A server to connect to: a streamable HTTP ``url`` (with ``headers``) or a stdio ``command``."""

    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    command: Sequence[str] = ()
    #: Environment of a stdio server; None inherits this process's environment, as a shell would.
    env: Mapping[str, str] | None = None
    cwd: str | None = None

    def __post_init__(self) -> None:
        if (self.url is None) == (not self.command):
            raise ValueError("a target is either a url or a stdio command")

    @property
    def label(self) -> str:
        """The target in messages: a URL without its credentials, or the command line."""
        return redact_url(self.url) if self.url is not None else " ".join(self.command)

    def secrets(self) -> set[str]:
        """What must never be shown: the URL's credentials, credential headers' values (and the command's URLs')."""
        found = secrets_in_text(self.url or " ".join(self.command))
        for name, value in self.headers.items():
            found |= header_secrets(f"{name}: {value}")
        return found


@dataclass(frozen=True, slots=True)
class Discovery:
    """What one server lists, in the order it listed it."""

    server_name: str
    server_version: str
    protocol_version: str
    tools: tuple[dict[str, Any], ...] = ()
    resources: tuple[dict[str, Any], ...] = ()
    resource_templates: tuple[dict[str, Any], ...] = ()
    prompts: tuple[dict[str, Any], ...] = ()


@dataclass(slots=True)
class Notes:
    """What the transports saw that the SDK's errors leave out: the last HTTP error status."""

    http_status: int | None = None

    async def on_response(self, response: Any) -> None:  # an httpx event hook
        if response.status_code >= 400:
            self.http_status = response.status_code


#: A page fetcher: (method, cursor) -> the raw result dict.
Fetch = Callable[[str, str | None], Awaitable[dict[str, Any]]]


def stdio_params(params_type: Any, target: Target) -> Any:
    """The SDK's ``StdioServerParameters`` (``params_type``) for a stdio target."""
    command, *args = target.command
    env = dict(os.environ) if target.env is None else dict(target.env)
    return params_type(command=command, args=list(args), env=env, cwd=target.cwd)
