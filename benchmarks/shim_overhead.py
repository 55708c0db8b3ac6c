"""Per-call cost of mcp_token_otel and of its peers, against OpenTelemetry SDK tracing alone, in the same run.

Every process sets a global SDK TracerProvider (BatchSpanProcessor to a discarding exporter that counts the
spans); no global MeterProvider. Arms, interleaved in time-based blocks (long enough to include every
background flush), each block a fresh server:
    sdk       SDK tracing alone: the baseline every ratio and "added" figure is taken against;
    otel      instrument() with a MeterProvider (periodic reader every 0.5 s to a discarding exporter):
              OpenTelemetry metrics on, recorded in the call;
    prom      instrument() with no MeterProvider and /metrics on (a server on a free port): Prometheus only;
    floor     no shim: a middleware that only emits what the shim emits, through the same SDK calls, from a
              precomputed measurement (--floor): the SDK's own price for these signals;
    deferred  the otel arm with metrics.defer_otel: true (--deferred);
    guard     the otel arm with every guard policy on in observe mode (--guard);
    peers     opentel-mcp and agentcat instrument each block's server (per server, nothing left behind);
              openlit instruments the process for good, so it runs in a child process of its own, with the
              sdk arm in a second child, blocks alternating between the two (--peers; a peer that does not
              import is skipped with a line saying why; scripts/bench-peers builds .venv-peers with them).
agentcat sends its events over HTTP to a discarding server in another process (as to its service).

Cells: ``Client(server)`` in mode auto (direct dispatcher) or legacy (JSON-RPC over memory streams), a tool
returning 2 KB or 200 KB of text, the shim on the server side only (``instrumentation.sides: [server]``);
``--both`` adds the cell with the client side too (otel arms client, server and both, interleaved). Per call:
median, mean and p99 latency and what each adds to the sdk arm's; an arm's mean includes the time
uninstrument() spends at the end of each block.

``--stdio``: a fresh mcp 2.x server subprocess per block over stdio (modes auto and legacy), with and without
the shim (and the floor with ``--floor``, opentel-mcp with ``--peers``); the figure is the server's CPU time
per call (its own process_time, read by a tool after its background exports of the block; a MeterProvider set
in every server, so each arm's metrics are recorded). ``--http``: the same over streamable HTTP (one server per arm).

    python benchmarks/shim_overhead.py [--seconds 1] [--rounds 10] [--peers] [--both] [--stdio] [--markdown]
    .venv-peers/bin/python benchmarks/shim_overhead.py --peers --both --stdio --markdown   # the docs' tables
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import logging
import os
import statistics
import subprocess
import sys
import time
import unittest.mock
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from loopback import free_port, wait_listening
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

SIZES = {"2 KB": 2 * 1024, "200 KB": 200 * 1024}
#: The guard arm: every policy on, observe mode (nothing altered), a model for the cost.
GUARD = {
    "mode": "observe", "max_response_tokens": 8000, "session_hard_limit": True, "session_warning_note": True,
    "annotate_meta": True, "rate_limit": True, "max_chain_depth": 3, "model": "claude-sonnet-5-5",
}
#: The issue's targets, server side, 2 KB, auto mode: ratio to the sdk arm of (median, mean, p99).
TARGETS = {"otel": (1.10, 1.12, 1.30), "prom": (1.05, 1.07, 1.20)}
LARGE_EXTRA_US = 60.0  # 200 KB may add at most this much more than 2 KB


class CountingDiscard(SpanExporter):
    spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        CountingDiscard.spans += len(spans)
        return SpanExportResult.SUCCESS


class DiscardMetrics(MetricExporter):
    def __init__(self) -> None:
        super().__init__(preferred_temporality={}, preferred_aggregation={})

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def setup_tracing() -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(CountingDiscard()))
    trace.set_tracer_provider(provider)
    return provider


def new_meter_provider() -> MeterProvider:
    return MeterProvider(metric_readers=[PeriodicExportingMetricReader(DiscardMetrics(), export_interval_millis=500)])


# ---------------------------------------------------------------------- arms


@dataclass
class Arm:
    """One way of serving the same calls: the shim with ``config`` (None: no shim), ``hook`` applied to each
    block's server (a peer, the floor), the sides measured, a MeterProvider or none."""

    name: str
    config: dict[str, Any] | None = None
    meter: bool = False
    hook: Callable[[Any], None] | None = None
    sides: tuple[str, ...] = ("server",)
    note: str = ""


