"""``profile``, ``lock`` and ``check``: token contracts of a server, live (stdio or streamable HTTP) or saved.

    mcp-token-otel profile [OPTIONS] (FILE | --url URL [--header K:V ...] | --stdio -- COMMAND [ARGS...])
    mcp-token-otel lock [-o mcp-token-otel.lock.json] (FILE | --url URL | --stdio -- COMMAND...)
    mcp-token-otel check --lock FILE [--fail-on breaking|risky] (FILE | --url URL | --stdio -- COMMAND...)

Options come first, ``--stdio`` last: everything after it (after an optional ``--``) is the server's
command line. Exit status: 0 clean, 1 when ``check`` finds a difference at or above ``--fail-on``, 2 on
any error (one ``error:`` line).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from ..config import Config
from ..core.contract import (
    CHANGE_CLASSES,
    DEFAULT_LOCK_FILE,
    CheckLimits,
    Difference,
    LockError,
    ServerProfile,
    build_lock,
    diff_locks,
    failing,
    lock_text,
    profile_server,
    validate_lock,
)
from ..core.estimators import ESTIMATOR_NAMES, get_estimator
from ..core.measure import Policy
from ..core.profiles import BASE_RULES
from ..core.risk import RISK_TIERS, RiskThresholds


class UsageError(ValueError):
    """A command line or input that cannot be used; printed as one ``error:`` line, exit 2."""


# --------------------------------------------------------------------------- parsing


def _split_at_stdio(parser: argparse.ArgumentParser) -> None:
    """Make ``--stdio`` take the rest of the line verbatim. argparse cannot: it re-reads ``--`` and the
    command's own options. The subparser's parse_known_args is wrapped on this instance only."""
    plain = parser.parse_known_args

    def parse_known_args(
        self: argparse.ArgumentParser, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        items = list(sys.argv[1:] if args is None else args)
        command: list[str] | None = None
        if "--stdio" in items:
            index = items.index("--stdio")
            items, command = items[:index], items[index + 1 :]
            if command[:1] == ["--"]:
                command = command[1:]
        ns, extras = plain(items, namespace)
        ns.stdio = command
        return ns, extras

    parser.parse_known_args = types.MethodType(parse_known_args, parser)  # type: ignore[method-assign]


def _target_options(parser: argparse.ArgumentParser, *, file_help: str) -> None:
    parser.add_argument("source", nargs="?", metavar="FILE", help=file_help)
    parser.add_argument("--url", help="a streamable HTTP server, e.g. http://127.0.0.1:3001/mcp")
    parser.add_argument("--header", action="append", default=[], metavar="K:V",
                        help="an HTTP header for --url (repeatable), e.g. 'Authorization: Bearer ...'")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds for connecting and listing everything (default 30)")
    parser.add_argument("--stdio", action="store_true",
                        help="last: run '-- COMMAND [ARGS...]' and talk to it over stdio")
    _split_at_stdio(parser)


def _output_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--json", action="store_true", help="machine-readable output")
    group.add_argument("--markdown", action="store_true", help="Markdown, e.g. for a pull-request comment")


def register(sub: Any) -> None:
    """Add ``profile``, ``lock`` and ``check`` to the ``mcp-token-otel`` subcommands."""
    prof = sub.add_parser(
        "profile", help="token profile of a server's tools: a tools/list file, or a live server over stdio or HTTP",
        description="Definition tokens, static risk profile and recommendations of every tool, and the server "
                    "total against the context window.",
    )
    _output_options(prof)
    prof.add_argument("--estimator", choices=ESTIMATOR_NAMES, help="overrides the configured estimator")
    prof.add_argument("--rule", choices=BASE_RULES, default="default",
                      help="base tokens of a result item: default, or seed (seed 000's rule; users -> 1450)")
    prof.add_argument("--egress-max-bytes", type=int, default=None, help="egress cap applied to every tool")
    _target_options(prof, file_help="a tools/list result or response, or - for standard input")
    prof.set_defaults(func=cmd_profile)

    lock = sub.add_parser("lock", help="write the token contract of a server to a lockfile",
                          description="A deterministic, sorted, versioned JSON lockfile of a server's tools.")
    lock.add_argument("-o", "--output", default=DEFAULT_LOCK_FILE,
                      help=f"the lockfile to write (default {DEFAULT_LOCK_FILE}; - for standard output)")
    lock.add_argument("--estimator", choices=ESTIMATOR_NAMES, help="overrides the configured estimator")
    lock.add_argument("--rule", choices=BASE_RULES, default="default", help="base-token rule (default or seed)")
    lock.add_argument("--egress-max-bytes", type=int, default=None, help="egress cap applied to every tool")
    _target_options(lock, file_help="a tools/list result or response, or - for standard input")
    lock.set_defaults(func=cmd_lock)

    check = sub.add_parser(
        "check", help="compare a server with its lockfile; BREAKING, RISKY and SAFE differences",
        description="Exit 0 when clean, 1 when a difference at or above --fail-on is found, 2 on error.",
    )
    check.add_argument("--lock", default=DEFAULT_LOCK_FILE, help=f"the lockfile (default {DEFAULT_LOCK_FILE})")
    check.add_argument("--fail-on", choices=("breaking", "risky"), default="breaking",
                       help="the lowest class that fails the check (default breaking)")
    check.add_argument("--max-token-increase", type=float, default=10.0, metavar="PERCENT",
                       help="definition tokens (a tool's or the server's) up more than this is RISKY (default 10)")
    check.add_argument("--token-budget", type=int, default=None, metavar="TOKENS",
                       help="the server's definition tokens above this are RISKY (default: no budget)")
    _output_options(check)
    _target_options(check, file_help="a tools/list result or response, or - for standard input")
    check.set_defaults(func=cmd_check, estimator=None)


# --------------------------------------------------------------------------- fetching


def _read_json(source: str) -> Any:
    raw = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise UsageError(f"{source}: not UTF-8 (bad byte at offset {exc.start})") from None
    except RecursionError:
        raise UsageError(f"{source}: JSON nested too deeply") from None
    except ValueError as exc:
        raise UsageError(f"{source}: not JSON ({exc})") from None


def _lists_from_file(source: str) -> dict[str, Any]:
    """A saved ``tools/list`` result or response; ``resources``, ``resourceTemplates`` and ``prompts``
    arrays beside ``tools`` are read too."""
    value = _read_json(source)
    if isinstance(value, dict) and isinstance(value.get("result"), dict):
        value = value["result"]
    if isinstance(value, list):
        value = {"tools": value}
    if not isinstance(value, dict) or not isinstance(value.get("tools"), list):
        raise UsageError("expected a tools/list result (an object with a 'tools' array)")

    def items(key: str) -> list[dict[str, Any]]:
        found = value.get(key)
        return [i for i in found if isinstance(i, dict)] if isinstance(found, list) else []

    info = value.get("serverInfo")
    if not isinstance(info, dict):
        info = {}
    return {
        "server_name": str(info.get("name", Path(source).name if source != "-" else "stdin")),
        "server_version": str(info.get("version", "")),
        "tools": items("tools"),
        "resources": items("resources"),
        "resource_templates": items("resourceTemplates"),
        "prompts": items("prompts"),
    }


def _parse_headers(values: Sequence[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for value in values:
        name, sep, content = value.partition(":")
        if not sep or not name.strip():
            raise UsageError(f"--header {value!r}: expected NAME:VALUE")
        headers[name.strip()] = content.strip()
    return headers


def fetch_lists(args: argparse.Namespace) -> dict[str, Any]:
    """What the chosen target lists: a file, a streamable HTTP URL or a stdio command."""
    stdio = getattr(args, "stdio", None)
    given = [name for name, on in (("FILE", args.source is not None), ("--url", args.url is not None),
                                    ("--stdio", stdio is not None)) if on]
    if len(given) != 1:
        raise UsageError("give exactly one of FILE, --url URL or --stdio -- COMMAND"
                         + (f" (got {', '.join(given)})" if given else ""))
    if args.header and args.url is None:
        raise UsageError("--header needs --url")
    if args.source is not None:
        return _lists_from_file(args.source)
    if stdio is not None and not stdio:
        raise UsageError("--stdio needs a command: --stdio -- COMMAND [ARGS...]")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UsageError(f"--timeout: expected a positive number of seconds, got {args.timeout}")
    from ..adapters.discovery import DiscoveryError, Target, discover

    if args.url is not None:
        target = Target(url=args.url, headers=_parse_headers(args.header))
    else:
        assert stdio is not None  # exactly one of FILE, --url and --stdio: checked above
        target = Target(command=tuple(stdio))
    try:
        found = discover(target, timeout=args.timeout)
    except DiscoveryError as exc:
        raise UsageError(str(exc)) from None
    return {
        "server_name": found.server_name,
        "server_version": found.server_version,
        "tools": list(found.tools),
        "resources": list(found.resources),
        "resource_templates": list(found.resource_templates),
        "prompts": list(found.prompts),
    }


def _profile(lists: Mapping[str, Any], *, estimator_name: str, rule: str, thresholds: RiskThresholds,
             context_window: int, egress_max_bytes: int | None) -> ServerProfile:
    if egress_max_bytes is not None and egress_max_bytes <= 0:
        raise UsageError(f"--egress-max-bytes: expected a positive number of bytes, got {egress_max_bytes}")
    return profile_server(
        lists["tools"], lists["resources"], lists["resource_templates"], lists["prompts"],
        server_name=lists["server_name"], server_version=lists["server_version"],
        estimator=get_estimator(estimator_name), estimator_name=estimator_name, rule=rule,
        thresholds=thresholds, context_window=context_window, egress_max_bytes=egress_max_bytes,
    )


def _guard(func: Any) -> Any:
    """One ``error:`` line and exit 2 for what the commands themselves reject."""

    def run(args: argparse.Namespace, config: Config, policy: Policy) -> int:
        try:
            return int(func(args, config, policy))
        except (UsageError, LockError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    run.__name__ = func.__name__
    return run


# --------------------------------------------------------------------------- profile


def _fields_text(fields: Sequence[str], width: int = 28) -> str:
    text = ", ".join(fields) if fields else "-"
    return text if len(text) <= width else text[: width - 3] + "..."


def _limit_text(limit: int | None, source: str) -> str:
    if source == "none":
        return "none"
    if source == "egress":
        return "egress cap"
    if source == "single object":
        return "single object"
    return f"{limit} ({source})"


def profile_dict(p: ServerProfile) -> dict[str, Any]:
    agg = p.aggregate
    others: dict[str, list[dict[str, Any]]] = {"resources": [], "resource_templates": [], "prompts": []}
    for item in p.others:
        others[item.kind].append({"key": item.key, "definition_tokens": item.definition_tokens})
    return {
        "server": {"name": p.server_name, "version": p.server_version},
        "estimator": p.estimator,
        "rule": p.rule,
        "overall_risk": agg.overall_risk,
        "unbounded_tool_names": list(agg.unbounded_tool_names),
        "critical_tool_names": list(agg.critical_tool_names),
        "definition_tokens": p.definition_tokens,
        "tool_definition_tokens": p.tool_definition_tokens,
        "context_window": p.context_window,
        "context_share": round(p.context_share, 6),
        "counts": dict(p.counts),
        "recommendations": list(agg.recommendations),
        "tools": [
            {
                "name": t.tool_name,
                "definition_tokens": t.definition_tokens,
                "risk": t.risk,
                "bounded": t.bounded,
                "max_tokens": t.max_tokens,
                "min_tokens": t.min_tokens,
                "base_tokens": t.base_tokens,
                "field_count": t.field_count,
                "fields": list(t.fields),
                "limit": t.limit,
                "limit_source": t.limit_source,
                "recommendations": list(t.recommendations),
            }
            for t in p.tools
        ],
        **others,
    }


def _totals_line(p: ServerProfile) -> str:
    parts = [f"tools {p.tool_definition_tokens:,}"]
    for kind, label in (("resources", "resources"), ("resource_templates", "resource templates"),
                        ("prompts", "prompts")):
        tokens = sum(i.definition_tokens for i in p.others if i.kind == kind)
        if p.counts.get(kind):
            parts.append(f"{label} {tokens:,}")
    return (f"server total: {p.definition_tokens:,} definition tokens ({'; '.join(parts)}), "
            f"{p.context_share:.1%} of a {p.context_window:,}-token context window")


def _ranked_recommendations(p: ServerProfile) -> list[tuple[str, str]]:
    ranked = sorted(p.tools, key=lambda t: -RISK_TIERS.index(t.risk))
    return [(t.risk, r) for t in ranked for r in t.recommendations]


def _header(p: ServerProfile) -> str:
    name = f"{p.server_name} {p.server_version}".strip() or "server"
    counts = ", ".join(f"{p.counts.get(k, 0)} {label}" for k, label in (
        ("tools", "tools"), ("resources", "resources"), ("resource_templates", "resource templates"),
        ("prompts", "prompts")))
    return f"{name} ({counts}); estimator {p.estimator}, rule {p.rule}"


def print_profile_table(p: ServerProfile, out: TextIO) -> None:
    print(f"server: {_plain(_header(p))}", file=out)
    print(f"  {'tool':<30}{'definition':>11}  {'risk':<9}{'bounded':<8}{'max tokens':>11}{'min':>6}  "
          f"{'limit':<18}fields", file=out)
    for t in p.tools:
        name = _plain(t.tool_name)[:30]
        print(f"  {name:<30}{t.definition_tokens:>11,}  {t.risk:<9}{'yes' if t.bounded else 'no':<8}"
              f"{t.max_tokens:>11,}{t.min_tokens:>6,}  {_limit_text(t.limit, t.limit_source):<18}"
              f"{_fields_text(t.fields)}", file=out)
    print(_totals_line(p), file=out)
    agg = p.aggregate
    line = f"aggregate risk: {agg.overall_risk}"
    if agg.unbounded_tool_names:
        line += f"; unbounded: {', '.join(agg.unbounded_tool_names)}"
    if agg.critical_tool_names:
        line += f"; critical: {', '.join(agg.critical_tool_names)}"
    print(_plain(line), file=out)
    recs = _ranked_recommendations(p)
    if recs:
        print("recommendations (critical first):", file=out)
        for tier, rec in recs:
            print(f"- [{tier}] {_plain(rec)}", file=out)


#: Names, descriptions and versions come from the server: control characters (newlines, terminal escapes)
#: must not reach a terminal or break a table row.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: What would let server-chosen text leave its table cell or add links, images or HTML to a PR comment.
_MD_SPECIAL = re.compile(r"([\\`<>\[\]|])")


def _plain(text: str) -> str:
    return _CONTROL.sub(" ", text)


def _md(text: str) -> str:
    return _MD_SPECIAL.sub(r"\\\1", _plain(text))


def _md_code(text: str) -> str:
    """``text`` as one inline code span (a fence longer than any backtick run in it; ``|`` escaped for tables)."""
    text = _plain(text).replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def print_profile_markdown(p: ServerProfile, out: TextIO) -> None:
    print(f"### MCP token profile: {_md(_header(p))}", file=out)
    print(file=out)
    print("| tool | definition tokens | risk | bounded | max tokens | min tokens | limit | fields |", file=out)
    print("|---|---:|---|---|---:|---:|---|---|", file=out)
    for t in p.tools:
        print(f"| {_md_code(t.tool_name)} | {t.definition_tokens:,} | {t.risk} | {'yes' if t.bounded else 'no'} | "
              f"{t.max_tokens:,} | {t.min_tokens:,} | {_md(_limit_text(t.limit, t.limit_source))} | "
              f"{_md(', '.join(t.fields)) or '-'} |", file=out)
    print(file=out)
    print(f"**{_totals_line(p).capitalize()}.** Aggregate risk: **{p.aggregate.overall_risk}**.", file=out)
    recs = _ranked_recommendations(p)
    if recs:
        print(file=out)
        print("Recommendations (critical first):", file=out)
        print(file=out)
        for tier, rec in recs:
            print(f"- **{tier}**: {_md(rec)}", file=out)


@_guard
def cmd_profile(args: argparse.Namespace, config: Config, policy: Policy) -> int:
    lists = fetch_lists(args)
    p = _profile(lists, estimator_name=policy.estimator_name, rule=args.rule, thresholds=policy.thresholds,
                 context_window=config.budget.context_window, egress_max_bytes=args.egress_max_bytes)
    if args.json:
        json.dump(profile_dict(p), sys.stdout, indent=2, ensure_ascii=False)
        print()
    elif args.markdown:
        print_profile_markdown(p, sys.stdout)
    else:
        print_profile_table(p, sys.stdout)
    return 0


# --------------------------------------------------------------------------- lock


@_guard
def cmd_lock(args: argparse.Namespace, config: Config, policy: Policy) -> int:
    lists = fetch_lists(args)
    p = _profile(lists, estimator_name=policy.estimator_name, rule=args.rule, thresholds=policy.thresholds,
                 context_window=config.budget.context_window, egress_max_bytes=args.egress_max_bytes)
    text = lock_text(build_lock(p))
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    path = Path(args.output)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)  # never a half-written lockfile
    finally:
        tmp.unlink(missing_ok=True)  # left only when writing or replacing failed
    print(f"wrote {path}: {len(p.tools)} tools, {p.definition_tokens:,} definition tokens, "
          f"aggregate risk {p.aggregate.overall_risk}", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- check


def read_lock(path: str) -> dict[str, Any]:
    try:
        value = _read_json(path)
    except OSError as exc:
        raise UsageError(f"cannot read lockfile {path}: {exc.strerror or exc}") from None
    except UsageError as exc:
        raise UsageError(f"lockfile {exc}") from None
    try:
        return validate_lock(value)
    except LockError as exc:
        raise LockError(f"lockfile {path}: {exc}") from None


def _counts(differences: Sequence[Difference]) -> dict[str, int]:
    return {cls: sum(1 for d in differences if d.cls == cls) for cls in reversed(CHANGE_CLASSES)}


def _summary(differences: Sequence[Difference], failed: Sequence[Difference], fail_on: str) -> str:
    if not differences:
        return "no differences: the server matches the lock"
    counts = ", ".join(f"{n} {cls}" for cls, n in _counts(differences).items() if n)
    verdict = "FAIL" if failed else "pass"
    return f"{len(differences)} differences ({counts}); {verdict} (--fail-on {fail_on})"


@_guard
def cmd_check(args: argparse.Namespace, config: Config, policy: Policy) -> int:
    try:
        limits = CheckLimits(args.max_token_increase, args.token_budget)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    old = read_lock(args.lock)
    estimator_name = old["estimator"]
    if estimator_name not in ESTIMATOR_NAMES:
        raise LockError(f"lockfile {args.lock}: unknown estimator {estimator_name!r}")
    if old["rule"] not in BASE_RULES:
        raise LockError(f"lockfile {args.lock}: unknown rule {old['rule']!r}")
    lists = fetch_lists(args)
    # Measured exactly as the lock was: its estimator, rule, thresholds, window and egress cap.
    egress = old.get("egress_max_bytes")
    window = old["totals"].get("context_window")
    p = _profile(
        lists, estimator_name=estimator_name, rule=old["rule"], thresholds=RiskThresholds.coerce(old["thresholds"]),
        context_window=window if isinstance(window, int) and window > 0 else config.budget.context_window,
        egress_max_bytes=egress if isinstance(egress, int) and egress > 0 else None,
    )
    differences = diff_locks(old, build_lock(p), limits)
    failed = failing(differences, args.fail_on)
    if args.json:
        json.dump({
            "lock": args.lock,
            "fail_on": args.fail_on,
            "failed": bool(failed),
            "counts": _counts(differences),
            "definition_tokens": {"lock": old["totals"].get("definition_tokens"), "now": p.definition_tokens},
            "differences": [d.to_dict() for d in differences],
        }, sys.stdout, indent=2, ensure_ascii=False)
        print()
    elif args.markdown:
        print(f"### MCP token contract check: {_md(p.server_name or 'server')} against {_md_code(args.lock)}")
        print()
        if differences:
            print("| class | kind | subject | change | detail |")
            print("|---|---|---|---|---|")
            for d in differences:
                print(f"| **{d.cls}** | {d.kind} | {_md_code(d.subject)} | {_md(d.change)} | {_md(d.detail)} |")
            print()
        print(_summary(differences, failed, args.fail_on))
    else:
        if differences:
            print(f"  {'class':<10}{'kind':<18}{'subject':<28}{'change':<28}detail")
            for d in differences:
                print(f"  {d.cls:<10}{d.kind:<18}{_plain(d.subject)[:27]:<28}{d.change:<28}{_plain(d.detail)}")
        print(_summary(differences, failed, args.fail_on))
    return 1 if failed else 0
