"""Client limits a server's tool list can run into, as warnings: names longer than clients accept, descriptions
some clients cut, and more tools than agents choose well among or than some clients take at all. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Tool name lengths: many model APIs take function names of at most 64 characters; the MCP specification
#: asks for 1 to 128.
NAME_LIMITS: tuple[int, int] = (64, 128)
#: Description characters past which some clients truncate.
DESCRIPTION_LIMIT = 4096
#: Tools on one server: agents choose worse past about 40; some clients take no more than 128.
TOOL_COUNT_LIMITS: tuple[int, int] = (40, 128)


@dataclass(frozen=True, slots=True)
class ClientLimitWarning:
    subject: str  # a tool name, or the server's
    rule: str  # tool name length, description length, tool count
    limit: int
    value: int
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"subject": self.subject, "rule": self.rule, "limit": self.limit, "value": self.value,
                "message": self.message}


def _name_warning(name: str) -> ClientLimitWarning | None:
    short, long = NAME_LIMITS
    if len(name) > long:
        limit, why = long, f"over {long}, the most the MCP specification allows: clients may reject the tool"
    elif len(name) > short:
        limit, why = short, f"over {short}: clients that pass it to a model API as a function name reject or cut it"
    else:
        return None
    return ClientLimitWarning(name, "tool name length", limit, len(name), f"tool name is {len(name)} characters, {why}")


def client_limit_warnings(tools: Sequence[Mapping[str, Any]], server: str = "server") -> list[ClientLimitWarning]:
    """Every client limit the listed tools exceed: per tool its name and description, then the tool count."""
    out: list[ClientLimitWarning] = []
    for tool in tools:
        name = str(tool.get("name", "?"))
        warning = _name_warning(name)
        if warning is not None:
            out.append(warning)
        description = tool.get("description")
        if isinstance(description, str) and len(description) > DESCRIPTION_LIMIT:
            out.append(ClientLimitWarning(
                name, "description length", DESCRIPTION_LIMIT, len(description),
                f"description is {len(description):,} characters, over {DESCRIPTION_LIMIT:,}: some clients cut it"))
    count = len(tools)
    few, most = TOOL_COUNT_LIMITS
    if count > most:
        out.append(ClientLimitWarning(server, "tool count", most, count,
                                       f"{count} tools, over {most}: some clients take no more than {most}"))
    elif count > few:
        out.append(ClientLimitWarning(server, "tool count", few, count,
                                      f"{count} tools, over {few}: agents choose tools less well past about {few}"))
    return out
