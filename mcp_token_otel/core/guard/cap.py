"""Response cap: cut a tool result to a token budget without ever producing broken text or broken JSON.

Block by block, within one budget: text is cut by :mod:`.text_cut`; JSON (``structuredContent``, and a text
block whose text is a JSON object or array) by :mod:`.json_cut`, or, too large or too deep to parse, as a closed
prefix of its text (:mod:`.json_prefix`); image, audio and blob blocks that do not fit are replaced by a notice.
What was cut is told in a notice appended to the result (:class:`~.report.CapReport`).

Accounting follows :func:`mcp_token_otel.core.measure.measure_result` block by block (same estimator,
same data/overhead rule), so the cut result measures at most ``cap`` data tokens plus the notices added.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..measure import Measurement, Policy, measure_result
from ..payload import size_value
from . import notices
from .json_cut import NOT_JSON, UNPARSED, cut_json, cut_json_text, dumped_size, dumper, parse_json_text
from .json_prefix import cut_json_text_unparsed
from .pagination import Pagination, no_pagination_hint
from .report import CapReport
from .text_cut import cut_text

#: A JSON text block is parsed (to cut it by whole items) up to this size, or this many characters per token
#: of its budget when that is more; a larger one is cut as a closed prefix of the text, without parsing.
_PARSE_ALWAYS_CHARS = 256 * 1024
_PARSE_BUDGET_FACTOR = 64


def _duplicate_index(content: list[Any], structured: Any) -> tuple[int, bool] | None:
    """Which text block structuredContent repeats: (index, wrapped) where wrapped means {"result": text}."""
    wrapped = structured.get("result", NOT_JSON) if isinstance(structured, dict) and len(structured) == 1 else None
    for index, block in enumerate(content):
        if not isinstance(block, Mapping) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            continue
        text = block["text"]
        if wrapped is not None and wrapped is not NOT_JSON and isinstance(wrapped, str) and wrapped == text:
            return index, True
        parsed = parse_json_text(text)
        if parsed is NOT_JSON or parsed is UNPARSED:
            continue
        try:
            if parsed == structured:
                return index, False
            if wrapped is not None and parsed == wrapped:
                return index, True
        except RecursionError:  # both nested beyond the comparison's stack: not a duplicate worth keeping equal
            continue
    return None


def cap_result(
    result: Mapping[str, Any],
    cap: int,
    *,
    policy: Policy,
    measurement: Measurement | None = None,
    tool: str | None = None,
    output_schema: Any = None,
    pagination: Pagination | None = None,
    arguments: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any] | None, CapReport]:
    """Cut a tools/call result to ``cap`` data tokens. Returns (new result, report); the new result is None
    when the result fits (then the report's kept_tokens is its total).

    Without an ``output_schema`` the cut always reaches the cap (plus the notices). With one, only what the
    schema allows is cut; whatever it forces above its share is taken from the text blocks' share, so only the
    part the schema itself cannot give up stays above the cap (reported in ``over_cap_tokens``)."""
    m = measurement if measurement is not None else measure_result("tools/call", result, policy=policy)
    report = CapReport(cap, m.data_tokens, kept_tokens=m.data_tokens)
    if m.data_tokens <= cap:
        return None, report
    estimator = policy.estimator
    content = result.get("content")
    content = content if isinstance(content, list) else []
    has_structured = "structuredContent" in result
    structured: Any = result.get("structuredContent")
    duplicate = _duplicate_index(content, structured) if has_structured else None
    block_tokens = [b.data_tokens for b in m.blocks[: len(content)]]
    structured_tokens = 0
    if has_structured and duplicate is None and len(m.blocks) > len(content):
        structured_tokens = m.blocks[len(content)].data_tokens
    new_structured = structured
    kept = 0
    if structured_tokens:
        # structuredContent that is data of its own gets a share of the cap in proportion to its size, and is
        # cut first: what its schema keeps above that share comes out of the text blocks' share.
        structured_budget = max(1, cap * structured_tokens // m.data_tokens)  # room for at least "{}"
        cut = cut_json(
            structured, structured_budget, lambda v: size_value(v, estimator).tokens, estimator, output_schema,
            prefix_ok=output_schema is None, tokens=structured_tokens,
        )
        new_structured = cut.value
        kept += cut.tokens
        report.arrays.extend(("structuredContent" + p, k, n) for p, k, n in cut.arrays)
        report.strings.extend("structuredContent" + p for p in cut.strings)
        if cut.cut_at is not None:
            report.prefixes.append(("structuredContent", cut.cut_at))
    remaining = cap - kept
    new_content: list[Any] = []
    lines = chars = 0  # of the text shown, for the pagination hint
    for index, block in enumerate(content):
        tokens = block_tokens[index] if index < len(block_tokens) else 0
        kind = block.get("type") if isinstance(block, Mapping) else None
        if tokens <= remaining:
            new_content.append(block)
            remaining -= tokens
            kept += tokens
            if kind == "text" and isinstance(block.get("text"), str):
                lines += block["text"].count("\n")
                chars += len(block["text"])
            continue
        if kind in ("image", "audio") or (
            kind == "resource" and isinstance(block.get("resource"), Mapping) and "blob" in block["resource"]
        ):
            mime = block.get("mimeType") if kind != "resource" else block["resource"].get("mimeType")
            text = notices.media_removed(kind, mime if isinstance(mime, str) else None, tokens, cap)
            new_content.append({"type": "text", "text": text})
            report.media_replaced += 1
            report.notice_tokens += estimator(text)
            continue
        is_duplicate = duplicate is not None and duplicate[0] == index
        if remaining <= 0 and not is_duplicate:  # the duplicate is cut (to its floor) to keep the pair equal
            report.blocks_dropped += 1
            continue
        where = f"content[{index}]"
        if kind == "text" and isinstance(block.get("text"), str):
            text = block["text"]
            if is_duplicate and duplicate is not None:
                # The text and structuredContent say the same: cut the JSON once, write the text from it.
                wrapped = duplicate[1]
                inner = structured["result"] if wrapped else structured
                if isinstance(inner, str):
                    new_text, tokens_kept = cut_text(text, max(0, remaining), estimator, tokens)
                    new_inner: Any = new_text
                    if len(new_text) < len(text):
                        report.text_blocks_cut += 1
                else:
                    sub_schema = _wrapped_schema(output_schema) if wrapped else output_schema
                    dump = dumper(text)
                    cut = cut_json(inner, max(0, remaining), dumped_size(dump, estimator), estimator, sub_schema,
                                   prefix_ok=output_schema is None, tokens=tokens)
                    new_inner, new_text, tokens_kept = cut.value, dump(cut.value), cut.tokens
                    prefix = "/result" if wrapped else ""
                    report.arrays.extend((prefix + p, k, n) for p, k, n in cut.arrays)
                    report.strings.extend(prefix + p for p in cut.strings)
                    if cut.cut_at is not None:
                        report.prefixes.append(("structuredContent", prefix + cut.cut_at))
                new_structured = {**structured, "result": new_inner} if wrapped else new_inner
            else:
                # A text far larger than the budget is not parsed: a closed prefix costs what it keeps.
                parsed = parse_json_text(text, max(_PARSE_ALWAYS_CHARS, _PARSE_BUDGET_FACTOR * remaining))
                as_json = None
                unparsed = None
                if parsed is not NOT_JSON and parsed is not UNPARSED:
                    as_json = cut_json_text(text, parsed, remaining, estimator, tokens)
                if as_json is None and parsed is not NOT_JSON:
                    unparsed = cut_json_text_unparsed(text, remaining, estimator, tokens)
                if as_json is not None:
                    new_text, cut = as_json
                    tokens_kept = cut.tokens
                    report.arrays.extend((where + p, k, n) for p, k, n in cut.arrays)
                    if cut.strings:
                        report.text_blocks_cut += 1
                    if cut.cut_at is not None:
                        report.prefixes.append((where, cut.cut_at))
                        report.text_blocks_cut += 1
                elif unparsed is not None:  # too large or too deep to parse: a closed prefix of the text itself
                    new_text, tokens_kept = unparsed
                    report.prefixes.append((where, ""))
                    report.text_blocks_cut += 1
                else:  # not JSON, or JSON whose beginning cannot be closed (e.g. a long string): cut as text
                    new_text, tokens_kept = cut_text(text, remaining, estimator, tokens)
                    report.text_blocks_cut += 1
                    if parsed is not NOT_JSON:
                        report.json_as_text.append(where)
            new_content.append({**block, "text": new_text})
            lines += new_text.count("\n")
            chars += len(new_text)
        elif kind == "resource" and isinstance(block.get("resource"), Mapping) and isinstance(
            block["resource"].get("text"), str
        ):
            text = block["resource"]["text"]
            new_text, tokens_kept = cut_text(text, remaining, estimator, tokens)
            new_content.append({**block, "resource": {**block["resource"], "text": new_text}})
            report.text_blocks_cut += 1
        else:  # a block that cannot be cut (resource link, unknown type) and does not fit
            report.blocks_dropped += 1
            continue
        kept += tokens_kept
        remaining -= tokens_kept
    report.kept_tokens = kept
    report.over_cap_tokens = max(0, kept - cap)
    report.schema_bound = output_schema is not None
    hint = (pagination.hint(tool, report, arguments, lines=lines, chars=chars) if pagination
            else no_pagination_hint(tool))
    report.notice = notices.truncated(report, tool, hint)
    report.notice_tokens += estimator(report.notice)
    new_content.append({"type": "text", "text": report.notice})
    new_result = {**result, "content": new_content}
    if has_structured:
        new_result["structuredContent"] = new_structured
    return new_result, report


def _wrapped_schema(schema: Any) -> Any:
    """The schema of ``result`` inside MCPServer's {"result": ...} wrapper (with $defs kept reachable)."""
    if not isinstance(schema, Mapping):
        return None
    props = schema.get("properties")
    sub = props.get("result") if isinstance(props, Mapping) else None
    if not isinstance(sub, Mapping):
        return None
    # Keep the root's definitions so local $refs inside still resolve.
    defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    return {**defs, **sub}
