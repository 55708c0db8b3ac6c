"""Cost of one /metrics scrape with 100 tools and every label combination populated.

The series come from the recorder's own calls (whatever it emits per message), on both sides (``--sides``):
every tool called in every risk tier (input and output, each call timed, one error result each), the list
methods and initialize, a protocol error, sessions crossing the warning and exhaustion ratios and ending, and a
fault of each stage: the largest exposition the default label bounds allow. Prints the body's bytes and lines
and the time of one scrape (what holds the instrumented process's GIL), median / mean / p99 over ``--scrapes``
scrapes, for prometheus-client's ``generate_latest`` and the collector's own exposition (what the /metrics
service serves for plain-text scrapes; the two interleaved), whether both give the same bytes, the first
exposition (its caches cold), how long the exposition holds the aggregate lock, and the targets (<= 1 MB,
<= 50 ms).

    python benchmarks/scrape_cost.py [--tools 100] [--scrapes 50] [--sides client,server] [--created]
        [--input-histograms] [--markdown]
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import threading
import time
from types import TracebackType
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import generate_latest

from mcp_token_otel.config import config_from_dict
from mcp_token_otel.emitters.prometheus_service import PrometheusService, start_prometheus
from mcp_token_otel.recorder import TokenRecorder

#: Tokens (chars/4) that put a result in each risk tier at the default thresholds.
TIER_TOKENS = {"low": 100, "medium": 2000, "high": 6000, "critical": 20_000}
METHODS = ("tools/list", "resources/list", "resources/read", "prompts/list", "prompts/get", "initialize", "ping")
MAX_BYTES, MAX_MS = 1_000_000, 50.0


def _text(tokens: int) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": "abcd" * tokens}]}


def exchange(recorder: TokenRecorder, side: Any, method: str, params: Any, session: str, seconds: float,
             result: Any = None, error: Any = None) -> None:
    """One request and its answer through the recorder's call path, ``seconds`` apart."""
    call = recorder.begin(side, method, params, session)
    call.open(started=0.0)
    if error is not None:
        call.error(error, at=seconds)
    else:
        call.result(result, at=seconds)
    call.close()


def populate(tools: int, created: bool, input_histograms: bool = False,
             sides: tuple[str, ...] = ("client", "server"), tool_errors: bool = True
             ) -> tuple[TokenRecorder, PrometheusService]:
    config = config_from_dict({
        "estimator": "chars/4", "metrics": {"max_tool_names": tools, "input_histograms": input_histograms},
        "prometheus": {"created_series": created}, "budget": {"context_window": 50_000},
    })
    recorder = TokenRecorder(config, TracerProvider(), MeterProvider())
    service = start_prometheus(recorder, config.prometheus, serve=False)
    names = [f"tool_{i:03d}" for i in range(tools)]
    for side in sides:
        session = f"{side}-busy"  # crosses warning and exhaustion, then ends
        exchange(recorder, side, "tools/list", {}, session, 0.01, result={"tools": [{"name": n} for n in names]})
        for name in names:
            params = {"name": name, "arguments": {"q": "x"}}
            for tokens in TIER_TOKENS.values():
                exchange(recorder, side, "tools/call", params, session, 0.05, result=_text(tokens))
            if tool_errors:  # an error result: one more duration and error series per tool
                exchange(recorder, side, "tools/call", params, session, 0.05, result={**_text(10), "isError": True})
        for method in METHODS:
            for tokens in TIER_TOKENS.values():
                exchange(recorder, side, method, {"cursor": "abcd" * tokens}, session, 0.01, result=_text(tokens))
        exchange(recorder, side, "tools/call", {"name": names[0]}, session, 0.01,
                 error={"code": -32602, "message": "bad"})
        recorder.end_session(side, session)
    for stage in ("estimate", "span", "budget", "metrics"):
        recorder.fault(stage)
    return recorder, service


