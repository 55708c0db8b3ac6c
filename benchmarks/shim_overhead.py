"""Per-call latency of ``tools/call`` with and without mcp_token_otel, in the same process.

In-process ``Client(server)`` (mode auto = direct dispatcher, legacy = JSON-RPC over memory streams), a
tool returning a 2 KB or 200 KB text. A global SDK TracerProvider (BatchSpanProcessor to a discarding
exporter) and MeterProvider are installed for both arms, so the baseline pays for the SDK's own spans
too. Blocks of calls alternate between the arms; the table reports the median and p95 per call and the
added time at the median.

    python benchmarks/shim_overhead.py [--blocks 20] [--calls 50] [--sides both,server,client] [--markdown]

``--sides``: both ends instrumented in this one process (every call is measured twice), or only the server
(the client session's proxy is unwrapped) or only the client (the server's middleware is removed), which is
what a process that is either an MCP server or an MCP client pays.
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import pstats
import statistics
import time
from collections.abc import Sequence

import anyio
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from mcp_token_otel.config import Config
from mcp_token_otel.instrumentation import instrument, uninstrument

SIZES = {"2 KB": 2 * 1024, "200 KB": 200 * 1024}


class Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def setup_otel() -> None:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))


def make_server(payload: str):  # type: ignore[no-untyped-def]
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("bench")

    @server.tool()
    def fetch() -> str:
        return payload

    return server


async def block(mode: str, payload: str, calls: int, sides: str = "both") -> list[float]:
    from mcp import Client

    from mcp_token_otel.adapters.mcp_v2 import DispatcherProxy, V2Shim

    times = []
    server = make_server(payload)
    if sides == "client":
        V2Shim.remove_middleware(server)
    async with Client(server, mode=mode) as client:
        dispatcher = client.session._dispatcher
        if sides == "server" and isinstance(dispatcher, DispatcherProxy):
            client.session._dispatcher = dispatcher._inner
        await client.call_tool("fetch", {})  # warm-up (and the SDK's implicit tools/list)
        for _ in range(calls):
            start = time.perf_counter_ns()
            await client.call_tool("fetch", {})
            times.append((time.perf_counter_ns() - start) / 1000)
    return times


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def measure(
    config: Config, mode: str, size: int, blocks: int, calls: int, sides: str = "both"
) -> dict[str, list[float]]:
    payload = "lorem ipsum dolor sit amet, " * (size // 28 + 1)
    payload = payload[:size]
    arms: dict[str, list[float]] = {"base": [], "shim": []}
    for i in range(blocks):
        order = ("base", "shim") if i % 2 == 0 else ("shim", "base")
        for arm in order:
            if arm == "shim":
                instrument(config)
            try:
                arms[arm].extend(anyio.run(block, mode, payload, calls, sides))
            finally:
                uninstrument()
    return arms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--modes", default="auto,legacy")
    parser.add_argument("--sides", default="both,server,client")
    parser.add_argument("--estimator", default="default", help="estimator name")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--profile", action="store_true", help="cProfile the instrumented 2 KB auto case")
    args = parser.parse_args()
    setup_otel()
    config = Config(estimator=args.estimator)
    if args.profile:
        instrument(config)
        payload = "x" * SIZES["2 KB"]
        cProfile.runctx("anyio.run(block, 'auto', payload, 2000)", globals(), locals(), "/tmp/shim.prof")
        uninstrument()
        pstats.Stats("/tmp/shim.prof").sort_stats("cumulative").print_stats(30)
        return
    rows = []
    cells = itertools.product(args.sides.split(","), args.modes.split(","), SIZES.items())
    for sides, mode, (label, size) in cells:
        arms = measure(config, mode, size, args.blocks, args.calls, sides)
        base, shim = arms["base"], arms["shim"]
        b_med, s_med = statistics.median(base), statistics.median(shim)
        rows.append(
            (
                sides,
                mode,
                label,
                f"{b_med:.0f}",
                f"{p95(base):.0f}",
                f"{s_med:.0f}",
                f"{p95(shim):.0f}",
                f"{s_med - b_med:+.0f}",
                f"{(s_med / b_med - 1) * 100:+.1f}%",
            )
        )
    header = (
        "instrumented", "mode", "result", "base med µs", "base p95", "shim med µs", "shim p95", "added µs", "added"
    )
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---" for _ in header) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
        for row in rows:
            print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    n = args.blocks * args.calls
    print(f"\n{n} calls per arm and cell, {args.blocks} interleaved blocks; estimator {args.estimator!r}.")


if __name__ == "__main__":
    main()
