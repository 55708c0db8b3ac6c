"""What ``profile`` and ``check`` print: a table, Markdown (a pull-request comment) or JSON.

Names, descriptions and versions come from the server: control characters are blanked and Markdown
specials escaped, so server-chosen text stays in its cell.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from ..core.client_limits import ClientLimitWarning
from ..core.contract import ServerProfile
from ..core.lock_diff import CHANGE_CLASSES, Difference
from ..core.observed import Observed, ToolView, overall_effective_risk, view_advice
from ..core.profiles import Advice, DefinitionParts, StaticProfile, advice_priority, sum_parts
from .observed_source import Observations

#: Control characters (newlines, terminal escapes) must not reach a terminal or break a table row.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: What would let server-chosen text leave its table cell or add links, images or HTML to a PR comment.
_MD_SPECIAL = re.compile(r"([\\`<>\[\]|])")


def plain(text: str) -> str:
    return _CONTROL.sub(" ", text)


def md(text: str) -> str:
    return _MD_SPECIAL.sub(r"\\\1", plain(text))


def md_code(text: str) -> str:
    """``text`` as one inline code span (a fence longer than any backtick run in it; ``|`` escaped for tables)."""
    text = plain(text).replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _bounded_text(t: StaticProfile) -> str:
    return "unknown" if t.bounded is None else "yes" if t.bounded else "no"


def _max_text(t: StaticProfile) -> str:
    if t.max_tokens is not None:
        return f"{t.max_tokens:,}"
    return "unknown" if t.bounded is None else "unbounded"


def _limit_text(limit: int | None, source: str) -> str:
    if source in ("none", "single object"):
        return source
    if source == "egress":
        return "egress cap"
    return f"{limit:,} ({source})" if limit is not None else source


# --------------------------------------------------------------------------- profile

#: The columns a definition's tokens are split into (``DefinitionParts``), after the ``definition`` total.
PART_COLUMNS = ("description", "schema", "names")


def _parts_dict(parts: DefinitionParts | None) -> dict[str, int] | None:
    return None if parts is None else {part: getattr(parts, part) for part in PART_COLUMNS}


def _part_cells(t: StaticProfile) -> list[str]:
    parts = _parts_dict(t.definition_parts)
    return [f"{parts[part]:,}" if parts else "-" for part in PART_COLUMNS]


def _tool_parts(p: ServerProfile) -> DefinitionParts | None:
    """The tools' definition tokens by part, summed; None if a tool's split is not known."""
    parts = [t.definition_parts for t in p.tools]
    return sum_parts(part for part in parts if part is not None) if None not in parts else None


def profile_dict(p: ServerProfile, warnings: Sequence[ClientLimitWarning],
                 observed: tuple[Observations, Sequence[ToolView]] | None = None) -> dict[str, Any]:
    """The ``--json`` of a profile; with observations, each tool gains ``observed`` and ``effective_risk``."""
    agg = p.aggregate
    priorities = _priorities(p, observed)
    others: dict[str, list[dict[str, Any]]] = {"resources": [], "resource_templates": [], "prompts": []}
    for item in p.others:
        others[item.kind].append({"key": item.key, "definition_tokens": item.definition_tokens})
    out: dict[str, Any] = {
        "server": {"name": p.server_name, "version": p.server_version},
        "estimator": p.estimator,
        "rule": p.rule,
        "overall_risk": agg.overall_risk,
        "unbounded_tool_names": list(agg.unbounded_tool_names),
        "unknown_tool_names": list(agg.unknown_tool_names),
        "critical_tool_names": list(agg.critical_tool_names),
        "definition_tokens": p.definition_tokens,
        "tool_definition_tokens": p.tool_definition_tokens,
        "tool_definition_parts": _parts_dict(_tool_parts(p)),
        "context_window": p.context_window,
        "context_share": round(p.context_share, 6),
        "counts": dict(p.counts),
        "warnings": [w.to_dict() for w in warnings],
        "recommendations": [a.text for a in _advice(p, observed)],
        "advice": [a.to_dict() for a in _advice(p, observed)],
        "tools": [
            {
                "name": t.tool_name, "definition_tokens": t.definition_tokens,
                "definition_parts": _parts_dict(t.definition_parts), "risk": t.risk, "bounded": t.bounded,
                "max_tokens": t.max_tokens, "min_tokens": t.min_tokens, "base_tokens": t.base_tokens,
                "field_count": t.field_count, "fields": list(t.fields), "limit": t.limit,
                "limit_source": t.limit_source, "reason": t.reason, "recommendations": list(t.recommendations),
                "priority": priorities[t.tool_name],
            }
            for t in p.tools
        ],
        **others,
    }
    return out if observed is None else _with_observed(out, *observed)


def _observed_dict(o: Observed | None) -> dict[str, Any] | None:
    return None if o is None else o.to_dict()


def observation_dict(obs: Observations) -> dict[str, Any]:
    return {"source": obs.source, "server": obs.server, "tools_observed": len(obs.tools),
            "calls": sum(o.calls for o in obs.tools.values()), "other_servers": list(obs.other_servers)}


def _with_observed(out: dict[str, Any], obs: Observations, views: Sequence[ToolView]) -> dict[str, Any]:
    by_name = {v.name: v for v in views if v.static is not None}
    for tool in out["tools"]:
        view = by_name[tool["name"]]
        tool["observed"], tool["effective_risk"] = _observed_dict(view.observed), view.effective_risk
    out["observation"] = observation_dict(obs)
    out["effective_risk"] = overall_effective_risk(views)
    out["bounded_but_observed_large"] = [v.name for v in views if v.bounded_but_large]
    out["observed_unlisted_tools"] = [{"name": v.name, "observed": _observed_dict(v.observed),
                                       "effective_risk": v.effective_risk} for v in views if v.static is None]
    return out


def _totals_line(p: ServerProfile) -> str:
    split = _parts_dict(_tool_parts(p))
    detail = ": " + ", ".join(f"{part} {n:,}" for part, n in split.items()) if split and p.tools else ""
    parts = [f"tools {p.tool_definition_tokens:,}{detail}"]
    for kind, label in (("resources", "resources"), ("resource_templates", "resource templates"),
                        ("prompts", "prompts")):
        tokens = sum(i.definition_tokens for i in p.others if i.kind == kind)
        if p.counts.get(kind):
            parts.append(f"{label} {tokens:,}")
    return (f"server total: {p.definition_tokens:,} definition tokens ({'; '.join(parts)}), "
            f"{p.context_share:.1%} of a {p.context_window:,}-token context window")


def _advice(p: ServerProfile, observed: tuple[Observations, Sequence[ToolView]] | None) -> tuple[Advice, ...]:
    """The recommendations ranked by impact: from the static profile, or with the observations."""
    return p.aggregate.advice if observed is None else view_advice(observed[1])


def _priorities(p: ServerProfile, observed: tuple[Observations, Sequence[ToolView]] | None) -> dict[str, str]:
    """Each listed tool's advice priority."""
    if observed is None:
        return {t.tool_name: advice_priority(t) for t in p.tools}
    return {v.name: advice_priority(v.static, v.effective_risk, v.observed.risk if v.observed else None)
            for v in observed[1] if v.static is not None}


