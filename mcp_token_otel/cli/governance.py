"""``profile``, ``lock`` and ``check``: token contracts of a server, live (stdio or streamable HTTP) or saved.

    mcp-token-otel profile [OPTIONS] (FILE | --url URL [--header K:V ...] | --stdio -- COMMAND [ARGS...])
    mcp-token-otel lock [-o mcp-token-otel.lock.json] (FILE | --url URL | --stdio -- COMMAND...)
    mcp-token-otel check --lock FILE [--fail-on breaking|risky] (FILE | --url URL | --stdio -- COMMAND...)

Each takes ``--observed URL`` (a /metrics) or ``--prometheus URL`` (``--window``): what the tools really
returned, beside what their schemas promise; the worse of the two tiers is the effective one.

Options come first, ``--stdio`` last: everything after it (after an optional ``--``) is the server's
command line. Exit status: 0 clean, 1 when ``check`` finds a difference at or above ``--fail-on``, 2 on
any error (one ``error:`` line).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import Config
from ..core.client_limits import client_limit_warnings
from ..core.contract import (
    DEFAULT_LOCK_FILE,
    LockError,
    ServerProfile,
    build_lock,
    lock_text,
    profile_server,
    validate_lock,
)
from ..core.estimators import ESTIMATOR_NAMES, get_estimator
from ..core.lock_diff import CheckLimits, diff_locks, failing, server_mismatch, sort_differences
from ..core.measure import Policy
from ..core.observed import (
    ToolView,
    effective_differences,
    merge,
    result_size_warnings,
    validate_effective,
    with_effective,
)
from ..core.profiles import BASE_RULES, canonical_rule
from ..core.risk import RiskThresholds
from . import observed_source
from .governance_render import (
    counts,
    observation_dict,
    print_check,
    print_profile_markdown,
    print_profile_table,
    profile_dict,
)
from .observed_source import Observations, ObservedSourceError


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
        elif "--" in items:  # a server's command line, as `proxy` takes it: say what this command needs
            self.error(f"to run a server over stdio, add --stdio before '--': {self.prog} [OPTIONS] --stdio -- "
                       "COMMAND [ARGS...]")
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


def _rule(value: str) -> str:
    """A base-token rule; ``seed`` is accepted as an older name of ``compact`` and not offered in --help."""
    try:
        return canonical_rule(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {', '.join(BASE_RULES)})") from None


_RULE_METAVAR = "{" + ",".join(BASE_RULES) + "}"


def register(sub: Any) -> None:
    """Add ``profile``, ``lock`` and ``check`` to the ``mcp-token-otel`` subcommands."""
    prof = sub.add_parser(
        "profile", help="token profile of a server's tools: a tools/list file, or a live server over stdio or HTTP",
        description="Definition tokens (split into description, schema and names), static risk profile and "
                    "recommendations of every tool, and the server "
                    "total against the context window.",
    )
    _output_options(prof)
    prof.add_argument("--estimator", choices=ESTIMATOR_NAMES, help="overrides the configured estimator")
    prof.add_argument("--rule", type=_rule, default="default", metavar=_RULE_METAVAR,
                      help="base tokens of a result item: default, or compact (4 characters of a field name per "
                           "token plus 5 for its value)")
    prof.add_argument("--egress-max-bytes", type=int, default=None, help="egress cap applied to every tool")
    observed_source.add_options(prof)
    _target_options(prof, file_help="a tools/list result or response, or - for standard input")
    prof.set_defaults(func=cmd_profile)

    lock = sub.add_parser("lock", help="write the token contract of a server to a lockfile",
                          description="A deterministic, sorted, versioned JSON lockfile of a server's tools.")
    lock.add_argument("-o", "--output", default=DEFAULT_LOCK_FILE,
                      help=f"the lockfile to write (default {DEFAULT_LOCK_FILE}; - for standard output)")
    lock.add_argument("--estimator", choices=ESTIMATOR_NAMES, help="overrides the configured estimator")
    lock.add_argument("--rule", type=_rule, default="default", metavar=_RULE_METAVAR,
                      help="base-token rule (default or compact)")
    lock.add_argument("--egress-max-bytes", type=int, default=None, help="egress cap applied to every tool")
    observed_source.add_options(lock)
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
    observed_source.add_options(check)
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
        "named": "name" in info,  # else the file's name stands in, and is no server's name to compare
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
        "named": True,
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
        except (UsageError, LockError, ObservedSourceError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    run.__name__ = func.__name__
    return run


# --------------------------------------------------------------------------- profile


@_guard
def cmd_profile(args: argparse.Namespace, config: Config, policy: Policy) -> int:
    lists = fetch_lists(args)
    p = _profile(lists, estimator_name=policy.estimator_name, rule=args.rule, thresholds=policy.thresholds,
                 context_window=config.budget.context_window, egress_max_bytes=args.egress_max_bytes)
    warnings = client_limit_warnings(p.tool_definitions, p.server_name or "server")
    observed = _observed(args, p, policy.thresholds)
    if observed is not None:
        warnings += result_size_warnings(observed[1])
    if args.json:
        json.dump(profile_dict(p, warnings, observed), sys.stdout, indent=2, ensure_ascii=False)
        print()
    elif args.markdown:
        print_profile_markdown(p, warnings, sys.stdout, observed)
    else:
        print_profile_table(p, warnings, sys.stdout, observed)
    return 0


def _observed(args: argparse.Namespace, p: ServerProfile,
              thresholds: RiskThresholds) -> tuple[Observations, list[ToolView]] | None:
    """The observations asked for, merged with the static profile; read only once the server was profiled, so
    that the server's own name picks its series."""
    found = observed_source.load(args, p.server_name, thresholds)
    return None if found is None else (found, merge(p, found.tools))


