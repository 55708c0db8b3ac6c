"""What a shared budget store (``budget.store: redis://``) adds per call against the default memory store, for the
in-process shim and for the HTTP proxy, in one run against one local redis-server (started here).

Shim: an instrumented mcp 2.x ``MCPServer`` (server side only) and its client in this process (``Client(server)``,
auto mode), a tool returning 2 KB; arms in time-based blocks, interleaved, a fresh server and ``instrument()`` per
block. Per call: wall time of ``call_tool`` and this process's CPU time (client, server and their threads: the
store's own included).

Proxy: ``mcp-token-otel proxy --listen --upstream`` subprocesses in front of one bare ASGI server (2 KB results),
one per arm, requests interleaved one by one. Each request carries a ``gen_ai.conversation.id`` baggage entry in
``params._meta`` (the budget key). Per call: round-trip time, and the CPU of the proxy's process tree. Without
guards the proxy measures off the relay path (after forwarding), so the store's round trip shows in its CPU and
not in the call's latency; with the session hard limit on it measures and guards on the relay path (a read of the
budget before the call, an add after it).

Arms of each: ``memory`` and ``redis``, and the same with ``guard.session_hard_limit`` in enforce mode
(``+limit``: the request-side guard reads the budget; the window is so large that nothing is refused). The Redis
arms run with a 1 s ``budget.store_timeout`` (the default, 50 ms, is for a Redis that answers in well under a
millisecond: on a loaded benchmark machine a late answer would send the rest of a block to the local fallback and
measure that instead). "added" is an arm's figure minus its memory counterpart's; round trips per call come from
Redis's own command counts (1 an add, 2 an add and the hard limit's read).

    python benchmarks/budget_store_overhead.py [--seconds 1] [--rounds 8] [--iterations 2000] [--markdown]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import proxy_overhead
import shim_overhead
from budget_store import redis_server
from loopback import free_port, wait_listening

#: A context window no benchmark conversation reaches: no transition, no refusal, the steady path.
WINDOW = 10**12
LIMIT_ENV = {"MCP_TOKEN_OTEL_GUARD_MODE": "enforce", "MCP_TOKEN_OTEL_GUARD_SESSION_HARD_LIMIT": "true"}
LIMIT_CONFIG = {"guard": {"mode": "enforce", "session_hard_limit": True}}
STORE_TIMEOUT = 1.0
SIZE = 2000


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Result:
    times: list[float] = field(default_factory=list)  # µs per call
    cpu_us: float = 0.0  # CPU µs over all calls
    round_trips: int = 0

    def row(self) -> tuple[float, float, float, float]:
        """(median, p99, CPU per call, round trips per call)."""
        n = len(self.times)
        return statistics.median(self.times), _p(self.times, 0.99), self.cpu_us / n, self.round_trips / n


def _round_trips(client: Any) -> int:
    """Commands Redis has run so far (every budget operation of the store is one EVALSHA)."""
    stats = client.info("commandstats")
    return sum(int(v.get("calls", 0)) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))


# ---------------------------------------------------------------------- the shim, in process


def shim_arms(url: str) -> dict[str, dict[str, Any]]:
    base: dict[str, Any] = {"instrumentation": {"sides": ["server"]}, "prometheus": {"enabled": False}}
    memory = {**base, "budget": {"context_window": WINDOW}}
    redis_ = {**base, "budget": {"context_window": WINDOW, "store": url, "store_timeout": STORE_TIMEOUT}}
    return {"memory": memory, "redis": redis_, "memory+limit": {**memory, **LIMIT_CONFIG},
            "redis+limit": {**redis_, **LIMIT_CONFIG}}


async def _shim_block(payload: str, seconds: float, into: Result) -> None:
    from mcp import Client

    server = shim_overhead.make_server(payload)
    async with Client(server, mode="auto") as client:
        shim_overhead._keep_sides(client, server, ("server",))
        await client.call_tool("fetch", {})  # warm-up: the SDK's tools/list, the store's connection
        cpu = time.process_time_ns()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter_ns()
            await client.call_tool("fetch", {})
            into.times.append((time.perf_counter_ns() - start) / 1000)
        into.cpu_us += (time.process_time_ns() - cpu) / 1000


def bench_shim(url: str, redis_client: Any, seconds: float, rounds: int) -> dict[str, Result]:
    from mcp_token_otel.config import config_from_dict
    from mcp_token_otel.instrumentation import instrument, uninstrument

    shim_overhead.setup_tracing()
    arms = shim_arms(url)
    results = {name: Result() for name in arms}
    payload = shim_overhead.payload_of(SIZE)
    for i in range(rounds + 1):  # round 0 warms every arm up and is not counted
        for name in list(arms) if i % 2 else list(arms)[::-1]:
            gc.collect()
            instrument(config_from_dict(arms[name]))
            scratch = Result()
            try:
                before = _round_trips(redis_client)
                anyio.run(_shim_block, payload, seconds, scratch)
                scratch.round_trips = _round_trips(redis_client) - before
            finally:
                uninstrument()
            if i:
                results[name].times += scratch.times
                results[name].cpu_us += scratch.cpu_us
                results[name].round_trips += scratch.round_trips
    return results


# ---------------------------------------------------------------------- the HTTP proxy, as subprocesses


class ProxyArm(proxy_overhead.HttpArm):
    """A proxy subprocess and a client of it whose requests name one conversation (baggage in ``_meta``)."""

    def __init__(self, upstream: str, env: dict[str, str]) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            proxy_overhead._proxy("--listen", f"127.0.0.1:{self.port}", "--upstream", upstream, "--name", "bench"),
            env=proxy_overhead._env(env), cwd=proxy_overhead.ROOT)
        wait_listening(self.port)
        super().__init__(f"http://127.0.0.1:{self.port}/mcp")

    def call(self) -> int:
        self.rid += 1
        body = {"jsonrpc": "2.0", "id": self.rid, "method": "tools/call",
                "params": {"name": "payload", "arguments": {"q": "benchmark"},
                           "_meta": {"baggage": "gen_ai.conversation.id=bench-conversation"}}}
        response = self.client.post(self.url, content=json.dumps(body).encode(),
                                    headers={"content-type": "application/json"})
        return len(response.content)

    def cpu_seconds(self) -> float:
        return sum(proxy_overhead._cpu(pid) for pid in proxy_overhead._tree(self.proc.pid))

    def close(self) -> None:
        super().close()
        self.proc.terminate()
        self.proc.wait(timeout=30)


def bench_proxy(url: str, redis_client: Any, iterations: int) -> dict[str, Result]:
    port = free_port()
    upstream = subprocess.Popen([sys.executable, "-c", proxy_overhead.HTTP_SERVER, str(SIZE), str(port)],
                                env=proxy_overhead._env())
    base = {"MCP_TOKEN_OTEL_BUDGET_CONTEXT_WINDOW": str(WINDOW)}
    shared = {**base, "MCP_TOKEN_OTEL_BUDGET_STORE": url, "MCP_TOKEN_OTEL_BUDGET_STORE_TIMEOUT": str(STORE_TIMEOUT)}
    envs = {"memory": base, "redis": shared, "memory+limit": {**base, **LIMIT_ENV}, "redis+limit": {**shared,
                                                                                                  **LIMIT_ENV}}
    arms: dict[str, ProxyArm] = {}
    try:
        wait_listening(port)
        for name, env in envs.items():
            arms[name] = ProxyArm(f"http://127.0.0.1:{port}/mcp", env)
        proxy_overhead._interleaved(arms, max(100, iterations // 10), 0)  # warm: connections, scripts loaded
        time.sleep(1.0)
        cpu = {name: arm.cpu_seconds() for name, arm in arms.items()}
        times = proxy_overhead._interleaved(arms, iterations, 0)
        time.sleep(1.0)  # the measuring of the last calls (off the relay path) lands
        results = {name: Result(times[name], (arm.cpu_seconds() - cpu[name]) * 1e6) for name, arm in arms.items()}
        for name, arm in arms.items():  # Redis counts commands for everyone: each arm's alone, untimed
            before = _round_trips(redis_client)
            for _ in range(200):
                arm.call()
            time.sleep(1.0)
            results[name].round_trips = round((_round_trips(redis_client) - before) * len(times[name]) / 200)
        return results
    finally:
        for arm in arms.values():
            arm.close()
        upstream.terminate()
        upstream.wait(timeout=30)


# ---------------------------------------------------------------------- the table


def rows(path: str, results: dict[str, Result]) -> list[list[str]]:
    out = []
    for name, result in results.items():
        median, p99, cpu, trips = result.row()
        base = results[name.replace("redis", "memory")].row()
        added = name.startswith("redis")
        out.append([path, name, f"{median:,.0f}", f"{p99:,.0f}", f"{cpu:,.0f}",
                    f"{median - base[0]:+,.0f}" if added else "", f"{p99 - base[1]:+,.0f}" if added else "",
                    f"{cpu - base[2]:+,.0f}" if added else "", f"{trips:.2f}" if added else ""])
    return out


def print_table(lines: list[list[str]], markdown: bool) -> None:
    header = ["path", "arm", "median µs", "p99 µs", "CPU µs/call", "added median", "added p99", "added CPU",
              "Redis round trips/call"]
    if markdown:
        print("| " + " | ".join(header) + " |\n|" + "|".join(["---", "---"] + ["---:"] * 7) + "|")
        for line in lines:
            print("| " + " | ".join(line) + " |")
        return
    widths = [max(len(row[i]) for row in (header, *lines)) for i in range(len(header))]
    for row in (header, *lines):
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))


@contextlib.contextmanager
def redis_at(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with redis_server() as started:
        yield started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="seconds per shim block")
    parser.add_argument("--rounds", type=int, default=8, help="shim blocks per arm (after one warm-up round)")
    parser.add_argument("--iterations", type=int, default=2000, help="interleaved proxy requests per arm")
    parser.add_argument("--url", help="an existing Redis (default: a redis-server started here)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    import redis

    for name in ("httpx", "httpx2"):  # one line per request otherwise, where something set logging to INFO
        logging.getLogger(name).setLevel(logging.WARNING)

    load_before = os.getloadavg()[0]
    with redis_at(args.url) as url:
        client = redis.Redis.from_url(url)
        shim = bench_shim(url, client, args.seconds, args.rounds)
        proxy = bench_proxy(url, client, args.iterations)
    load_after = os.getloadavg()[0]
    print(f"{os.cpu_count()} CPUs, load average {load_before:.1f} before, {load_after:.1f} after; 2 KB results; "
          f"shim: {args.rounds} blocks of {args.seconds:g} s per arm; proxy: {args.iterations} requests per arm\n")
    print_table(rows("shim (server side)", shim) + rows("HTTP proxy", proxy), args.markdown)


if __name__ == "__main__":
    main()