#: The line above the recommendations.
ADVICE_TITLE = "recommendations (by impact, critical first)"


def _header(p: ServerProfile) -> str:
    name = f"{p.server_name} {p.server_version}".strip() or "server"
    counts = ", ".join(f"{p.counts.get(k, 0)} {label}" for k, label in (
        ("tools", "tools"), ("resources", "resources"), ("resource_templates", "resource templates"),
        ("prompts", "prompts")))
    return f"{name} ({counts}); estimator {p.estimator}, rule {p.rule}"


def warning_lines(warnings: Sequence[ClientLimitWarning]) -> list[str]:
    return [f"warning: {plain(w.subject)}: {w.message}" for w in warnings]


def _static_table(p: ServerProfile, out: TextIO) -> None:
    width = max([4, *(len(plain(t.tool_name)) for t in p.tools)]) + 2
    limits = [_limit_text(t.limit, t.limit_source) for t in p.tools]
    limit_width = max([5, *(len(text) for text in limits)]) + 2
    cells = [_part_cells(t) for t in p.tools]
    part_widths = [max([len(head), *(len(row[i]) for row in cells)]) for i, head in enumerate(PART_COLUMNS)]
    heads = "".join(f"  {head:>{w}}" for head, w in zip(PART_COLUMNS, part_widths, strict=True))
    print(f"  {'tool':<{width}}{'definition':>10}{heads}  {'risk':<10}{'bounded':<9}{'max tokens':>10}  "
          f"{'limit':<{limit_width}}reason", file=out)
    for t, limit, row in zip(p.tools, limits, cells, strict=True):
        split = "".join(f"  {cell:>{w}}" for cell, w in zip(row, part_widths, strict=True))
        print(f"  {plain(t.tool_name):<{width}}{t.definition_tokens:>10,}{split}  {t.risk:<10}{_bounded_text(t):<9}"
              f"{_max_text(t):>10}  {limit:<{limit_width}}{plain(t.reason)}", file=out)


# --------------------------------------------------------------------------- observed beside static