def shim_arm(name: str, sides: tuple[str, ...] = ("server",), meter: bool = True, **config: Any) -> Arm:
    base: dict[str, Any] = {"instrumentation": {"sides": list(sides)}, "prometheus": {"enabled": False}}
    return Arm(name, {**base, **config}, meter=meter, sides=sides)


def floor_hook(meter_provider: MeterProvider) -> Callable[[Any], None]:
    """The floor arm: the shim's signals for one call at their SDK price, with nothing measured: the span
    attributes, and the call's points through an aggregate with its OpenTelemetry side (the counters read at
    collection, the histogram points in the call) from precomputed figures."""
    from mcp_token_otel.emitters.aggregate import Aggregate
    from mcp_token_otel.emitters.otel_metrics import NO_SPAN, OtelMetrics
    from mcp_token_otel.semconv import MCP_SERVER_OPERATION_DURATION

    aggregate = Aggregate()
    aggregate.points = OtelMetrics(aggregate, meter_provider).points
    attributes: dict[str, Any] = {  # what the shim sets on a server-side 2 KB tools/call (constant values)
        "mcp_token.input_tokens": 2, "mcp_token.output_tokens": 767, "mcp_token.overhead_tokens": 403,
        "mcp_token.overhead_ratio": 0.525, "mcp_token.risk_tier": "low", "mcp_token.estimator": "default",
        "mcp_token.session.tokens": 1726, "mcp_token.session.utilization": 0.0086, "mcp_token.session.state": "ok",
    }

    async def middleware(ctx: Any, call_next: Any) -> Any:
        started = time.perf_counter()
        result = await call_next(ctx)
        if ctx.request_id is not None:
            trace.get_current_span().set_attributes(attributes)
            request = aggregate.message("server", "bench", ctx.method, "fetch", "input")
            response = aggregate.message("server", "bench", ctx.method, "fetch", "output")
            aggregate.add_message(request, 2, 40, 0, None, None, NO_SPAN)
            aggregate.add_message(response, 767, 2100, 403, "low", None, NO_SPAN)
            duration = time.perf_counter() - started
            aggregate.add_duration(response, duration)
            aggregate.observe(MCP_SERVER_OPERATION_DURATION, (None, "bench", ctx.method, "fetch", None, None, None),
                              duration, NO_SPAN)
        return result

    return lambda server: server._lowlevel_server.middleware.append(middleware)


def peer_arms(sink_url: str, meter_provider: MeterProvider) -> list[Arm]:
    """The peers that instrument one server object (opentel-mcp, agentcat); each skipped with a line when absent."""
    arms = []
    if importlib.util.find_spec("opentel_mcp") is not None:
        from opentel_mcp import instrument_mcp_server  # type: ignore[import-not-found,unused-ignore]
        from opentelemetry import metrics

        def opentel_mcp(server: Any) -> None:
            # Its instruments come from the global meter provider, which this process leaves unset (the prom
            # arm's condition): it gets the otel arm's provider, so its metrics are recorded as the shim's are.
            with unittest.mock.patch.object(metrics, "get_meter", meter_provider.get_meter):
                instrument_mcp_server(server)

        arms.append(Arm("opentel-mcp", hook=opentel_mcp, note="1 span, calls + duration"))
    else:
        print("opentel-mcp: skipped, not importable here (scripts/bench-peers installs it)")
    if importlib.util.find_spec("agentcat") is not None:
        import agentcat  # type: ignore[import-not-found,unused-ignore]

        options = agentcat.AgentCatOptions(api_base_url=sink_url, disable_diagnostics=True)
        arms.append(Arm("agentcat", hook=lambda server: agentcat.track(server, "proj_bench", options),
                        note="content events over HTTP"))
    else:
        print("agentcat: skipped, not importable here (scripts/bench-peers installs it)")
    return arms


# ---------------------------------------------------------------------- in-process blocks


