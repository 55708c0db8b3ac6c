"""Python function calls the shim adds per server-side ``tools/call`` on the calling thread (cProfile counts:
deterministic, unlike wall-clock time on a shared machine). Same server and client as shim_overhead.py,
with and without ``instrument()``; the client session's proxy is unwrapped (server side only). The shim
runs with ``metrics.defer_otel: true``, so what is counted is its own work: the OpenTelemetry SDK's metric
points are replayed on another thread, which cProfile does not see (the floor arm of shim_overhead.py
prices them).

    python benchmarks/calls_per_call.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from typing import Any

import anyio
from opentelemetry import metrics
from shim_overhead import make_server, new_meter_provider, payload_of, setup_tracing


async def profiled(mode: str, size: int, calls: int, profile: cProfile.Profile) -> None:
    from mcp import Client

    from mcp_token_otel.adapters.mcp_v2 import DispatcherProxy

    async with Client(make_server(payload_of(size)), mode=mode) as client:
        dispatcher: Any = client.session._dispatcher
        if isinstance(dispatcher, DispatcherProxy):
            client.session._dispatcher = dispatcher._inner
        for _ in range(100):  # warm-up: caches, the implicit tools/list
            await client.call_tool("fetch", {})
        profile.enable()
        for _ in range(calls):
            await client.call_tool("fetch", {})
        profile.disable()


def calls_per_call(mode: str, size: int, calls: int, shim: bool) -> float:
    from mcp_token_otel.instrumentation import instrument, uninstrument

    if shim:
        from mcp_token_otel.config import config_from_dict

        instrument(config_from_dict({"prometheus": {"enabled": False}, "metrics": {"defer_otel": True}}))
    profile = cProfile.Profile()
    try:
        anyio.run(profiled, mode, size, calls, profile)
    finally:
        if shim:
            uninstrument()
    return pstats.Stats(profile).total_calls / calls  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    setup_tracing()
    metrics.set_meter_provider(new_meter_provider())  # OTel metrics on, as by default with a MeterProvider
    for mode, size in (("auto", 2048), ("legacy", 2048), ("auto", 200 * 1024)):
        added = calls_per_call(mode, size, args.calls, True) - calls_per_call(mode, size, args.calls, False)
        print(f"{mode} {size // 1024} KB: {added:.0f} Python calls added per tools/call", flush=True)


if __name__ == "__main__":
    main()
