"""Python function calls the shim adds per server-side ``tools/call`` on the calling thread (cProfile counts:
deterministic, unlike wall-clock time on a shared machine). Same server and client as shim_overhead.py, with and
without ``instrument()``; the client session's proxy is unwrapped (server side only).

Two configurations: the default (OpenTelemetry metric points recorded in the call, /metrics served) and
``metrics.defer_otel: true`` (the OpenTelemetry histogram points replayed on another thread, which cProfile does
not see). Each added count is split by whose code the calls run in: the shim's own (``mcp_token_otel``) and the
OpenTelemetry SDK's (span attributes, metric points), whose price the shim pays for the signals it must emit.

    python benchmarks/calls_per_call.py [--calls 2000] [--markdown]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from collections import Counter
from typing import Any

import anyio
from opentelemetry import metrics
from shim_overhead import make_server, new_meter_provider, payload_of, setup_tracing

#: The issue's targets: Python calls added per server-side tools/call with the default configuration.
TARGETS = {"2 KB": 200, "200 KB": 250}
CELLS = (("auto", 2 * 1024, "2 KB"), ("legacy", 2 * 1024, "2 KB"), ("auto", 200 * 1024, "200 KB"))


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


def _owner(key: tuple[str, int, str]) -> str | None:
    """Whose code a profiled function is: the shim's, the OpenTelemetry SDK's, other (None: a builtin, counted
    for its caller)."""
    path = key[0]
    if "mcp_token_otel" in path:
        return "shim"
    if "opentelemetry" in path:
        return "otel"
    if path == "~":
        return None
    return "other"


def split(stats: pstats.Stats) -> Counter[str]:
    """Calls per owner; a builtin's calls go to the owner of the function that called it."""
    out: Counter[str] = Counter()
    for key, row in stats.stats.items():  # type: ignore[attr-defined]
        owner = _owner(key)
        if owner is not None:
            out[owner] += row[1]
            continue
        for caller, counts in row[4].items():
            out[_owner(caller) or "other"] += counts[1] if isinstance(counts, tuple) else counts
    return out


def profile_calls(mode: str, size: int, calls: int, config: dict[str, Any] | None) -> Counter[str]:
    from mcp_token_otel.config import config_from_dict
    from mcp_token_otel.instrumentation import instrument, metrics_app, uninstrument

    if config is not None:
        instrument(config_from_dict(config))
        metrics_app()  # /metrics as served (the Prometheus collector reads the same aggregate)
    profile = cProfile.Profile()
    try:
        anyio.run(profiled, mode, size, calls, profile)
    finally:
        if config is not None:
            uninstrument()
    return split(pstats.Stats(profile))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    setup_tracing()
    metrics.set_meter_provider(new_meter_provider())  # OTel metrics on, as in any application with a MeterProvider
    configs = {"default": {}, "deferred": {"metrics": {"defer_otel": True}}}
    rows = []
    for mode, size, label in CELLS:
        base = profile_calls(mode, size, args.calls, None)
        for name, config in configs.items():
            shim = profile_calls(mode, size, args.calls, config)
            added = {k: (shim[k] - base.get(k, 0)) / args.calls for k in ("shim", "otel", "other")}
            total = sum(added.values())
            target = TARGETS[label] if name == "default" and mode == "auto" else None
            verdict = "" if target is None else ("met" if total <= target else "missed") + f" (<= {target})"
            rows.append((f"{mode} {label}", name, total, added["shim"], added["otel"], added["other"], verdict))
            print(f"{mode} {label} {name}: {total:.0f} calls added per tools/call (shim {added['shim']:.0f}, "
                  f"OpenTelemetry SDK {added['otel']:.0f}, other {added['other']:.0f}) {verdict}", flush=True)
    if args.markdown:
        print("\n| cell | configuration | calls added | shim's own | OpenTelemetry SDK | other | target |")
        print("|---|---|---|---|---|---|---|")
        for cell, name, total, shim, otel, other, verdict in rows:
            print(f"| {cell} | {name} | {total:.0f} | {shim:.0f} | {otel:.0f} | {other:.0f} | {verdict} |")


if __name__ == "__main__":
    main()