class TimedLock:
    """The aggregate's lock, recording how long each hold lasts (while ``on``)."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.on = False
        self.holds: list[float] = []
        self._since = 0.0

    def __enter__(self) -> None:
        self._lock.acquire()
        self._since = time.perf_counter()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self.on:
            self.holds.append((time.perf_counter() - self._since) * 1000)
        self._lock.release()


def time_lock(recorder: TokenRecorder) -> TimedLock:
    """Swap a timing wrapper in for the lock of the recorder's aggregate (every family's series share it)."""
    aggregate: Any = recorder.aggregate
    timed = TimedLock(aggregate.lock)
    aggregate.lock = timed
    return timed


def summary(times: list[float]) -> str:
    times = sorted(times)
    p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    median, mean = statistics.median(times), statistics.fmean(times)
    return f"median {median:.2f}, mean {mean:.2f}, p99 {p99:.2f}, max {times[-1]:.2f}"


def _p99(times: list[float]) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def families(body: bytes) -> list[tuple[str, int, int]]:
    """Bytes and series per family of an exposition, largest first (a histogram's series: its ``_count`` lines)."""
    sizes: dict[str, list[int]] = {}
    family = ""
    for line in body.splitlines(keepends=True):
        if line.startswith(b"# HELP "):
            family = line.split()[2].decode()
        size = sizes.setdefault(family, [0, 0])
        size[0] += len(line)
        name = line.split(b"{", 1)[0].split(b" ", 1)[0]
        size[1] += not line.startswith(b"#") and not name.endswith((b"_bucket", b"_sum", b"_created"))
    return sorted(((name, size, series) for name, (size, series) in sizes.items()), key=lambda item: -item[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", type=int, default=100)
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--created", action="store_true", help="with prometheus.created_series: true")
    parser.add_argument("--input-histograms", action="store_true", help="with metrics.input_histograms: true")
    parser.add_argument("--sides", default="client,server", help="the sides that see every tool")
    parser.add_argument("--no-tool-errors", action="store_true", help="no tool returns an error result")
    parser.add_argument("--markdown", action="store_true", help="also print the figures as a Markdown table")
    args = parser.parse_args()
    sides = tuple(args.sides.split(","))
    recorder, service = populate(args.tools, args.created, args.input_histograms, sides, not args.no_tool_errors)
    lock = time_lock(recorder)
    start = time.perf_counter()
    fast = service.exposition()
    cold = (time.perf_counter() - start) * 1000
    body = generate_latest(service.registry)
    timings: dict[str, list[float]] = {"generate_latest": [], "exposition": []}
    for _ in range(args.scrapes):  # the two renderers interleaved
        for label, render in (("generate_latest", lambda: generate_latest(service.registry)),
                              ("exposition", service.exposition)):
            lock.on = label == "exposition"
            start = time.perf_counter()
            render()
            timings[label].append((time.perf_counter() - start) * 1000)
            lock.on = False
    print(f"tools={args.tools} sides={','.join(sides)} created_series={args.created} "
          f"input_histograms={args.input_histograms} tool_errors={not args.no_tool_errors}")
    lines = body.count(b"\n")
    print(f"bytes={len(body):,} ({len(body) / 1e6:.2f} MB) lines={lines:,} "
          f"gzip={len(gzip.compress(body, compresslevel=1)):,} (as the /metrics server sends it)")
    largest = families(body)[:6]  # a _created family of the client's layout has no series of its own
    print("largest families: " + ", ".join(f"{name} {size / 1e3:.0f} KB ({series:,} series, "
                                           f"{size // max(series, 1):,} B each)" for name, size, series in largest))
    print(f"exposition() gives generate_latest's bytes: {fast == body}")
    for label, times in timings.items():
        print(f"{label} ms: {summary(times)}")
    print(f"first exposition (caches cold) ms: {cold:.1f}")
    if lock.holds:
        per_scrape = len(lock.holds) / args.scrapes
        print(f"aggregate lock held per hold ms ({per_scrape:.0f} holds a scrape): {summary(lock.holds)}")
    served = statistics.median(timings["exposition"])
    for what, value, limit, unit in (("bytes", len(body), MAX_BYTES, ""), ("median scrape", served, MAX_MS, " ms")):
        print(f"target {what} <= {limit:,.0f}{unit}: {value:,.1f}{unit} {'met' if value <= limit else 'MISSED'}")
    if args.markdown:
        print("\n| tools | sides | bytes | lines | gzip | scrape ms (median / p99) | generate_latest ms | largest |")
        print(f"|---|---|---|---|---|---|---|---|\n| {args.tools} | {', '.join(sides)} | {len(body):,} | {lines:,} | "
              f"{len(gzip.compress(body, compresslevel=1)):,} | {served:.1f} / {_p99(timings['exposition']):.1f} | "
              f"{statistics.median(timings['generate_latest']):.1f} | {families(body)[0][0]} |")


if __name__ == "__main__":
    main()
