"""Where the shim's time goes inside a server-side ``tools/call``: each part of its work skipped in turn.

One process, one client and server (``Client(server)``, the tool of shim_overhead.py returning 2 KB of text),
SDK tracing on, the shim on the server side. Calls are interleaved one by one between the arms, so every arm
sees the same machine at the same moments:

    off        the shim installed but inactive (its middleware hands the call straight on): the baseline;
    on         the shim, Prometheus only (no MeterProvider, /metrics served), or with OpenTelemetry metrics
               (``--otel``);
    -measure   measuring skipped: the first request's and result's measurement reused (sizing, estimating);
    -spans     the span attributes and events not written (the SDK's set_attributes included);
    -metrics   the metric points skipped (every aggregate update, the OpenTelemetry histogram points);
    -costs     the repeat and duplicate detection skipped (wasted tokens);
    adapter    the recorder skipped entirely (every call passes through untouched, as in a suppression context):
               what is left is the adapter's own work;
    sdk-span   the shim off, and a bare middleware setting the attributes the shim sets on the call's span (the
               values of floor_hook in shim_overhead.py): the SDK's price of those attributes alone, against "off".

A part's "saves" is the median call time the arm without it saves against "on": that part's cost in the call,
with the caches as cold as a real call leaves them, which is two to four times what the same code costs in a
tight loop (`measure_cost.py`). The parts overlap a little (the metrics read what measuring produced), so the
savings need not add up to "added" exactly. The arms reach into the recorder's parts: a diagnostic, not an API.

    python benchmarks/cost_split.py [--calls 4000] [--modes auto,legacy] [--otel]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
from opentelemetry import metrics, trace
from shim_overhead import make_server, new_meter_provider, payload_of, setup_tracing

ARMS = ("off", "on", "-measure", "-spans", "-metrics", "-costs", "adapter", "sdk-span")
#: What the shim sets on a server-side 2 KB tools/call span (floor_hook's values), for the sdk-span arm.
SPAN_ATTRIBUTES: dict[str, Any] = {
    "mcp_token.input_tokens": 2, "mcp_token.output_tokens": 767, "mcp_token.overhead_tokens": 403,
    "mcp_token.overhead_ratio": 0.525, "mcp_token.risk_tier": "low", "mcp_token.estimator": "default",
    "mcp_token.session.tokens": 1726, "mcp_token.session.utilization": 0.0086, "mcp_token.session.state": "ok",
    "mcp.session.id": "a941566019144f9f88a8fc577916b777",
}


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


@contextlib.contextmanager
def _replaced(pairs: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Set each (object, attribute, value) for the duration; the originals back afterwards."""
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in pairs]
    for obj, name, value in pairs:
        setattr(obj, name, value)
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


def _reusing(measure: Callable[..., Any]) -> Callable[..., Any]:
    """``measure`` computed once per (method, tool) and then reused: the arm without measuring."""
    memo: dict[Any, Any] = {}

    def reused(method: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        key = (method, kwargs.get("tool_name"))
        if key not in memo:
            memo[key] = measure(method, value, *args, **kwargs)
        return memo[key]

    return reused


def arm_patches(shim: Any) -> dict[str, list[tuple[Any, str, Any]]]:
    from mcp_token_otel.recorder import call as calls
    from mcp_token_otel.recorder.call import OffCall

    rec = shim.recorder

    def passing_through(side: Any, method: str, params: Any, key: Any, *, server: Any = None,
                        budgeted: bool = True, version: Any = None) -> Any:
        return OffCall(rec, side, method, params, key, server, budgeted, version)

    return {
        "-measure": [(calls, "measure_result", _reusing(calls.measure_result)),
                     (calls, "measure_request", _reusing(calls.measure_request))],
        "-spans": [(rec._spans, "request", _noop), (rec._spans, "response", _noop)],
        "-metrics": [(calls, "message_metrics", _noop), (rec.aggregate, "add", _noop),
                     (rec.aggregate, "observe", _noop)],
        "-costs": [(rec._costs, "call_digest", _noop), (rec._costs, "output", _noop)],
        "adapter": [(rec, "begin", passing_through)],
    }


async def interleaved(mode: str, calls: int, shim: Any) -> dict[str, list[float]]:
    from mcp import Client

    patches = arm_patches(shim)
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    span_only = False

    async def set_span_attributes(ctx: Any, call_next: Any) -> Any:
        result = await call_next(ctx)
        if span_only and ctx.request_id is not None:
            trace.get_current_span().set_attributes(SPAN_ATTRIBUTES)
        return result

    server = make_server(payload_of(2048))
    server._lowlevel_server.middleware.append(set_span_attributes)
    async with Client(server, mode=mode) as client:
        for _ in range(200):  # warm-up: the implicit tools/list, caches, the series
            await client.call_tool("fetch", {})
        for _ in range(calls):
            for arm in ARMS:
                shim.active = arm not in ("off", "sdk-span")
                span_only = arm == "sdk-span"
                with _replaced(patches.get(arm, [])):
                    started = time.perf_counter()
                    await client.call_tool("fetch", {})
                    times[arm].append(time.perf_counter() - started)
    shim.active = True
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4000, help="calls per arm and mode")
    parser.add_argument("--modes", default="auto,legacy")
    parser.add_argument("--otel", action="store_true", help="OpenTelemetry metrics on (a MeterProvider set)")
    args = parser.parse_args()

    from mcp_token_otel.config import config_from_dict
    from mcp_token_otel.instrumentation import McpTokenInstrumentor, instrument, uninstrument

    setup_tracing()
    if args.otel:
        metrics.set_meter_provider(new_meter_provider())
    config = {"instrumentation": {"sides": ["server"]}, "prometheus": {"enabled": not args.otel, "port": 0}}
    instrument(config_from_dict(config))
    shim = McpTokenInstrumentor()._shim
    print(f"server side, 2 KB, {'OpenTelemetry metrics on' if args.otel else 'Prometheus only'}, "
          f"{args.calls} calls per arm, interleaved one by one")
    try:
        for mode in args.modes.split(","):
            times = anyio.run(interleaved, mode, args.calls, shim)
            median = {arm: statistics.median(t) * 1e6 for arm, t in times.items()}
            print(f"\n{mode}: off {median['off']:,.0f} µs, on {median['on']:,.0f} µs "
                  f"(added {median['on'] - median['off']:+,.0f} µs)")
            for arm in ARMS[2:-1]:
                print(f"  {arm:9} {median[arm]:7,.0f} µs  saves {median['on'] - median[arm]:+5,.0f} µs")
            print(f"  sdk-span  {median['sdk-span']:7,.0f} µs  adds  {median['sdk-span'] - median['off']:+5,.0f} µs "
                  "to off (the SDK's price of the span attributes alone)")
    finally:
        uninstrument()


if __name__ == "__main__":
    main()