#: Columns of the table with observations; the right-aligned ones are numbers.
OBSERVED_HEAD = ("tool", "definition", "static", "bounded", "max tokens", "calls", "p50", "p95", "max seen",
                 "observed", "effective", "limit", "reason")
_RIGHT = frozenset({"definition", "max tokens", "calls", "p50", "p95", "max seen"})


def _seen_max(o: Observed) -> str:
    """An exact maximum as it is, a bound as '<=N'."""
    return f"{o.max:,}" if o.max_exact else f"<={o.max:,}"


def observed_rows(views: Sequence[ToolView]) -> list[list[str]]:
    """One row of OBSERVED_HEAD cells per tool (server-chosen text not yet escaped)."""
    rows = []
    for v in views:
        s, o = v.static, v.observed
        static = [f"{s.definition_tokens:,}", s.risk, _bounded_text(s), _max_text(s)] if s else [
            "-", "-", "not listed", "-"]
        seen = [f"{o.calls:,}", f"{o.p50:,}", f"{o.p95:,}", _seen_max(o), o.risk] if o else [
            "0", "-", "-", "-", "not observed"]
        tail = [_limit_text(s.limit, s.limit_source), s.reason] if s else ["-", "observed, not listed by the server"]
        rows.append([v.name, *static, *seen, v.effective_risk, *tail])
    return rows


def _observed_table(views: Sequence[ToolView], out: TextIO) -> None:
    rows = [[plain(cell) for cell in row] for row in observed_rows(views)]
    widths = [max([len(head), *(len(row[i]) for row in rows)]) for i, head in enumerate(OBSERVED_HEAD)]
    for row in [list(OBSERVED_HEAD), *rows]:
        cells = [cell.rjust(w) if head in _RIGHT else cell.ljust(w)
                 for cell, w, head in zip(row, widths, OBSERVED_HEAD, strict=True)]
        print(("  " + "  ".join(cells)).rstrip(), file=out)


def observation_line(obs: Mapping[str, Any]) -> str:
    """One line saying where the observations come from and what they hold (``observation_dict``)."""
    if obs["tools_observed"]:
        return (f"observed: {obs['source']}, server {obs['server']!r}: {obs['tools_observed']} tools, "
                f"{obs['calls']:,} calls")
    others = obs["other_servers"]
    hint = f" (the metrics name {', '.join(repr(s) for s in others)}; choose one with --server)" if others else ""
    return f"observed: {obs['source']}: no tool calls of server {obs['server']!r}{hint}"


def observed_summary(views: Sequence[ToolView]) -> list[str]:
    """The effective tier over the server, and the tools declared bounded but observed large."""
    lines = [f"effective risk (static and observed): {overall_effective_risk(views)}"]
    large = [f"{v.name} (p95 {v.observed.p95:,} tokens, declared max {v.static.max_tokens:,})"
             for v in views if v.bounded_but_large and v.observed and v.static and v.static.max_tokens is not None]
    if large:
        lines.append(f"declared bounded but observed large: {', '.join(large)}")
    return lines


def print_profile_table(p: ServerProfile, warnings: Sequence[ClientLimitWarning], out: TextIO,
                        observed: tuple[Observations, Sequence[ToolView]] | None = None) -> None:
    print(f"server: {plain(_header(p))}", file=out)
    if observed is None:
        _static_table(p, out)
    else:
        print(plain(observation_line(observation_dict(observed[0]))), file=out)
        _observed_table(observed[1], out)
    print(_totals_line(p), file=out)
    agg = p.aggregate
    line = f"aggregate risk: {agg.overall_risk}"
    for label, names in (("unbounded", agg.unbounded_tool_names), ("unknown", agg.unknown_tool_names),
                         ("critical", agg.critical_tool_names)):
        if names:
            line += f"; {label}: {', '.join(names)}"
    print(plain(line), file=out)
    for text in observed_summary(observed[1]) if observed else ():
        print(plain(text), file=out)
    for text in warning_lines(warnings):
        print(text, file=out)
    advice = _advice(p, observed)
    if advice:
        print(f"{ADVICE_TITLE}:", file=out)
        for a in advice:
            print(f"- [{a.priority}] {plain(a.text)}", file=out)


