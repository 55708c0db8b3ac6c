"""One message exchange driven through a recorder's public call path, as an adapter or the proxy drives it:
``begin``, ``guard`` (where asked), ``open``, one answer, ``close``."""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import Span

from mcp_token_otel.core.measure import Measurement
from mcp_token_otel.recorder import TokenRecorder


class Answers:
    """A listener of finished calls (``recorder.listeners``): every answer's measurement, in order."""

    def __init__(self, recorder: TokenRecorder) -> None:
        self.measurements: list[Measurement] = []
        recorder.listeners.append(self)

    def __call__(self, call: Any, measurement: Measurement) -> None:
        self.measurements.append(measurement)

    @property
    def last(self) -> Measurement:
        return self.measurements[-1]


def exchange(
    rec: TokenRecorder,
    side: Any,
    method: str,
    params: Any,
    key: str | None,
    *,
    result: Any = None,
    error: Any = None,
    span: Span | None = None,
    server: str | None = None,
    attributes: dict[str, Any] | None = None,
    guard: bool = False,
    started: float | None = None,
    at: float | None = None,
) -> tuple[Any, Measurement | None]:
    """A request and its answer (``result``, else ``error``; neither: no answer, only ``close``). With ``guard``,
    the request-side guards run first and their answer (a refusal, a spill page or its JSON-RPC error) answers in
    the server's place. Returns what is delivered and the
    answer's measurement (None when nothing was measured)."""
    answers = Answers(rec)
    try:
        call = rec.begin(side, method, params, key, server=server)
        delivered: Any = None
        if guard:
            call.span = span
            if call.guard() is not None or call.refusal_error is not None:
                call.open(span, attributes, started)
                delivered = call.refused(at)
                call.close()
                return delivered, answers.measurements[-1] if answers.measurements else None
        call.open(span, attributes, started)
        if result is not None:
            delivered = call.result(result, at)
        elif error is not None:
            call.error(error, at)
        call.close()
        return delivered, answers.measurements[-1] if answers.measurements else None
    finally:
        rec.listeners.remove(answers)
