"""Per-call cost of mcp_token_otel on the server side, against SDK tracing alone, in the same run.

Arms, interleaved in time-based blocks (long enough to include every background metric flush):
    sdk   a global SDK TracerProvider (BatchSpanProcessor to a discarding exporter) and MeterProvider
          (periodic reader every 0.5 s), no shim: what an application with OpenTelemetry already pays;
    shim  the same providers plus instrument() (defaults: OTel metrics in the call, no /metrics server), or
    both  with ``--prometheus``, the Prometheus sink as well (no server; the families are fed);
    floor no shim: a middleware that only emits what the shim emits, through the same SDK calls, from a
          precomputed measurement (one set_attributes of the shim's span attributes, the same metric calls on
          the same sink, in the call as by default; ``--no-floor`` leaves it out): the part of the shim's cost
          that is the OpenTelemetry SDK's own price for these signals, which no measuring code can go below;
    guard the shim with every guard policy on in observe mode and a model for the cost (``--no-guard`` leaves
          this arm out): response cap 8,000, session hard limit and warning note, annotation, rate limit,
          chain depth, padding checks. The payload repeats one sentence, so the padding checks report it
          (the costlier path: a finding is built and counted on every call).

In-process cells: ``Client(server)`` in mode auto (direct dispatcher) or legacy (JSON-RPC over memory
streams), a tool returning 2 KB or 200 KB of text, the shim on the server side only (the client session's
proxy is unwrapped). Per call: median, mean and p99 latency; an arm's mean includes the time
uninstrument() spends replaying what was still queued at the end of each block (``--deferred`` adds an
arm with ``metrics.defer_otel: true``: the OTel points replayed by a background thread).

Streamable HTTP cell (``--http``): two server subprocesses (uvicorn), one with the shim; the client
alternates blocks between them; the figure is the server process's CPU time (user + system, from
/proc) per call.

    python benchmarks/shim_overhead.py [--seconds 2] [--rounds 10] [--http] [--markdown] [--no-guard] [--no-floor]
        [--deferred]
    python benchmarks/shim_overhead.py --http --modes ""    # the streamable HTTP cell alone
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import anyio
from opentelemetry import metrics, trace
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


class Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
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


def setup_otel() -> None:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    trace.set_tracer_provider(provider)
    reader = PeriodicExportingMetricReader(DiscardMetrics(), export_interval_millis=500)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))


#: The span attributes the shim sets on a server-side 2 KB tools/call (constant values: nothing measured).
FLOOR_ATTRIBUTES = {
    "mcp_token.input_tokens": 2, "mcp_token.output_tokens": 767, "mcp_token.overhead_tokens": 403,
    "mcp_token.overhead_ratio": 0.525, "mcp_token.risk_tier": "low", "mcp_token.estimator": "default",
    "mcp_token.session.tokens": 1726, "mcp_token.session.utilization": 0.0086, "mcp_token.session.state": "ok",
}
FLOOR = "floor"  # the floor arm's marker in run_cell's configs


class FloorMiddleware:
    """The floor arm: the shim's signals for one call at their SDK price, with nothing measured."""

    def __init__(self) -> None:
        from mcp_token_otel.core.measure import Measurement
        from mcp_token_otel.emitters.otel_metrics import OtelMetricsSink

        self.sink = OtelMetricsSink(metrics.get_meter_provider(), server="bench")
        self._input = Measurement("input", "tools/call", "fetch", (), 2, 2, 0, 0.0, "low")  # type: ignore[arg-type]
        self._output = Measurement(
            "output", "tools/call", "fetch", (), 767, 364, 403, 0.525, "low"  # type: ignore[arg-type]
        )

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        from mcp_token_otel.emitters.sink import CallInfo

        started = time.perf_counter()
        result = await call_next(ctx)
        if ctx.request_id is not None:
            trace.get_current_span().set_attributes(FLOOR_ATTRIBUTES)
            self.sink.record_message("server", ctx.method, "fetch", "input", self._input, "bench")
            self.sink.record_message("server", ctx.method, "fetch", "output", self._output, "bench")
            duration = time.perf_counter() - started
            self.sink.record_call("server", ctx.method, "fetch", "bench", CallInfo(None, duration, None, None))
        return result


