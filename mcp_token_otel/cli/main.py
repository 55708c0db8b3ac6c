"""The ``mcp-token-otel`` command line."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

import yaml

from ..config import Config, ConfigError, build_policy, config_as_dict, load_config
from ..core.estimators import ESTIMATOR_NAMES, EstimatorUnavailable
from ..core.measure import Measurement, Policy, measure_message, measure_result
from . import governance


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
    except json.JSONDecodeError as exc:
        if text.lstrip()[:1] in ("{", "[", '"'):  # meant as JSON (truncated, say): say it was not parsed
            why = f"input looks like JSON but does not parse ({exc.msg}: line {exc.lineno}, column {exc.colno})"
            return text, "; ".join(filter(None, [note, why + "; measured as plain text"]))
        return text, note
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


EMPTY_NOTE = "input is empty: nothing to measure"


def _cmd_estimate(args: argparse.Namespace, config: Config, policy: Policy) -> int:
    value, note = _read_input(args.source)
    if isinstance(value, str) and not value.strip():  # not a message of zero tokens with 100% overhead
        if args.json:
            print("[]")
            print(f"note: {EMPTY_NOTE}", file=sys.stderr)
        else:
            print(f"note: {EMPTY_NOTE}")
        return 0
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
        guard=args.guard,
    )
    try:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends a --duration 0 run
            anyio.run(run_demo, config, options)
    except (RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _number(kind: type, low: float, *, inclusive: bool, words: str) -> Callable[[str], Any]:
    """An argparse type: a finite ``kind`` above ``low`` (or at it, with ``inclusive``)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {words}, got {text!r}") from None
        if not math.isfinite(value) or value < low or (value == low and not inclusive):
            raise argparse.ArgumentTypeError(f"expected {words}, got {text!r}")
        return value

    return parse


_POSITIVE_INT = _number(int, 0, inclusive=False, words="a positive integer")
_DURATION = _number(float, 0, inclusive=True, words="a finite number of seconds >= 0 (0 = until Ctrl-C)")
_RATE = _number(float, 0, inclusive=False, words="a positive finite number")
_INTERVAL = _number(float, 0.1, inclusive=True, words="a finite number of seconds >= 0.1")


def _port(text: str) -> int:
    value = _number(int, 0, inclusive=True, words="a port number from 0 to 65535")(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 0 to 65535, got {text!r}")
    return int(value)


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (exit 2), not a usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mcp-token-otel",
        description="Token economics for MCP tool calls: estimates, overhead, risk tiers, budgets.",
    )
    parser.add_argument("--config", help="YAML configuration file (default: $MCP_TOKEN_OTEL_CONFIG)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    est = sub.add_parser("estimate", help="estimate and classify a payload or an MCP JSON-RPC message")
    est.add_argument("source", help="a file, or - for standard input")
    est.add_argument("--json", action="store_true", help="machine-readable output")
    est.add_argument("--estimator", choices=ESTIMATOR_NAMES, help="overrides the configured estimator")
    est.add_argument("--method", help="the request method a bare result answers (default: inferred)")
    est.add_argument("--tool", help="the tool name, for advisories")
    est.set_defaults(func=_cmd_estimate)

    governance.register(sub)  # profile, lock, check

    demo = sub.add_parser("demo", help="run an instrumented MCP server and client, serving /metrics")
    demo.add_argument("--metrics-host", default="127.0.0.1", help="address for /metrics (default 127.0.0.1)")
    demo.add_argument("--metrics-port", type=_port, default=9464, help="port for /metrics (default 9464; 0 = any)")
    demo.add_argument("--duration", type=_DURATION, default=20.0, help="seconds to run (default 20; 0 = until Ctrl-C)")
    demo.add_argument("--rate", type=_RATE, default=20.0, help="tool calls per second, all sessions (default 20)")
    demo.add_argument("--sessions", type=_POSITIVE_INT, default=3, help="concurrent agent sessions (default 3)")
    demo.add_argument("--context-window", type=_POSITIVE_INT, default=60_000,
                      help="context window of each session, small so sessions reach exhaustion (default 60000)")
    demo.add_argument("--seed", type=int, default=0, help="random seed of the workload")
    demo.add_argument("--interval", type=_INTERVAL, default=5.0,
                      help="seconds between live summaries (default 5, at least 0.1)")
    demo.add_argument("--quiet", action="store_true", help="print the final table only")
    demo.add_argument("--no-guard", dest="guard", action="store_false",
                      help="do not turn on the demo's guards (enforce on the server side; see docs/guardrails.md)")
    demo.set_defaults(func=_cmd_demo, estimator=None)

    from .proxy import add_parser as add_proxy_parser

    add_proxy_parser(sub)

    cfg = sub.add_parser("config", help="print the effective configuration (file + environment)")
    cfg.set_defaults(func=_cmd_config, estimator=None)
    return parser


#: Exit status when the reader of our output went away (128 + SIGPIPE), as for standard tools.
EXIT_BROKEN_PIPE = 128 + 13


def _quiet_stdout() -> None:
    """After a closed pipe: send what is still buffered to /dev/null so exit does not complain."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config)
        if args.estimator:
            config = dataclasses.replace(config, estimator=args.estimator)
        policy = build_policy(config)
        status = int(args.func(args, config, policy))
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return status
    except BrokenPipeError:  # `mcp-token-otel estimate big.json | head`: end quietly
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except (ConfigError, EstimatorUnavailable, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RecursionError:
        print("error: input nested too deeply to process", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