# --------------------------------------------------------------------------- lock


def _locked_name(lists: dict[str, Any]) -> dict[str, Any]:
    """A lock names the server only when the server named itself (a saved listing may not say)."""
    return lists if lists.get("named", True) else {**lists, "server_name": ""}


@_guard
def cmd_lock(args: argparse.Namespace, config: Config, policy: Policy) -> int:
    lists = _locked_name(fetch_lists(args))
    p = _profile(lists, estimator_name=policy.estimator_name, rule=args.rule, thresholds=policy.thresholds,
                 context_window=config.budget.context_window, egress_max_bytes=args.egress_max_bytes)
    lock = build_lock(p)
    observed = _observed(args, p, policy.thresholds)
    text = lock_text(lock if observed is None else with_effective(lock, observed[1]))
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


@_guard
def cmd_check(args: argparse.Namespace, config: Config, policy: Policy) -> int:
    try:
        limits = CheckLimits(args.max_token_increase, args.token_budget)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    old = read_lock(args.lock)
    try:
        validate_effective(old)
    except LockError as exc:
        raise LockError(f"lockfile {args.lock}: {exc}") from None
    estimator_name = old["estimator"]
    if estimator_name not in ESTIMATOR_NAMES:
        raise LockError(f"lockfile {args.lock}: unknown estimator {estimator_name!r}")
    try:
        rule = canonical_rule(old["rule"])
    except ValueError:
        raise LockError(f"lockfile {args.lock}: unknown rule {old['rule']!r}") from None
    lists = _locked_name(fetch_lists(args))
    mismatch = server_mismatch(old, lists["server_name"])
    if mismatch is not None:  # two different servers: a diff of them would only be noise
        raise UsageError(f"{mismatch} (lockfile {args.lock})")
    # Measured exactly as the lock was: its estimator, rule, thresholds, window and egress cap.
    egress = old.get("egress_max_bytes")
    window = old["totals"].get("context_window")
    p = _profile(
        lists, estimator_name=estimator_name, rule=rule, thresholds=RiskThresholds.coerce(old["thresholds"]),
        context_window=window if isinstance(window, int) and window > 0 else config.budget.context_window,
        egress_max_bytes=egress if isinstance(egress, int) and egress > 0 else None,
    )
    differences = diff_locks(old, build_lock(p), limits)
    warnings = client_limit_warnings(p.tool_definitions, p.server_name or "server")
    observed = _observed(args, p, p.thresholds)  # the lock's thresholds, as for the static tiers
    if observed is not None:
        differences = sort_differences(differences + effective_differences(old, observed[1]))
        warnings += result_size_warnings(observed[1])
    failed = failing(differences, args.fail_on)
    report = {
        "lock": args.lock,
        "server": p.server_name,
        "fail_on": args.fail_on,
        "failed": bool(failed),
        "counts": counts(differences),
        "definition_tokens": {"lock": old["totals"].get("definition_tokens"), "now": p.definition_tokens},
        "differences": [d.to_dict() for d in differences],
        "warnings": [w.to_dict() for w in warnings],
    }
    if observed is not None:
        report["observation"] = observation_dict(observed[0])
    print_check(report, differences, warnings, "json" if args.json else "markdown" if args.markdown else "table",
                sys.stdout)
    return 1 if failed else 0
