"""The ``mcp-token-otel`` command line."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from ..config import Config, ConfigError, build_policy, config_as_dict, load_config
from ..core.estimators import ESTIMATOR_NAMES, EstimatorUnavailable
from ..core.measure import Measurement, Policy, measure_message, measure_result
from ..core.profiles import aggregate_profiles, profile_tool_definition


def _read_input(source: str) -> tuple[Any, str | None]:
    """The parsed JSON in ``source`` (a path or ``-``), or its text when it is not JSON; and a note."""
    raw = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    try:
        text = raw.decode("utf-8")
        note = None
    except UnicodeDecodeError as exc:
        text = raw.decode("utf-8", errors="replace")
        note = f"input is not valid UTF-8 (first bad byte at offset {exc.start}); bad bytes replaced"
    try:
        return json.loads(text), note
    except RecursionError:
        return text, "; ".join(filter(None, [note, "JSON nested too deeply to parse; measured as text"]))
    except ValueError:
        return text, note


def _measure(value: Any, policy: Policy, method: str | None, tool: str | None) -> list[Measurement]:
    if isinstance(value, str):
        return [measure_result(method or "text", {"content": [{"type": "text", "text": value}]},
                               tool_name=tool, policy=policy)]
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):  # JSON-RPC batch
        return [measure_message(v, request_method=method, tool_name=tool, policy=policy) for v in value]
    return [measure_message(value, request_method=method, tool_name=tool, policy=policy)]


def _print_measurement(m: Measurement, policy: Policy, out: TextIO) -> None:
    what = f"{m.method} {'request' if m.direction == 'input' else 'response'} ({m.direction})"
    if m.tool_name:
        what += f", tool '{m.tool_name}'"
    print(what, file=out)
    print(f"estimator: {policy.estimator_name}", file=out)
    print(f"  {'block':<28}{'tokens':>10}{'bytes':>12}{'overhead':>10}", file=out)
    for b in m.blocks:
        print(f"  {b.type:<28}{b.tokens:>10,}{b.bytes:>12,}{b.overhead_tokens:>10,}", file=out)
    print(
        f"total: {m.total_tokens:,} tokens (data {m.data_tokens:,}, overhead {m.overhead_tokens:,}), "
        f"overhead ratio {m.overhead_ratio:.3f}",
        file=out,
    )
    print(f"risk tier: {m.risk_tier}", file=out)
    if m.error_type:
        print(f"error: {m.error_type}", file=out)
    for advice in m.advisories:
        print(f"advisory: {advice}", file=out)
    if m.reason:
        print(f"note: {m.reason}", file=out)


def _cmd_estimate(args: argparse.Namespace, config: Config, policy: Policy) -> int:
    value, note = _read_input(args.source)
    results = _measure(value, policy, args.method, args.tool)
    if args.json:
        payload = [{**m.to_dict(), "estimator": policy.estimator_name} for m in results]
        for item in payload:
            item["input_note"] = note
        json.dump(payload[0] if len(payload) == 1 else payload, sys.stdout, indent=2)
        print()
        return 0
    for index, m in enumerate(results):
        if index:
            print()
        _print_measurement(m, policy, sys.stdout)
    if note:
        print(f"note: {note}")
    return 0


def _cmd_profile(args: argparse.Namespace, config: Config, policy: Policy) -> int:
    value, _ = _read_input(args.source)
    if isinstance(value, dict) and "result" in value:
        value = value["result"]
    tools = value.get("tools") if isinstance(value, dict) else value
    if not isinstance(tools, list):
        print("error: expected a tools/list result (an object with a 'tools' array)", file=sys.stderr)
        return 2
    defs = [t for t in tools if isinstance(t, dict)]
    agg = aggregate_profiles(
        profile_tool_definition(t, egress_max_bytes=args.egress_max_bytes, thresholds=policy.thresholds)
        for t in defs
    )
    if args.json:
        json.dump(
            {
                "overall_risk": agg.overall_risk,
                "unbounded_tool_names": list(agg.unbounded_tool_names),
                "critical_tool_names": list(agg.critical_tool_names),
                "definition_tokens": agg.definition_tokens,
                "recommendations": list(agg.recommendations),
                "tools": [
                    {k: getattr(p, k) for k in p.__dataclass_fields__} | {"recommendations": list(p.recommendations)}
                    for p in agg.profiles
                ],
            },
            sys.stdout,
            indent=2,
        )
        print()
        return 0
    print(f"  {'tool':<32}{'risk':>10}{'bounded':>9}{'max tokens':>12}{'definition':>12}")
    for p in agg.profiles:
        print(f"  {p.tool_name:<32}{p.risk:>10}{'yes' if p.bounded else 'no':>9}"
              f"{p.max_tokens:>12,}{p.definition_tokens:>12,}")
    print(f"overall risk: {agg.overall_risk}; tool definitions cost {agg.definition_tokens:,} tokens")
    for rec in agg.recommendations:
        print(f"- {rec}")
    return 0


def _cmd_config(args: argparse.Namespace, config: Config, policy: Policy) -> int:
    print(yaml.safe_dump(config_as_dict(config, hide_secrets=True), sort_keys=False), end="")
    return 0


def _cmd_demo(args: argparse.Namespace, config: Config, policy: Policy) -> int:
    import anyio

    from .demo import DemoOptions, run_demo

    options = DemoOptions(
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        duration=args.duration,
        rate=args.rate,
        sessions=args.sessions,
        context_window=args.context_window,
        seed=args.seed,
        interval=args.interval,
        quiet=args.quiet,
    )
    try:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends a --duration 0 run
            anyio.run(run_demo, config, options)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mcp-token-otel",
        description="Token economics for MCP tool calls: estimates, overhead, risk tiers, budgets.",
    )
    parser.add_argument("--config", help="YAML configuration file (default: $MCP_TOKEN_OTEL_CONFIG)")
    sub = parser.add_subparsers(dest="command", required=True)

    est = sub.add_parser("estimate", help="estimate and classify a payload or an MCP JSON-RPC message")
    est.add_argument("source", help="a file, or - for standard input")
    est.add_argument("--json", action="store_true", help="machine-readable output")
    est.add_argument("--estimator", choices=ESTIMATOR_NAMES, help="overrides the configured estimator")
    est.add_argument("--method", help="the request method a bare result answers (default: inferred)")
    est.add_argument("--tool", help="the tool name, for advisories")
    est.set_defaults(func=_cmd_estimate)

    prof = sub.add_parser("profile", help="static risk profiles of the tools in a tools/list result")
    prof.add_argument("source", help="a file, or - for standard input")
    prof.add_argument("--json", action="store_true", help="machine-readable output")
    prof.add_argument("--egress-max-bytes", type=int, default=None, help="egress cap applied to every tool")
    prof.set_defaults(func=_cmd_profile, estimator=None)

    demo = sub.add_parser("demo", help="run an instrumented MCP server and client, serving /metrics")
    demo.add_argument("--metrics-host", default="127.0.0.1", help="address for /metrics (default 127.0.0.1)")
    demo.add_argument("--metrics-port", type=int, default=9464, help="port for /metrics (default 9464; 0 = any)")
    demo.add_argument("--duration", type=float, default=20.0, help="seconds to run (default 20; 0 = until Ctrl-C)")
    demo.add_argument("--rate", type=float, default=20.0, help="tool calls per second, all sessions (default 20)")
    demo.add_argument("--sessions", type=int, default=3, help="concurrent agent sessions (default 3)")
    demo.add_argument("--context-window", type=int, default=60_000,
                      help="context window of each session, small so sessions reach exhaustion (default 60000)")
    demo.add_argument("--seed", type=int, default=0, help="random seed of the workload")
    demo.add_argument("--interval", type=float, default=5.0, help="seconds between live summaries (default 5)")
    demo.add_argument("--quiet", action="store_true", help="print the final table only")
    demo.set_defaults(func=_cmd_demo, estimator=None)

    from .proxy import add_parser as add_proxy_parser

    add_proxy_parser(sub)

    cfg = sub.add_parser("config", help="print the effective configuration (file + environment)")
    cfg.set_defaults(func=_cmd_config, estimator=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config)
        if args.estimator:
            config = dataclasses.replace(config, estimator=args.estimator)
        policy = build_policy(config)
        return int(args.func(args, config, policy))
    except (ConfigError, EstimatorUnavailable, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