def payload_of(size: int) -> str:
    return ("lorem ipsum dolor sit amet, " * (size // 28 + 1))[:size]


def make_server(payload: str) -> Any:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("bench")

    @server.tool()
    def fetch() -> str:
        return payload

    return server


async def timed_block(mode: str, payload: str, seconds: float, floor: FloorMiddleware | None = None) -> list[float]:
    from mcp import Client

    from mcp_token_otel.adapters.mcp_v2 import DispatcherProxy

    times: list[float] = []
    server = make_server(payload)
    if floor is not None:
        server._lowlevel_server.middleware.append(floor)  # after the SDK's span middleware, as the shim's
    async with Client(server, mode=mode) as client:
        dispatcher = client.session._dispatcher
        if isinstance(dispatcher, DispatcherProxy):  # server side only
            client.session._dispatcher = dispatcher._inner
        await client.call_tool("fetch", {})  # warm-up (and the SDK's implicit tools/list)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter_ns()
            await client.call_tool("fetch", {})
            times.append((time.perf_counter_ns() - start) / 1000)
    return times


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def run_cell(
    configs: dict[str, Any], mode: str, size: int, seconds: float, rounds: int, prometheus: bool
) -> dict[str, Any]:
    """``configs``: arm -> instrument() config (the "sdk" arm, None, runs without the shim; FLOOR: the floor
    middleware)."""
    from mcp_token_otel.emitters.prometheus_metrics import PrometheusMetrics
    from mcp_token_otel.instrumentation import instrument, uninstrument

    payload = payload_of(size)
    names = list(configs)
    arms: dict[str, list[float]] = {arm: [] for arm in names}
    tail_us = dict.fromkeys(names, 0.0)  # replay left at the end of a block, charged to its arm's mean
    for i in range(rounds):
        for arm in names if i % 2 == 0 else names[::-1]:
            gc.collect()
            floor = FloorMiddleware() if configs[arm] is FLOOR else None
            if configs[arm] is not None and floor is None:
                recorder = instrument(configs[arm])
                if prometheus and recorder is not None:
                    recorder.add_sink(PrometheusMetrics(states=recorder.states), inline=True)
            try:
                arms[arm].extend(anyio.run(timed_block, mode, payload, seconds, floor))
            finally:
                start = time.perf_counter_ns()
                uninstrument()
                tail_us[arm] += (time.perf_counter_ns() - start) / 1000
    out: dict[str, Any] = {"calls": min(len(v) for v in arms.values())}
    for arm, times in arms.items():
        out[arm] = (statistics.median(times), (sum(times) + tail_us[arm]) / len(times), p99(times))
    return out


# ---------------------------------------------------------------------- streamable HTTP, server CPU


def serve(port: int, shim: bool, size: int) -> None:
    """Child process: an MCPServer over streamable HTTP (stateful), with or without the shim."""
    import uvicorn

    setup_otel()
    if shim:
        from mcp_token_otel.instrumentation import instrument

        instrument()
    app = make_server(payload_of(size)).streamable_http_app()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def http_block(url: str, seconds: float) -> int:
    from mcp import Client

    async with Client(url, mode="legacy") as client:
        await client.call_tool("fetch", {})
        end, calls = time.perf_counter() + seconds, 0
        while time.perf_counter() < end:
            await client.call_tool("fetch", {})
            calls += 1
    return calls


def run_http(size: int, seconds: float, rounds: int) -> dict[str, float]:
    import socket

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    procs: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    for arm in ("sdk", "shim"):
        port = free_port()
        cmd = [sys.executable, __file__, "--serve", str(port), "--size", str(size)]
        cmd += ["--shim"] if arm == "shim" else []
        procs[arm] = (subprocess.Popen(cmd), f"http://127.0.0.1:{port}/mcp")
    try:
        for _, url in procs.values():  # wait until both answer (bounded)
            for _ in range(200):
                try:
                    anyio.run(http_block, url, 0.0)
                    break
                except Exception:
                    time.sleep(0.05)
        cpu = {"sdk": 0.0, "shim": 0.0}
        calls = {"sdk": 0, "shim": 0}
        for i in range(rounds):
            for arm in ("sdk", "shim") if i % 2 == 0 else ("shim", "sdk"):
                proc, url = procs[arm]
                before = cpu_seconds(proc.pid)
                calls[arm] += anyio.run(http_block, url, seconds)
                time.sleep(0.6)  # the server's background flush of this block lands in this block
                cpu[arm] += cpu_seconds(proc.pid) - before
        return {arm: cpu[arm] / calls[arm] * 1e6 for arm in cpu}
    finally:
        for proc, _ in procs.values():
            proc.terminate()
            proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one timed block")
    parser.add_argument("--rounds", type=int, default=10, help="blocks per arm and cell")
    parser.add_argument("--modes", default="auto,legacy")
    parser.add_argument("--sizes", default="2 KB,200 KB")
    parser.add_argument("--prometheus", action="store_true", help="feed the Prometheus sink too")
    parser.add_argument("--http", action="store_true", help="also the streamable HTTP server-CPU cell")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--no-guard", action="store_true", help="leave out the guard arm")
    parser.add_argument("--no-floor", action="store_true", help="leave out the floor arm")
    parser.add_argument("--deferred", action="store_true", help="add the shim with metrics.defer_otel: true")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--shim", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, default=2048, help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.disable(logging.INFO)  # the SDK and httpx log every request at INFO
    if args.serve:
        serve(args.serve, args.shim, args.size)
        return
    from mcp_token_otel.config import config_from_dict

    setup_otel()
    configs: dict[str, Any] = {"sdk": None, "shim": config_from_dict({"prometheus": {"enabled": False}})}
    if not args.no_floor:
        configs["floor"] = FLOOR
    if args.deferred:
        configs["deferred"] = config_from_dict({"prometheus": {"enabled": False}, "metrics": {"defer_otel": True}})
    if not args.no_guard:
        configs["guard"] = config_from_dict({"prometheus": {"enabled": False}, "guard": GUARD})
    header = ("mode", "result", "sdk med µs", "shim med µs", "added med", "sdk mean", "shim mean", "added mean",
              "sdk p99", "shim p99", "p99 ratio", "calls/arm")
    for arm in ("floor", "deferred"):
        if arm in configs:
            header += (f"{arm} med µs", f"{arm} added med", f"{arm} mean", f"{arm} added mean", f"{arm} p99 ratio")
    if "guard" in configs:
        header += ("guard med µs", "guard vs shim med", "guard mean", "guard vs shim mean", "guard p99")
    rows = []
    for mode in filter(None, args.modes.split(",")):  # --modes "" with --http: the HTTP cell alone
        for label in args.sizes.split(","):
            r = run_cell(configs, mode, SIZES[label], args.seconds, args.rounds, args.prometheus)
            (bm, ba, bp), (sm, sa, sp) = r["sdk"], r["shim"]
            row = (mode, label, f"{bm:.0f}", f"{sm:.0f}", f"{(sm / bm - 1) * 100:+.1f}%", f"{ba:.0f}",
                   f"{sa:.0f}", f"{(sa / ba - 1) * 100:+.1f}%", f"{bp:.0f}", f"{sp:.0f}", f"{sp / bp:.2f}x",
                   f"{r['calls']:,}")
            for arm in ("floor", "deferred"):
                if arm in r:
                    am, aa, ap = r[arm]
                    row += (f"{am:.0f}", f"{(am / bm - 1) * 100:+.1f}%", f"{aa:.0f}", f"{(aa / ba - 1) * 100:+.1f}%",
                            f"{ap / bp:.2f}x")
            if "guard" in r:
                gm, ga, gp = r["guard"]
                row += (f"{gm:.0f}", f"{gm - sm:+.0f} µs", f"{ga:.0f}", f"{ga - sa:+.0f} µs", f"{gp:.0f}")
            rows.append(row)
            print(" ".join(rows[-1]), flush=True)
    if args.markdown:
        print("\n| " + " | ".join(header) + " |")
        print("|" + "|".join("---" for _ in header) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    print(f"\nserver side only; {args.rounds} interleaved blocks of {args.seconds:g} s per arm and cell"
          f"{'; Prometheus sink fed too' if args.prometheus else ''}.")
    if args.http:
        for label in args.sizes.split(","):
            cpu = run_http(SIZES[label], args.seconds, args.rounds)
            print(f"streamable HTTP {label}: server CPU per call sdk {cpu['sdk']:.0f} µs, shim {cpu['shim']:.0f} µs "
                  f"({(cpu['shim'] / cpu['sdk'] - 1) * 100:+.1f}%)", flush=True)


if __name__ == "__main__":
    main()
