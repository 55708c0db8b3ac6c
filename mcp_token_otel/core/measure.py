"""Measure MCP messages (wire dicts, camelCase) in tokens: data versus overhead, risk tier, advisories.

Pure and SDK-independent: adapters hand in the JSON-RPC ``method``, ``params`` and ``result`` dicts.

Input side (what the model wrote to make the call):
    ``tools/call`` counts the tool name and arguments; ``resources/read`` the uri; ``prompts/get`` the name
    and arguments; any other method its params without ``_meta``. The input side has no overhead.

Output side (what enters the context), block by block. The overhead rule:
    * **data** is what the tool returns for the model to use: a text block's ``text``, an image or audio
      block's ``data`` (see below), an embedded resource's ``text``/``blob``, a resource link's uri, name, title
      and description, a tool/prompt/resource definition's descriptive fields (``tools/list`` counts name,
      description, inputSchema and outputSchema: schemas cost context too), a prompt message's content,
      a JSON-RPC error's code, message and data, and a whole result that is none of these (primitives);
    * **overhead** is everything else that still enters the context: each block's framing (``type``,
      ``mimeType``), ``annotations`` and ``_meta`` (per block and per result), a ``structuredContent`` that
      duplicates a text block (the same JSON, or ``{"result": text}`` as MCPServer emits), and the remaining
      result fields (``isError``, ``nextCursor``...) when the result carries a recognised payload;
    * ``overhead_ratio = overhead_tokens / total_tokens``, in [0, 1] (0 for an empty message).

Media: an image block counts the tokens its dimensions cost under ``Policy.image_tokens`` (read from the
header only, see core/media.py), a WAV audio block the tokens of its duration. An image whose header cannot
be read, and audio in any other format (no duration in a fixed header), count their base64 text, the upper
bound, and say so in ``reason``; so does every media block under the rule "base64". Embedded resource blobs
count their base64 text. Nothing here raises: odd input yields an estimate with a ``reason``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .estimation import estimate_tokens
from .media import DEFAULT_IMAGE_RULE, ImageRule, media_tokens
from .payload import ZERO, Estimator, Size, size_text, size_value
from .risk import (
    BREACH_TIERS,
    DEFAULT_MAX_OVERHEAD_RATIO,
    DEFAULT_THRESHOLDS,
    RiskThresholds,
    RiskTier,
    overhead_advisory,
    risk_advisory,
    tier_of,
)

Direction = Literal["input", "output"]

#: Content blocks, list items and result fields measured one by one; the rest is sized in bulk.
MAX_BLOCKS = 2000
#: Text blocks larger than this are not parsed when looking for a duplicated structuredContent.
_MAX_DUPLICATE_CHECK_CHARS = 4 << 20
#: List results whose items are definitions, and the fields of an item that are data.
_LIST_DATA_FIELDS: dict[str, tuple[str, ...]] = {
    "tools": ("name", "description", "inputSchema", "outputSchema"),
    "prompts": ("name", "description", "arguments"),
    "resources": ("uri", "name", "description"),
    "resourceTemplates": ("uriTemplate", "name", "description"),
}
_RESULT_PAYLOAD_KEYS = frozenset({"content", "structuredContent", "contents", "messages", *_LIST_DATA_FIELDS})
#: What a result's remaining fields (isError, nextCursor...) are not.
_NOT_RESULT_FIELDS = _RESULT_PAYLOAD_KEYS | {"_meta"}


@dataclass(frozen=True, slots=True)
class Policy:
    """How messages are measured and judged: the estimator, image rule, tier thresholds, overhead limit."""

    estimator: Estimator = estimate_tokens
    estimator_name: str = "default"
    thresholds: RiskThresholds = DEFAULT_THRESHOLDS
    max_overhead_ratio: float = DEFAULT_MAX_OVERHEAD_RATIO
    #: How an image block is counted: "area", "tiles", "patches" or "base64" (core/media.py).
    image_tokens: ImageRule = DEFAULT_IMAGE_RULE


DEFAULT_POLICY = Policy()


# Block and Measurement are made on every MCP message: plain slotted dataclasses (read-only by
# convention) build several times faster than frozen ones.
@dataclass(slots=True)
class Block:
    """One part of a message: its type, total tokens (data + overhead), UTF-8 bytes and overhead share."""

    type: str
    tokens: int
    bytes: int
    overhead_tokens: int = 0

    @property
    def data_tokens(self) -> int:
        return self.tokens - self.overhead_tokens


@dataclass(slots=True)
class Measurement:
    """Token economics of one message."""

    direction: Direction
    method: str
    tool_name: str | None
    blocks: tuple[Block, ...]
    total_tokens: int
    data_tokens: int
    overhead_tokens: int
    overhead_ratio: float
    risk_tier: RiskTier
    error_type: str | None = None
    reason: str | None = None
    bytes: int = field(default=0)
    #: The overhead limit the advisories are judged against (risk.max_overhead_ratio).
    max_overhead_ratio: float = DEFAULT_MAX_OVERHEAD_RATIO

    @property
    def advisories(self) -> tuple[str, ...]:
        """What a user should do about this response; formatted only when read (most never are)."""
        if self.direction != "output":
            return ()
        ratio_over = self.overhead_ratio > self.max_overhead_ratio
        if self.risk_tier not in BREACH_TIERS and not ratio_over:
            return ()
        subject = f"Tool '{self.tool_name}'" if self.tool_name else f"'{self.method}'"
        advice = (
            risk_advisory(self.risk_tier, self.total_tokens, subject),
            overhead_advisory(self.overhead_tokens, self.overhead_ratio, self.max_overhead_ratio),
        )
        return tuple(a for a in advice if a)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["max_overhead_ratio"]
        out["blocks"] = [{**asdict(b), "data_tokens": b.data_tokens} for b in self.blocks]
        out["advisories"] = list(self.advisories)
        return out


class _Builder:
    """Accumulates blocks and the reasons for partial answers."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.blocks: list[Block] = []
        self.reasons: list[str] = []
        self.total = self.overhead = self.bytes = 0
        self.pending: list[Any] = []  # bulk sizing to run once the measured items are in

    def run_pending(self) -> None:
        while self.pending:
            self.pending.pop()()

    def text(self, text: Any) -> Size:
        return size_text(text, self.policy.estimator) if isinstance(text, str) else self.value(text)

    def value(self, value: Any) -> Size:
        if value is None:
            return ZERO
        size = size_value(value, self.policy.estimator)
        if size.reason:
            self.reasons.append(size.reason)
        return size

    def add(self, type_: str, data: Size = ZERO, overhead: Size = ZERO) -> None:
        tokens, size = data.tokens + overhead.tokens, data.bytes + overhead.bytes
        self.blocks.append(Block(type_, tokens, size, overhead.tokens))
        self.total += tokens
        self.overhead += overhead.tokens
        self.bytes += size

    def add_counts(self, type_: str, tokens: int, size: int, overhead_tokens: int) -> None:
        """:meth:`add` from the block's totals (the fast paths: no Size made to be summed)."""
        self.blocks.append(Block(type_, tokens, size, overhead_tokens))
        self.total += tokens
        self.overhead += overhead_tokens
        self.bytes += size

    def split(self, type_: str, obj: Mapping[str, Any], data_keys: tuple[str, ...]) -> None:
        """Add ``obj`` as one block whose ``data_keys`` are data and every other field overhead."""
        if len(data_keys) == 1:
            data = self.text(obj.get(data_keys[0]))
        else:
            data = self.value({k: obj[k] for k in data_keys if k in obj})
        rest = {k: v for k, v in obj.items() if k not in data_keys}
        self.add(type_, data, self.value(rest) if rest else ZERO)

    def finish(
        self,
        direction: Direction,
        method: str,
        tool_name: str | None,
        error_type: str | None = None,
    ) -> Measurement:
        total, overhead = self.total, self.overhead
        ratio = overhead / total if total else 0.0
        return Measurement(
            direction,
            method,
            tool_name,
            tuple(self.blocks),
            total,
            total - overhead,
            overhead,
            ratio,
            tier_of(total, self.policy.thresholds),
            error_type,
            "; ".join(dict.fromkeys(self.reasons)) if self.reasons else None,
            self.bytes,
            self.policy.max_overhead_ratio,
        )