def _markdown_table(p: ServerProfile, observed: tuple[Observations, Sequence[ToolView]] | None,
                    out: TextIO) -> None:
    if observed is not None:
        print(md(observation_line(observation_dict(observed[0]))), file=out)
        print(file=out)
        print("| " + " | ".join(OBSERVED_HEAD) + " |", file=out)
        print("|" + "|".join("---:" if h in _RIGHT else "---" for h in OBSERVED_HEAD) + "|", file=out)
        for row in observed_rows(observed[1]):
            print("| " + " | ".join([md_code(row[0]), *(md(cell) for cell in row[1:])]) + " |", file=out)
        return
    print(f"| tool | definition tokens | {' | '.join(PART_COLUMNS)} | risk | bounded | max tokens | limit | reason |",
          file=out)
    print("|---|---:|" + "---:|" * len(PART_COLUMNS) + "---|---|---:|---|---|", file=out)
    for t in p.tools:
        print(f"| {md_code(t.tool_name)} | {t.definition_tokens:,} | {' | '.join(_part_cells(t))} | {t.risk} | "
              f"{_bounded_text(t)} | {_max_text(t)} | {md(_limit_text(t.limit, t.limit_source))} | {md(t.reason)} |",
              file=out)


def print_profile_markdown(p: ServerProfile, warnings: Sequence[ClientLimitWarning], out: TextIO,
                           observed: tuple[Observations, Sequence[ToolView]] | None = None) -> None:
    print(f"### MCP token profile: {md(_header(p))}", file=out)
    print(file=out)
    _markdown_table(p, observed, out)
    print(file=out)
    print(f"**{_totals_line(p).capitalize()}.** Aggregate risk: **{p.aggregate.overall_risk}**.", file=out)
    for text in observed_summary(observed[1]) if observed else ():
        print(file=out)
        print(md(text[0].upper() + text[1:]) + ".", file=out)
    _markdown_warnings(warnings, out)
    advice = _advice(p, observed)
    if advice:
        print(file=out)
        print(f"{ADVICE_TITLE.capitalize()}:", file=out)
        print(file=out)
        for a in advice:
            print(f"- **{a.priority}**: {md(a.text)}", file=out)


def _markdown_warnings(warnings: Sequence[ClientLimitWarning], out: TextIO) -> None:
    if warnings:
        print(file=out)
        print("Client limits:", file=out)
        print(file=out)
        for w in warnings:
            print(f"- **warning** {md_code(w.subject)}: {md(w.message)}", file=out)


# --------------------------------------------------------------------------- check


def counts(differences: Sequence[Difference]) -> dict[str, int]:
    return {cls: sum(1 for d in differences if d.cls == cls) for cls in reversed(CHANGE_CLASSES)}


def summary(differences: Sequence[Difference], failed: Sequence[Difference], fail_on: str) -> str:
    if not differences:
        return "no differences: the server matches the lock"
    found = ", ".join(f"{n} {cls}" for cls, n in counts(differences).items() if n)
    verdict = "FAIL" if failed else "pass"
    return f"{len(differences)} differences ({found}); {verdict} (--fail-on {fail_on})"


def print_check(report: dict[str, Any], differences: Sequence[Difference], warnings: Sequence[ClientLimitWarning],
                fmt: str, out: TextIO) -> None:
    """``report`` is the JSON form (lock, fail_on, failed, counts, definition_tokens, differences, warnings)."""
    failed = [d for d in differences if CHANGE_CLASSES.index(d.cls) >= CHANGE_CLASSES.index(report["fail_on"].upper())]
    if fmt == "json":
        json.dump(report, out, indent=2, ensure_ascii=False)
        print(file=out)
        return
    if fmt == "markdown":
        print(f"### MCP token contract check: {md(report['server'] or 'server')} against {md_code(report['lock'])}",
              file=out)
        print(file=out)
        if "observation" in report:
            print(md(observation_line(report["observation"])), file=out)
            print(file=out)
        if differences:
            print("| class | kind | subject | change | detail |", file=out)
            print("|---|---|---|---|---|", file=out)
            for d in differences:
                print(f"| **{d.cls}** | {d.kind} | {md_code(d.subject)} | {md(d.change)} | {md(d.detail)} |", file=out)
        _markdown_warnings(warnings, out)
        if differences or warnings:
            print(file=out)
        print(summary(differences, failed, report["fail_on"]), file=out)
        return
    if "observation" in report:
        print(plain(observation_line(report["observation"])), file=out)
    if differences:
        subject = max([7, *(len(plain(d.subject)) for d in differences)]) + 2
        change = max([6, *(len(d.change) for d in differences)]) + 2
        print(f"  {'class':<10}{'kind':<18}{'subject':<{subject}}{'change':<{change}}detail", file=out)
        for d in differences:
            row = f"  {d.cls:<10}{d.kind:<18}{plain(d.subject):<{subject}}{d.change:<{change}}{plain(d.detail)}"
            print(row.rstrip(), file=out)
    for text in warning_lines(warnings):
        print(text, file=out)
    print(summary(differences, failed, report["fail_on"]), file=out)
