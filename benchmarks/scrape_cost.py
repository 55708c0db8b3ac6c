"""Cost of one /metrics scrape with 100 tools and every label combination populated.

Both sides, every tool called with input and output in every risk tier, the list methods, errors,
transitions and ended sessions: the largest exposition the default label bounds allow. Prints the body's
bytes and lines and the time of one scrape (generate_latest on the registry the server serves: what holds
the instrumented process's GIL), median / mean / p99 over ``--scrapes`` scrapes.

    python benchmarks/scrape_cost.py [--tools 100] [--scrapes 50] [--created]
"""

from __future__ import annotations

import argparse
import statistics
import time

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import generate_latest

from mcp_token_otel.config import config_from_dict
from mcp_token_otel.core.measure import Measurement
from mcp_token_otel.emitters.prometheus_metrics import PrometheusMetrics
from mcp_token_otel.recorder import TokenRecorder

TIER_TOKENS = {"low": 100, "medium": 2000, "high": 6000, "critical": 20_000}
METHODS = ("tools/list", "resources/list", "resources/read", "prompts/list", "prompts/get", "initialize", "ping")


def populate(tools: int, created: bool) -> PrometheusMetrics:
    config = config_from_dict({"metrics": {"max_tool_names": tools}})
    recorder = TokenRecorder(config, TracerProvider(), MeterProvider())
    sink = PrometheusMetrics(states=recorder.session_states, created_series=created)
    recorder.sinks = [sink]  # only the sink under test
    names = [f"tool_{i:03d}" for i in range(tools)]
    recorder.record_output(None, "server", "tools/list", None, result={"tools": [{"name": n} for n in names]})
    for side in ("client", "server"):
        for name in names:
            for tier, tokens in TIER_TOKENS.items():
                m = Measurement("output", "tools/call", name, (), tokens, tokens, 0, 0.2, tier)  # type: ignore[arg-type]
                sink.record_message(side, "tools/call", recorder.tool_names(name), "output", m)
                sink.record_message(side, "tools/call", recorder.tool_names(name), "input", m)
                sink.record_breach(side, "tools/call", name, tier)
        for method in METHODS:
            for tier, tokens in TIER_TOKENS.items():
                m = Measurement("output", method, None, (), tokens, tokens, 0, 0.2, tier)  # type: ignore[arg-type]
                sink.record_message(side, method, None, "output", m)
                sink.record_message(side, method, None, "input", m)
        for state in ("warning", "exhausted"):
            sink.record_transition(side, state)
        sink.record_session_end(side, 0.5)
    for stage in ("estimate", "span", "budget", "metrics"):
        sink.record_error(stage)
    return sink


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", type=int, default=100)
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--created", action="store_true", help="with prometheus.created_series: true")
    args = parser.parse_args()
    sink = populate(args.tools, args.created)
    body = generate_latest(sink.registry)
    timings: dict[str, list[float]] = {"generate_latest": [], "exposition": []}
    for _ in range(args.scrapes):  # the two renderers interleaved
        for label, render in (("generate_latest", lambda: generate_latest(sink.registry)),
                              ("exposition", sink.exposition)):
            start = time.perf_counter()
            render()
            timings[label].append((time.perf_counter() - start) * 1000)
    print(f"tools={args.tools} created_series={args.created}")
    lines = body.count(b"\n")
    print(f"bytes={len(body):,} ({len(body) / 1e6:.2f} MB) lines={lines:,}")
    for label, times in timings.items():
        times.sort()
        p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
        print(f"{label} ms: median {statistics.median(times):.1f}, mean {statistics.fmean(times):.1f}, p99 {p99:.1f}")


if __name__ == "__main__":
    main()
