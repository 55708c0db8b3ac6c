"""Cost of one /metrics scrape with 100 tools and every label combination populated.

Both sides (``--sides``), every tool called with input and output in every risk tier and timed (a call
duration; each error type a tool returns would add one more duration and error series), the list methods,
errors, transitions and ended sessions: the largest exposition the default label bounds allow. Prints the body's
bytes and lines and the time of one scrape (what holds the instrumented process's GIL), median / mean / p99
over ``--scrapes`` scrapes, for prometheus-client's ``generate_latest`` and ``PrometheusMetrics.exposition()``
(what the /metrics service serves for plain-text scrapes; the two arms interleaved), whether both give the same
bytes, the first exposition (its per-series caches cold), and how long exposition() holds the aggregate lock
(what a message being recorded meanwhile may wait for).

    python benchmarks/scrape_cost.py [--tools 100] [--scrapes 50] [--sides client,server] [--created]
        [--input-histograms]
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
from mcp_token_otel.core.measure import Measurement
from mcp_token_otel.core.risk import BREACH_TIERS
from mcp_token_otel.emitters.prometheus_metrics import PrometheusMetrics
from mcp_token_otel.emitters.sink import CallInfo
from mcp_token_otel.recorder import TokenRecorder

TIER_TOKENS = {"low": 100, "medium": 2000, "high": 6000, "critical": 20_000}
METHODS = ("tools/list", "resources/list", "resources/read", "prompts/list", "prompts/get", "initialize", "ping")


def populate(
    tools: int, created: bool, input_histograms: bool = False, sides: tuple[str, ...] = ("client", "server")
) -> PrometheusMetrics:
    config = config_from_dict({"metrics": {"max_tool_names": tools}})
    recorder = TokenRecorder(config, TracerProvider(), MeterProvider())
    sink = PrometheusMetrics(
        states=recorder.session_states, created_series=created, input_histograms=input_histograms
    )
    recorder.sinks = [sink]  # only the sink under test
    names = [f"tool_{i:03d}" for i in range(tools)]
    recorder.record_output(None, "server", "tools/list", None, result={"tools": [{"name": n} for n in names]})
    call = CallInfo(duration=0.05)
    for side in sides:
        for name in names:
            for tier, tokens in TIER_TOKENS.items():
                m = Measurement("output", "tools/call", name, (), tokens, tokens, 0, 0.2, tier)  # type: ignore[arg-type]
                sink.record_message(side, "tools/call", recorder.tool_names(name), "output", m, "")
                sink.record_message(side, "tools/call", recorder.tool_names(name), "input", m, "")
                if tier in BREACH_TIERS:  # as the recorder calls it
                    sink.record_breach(side, "tools/call", name, tier, "")
            sink.record_call(side, "tools/call", name, "", call)
        for method in METHODS:
            for tier, tokens in TIER_TOKENS.items():
                m = Measurement("output", method, None, (), tokens, tokens, 0, 0.2, tier)  # type: ignore[arg-type]
                sink.record_message(side, method, None, "output", m, "")
                sink.record_message(side, method, None, "input", m, "")
            sink.record_call(side, method, None, "", call)
        for state in ("warning", "exhausted"):
            sink.record_transition(side, state, "")
        sink.record_session_end(side, 0.5, "", CallInfo())
    for stage in ("estimate", "span", "budget", "metrics"):
        sink.record_error(stage, "")
    return sink


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


def time_lock(sink: PrometheusMetrics) -> TimedLock:
    """Swap a timing wrapper in for the lock every aggregate family of ``sink`` shares."""
    families: list[Any] = [*sink.hists.values(), *sink.counts.values()]
    timed = TimedLock(families[0]._lock)
    for family in families:
        family._lock = timed
    return timed


def summary(times: list[float]) -> str:
    times = sorted(times)
    p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    median, mean = statistics.median(times), statistics.fmean(times)
    return f"median {median:.2f}, mean {mean:.2f}, p99 {p99:.2f}, max {times[-1]:.2f}"


def families(body: bytes) -> list[tuple[str, int]]:
    """Bytes per family of an exposition, largest first."""
    sizes: dict[str, int] = {}
    family = ""
    for line in body.splitlines(keepends=True):
        if line.startswith(b"# HELP "):
            family = line.split()[2].decode()
        sizes[family] = sizes.get(family, 0) + len(line)
    return sorted(sizes.items(), key=lambda item: -item[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", type=int, default=100)
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--created", action="store_true", help="with prometheus.created_series: true")
    parser.add_argument("--input-histograms", action="store_true", help="with metrics.input_histograms: true")
    parser.add_argument("--sides", default="client,server", help="the sides that see every tool")
    args = parser.parse_args()
    sides = tuple(args.sides.split(","))
    sink = populate(args.tools, args.created, args.input_histograms, sides)
    lock = time_lock(sink)
    start = time.perf_counter()
    fast = sink.exposition()
    cold = (time.perf_counter() - start) * 1000
    body = generate_latest(sink.registry)
    timings: dict[str, list[float]] = {"generate_latest": [], "exposition": []}
    for _ in range(args.scrapes):  # the two renderers interleaved
        for label, render in (("generate_latest", lambda: generate_latest(sink.registry)),
                              ("exposition", sink.exposition)):
            lock.on = label == "exposition"
            start = time.perf_counter()
            render()
            timings[label].append((time.perf_counter() - start) * 1000)
            lock.on = False
    print(f"tools={args.tools} sides={','.join(sides)} created_series={args.created} "
          f"input_histograms={args.input_histograms}")
    lines = body.count(b"\n")
    print(f"bytes={len(body):,} ({len(body) / 1e6:.2f} MB) lines={lines:,} "
          f"gzip={len(gzip.compress(body, compresslevel=1)):,} (as the /metrics server sends it)")
    print("largest families: " + ", ".join(f"{name} {size / 1e3:.0f} KB" for name, size in families(body)[:6]))
    print(f"exposition() gives generate_latest's bytes: {fast == body}")
    for label, times in timings.items():
        print(f"{label} ms: {summary(times)}")
    print(f"first exposition (caches cold) ms: {cold:.1f}")
    if lock.holds:
        per_scrape = len(lock.holds) / args.scrapes
        print(f"aggregate lock held per hold ms ({per_scrape:.0f} holds a scrape): {summary(lock.holds)}")


if __name__ == "__main__":
    main()
