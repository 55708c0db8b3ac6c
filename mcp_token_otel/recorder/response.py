"""One response as an adapter hands it to the recorder: what travels together from measuring to metrics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import Span

from .ledger import Side


@dataclass(slots=True)
class Response:
    """A result (wire dict or model) or an error (MCPError/ErrorData/dict), with its call's context."""

    span: Span | None
    side: Side
    method: str
    tool_name: str | None
    result: Any
    error: Any
    session_id: str | None
    #: The server's own name where the adapter knows it.
    server: str | None
    #: The tools/call arguments (the guards' chain and padding policies read them).
    arguments: Mapping[str, Any] | None
    #: The request's span attributes held by record_input, set with the response's.
    held: dict[str, Any] | None
    #: A time.perf_counter() value taken when the request went out or came in.
    started: float | None
    #: The call's duration in seconds, when the adapter timed it itself.
    duration: float | None