def _as_mapping(value: Any) -> Mapping[str, Any] | None:
    if type(value) is dict:  # the wire form: an exact-type check is ten times cheaper than the ABC's
        return value
    if isinstance(value, Mapping):
        return value
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            dumped = dump(mode="json", by_alias=True, exclude_none=True)
        except Exception:
            return None
        return dumped if isinstance(dumped, Mapping) else None
    return None


def _name(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _tool_call_request(params: dict[str, Any], policy: Policy) -> Measurement | None:
    """The commonest request, a tools/call with a string name and object (or no) arguments, measured exactly
    as :func:`measure_request`'s general rule measures it (two blocks, no overhead) without a _Builder;
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
    b = _Builder(policy)
    p = _as_mapping(params)
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


_TEXT_FRAMING: dict[str, str] = {"type": "text"}


def _content_block(b: _Builder, block: Any, type_prefix: str = "") -> tuple[str, Size] | None:
    """Add one content block; for a text block, return its text and data size (duplicate detection)."""
    blk = _as_mapping(block)
    if blk is None:
        b.add(type_prefix + "unknown", b.value(block))
        return None
    kind = blk.get("type")
    label = type_prefix + (kind if isinstance(kind, str) else "unknown")
    if kind == "text":
        text = blk.get("text")
        data = b.text(text)
        # The common block is exactly {type, text}: its framing is {"type": "text"} (no copy of the block).
        rest = _TEXT_FRAMING if len(blk) == 2 and "text" in blk else {k: v for k, v in blk.items() if k != "text"}
        b.add(label, data, b.value(rest) if rest else ZERO)
        return (text, data) if isinstance(text, str) else None
    if kind in ("image", "audio"):
        _media_block(b, blk, label, kind)
    elif kind == "resource_link":
        b.split(label, blk, ("uri", "name", "title", "description"))
    elif kind == "resource":
        _embedded_resource(b, blk, label)
    else:
        b.add(label, b.value(blk))
    return None


def _media_block(b: _Builder, blk: Mapping[str, Any], label: str, kind: str) -> None:
    """An image or audio block: its data counts what the picture or sound costs when its header says."""
    data = blk.get("data")
    text = data if type(data) is str else None
    tokens = None if text is None else media_tokens(kind, text, b.policy.image_tokens)
    if text is None or tokens is None:
        if text is not None and b.policy.image_tokens != "base64":
            what = "header unreadable" if kind == "image" else "duration unknown"
            b.reasons.append(f"{kind} {what}: counted as its base64 text")
        b.split(label, blk, ("data",))
        return
    rest = {k: v for k, v in blk.items() if k != "data"}
    b.add(label, Size(tokens, len(text)), b.value(rest))


def _embedded_resource(b: _Builder, blk: Mapping[str, Any], label: str) -> None:
    resource = _as_mapping(blk.get("resource")) or {}
    key = "text" if "text" in resource else "blob"
    data = b.text(resource.get(key))
    rest = {k: v for k, v in blk.items() if k != "resource"}
    rest["resource"] = {k: v for k, v in resource.items() if k != key}
    b.add(label, data, b.value(rest))


def _parsed_json(text: str) -> Any:
    stripped = text.strip()
    if not stripped or stripped[0] not in "{[" or len(stripped) > _MAX_DUPLICATE_CHECK_CHARS:
        return _NOT_JSON
    try:
        return json.loads(stripped)
    except (ValueError, RecursionError):
        return _NOT_JSON


_NOT_JSON = object()


def _duplicate_of(structured: Any, texts: list[tuple[str, Size]]) -> tuple[Size, bool] | None:
    """How structuredContent repeats a text block, if it does: (that text's size, whether it is MCPServer's
    {"result": text} wrapping of the very string, whose size is then the text's plus the wrapper's)."""
    wrapped = _NOT_JSON
    if (type(structured) is dict or isinstance(structured, Mapping)) and len(structured) == 1:
        wrapped = structured.get("result", _NOT_JSON)
    for text, size in texts:
        if wrapped is not _NOT_JSON and (wrapped is text or wrapped == text):
            return size, True
        parsed = _parsed_json(text)
        if parsed is _NOT_JSON:
            continue
        try:
            if parsed == structured or (wrapped is not _NOT_JSON and parsed == wrapped):
                return size, False
        except RecursionError:
            continue
    return None


def _bounded(b: _Builder, items: list[Any], label: str) -> list[Any]:
    """The items to measure one by one; past MAX_BLOCKS the rest is sized in bulk from its JSON, split into
    data and overhead in the proportion the measured ones had (bounded time, no silent undercount)."""
    if len(items) <= MAX_BLOCKS:
        return items
    head, tail = items[:MAX_BLOCKS], items[MAX_BLOCKS:]

    def bulk() -> None:
        measured_total = sum(blk.tokens for blk in b.blocks[start:])
        measured_overhead = sum(blk.overhead_tokens for blk in b.blocks[start:])
        share = measured_overhead / measured_total if measured_total else 0.0
        # The tail's JSON is scaled by how the measured head compares with its own JSON: the rules above
        # count a text block's text verbatim, not as a JSON string with its key and quotes.
        as_json = b.value(head)
        scale = measured_total / as_json.tokens if as_json.tokens and measured_total else 1.0
        raw = b.value(tail)
        size = Size(round(raw.tokens * scale), raw.bytes)
        overhead = Size(round(size.tokens * share), round(size.bytes * share))
        b.add(f"{label}:bulk", Size(size.tokens - overhead.tokens, size.bytes - overhead.bytes), overhead)
        b.reasons.append(f"{len(tail)} {label} items past the first {MAX_BLOCKS} sized in bulk from their JSON")

    start = len(b.blocks)
    b.pending.append(bulk)
    return head


def _measure_payload(b: _Builder, result: Mapping[str, Any]) -> None:
    content = result.get("content")
    texts: list[tuple[str, Size]] = []  # text blocks and their data sizes, to spot a duplicate
    if isinstance(content, list):
        for block in _bounded(b, content, "content"):
            data = _content_block(b, block)
            if data is not None:
                texts.append(data)
        b.run_pending()
    if "structuredContent" in result:
        structured = result["structuredContent"]
        duplicate = _duplicate_of(structured, texts)
        if duplicate is None:
            b.add("structuredContent", b.value(structured))
        elif duplicate[1]:  # {"result": text}: no need to estimate the same string twice
            text, wrapper = duplicate[0], b.value(_RESULT_WRAPPER)
            b.add("structuredContent", overhead=Size(text.tokens + wrapper.tokens, text.bytes + wrapper.bytes))
        else:
            b.add("structuredContent", overhead=b.value(structured))
    contents = result.get("contents")
    if isinstance(contents, list):  # resources/read
        for item in _bounded(b, contents, "contents"):
            res = _as_mapping(item) or {}
            b.split("resource", res, ("text",) if "text" in res else ("blob",))
        b.run_pending()
    messages = result.get("messages")
    if isinstance(messages, list):  # prompts/get
        for message in _bounded(b, messages, "messages"):
            msg = _as_mapping(message) or {}
            _content_block(b, msg.get("content"), "message:")
            rest = {k: v for k, v in msg.items() if k != "content"}
            if rest:
                b.add("message_framing", overhead=b.value(rest))
        b.run_pending()
    for key, data_fields in _LIST_DATA_FIELDS.items():
        items = result.get(key)
        if isinstance(items, list):
            singular = key[:-1]
            for item in _bounded(b, items, key):
                definition = _as_mapping(item)
                if definition is None:
                    b.add(singular, b.value(item))
                else:
                    b.split(singular, definition, data_fields)
            b.run_pending()


_RESULT_WRAPPER: dict[str, str] = {"result": ""}
#: Payload keys other than a tools/call result's own.
_OTHER_PAYLOAD_KEYS = _RESULT_PAYLOAD_KEYS - {"content", "structuredContent"}


@dataclass(frozen=True, slots=True)
class _Framing:
    """Sizes of the framing the commonest results carry, under one estimator (by the general rule, size_value)."""

    text_block: Size  # a text block's {"type": "text"}
    result_wrapper: Size  # MCPServer's structuredContent {"result": text}, less the text
    is_error: Size  # the result fields {"isError": true}
    not_error: Size  # ... and {"isError": false}


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
            size_value(_TEXT_FRAMING, estimator),
            size_value(_RESULT_WRAPPER, estimator),
            size_value({"isError": True}, estimator),
            size_value({"isError": False}, estimator),
        )
    return framing


def _single_text(b: _Builder, result: dict[str, Any]) -> bool:
    """The commonest result (one plain text block, and MCPServer's ``{"result": text}`` or no
    structuredContent) measured exactly as :func:`_measure_payload` measures it, with fewer steps; False
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


def _result_fields(b: _Builder, rest: dict[str, Any]) -> Size:
    """Size a result's fields besides its payload and _meta: nearly always just ``isError``, whose two
    possible sizes are known."""
    if len(rest) == 1:
        is_error = rest.get("isError")
        if is_error is False:
            return _framing(b.policy.estimator).not_error
        if is_error is True:
            return _framing(b.policy.estimator).is_error
    return b.value(rest)


def measure_result(
    method: str, result: Any, *, tool_name: str | None = None, policy: Policy | None = None
) -> Measurement:
    """Output-side tokens of a successful response (see the module docstring for the overhead rule)."""
    b = _Builder(policy or DEFAULT_POLICY)
    res = _as_mapping(result)
    error_type = None
    if res is None:
        b.add("result", b.value(result))
    elif len(res) > MAX_BLOCKS:  # not a result shape: sized whole (no per-key copy), from its JSON if large
        b.add("result", b.value(res))
        b.reasons.append(f"a result with {len(res)} fields is sized whole")
        if res.get("isError") is True:
            error_type = "tool_error"
    else:
        has_payload = not _RESULT_PAYLOAD_KEYS.isdisjoint(res)
        if has_payload and (type(res) is not dict or not _single_text(b, res)):
            _measure_payload(b, res)
        if "_meta" in res:
            b.add("_meta", overhead=b.value(res["_meta"]))
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
    b = _Builder(policy or DEFAULT_POLICY)
    err = _as_mapping(error)
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
    res = _as_mapping(result)
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
    msg = _as_mapping(message)
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
    if method == "tools/call" and (type(params) is dict or isinstance(params, Mapping)):  # exact type: no ABC call
        name = params.get("name")
        return name if isinstance(name, str) else None
    return None
