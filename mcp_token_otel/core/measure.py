"""Measure MCP messages (wire dicts, camelCase) in tokens: data versus overhead, risk tier, advisories.

Pure and SDK-independent: adapters hand in the JSON-RPC ``method``, ``params`` and ``result`` dicts.

Input side (what the model wrote to make the call):
    ``tools/call`` counts the tool name and arguments; ``resources/read`` the uri; ``prompts/get`` the name
    and arguments; any other method its params without ``_meta``. The input side has no overhead.

Output side (what enters the context), block by block. The overhead rule:
    * **data** is what the tool returns for the model to use: a text block's ``text``, an image or audio
      block's ``data`` (see :mod:`.result_blocks`), an embedded resource's ``text``/``blob``, a resource
      link's uri, name, title and description, a tool/prompt/resource definition's descriptive fields
      (``tools/list`` counts name, description, inputSchema and outputSchema: schemas cost context too), a
      prompt message's content, a JSON-RPC error's code, message and data, and a whole result that is none
      of these (primitives);
    * **overhead** is everything else that still enters the context: each block's framing (``type``,
      ``mimeType``), ``annotations`` and ``_meta`` (per block and per result), a ``structuredContent`` that
      duplicates a text block (the same JSON, or ``{"result": text}`` as MCPServer emits), and the remaining
      result fields (``isError``, ``nextCursor``...) when the result carries a recognised payload;
    * ``overhead_ratio = overhead_tokens / total_tokens``, in [0, 1] (0 for an empty message).

Media (images and audio) and the block-by-block rules: :mod:`.result_blocks`. Nothing here raises: odd input
yields an estimate with a ``reason``. The types (:class:`Policy`, :class:`Measurement`, :class:`Block`) live in
:mod:`.measurement` and are importable from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .measurement import DEFAULT_POLICY, Block, Builder, Direction, Measurement, Policy, as_mapping
from .payload import ZERO, Estimator, Size, size_text, size_value
from .protocol import SERVER_INFO_META_KEY
from .result_blocks import MAX_BLOCKS, RESULT_PAYLOAD_KEYS, RESULT_WRAPPER, TEXT_FRAMING, measure_payload
from .risk import tier_of

__all__ = [
    "DEFAULT_POLICY", "MAX_BLOCKS", "Block", "Direction", "Measurement", "Policy", "called_tool", "infer_method",
    "measure_error", "measure_message", "measure_request", "measure_result",
]

#: What a result's remaining fields (isError, nextCursor...) are not.
_NOT_RESULT_FIELDS = RESULT_PAYLOAD_KEYS | {"_meta"}


def _name(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _tool_call_request(params: dict[str, Any], policy: Policy) -> Measurement | None:
    """The commonest request, a tools/call with a string name and object (or no) arguments, measured exactly
    as :func:`measure_request`'s general rule measures it (two blocks, no overhead) without a Builder;
    None for any other shape."""
    name, arguments = params.get("name"), params.get("arguments")
    if type(name) is not str or not (arguments is None or type(arguments) is dict):
        return None
    name_size = size_text(name, policy.estimator)
    args_size = ZERO if arguments is None else size_value(arguments, policy.estimator)
    total = name_size.tokens + args_size.tokens
    return Measurement(
        "input",
        "tools/call",
        name,
        (Block("tool_name", name_size.tokens, name_size.bytes), Block("arguments", args_size.tokens, args_size.bytes)),
        total,
        total,
        0,
        0.0,
        tier_of(total, policy.thresholds),
        None,
        args_size.reason or None,
        name_size.bytes + args_size.bytes,
        policy.max_overhead_ratio,
    )


def measure_request(method: str, params: Any, policy: Policy | None = None) -> Measurement:
    """Input-side tokens of a request or notification (see the module docstring for what counts)."""
    policy = policy or DEFAULT_POLICY
    if method == "tools/call" and type(params) is dict:
        fast = _tool_call_request(params, policy)
        if fast is not None:
            return fast
    b = Builder(policy)
    p = as_mapping(params)
    tool_name = None
    if p is None:
        if params is not None:
            b.reasons.append(f"params is a {type(params).__name__}, not an object")
            b.add("params", b.value(params))
    elif method == "tools/call":
        tool_name = _name(p.get("name"))
        b.add("tool_name", b.text(p.get("name")))
        b.add("arguments", b.value(p.get("arguments")))
    elif method == "resources/read":
        b.add("uri", b.text(p.get("uri")))
    elif method == "prompts/get":
        b.add("prompt_name", b.text(p.get("name")))
        b.add("arguments", b.value(p.get("arguments")))
    else:
        rest = {k: v for k, v in p.items() if k != "_meta"}
        if rest:
            b.add("params", b.value(rest))
    return b.finish("input", method, tool_name)


#: Payload keys other than a tools/call result's own.
_OTHER_PAYLOAD_KEYS = RESULT_PAYLOAD_KEYS - {"content", "structuredContent"}


@dataclass(frozen=True, slots=True)
class _Framing:
    """Sizes of the framing the commonest results carry, under one estimator (by the general rule, size_value)."""

    text_block: Size  # a text block's {"type": "text"}
    result_wrapper: Size  # MCPServer's structuredContent {"result": text}, less the text
    is_error: Size  # the result fields {"isError": true}
    not_error: Size  # ... and {"isError": false}
    #: ... and the same with a 2026-07-28 result's {"resultType": "complete"}
    complete_is_error: Size
    complete_not_error: Size


#: Estimator -> its _Framing: computing the four costs more than the rest of a common result's bookkeeping.
#: A process uses one estimator or a few; bounded all the same (cleared when full).
_framings: dict[Estimator, _Framing] = {}
_FRAMINGS_MAX = 16


def _framing(estimator: Estimator) -> _Framing:
    framing = _framings.get(estimator)
    if framing is None:
        if len(_framings) >= _FRAMINGS_MAX:
            _framings.clear()
        framing = _framings[estimator] = _Framing(
            size_value(TEXT_FRAMING, estimator),
            size_value(RESULT_WRAPPER, estimator),
            size_value({"isError": True}, estimator),
            size_value({"isError": False}, estimator),
            size_value({"isError": True, "resultType": "complete"}, estimator),
            size_value({"isError": False, "resultType": "complete"}, estimator),
        )
    return framing


def _single_text(b: Builder, result: dict[str, Any]) -> bool:
    """The commonest result (one plain text block, and MCPServer's ``{"result": text}`` or no
    structuredContent) measured exactly as :func:`measure_payload` measures it, with fewer steps; False
    (nothing added) for any other shape, which the general rules then measure."""
    content = result.get("content")
    if type(content) is not list or len(content) != 1 or not _OTHER_PAYLOAD_KEYS.isdisjoint(result):
        return False
    block = content[0]
    if type(block) is not dict or len(block) != 2 or block.get("type") != "text":
        return False
    text = block.get("text")
    if type(text) is not str:
        return False
    wrapped = False
    if "structuredContent" in result:
        structured = result["structuredContent"]
        if type(structured) is not dict or len(structured) != 1:
            return False
        inner = structured.get("result")
        if inner is not text and (type(inner) is not str or inner != text):
            return False
        wrapped = True
    data = b.text(text)
    framing = _framing(b.policy.estimator)
    type_field = framing.text_block
    b.add_counts("text", data.tokens + type_field.tokens, data.bytes + type_field.bytes, type_field.tokens)
    if wrapped:  # the duplicate is the same string: its size is the text's plus the wrapper's
        wrapper = framing.result_wrapper
        tokens = data.tokens + wrapper.tokens
        b.add_counts("structuredContent", tokens, data.bytes + wrapper.bytes, tokens)
    return True


def _result_fields(b: Builder, rest: dict[str, Any]) -> Size:
    """Size a result's fields besides its payload and _meta: nearly always just ``isError``, whose two
    possible sizes are known."""
    size = len(rest)
    if size == 1 or (size == 2 and rest.get("resultType") == "complete"):
        is_error = rest.get("isError")
        if is_error is False:
            framing = _framing(b.policy.estimator)
            return framing.not_error if size == 1 else framing.complete_not_error
        if is_error is True:
            framing = _framing(b.policy.estimator)
            return framing.is_error if size == 1 else framing.complete_is_error
    return b.value(rest)


#: (estimator, the serverInfo stamp's fields) -> the size of a 2026-07-28 result's _meta that holds only that
#: stamp: the same few strings on every result of a server (sized by the general rule once). Bounded.
_stamps: dict[tuple[Any, ...], Size] = {}
_STAMPS_MAX = 256


def _meta_size(b: Builder, meta: Any) -> Size:
    """A result's ``_meta``: the serverInfo stamp alone (every 2026-07-28 result carries it) from a cache, anything
    else by the general rule."""
    if type(meta) is dict and len(meta) == 1:
        info = meta.get(SERVER_INFO_META_KEY)
        if type(info) is dict and len(info) <= 4:
            try:
                key = (b.policy.estimator, *info.items())
                found = _stamps.get(key)
            except TypeError:  # a value that is not hashable (a nested structure): the general rule
                return b.value(meta)
            if found is None:
                found = b.value(meta)
                if len(_stamps) >= _STAMPS_MAX:
                    _stamps.clear()
                _stamps[key] = found
            return found
    return b.value(meta)


def measure_result(
    method: str, result: Any, *, tool_name: str | None = None, policy: Policy | None = None
) -> Measurement:
    """Output-side tokens of a successful response (see the module docstring for the overhead rule)."""
    b = Builder(policy or DEFAULT_POLICY)
    res = as_mapping(result)
    error_type = None
    if res is None:
        b.add("result", b.value(result))
    elif len(res) > MAX_BLOCKS:  # not a result shape: sized whole (no per-key copy), from its JSON if large
        b.add("result", b.value(res))
        b.reasons.append(f"a result with {len(res)} fields is sized whole")
        if res.get("isError") is True:
            error_type = "tool_error"
    else:
        has_payload = not RESULT_PAYLOAD_KEYS.isdisjoint(res)
        if has_payload and (type(res) is not dict or not _single_text(b, res)):
            measure_payload(b, res)
        if "_meta" in res:
            b.add("_meta", overhead=_meta_size(b, res["_meta"]))
        rest = {k: v for k, v in res.items() if k not in _NOT_RESULT_FIELDS}
        if rest and has_payload:
            b.add("framing", overhead=_result_fields(b, rest))
        elif rest:
            b.add("result", b.value(rest))
        if res.get("isError") is True:
            error_type = "tool_error"
    return b.finish("output", method, tool_name, error_type)


def measure_error(
    method: str, error: Any, *, tool_name: str | None = None, policy: Policy | None = None
) -> Measurement:
    """Output-side tokens of a JSON-RPC error (code + message + data are what the model reads)."""
    b = Builder(policy or DEFAULT_POLICY)
    err = as_mapping(error)
    if err is None:
        err = {
            "code": getattr(error, "code", None),
            "message": getattr(error, "message", None) or (str(error) if error is not None else None),
            "data": getattr(error, "data", None),
        }
    body = {k: err[k] for k in ("code", "message", "data") if err.get(k) is not None}
    b.add("error", b.value(body))
    code = err.get("code")
    return b.finish("output", method, tool_name, str(code) if code is not None else "error")


_RESULT_SHAPES: tuple[tuple[str, str], ...] = (
    ("content", "tools/call"),
    ("structuredContent", "tools/call"),
    ("contents", "resources/read"),
    ("messages", "prompts/get"),
    ("tools", "tools/list"),
    ("prompts", "prompts/list"),
    ("resources", "resources/list"),
    ("resourceTemplates", "resources/templates/list"),
)


def infer_method(result: Any) -> str:
    """Best guess of the request method that produced ``result``, from its shape."""
    res = as_mapping(result)
    if res is not None:
        for key, method in _RESULT_SHAPES:
            if key in res:
                return method
    return "unknown"


def measure_message(
    message: Any,
    *,
    request_method: str | None = None,
    tool_name: str | None = None,
    policy: Policy | None = None,
) -> Measurement:
    """Measure one JSON-RPC message: a request or notification (input) or a response (output)."""
    msg = as_mapping(message)
    if msg is None:
        return measure_result(request_method or "unknown", message, tool_name=tool_name, policy=policy)
    method = msg.get("method")
    if isinstance(method, str):
        return measure_request(method, msg.get("params"), policy)
    if "error" in msg:
        return measure_error(request_method or "unknown", msg["error"], tool_name=tool_name, policy=policy)
    if "result" in msg:
        result = msg["result"]
        return measure_result(
            request_method or infer_method(result), result, tool_name=tool_name, policy=policy
        )
    # Not an envelope: treat the value itself as a result payload.
    return measure_result(request_method or infer_method(msg), msg, tool_name=tool_name, policy=policy)


def called_tool(method: str, params: Any) -> str | None:
    """The tool a ``tools/call`` names, else None."""
    if method == "tools/call" and isinstance(params, (dict, Mapping)):  # exact type: no ABC call
        name = params.get("name")
        return name if isinstance(name, str) else None
    return None
