"""What one budgeted message costs in each budget store: the session registry as the ledger calls it today, the
memory store behind the store protocol, and the Redis store (a local redis-server on loopback, started here in
a temporary directory unless ``--url`` names one).

Arms run interleaved (a batch of each in turn, many rounds) so that a noisy neighbour on a shared machine
weighs on all of them alike. Per call: wall time (median, mean, p99) and the calling thread's CPU time (a
Redis round trip mostly waits: its CPU is what the instrumented process pays). A tool call is one add (its
request's and its answer's tokens together): ``redis call`` is one round trip; a plain PING on the same pool is the
floor of any round trip.

    python benchmarks/budget_store.py [--rounds 40] [--batch 250] [--conversations 1000] [--url redis://...]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from mcp_token_otel.config import BudgetConfig, config_from_dict
from mcp_token_otel.core.budget import SessionRegistry
from mcp_token_otel.store import MemoryStore


@contextmanager
def redis_server() -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found (Debian: redis-server; scripts/system-deps installs it)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as directory:
        process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", directory,
                                    "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
        try:
            import redis

            client = redis.Redis(port=port)
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            process.wait(timeout=10)


Arm = Callable[[str], None]


def arms(budget: BudgetConfig, url: str) -> dict[str, Arm]:
    from mcp_token_otel.store.redis_store import RedisStore

    lock = threading.Lock()
    registry = SessionRegistry(budget.context_window, max_sessions=budget.max_sessions)
    memory = MemoryStore(budget)
    shared = config_from_dict({"budget": {"store": url, "context_window": budget.context_window,
                                          "store_timeout": 1.0}}).budget
    redis_store = RedisStore(shared)

    def today(key: str) -> None:
        with lock:
            registry.record(key, 120)

    def memory_add(key: str) -> None:
        memory.add("server", key, 120)

    def redis_call(key: str) -> None:
        redis_store.add("server", key, 120)

    client = redis_store._redis  # the same pool: the floor any round trip pays

    def redis_ping(key: str) -> None:
        client.ping()

    return {"registry (the session registry alone)": today, "memory store": memory_add, "redis call": redis_call,
            "redis PING (the client's floor)": redis_ping}


def run(rounds: int, batch: int, conversations: int, url: str) -> dict[str, tuple[list[int], list[float]]]:
    budget = config_from_dict({"budget": {"context_window": 10**12}}).budget  # no transition: the steady path
    measured = arms(budget, url)
    keys = [f"conversation-{i}" for i in range(conversations)]
    for arm in measured.values():  # warm-up: every conversation known, scripts loaded, connections open
        for key in keys:
            arm(key)
    wall: dict[str, list[int]] = {name: [] for name in measured}
    cpu: dict[str, list[float]] = {name: [] for name in measured}
    clock, thread_cpu = time.perf_counter_ns, time.thread_time_ns
    for r in range(rounds):
        for name, arm in measured.items():
            times = wall[name]
            start_cpu = thread_cpu()
            for i in range(batch):
                key = keys[(r * batch + i) % conversations]
                t0 = clock()
                arm(key)
                times.append(clock() - t0)
            cpu[name].append((thread_cpu() - start_cpu) / batch)
    return {name: (wall[name], cpu[name]) for name in measured}


def table(results: dict[str, tuple[list[int], list[float]]]) -> str:
    lines = ["| arm | median | mean | p99 | CPU per call |", "|---|---:|---:|---:|---:|"]
    for name, (times, cpu) in results.items():
        times = sorted(times)
        p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
        lines.append(f"| {name} | {statistics.median(times) / 1000:.1f} µs | {statistics.fmean(times) / 1000:.1f} µs"
                     f" | {p99 / 1000:.1f} µs | {statistics.fmean(cpu) / 1000:.1f} µs |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--batch", type=int, default=250)
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--url", help="an existing Redis (default: a redis-server started here)")
    args = parser.parse_args()
    if args.url:
        results = run(args.rounds, args.batch, args.conversations, args.url)
    else:
        with redis_server() as url:
            results = run(args.rounds, args.batch, args.conversations, url)
    print(f"{args.rounds} rounds x {args.batch} calls per arm, {args.conversations} conversations\n")
    print(table(results))


if __name__ == "__main__":
    main()
