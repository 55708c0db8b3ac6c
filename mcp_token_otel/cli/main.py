"""The ``mcp-token-otel`` command line."""

from __future__ import annotations

import argparse
import asyncio
import codecs
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO, cast
from urllib.parse import unquote

import yaml

from .. import __version__
from ..config import (
    SECRET_KEYS,
    URL_KEYS,
    Config,
    ConfigError,
    build_policy,
    config_as_dict,
    load_config,
    url_password,
)
from ..core.estimators import ESTIMATOR_NAMES, EstimatorUnavailable
from ..core.measure import Measurement, Policy, measure_message, measure_result
from ..core.redact import ScrubbedStream, secrets_in_args
from . import governance
from .options import number, port

#: The most ``estimate`` reads (``--max-bytes``): the largest message the proxy measures. Endless input
#: (``/dev/zero``, a stream that never closes) is cut there, with a note, rather than read until memory runs out.
DEFAULT_MAX_INPUT_BYTES = 128 * 1024 * 1024


def _read_bounded(source: str, limit: int) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of ``source`` (a path or ``-``), and whether there was more."""
    if source == "-":
        raw = sys.stdin.buffer.read(limit + 1)
    else:
        with Path(source).open("rb") as file:
            raw = file.read(limit + 1)
    return raw[:limit], len(raw) > limit


def _size(count: int) -> str:
    return f"{count // (1024 * 1024):,} MiB" if count % (1024 * 1024) == 0 else f"{count:,} bytes"


def _read_input(source: str, limit: int = DEFAULT_MAX_INPUT_BYTES) -> tuple[Any, str | None]:
    """The parsed JSON in ``source`` (a path or ``-``), or its text when it is not JSON; and a note."""
    raw, cut = _read_bounded(source, limit)
    cut_note = f"input is larger than {_size(limit)} (--max-bytes): measured its first {_size(limit)} only"
    try:  # a character the cut split is left out, not taken for a bad byte
        text = codecs.getincrementaldecoder("utf-8")().decode(raw, final=not cut)
        note = cut_note if cut else None
    except UnicodeDecodeError as exc:
        text = raw.decode("utf-8", errors="replace")
        bad = f"input is not valid UTF-8 (first bad byte at offset {exc.start}); bad bytes replaced"
        note = "; ".join(filter(None, [cut_note if cut else None, bad]))
    return _parsed(text, note)


def _parsed(text: str, note: str | None) -> tuple[Any, str | None]:
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


def _is_batch(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _measure(value: Any, policy: Policy, method: str | None, tool: str | None) -> list[Measurement]:
    if isinstance(value, str):
        return [measure_result(method or "text", {"content": [{"type": "text", "text": value}]},
                               tool_name=tool, policy=policy)]
    if _is_batch(value):
        return [measure_message(v, request_method=method, tool_name=tool, policy=policy) for v in value]
    return [measure_message(value, request_method=method, tool_name=tool, policy=policy)]


def _jsonrpc_error(value: Any) -> str | None:
    """What a JSON-RPC error response says, in one line: ``JSON-RPC error -32602: Invalid params``."""
    error = value.get("error") if isinstance(value, dict) and "result" not in value else None
    if not isinstance(error, dict):
        return None
    code = error.get("code")
    message = " ".join(str(error.get("message", "")).split())
    message = message if len(message) <= 200 else message[:200] + "..."
    return f"JSON-RPC error {code}" + (f": {message}" if message else "")


def _print_measurement(m: Measurement, policy: Policy, out: TextIO, error: str | None = None) -> None:
    kind = "error response" if error else "request" if m.direction == "input" else "response"
    what = f"{'JSON-RPC' if error and m.method == 'unknown' else m.method} {kind} ({m.direction})"
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
    if error or m.error_type:
        print(f"error: {error or m.error_type}", file=out)
    for advice in m.advisories:
        print(f"advisory: {advice}", file=out)
    if m.reason:
        print(f"note: {m.reason}", file=out)


EMPTY_NOTE = "input is empty: nothing to measure"


def _cmd_estimate(args: argparse.Namespace, config: Config, policy: Policy) -> int:
    value, note = _read_input(args.source, args.max_bytes)
    if isinstance(value, str) and not value.strip():  # not a message of zero tokens with 100% overhead
        if args.json:
            print("[]")
            print(f"note: {EMPTY_NOTE}", file=sys.stderr)
        else:
            print(f"note: {EMPTY_NOTE}")
        return 0
    results = _measure(value, policy, args.method, args.tool)
    messages = value if _is_batch(value) else [value]
    errors = [_jsonrpc_error(message) for message in messages]
    if args.json:
        payload = [{**m.to_dict(), "estimator": policy.estimator_name} for m in results]
        for item, error in zip(payload, errors, strict=True):
            item["error_message"] = error
            item["input_note"] = note
        json.dump(payload[0] if len(payload) == 1 else payload, sys.stdout, indent=2)
        print()
        return 0
    for index, (m, error) in enumerate(zip(results, errors, strict=True)):
        if index:
            print()
        _print_measurement(m, policy, sys.stdout, error)
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
        # Ctrl-C ends a --duration 0 run. Python 3.10's event loop runner (anyio's backport of asyncio.Runner)
        # reports it as the main task's CancelledError where 3.11 raises KeyboardInterrupt.
        with contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError):
            anyio.run(run_demo, config, options)
    except (RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


_POSITIVE_INT = number(int, 0, inclusive=False, words="a positive integer")
_DURATION = number(float, 0, inclusive=True, words="a finite number of seconds >= 0 (0 = until Ctrl-C)")
_RATE = number(float, 0, inclusive=False, words="a positive finite number")
_INTERVAL = number(float, 0.1, inclusive=True, words="a finite number of seconds >= 0.1")


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
    parser.add_argument("--version", action="version", version=f"mcp-token-otel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    est = sub.add_parser("estimate", help="estimate and classify a payload or an MCP JSON-RPC message")
    est.add_argument("source", help="a file, or - for standard input")
    est.add_argument("--json", action="store_true", help="machine-readable output")
    est.add_argument("--estimator", choices=ESTIMATOR_NAMES, help="overrides the configured estimator")
    est.add_argument("--method", help="the request method a bare result answers (default: inferred)")
    est.add_argument("--tool", help="the tool name, for advisories")
    est.add_argument("--max-bytes", type=_POSITIVE_INT, default=DEFAULT_MAX_INPUT_BYTES, metavar="BYTES",
                     help="read at most this much input, say so when there is more (default 128 MiB)")
    est.set_defaults(func=_cmd_estimate)

    governance.register(sub)  # profile, lock, check

    demo = sub.add_parser("demo", help="run an instrumented MCP server and client, serving /metrics")
    demo.add_argument("--metrics-host", default="127.0.0.1", help="address for /metrics (default 127.0.0.1)")
    demo.add_argument("--metrics-port", type=port, default=9464, help="port for /metrics (default 9464; 0 = any)")
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
    from .serve import add_parser as add_serve_parser

    add_proxy_parser(sub)
    add_serve_parser(sub)

    cfg = sub.add_parser("config", help="print the effective configuration (file + environment)")
    cfg.set_defaults(func=_cmd_config, estimator=None)
    for command in sub.choices.values():  # --config after the subcommand too; the later one wins
        command.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


#: Exit status when the reader of our output went away (128 + SIGPIPE), as for standard tools.
EXIT_BROKEN_PIPE = 128 + 13


def _quiet_stdout() -> None:
    """After a closed pipe: send what is still buffered to /dev/null so exit does not complain."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _config_secrets(config: Config) -> set[str]:
    secrets = set()
    for key in SECRET_KEYS:
        section, leaf = key.split(".")
        secrets.add(str(getattr(getattr(config, section), leaf)))
    for key in URL_KEYS:  # a password inside a URL (budget.store), as written and percent-decoded
        section, leaf = key.split(".")
        password = url_password(str(getattr(getattr(config, section), leaf)))
        secrets.update((password, unquote(password)))
    return secrets


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Credentials on the command line or in the configuration never reach standard error:
    every error, log record and library message written there has them masked."""
    argv = list(sys.argv[1:] if argv is None else argv)
    stderr = sys.stderr
    scrubbed = ScrubbedStream(stderr, secrets_in_args(argv))
    sys.stderr = cast(TextIO, scrubbed)
    try:
        return _run(argv, scrubbed)
    finally:
        sys.stderr = stderr


def _run(argv: list[str], stderr: ScrubbedStream) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config)
        stderr.add(_config_secrets(config))
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