def payload_of(size: int) -> str:
    return ("lorem ipsum dolor sit amet, " * (size // 28 + 1))[:size]


def make_server(payload: str) -> Any:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("bench")

    @server.tool()
    def fetch() -> str:
        return payload

    @server.tool()
    def cpu() -> float:
        """This process's CPU seconds (the stdio cell reads the server's own)."""
        return time.process_time()

    return server


def _keep_sides(client: Any, server: Any, sides: tuple[str, ...]) -> None:
    """Leave the shim on the arm's sides only, whatever the adapter made of ``instrumentation.sides``."""
    from mcp_token_otel.adapters.mcp_v2 import DispatcherProxy
    from mcp_token_otel.adapters.mcp_v2.server import remove_middleware

    dispatcher = client.session._dispatcher
    if "client" not in sides and isinstance(dispatcher, DispatcherProxy):
        client.session._dispatcher = dispatcher._inner
    if "server" not in sides:
        remove_middleware(server)


async def timed_block(mode: str, payload: str, seconds: float, arm: Arm) -> tuple[list[float], int]:
    """(microseconds per call, spans exported during the block)."""
    from mcp import Client

    times: list[float] = []
    server = make_server(payload)
    if arm.hook is not None:
        arm.hook(server)
    async with Client(server, mode=mode) as client:
        _keep_sides(client, server, arm.sides)
        await client.call_tool("fetch", {})  # warm-up (and the SDK's implicit tools/list)
        trace.get_tracer_provider().force_flush()  # type: ignore[attr-defined]
        spans_before = CountingDiscard.spans
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter_ns()
            await client.call_tool("fetch", {})
            times.append((time.perf_counter_ns() - start) / 1000)
    trace.get_tracer_provider().force_flush()  # type: ignore[attr-defined]
    return times, CountingDiscard.spans - spans_before


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


@dataclass
class Figures:
    times: list[float] = field(default_factory=list)
    tail_us: float = 0.0
    spans: int = 0

    def stats(self) -> tuple[float, float, float, float]:
        """(median, mean, p99, spans per call)."""
        n = len(self.times)
        return statistics.median(self.times), (sum(self.times) + self.tail_us) / n, p99(self.times), self.spans / n


def run_block(arm: Arm, mode: str, payload: str, seconds: float, meter_provider: MeterProvider,
              figures: Figures) -> None:
    from mcp_token_otel.config import config_from_dict
    from mcp_token_otel.instrumentation import instrument, uninstrument

    gc.collect()
    if arm.config is not None:
        instrument(config_from_dict(arm.config), meter_provider=meter_provider if arm.meter else None)
    try:
        times, spans = anyio.run(timed_block, mode, payload, seconds, arm)
        figures.times.extend(times)
        figures.spans += spans
    finally:
        start = time.perf_counter_ns()
        uninstrument()
        figures.tail_us += (time.perf_counter_ns() - start) / 1000


def run_cell(arms: list[Arm], mode: str, size: int, seconds: float, rounds: int,
             meter_provider: MeterProvider) -> dict[str, tuple[float, float, float, float]]:
    payload = payload_of(size)
    figures = {arm.name: Figures() for arm in arms}
    for i in range(rounds):
        for arm in arms if i % 2 == 0 else arms[::-1]:
            run_block(arm, mode, payload, seconds, meter_provider, figures[arm.name])
    return {name: f.stats() for name, f in figures.items()}


# ---------------------------------------------------------------------- a peer in a process of its own


def isolated_child(peer: str, mode: str, size: int, seconds: float) -> None:
    """Child: ``peer`` instruments this process for good ("sdk": nothing does); one block per line read."""
    setup_tracing()
    meter_provider = new_meter_provider()
    if peer == "openlit":
        import openlit  # type: ignore[import-not-found,unused-ignore]
        from opentelemetry import metrics

        metrics.set_meter_provider(meter_provider)  # openlit records on the application's providers
        openlit.init(application_name="bench", disable_batch=False, collect_gpu_stats=False)
    for _ in sys.stdin:
        f = Figures()
        run_block(Arm(peer), mode, payload_of(size), seconds, meter_provider, f)
        print(json.dumps([f.times, f.spans, f.tail_us]), flush=True)


def run_isolated(peer: str, mode: str, size: int, seconds: float, rounds: int) -> dict[str, Any]:
    """``peer`` and the sdk arm in two child processes, blocks alternating between them."""
    children = {name: subprocess.Popen([sys.executable, __file__, "--child", name, "--mode", mode,
                                        "--size", str(size), "--seconds", str(seconds)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for name in ("sdk", peer)}
    figures = {name: Figures() for name in children}
    try:
        for i in range(rounds):
            for name in list(children) if i % 2 == 0 else list(children)[::-1]:
                child = children[name]
                assert child.stdin is not None and child.stdout is not None
                child.stdin.write("block\n")
                child.stdin.flush()
                times, spans, tail = json.loads(child.stdout.readline())
                figures[name].times += times
                figures[name].spans += spans
                figures[name].tail_us += tail
    finally:
        for child in children.values():
            child.communicate(timeout=60)
    return {name: f.stats() for name, f in figures.items()}


# ---------------------------------------------------------------------- server CPU over stdio and HTTP


def serve(arm: str, size: int, port: int | None) -> None:
    """Child: an MCPServer over stdio (``port`` None) or streamable HTTP, with the shim or a peer (``arm``)."""
    from opentelemetry import metrics

    setup_tracing()
    meter_provider = new_meter_provider()
    metrics.set_meter_provider(meter_provider)  # every arm's metrics recorded (what the process has is theirs)
    server = make_server(payload_of(size))
    if arm == "floor":
        floor_hook(meter_provider)(server)
    elif arm == "shim":
        from mcp_token_otel.config import config_from_dict
        from mcp_token_otel.instrumentation import instrument, instrument_server

        instrument(config_from_dict({"instrumentation": {"sides": ["server"]}}))
        instrument_server(server)
    elif arm == "opentel-mcp":
        from opentel_mcp import instrument_mcp_server  # type: ignore[import-not-found,unused-ignore]

        instrument_mcp_server(server)
    if port is None:
        server.run("stdio")
        return
    import uvicorn

    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")


async def cpu_block(target: Any, mode: str, seconds: float) -> tuple[float, int]:
    """(server CPU seconds, calls) over one block: the server's own process_time, read through its cpu tool
    after the warm-up and again once the block's background exports (0.5 s reader, 5 s span batches) ran."""
    from mcp import Client

    async with Client(target, mode=mode) as client:
        await client.call_tool("fetch", {})
        before = (await client.call_tool("cpu", {})).structured_content["result"]  # type: ignore[index,unused-ignore]
        end, calls = time.perf_counter() + seconds, 0
        while time.perf_counter() < end:
            await client.call_tool("fetch", {})
            calls += 1
        await anyio.sleep(0.6)
        after = (await client.call_tool("cpu", {})).structured_content["result"]  # type: ignore[index,unused-ignore]
    return after - before, calls


def run_stdio(arms: list[str], mode: str, size: int, seconds: float, rounds: int) -> dict[str, float]:
    """Server CPU µs per call over stdio, a fresh server process per block, arms interleaved."""
    from mcp import StdioServerParameters

    cpu, calls = dict.fromkeys(arms, 0.0), dict.fromkeys(arms, 0)
    for i in range(rounds):
        for arm in arms if i % 2 == 0 else arms[::-1]:
            params = StdioServerParameters(command=sys.executable, args=[__file__, "--serve", arm, "--size", str(size)])
            spent, n = anyio.run(cpu_block, params, mode, seconds)
            cpu[arm] += spent
            calls[arm] += n
    return {arm: cpu[arm] / calls[arm] * 1e6 for arm in arms}


def run_http(arms: list[str], size: int, seconds: float, rounds: int) -> dict[str, float]:
    """Server CPU µs per call over streamable HTTP (stateful, legacy mode), one server process per arm."""
    procs, urls = [], {}
    try:
        for arm in arms:
            port = free_port()
            procs.append(subprocess.Popen([sys.executable, __file__, "--serve", arm, "--size", str(size),
                                           "--port", str(port)]))
            urls[arm] = f"http://127.0.0.1:{port}/mcp"
            wait_listening(port)
        cpu, calls = dict.fromkeys(arms, 0.0), dict.fromkeys(arms, 0)
        for i in range(rounds):
            for arm in arms if i % 2 == 0 else arms[::-1]:
                spent, n = anyio.run(cpu_block, urls[arm], "legacy", seconds)
                cpu[arm] += spent
                calls[arm] += n
        return {arm: cpu[arm] / calls[arm] * 1e6 for arm in arms}
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


SINK_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = b"{}"
        self.send_response(200); self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


# ---------------------------------------------------------------------- report


def table(title: str, rows: list[tuple[str, ...]], header: tuple[str, ...], markdown: bool) -> None:
    print(f"\n{title}")
    if markdown:
        print("| " + " | ".join(header) + " |\n|" + "|".join("---" for _ in header) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        print("  ".join(str(c).rjust(w) for c, w in zip(row, widths, strict=True)))


CELL_HEADER = ("arm", "median µs", "added", "x", "mean µs", "added", "x", "p99 µs", "added", "x", "spans/call", "")


def cell_rows(stats: dict[str, tuple[float, float, float, float]], notes: dict[str, str],
              base: str = "sdk") -> list[tuple[str, ...]]:
    b = stats[base]
    rows = []
    for name, s in stats.items():
        row: tuple[str, ...] = (name,)
        for k in range(3):
            row += (f"{s[k]:,.0f}", "" if name == base else f"{s[k] - b[k]:+,.0f}", f"{s[k] / b[k]:.2f}")
        rows.append((*row, f"{s[3]:.1f}", notes.get(name, "")))
    return rows


def check_targets(results: dict[tuple[str, str], dict[str, tuple[float, float, float, float]]]) -> None:
    """The issue's ratio targets, and the 200 KB allowance, printed as met or MISSED."""
    small = results.get(("auto", "2 KB"))
    if small is None:
        return
    print()
    for arm, limits in TARGETS.items():
        if arm not in small:
            continue
        got = [small[arm][k] / small["sdk"][k] for k in range(3)]
        for what, value, limit in zip(("median", "mean", "p99"), got, limits, strict=True):
            verdict = "met" if value <= limit else "MISSED"
            print(f"target {arm} 2 KB auto {what} <= x{limit:.2f}: x{value:.3f} {verdict}")
        large = results.get(("auto", "200 KB"))
        if large is not None and arm in large:
            added_small, added_large = small[arm][0] - small["sdk"][0], large[arm][0] - large["sdk"][0]
            ok = added_large <= added_small + LARGE_EXTRA_US
            print(f"target {arm} 200 KB median added <= 2 KB's + {LARGE_EXTRA_US:.0f} µs: {added_large:+.0f} vs "
                  f"{added_small:+.0f} µs {'met' if ok else 'MISSED'}")
    for ours in ("otel", "prom"):
        for peer in ("opentel-mcp", "agentcat", "openlit"):
            if peer in small and ours in small:  # openlit's figures are against the sdk arm of its own run
                mine, theirs = small[ours][0] - small["sdk"][0], small[peer][0] - small["sdk"][0]
                print(f"target {ours} added median <= {peer}'s: {mine:+.0f} vs {theirs:+.0f} µs "
                      f"{'met' if mine <= theirs else 'MISSED'}")


def both_sides_check(stats: dict[str, tuple[float, float, float, float]], label: str) -> None:
    added = {arm: stats[arm][0] - stats["sdk"][0] for arm in ("otel client", "otel server", "otel both")}
    total = added["otel client"] + added["otel server"]
    print(f"target both sides {label} median added <= client's + server's: {added['otel both']:+.0f} vs "
          f"{total:+.0f} µs {'met' if added['otel both'] <= total else 'MISSED'}")


def in_process_cells(args: argparse.Namespace, meter_provider: MeterProvider) -> None:
    arms = [Arm("sdk"), shim_arm("otel"), shim_arm("prom", meter=False, prometheus={"enabled": True, "port": 0})]
    if args.floor:
        arms.append(Arm("floor", hook=floor_hook(meter_provider)))
    if args.deferred:
        arms.append(shim_arm("deferred", metrics={"defer_otel": True}))
    if args.guard:
        arms.append(shim_arm("guard", guard=GUARD))
    sink = None
    if args.peers:
        port = free_port()
        sink = subprocess.Popen([sys.executable, "-c", SINK_SERVER, str(port)])
        wait_listening(port)
        arms += peer_arms(f"http://127.0.0.1:{port}", meter_provider)
        if importlib.util.find_spec("openlit") is None:
            print("openlit: skipped, not importable here (scripts/bench-peers installs it)")
    notes = {arm.name: arm.note for arm in arms}
    results = {}
    try:
        for mode in filter(None, args.modes.split(",")):
            for label in args.sizes.split(","):
                stats = run_cell(arms, mode, SIZES[label], args.seconds, args.rounds, meter_provider)
                if args.peers and importlib.util.find_spec("openlit") is not None:
                    alone = run_isolated("openlit", mode, SIZES[label], args.seconds, args.rounds)
                    # Shown as this run's sdk arm plus what openlit added to the sdk arm of its own run.
                    stats["openlit"] = (*(stats["sdk"][k] + alone["openlit"][k] - alone["sdk"][k] for k in range(3)),
                                        alone["openlit"][3])
                    notes["openlit"] = f"own processes, vs their sdk arm ({alone['sdk'][0]:,.0f} µs)"
                results[(mode, label)] = stats
                table(f"server side, {mode}, {label}", cell_rows(stats, notes), CELL_HEADER, args.markdown)
            if args.both:
                both = [Arm("sdk"), shim_arm("otel server"), shim_arm("otel client", ("client",)),
                        shim_arm("otel both", ("client", "server"))]
                stats = run_cell(both, mode, SIZES["2 KB"], args.seconds, args.rounds, meter_provider)
                table(f"both sides, {mode}, 2 KB", cell_rows(stats, {}), CELL_HEADER, args.markdown)
                both_sides_check(stats, f"{mode} 2 KB")
    finally:
        if sink is not None:
            sink.terminate()
    check_targets(results)


def cpu_cells(args: argparse.Namespace) -> None:
    arms = ["sdk", "shim"] + (["floor"] if args.floor else []) \
        + (["opentel-mcp"] if args.peers and importlib.util.find_spec("opentel_mcp") else [])
    rows = []
    for mode in ("auto", "legacy") if args.stdio else ():
        cpu = run_stdio(arms, mode, SIZES["2 KB"], args.seconds, args.rounds)
        rows.append((f"stdio, {mode}", *(f"{cpu[a]:,.0f}" for a in arms),
                     *(f"{cpu[a] - cpu['sdk']:+,.0f} ({(cpu[a] / cpu['sdk'] - 1) * 100:+.0f}%)" for a in arms[1:])))
        added = cpu["shim"] / cpu["sdk"] - 1
        print(f"target stdio {mode} 2 KB server CPU added <= 10%: {added * 100:+.1f}% "
              f"{'met' if added <= 0.10 else 'MISSED'}", flush=True)
    if args.http:
        cpu = run_http(arms, SIZES["2 KB"], args.seconds, args.rounds)
        rows.append(("streamable HTTP, legacy", *(f"{cpu[a]:,.0f}" for a in arms),
                     *(f"{cpu[a] - cpu['sdk']:+,.0f} ({(cpu[a] / cpu['sdk'] - 1) * 100:+.0f}%)" for a in arms[1:])))
    if rows:
        header = ("2 KB, server CPU µs per call", *arms, *(f"{a} added" for a in arms[1:]))
        table("server process CPU per call (fresh server per block over stdio)", rows, header, args.markdown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one timed block")
    parser.add_argument("--rounds", type=int, default=10, help="blocks per arm and cell")
    parser.add_argument("--modes", default="auto,legacy", help='in-process modes ("" for none)')
    parser.add_argument("--sizes", default="2 KB,200 KB")
    parser.add_argument("--peers", action="store_true", help="add the peers that import here")
    parser.add_argument("--both", action="store_true", help="add the cell with both sides instrumented")
    parser.add_argument("--stdio", action="store_true", help="add the server-CPU cells over stdio")
    parser.add_argument("--http", action="store_true", help="add the server-CPU cell over streamable HTTP")
    parser.add_argument("--floor", action="store_true", help="add the floor arm (the SDK's price of the signals)")
    parser.add_argument("--guard", action="store_true", help="add the arm with every guard policy on (observe)")
    parser.add_argument("--deferred", action="store_true", help="add the arm with metrics.defer_otel: true")
    parser.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, default=2048, help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the SDK and httpx log every request; peers warn about their set-up
    if args.serve:
        return serve(args.serve, args.size, args.port)
    if args.child:
        return isolated_child(args.child, args.mode, args.size, args.seconds)
    load = os.getloadavg()[0]
    setup_tracing()
    in_process_cells(args, new_meter_provider())
    cpu_cells(args)
    print(f"\n{os.cpu_count()} CPUs, load average {load:.1f} before, {os.getloadavg()[0]:.1f} after; {args.rounds} "
          f"interleaved blocks of {args.seconds:g} s per arm and cell")


if __name__ == "__main__":
    main()
