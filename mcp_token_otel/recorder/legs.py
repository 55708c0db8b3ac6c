"""One logical call, however many requests it takes (protocol 2026-07-28): what a call's legs count as.

A ``tools/call``, ``prompts/get`` or ``resources/read`` answered ``input_required`` and its retries are one logical
call, and so is a task-augmented call and the task messages that deliver its result (core/logical_calls.py joins
them). Each leg is still one message exchange with its own span and operation duration; what it adds to the
metrics follows what it is (the ``direction`` label):

==================  ====================================================================  ========
direction           what                                                                    budget
==================  ====================================================================  ========
``input``           the call's name and arguments, on its first leg only                    yes
``input_response``  a retry's ``inputResponses`` and echoed ``requestState``                yes
``input_required``  an ``input_required`` answer: the questions, the sealed state          yes
``output``          the call's final result, once (a task's result, unwrapped)             yes
``task``            task bookkeeping: the task handle, ``tasks/*`` requests and answers     no
==================  ====================================================================  ========

So ``mcp_token_responses_total`` and the risk tiers count logical calls (final results only), a retry is never a
``repeated`` call, and ``mcp_token_logical_call_duration_seconds`` times the whole call once, from its first
request to its final result. The retry's span links to the first leg's (``mcp_token.link.type=retry_of``), a task
message's to the call that created the task (``task_of``).
"""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import Span

from ..core.logical_calls import (
    CALL,
    FINAL,
    INPUT_REQUIRED,
    MRTR_METHODS,
    PLAIN,
    RETRY,
    TASK,
    TASK_CREATED,
    TASK_REQUESTS,
    TASK_RESULT,
    TASK_STATUS,
    Leg,
    Outcome,
    is_retry,
)

#: Methods whose requests may be legs of a logical call.
LEG_METHODS = MRTR_METHODS | TASK_REQUESTS
#: Answers that are not the call's final answer, with the direction they count as.
_LEG_DIRECTIONS = {INPUT_REQUIRED: "input_required", TASK_CREATED: "task", TASK_STATUS: "task"}
A_LEG = "mcp_token.call.leg"
A_LEGS = "mcp_token.call.legs"
A_RESULT_TYPE = "mcp_token.result_type"
A_LINK_TYPE = "mcp_token.link.type"


def asks_more(result: Any) -> bool:
    """Whether a first leg's answer makes its call go on: ``input_required``, a task handle (the extension's
    ``resultType: "task"``, or 2025-11-25's result holding ``task``)."""
    if type(result) is not dict:
        return False
    kind = result.get("resultType")
    if kind is None:
        return "task" in result and "content" not in result
    return kind == "input_required" or kind == "task"


def request_part(leg: Leg | None, params: Any) -> tuple[Any, str]:
    """What of a leg's request counts, and as which direction: a first leg's whole params as ``input``, a
    retry's answers as ``input_response``, a task request's params as ``task``."""
    if leg is None or leg.role in (CALL, PLAIN):
        return params, "input"
    if leg.role == RETRY:
        return leg.answers or {}, "input_response"
    return params, "task"


def answer_direction(leg: Leg | None, outcome: Outcome | None) -> str:
    """The direction an answer counts as: ``output`` for a call's final answer (and any other request's)."""
    if outcome is None:
        return "output"
    direction = _LEG_DIRECTIONS.get(outcome.kind)
    if direction is not None:
        return direction
    if leg is not None and leg.role == TASK and outcome.kind != TASK_RESULT:
        return "task"
    return "output"


def link(span: Span | None, leg: Leg | None) -> None:
    """A later leg's span links to its call's first leg; a call's first leg keeps its span context for them."""
    if span is None or leg is None:
        return
    if leg.role == CALL and leg.call is not None:
        leg.call.link = span.get_span_context()
        return
    context = leg.link
    if context is not None:
        span.add_link(context, {A_LINK_TYPE: "task_of" if leg.role == TASK else "retry_of"})


def leg_attributes(leg: Leg, outcome: Outcome | None, result: Any) -> dict[str, Any]:
    """The span attributes of a leg of a call that takes several (none for a call answered at once): its number
    in the call, the answer's ``resultType``, and on the final leg the number of legs."""
    call = outcome.call if outcome is not None else None
    if leg.index == 0 and (outcome is None or outcome.kind == FINAL) and (call is None or call.legs == 1):
        return {}
    attrs: dict[str, Any] = {A_LEG: leg.index + 1}
    kind = result.get("resultType") if isinstance(result, dict) else None
    if isinstance(kind, str):
        attrs[A_RESULT_TYPE] = kind
    if call is not None and outcome is not None and outcome.final and call.legs > 1:
        attrs[A_LEGS] = call.legs
    return attrs


__all__ = ["CALL", "LEG_METHODS", "MRTR_METHODS", "RETRY", "TASK", "TASK_CREATED", "TASK_RESULT", "answer_direction",
           "asks_more", "is_retry", "leg_attributes", "link", "request_part"]
