"""/metrics under load and abuse, on the demo's real metrics.

Starts ``mcp-token-otel demo`` (a subprocess serving /metrics on a free port while its sessions run), then:

* ``idle``: one scraper alone, the reference;
* ``50 scrapers``: 50 concurrent asyncio clients scraping back to back (a new connection per scrape);
* ``500 drip``: one scraper while 500 slow-drip clients each send a header line every second and
  reconnect when the server cuts them at its request deadline; the server's thread count is sampled.

Prints median, mean, p95, p99 and max latency per arm, requests answered and failed, and thread counts.
Targets (issue 9): 50 scrapers p99 < 100 ms; with 500 drip clients the thread count stays at its cap and
real scrapes stay < 50 ms.

With ``--baseline DIR`` (another checkout, e.g. ``git worktree add /tmp/base REV``) both trees' demos run side
by side and every arm alternates between them (``--rounds`` times), so before and after are measured in the
same conditions on a shared machine.

    python benchmarks/metrics_server_abuse.py [--seconds 10] [--scrapers 50] [--drips 500]
    python benchmarks/metrics_server_abuse.py --baseline /tmp/base --rounds 3 --seconds 8
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: bench\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"


async def _scrape(host: str, port: int) -> float:
    """One scrape on a new connection, as a light asyncio client (the scrapers' own cost stays small)."""
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(_REQUEST)
        response = await reader.read()  # the server closes after the response
    finally:
        writer.close()
    ok = response.startswith(b"HTTP/1.") and b" 200 " in response[:16]
    if not ok or b"mcp_token_tokens_total" not in response:
        raise RuntimeError(f"bad scrape: {response[:40]!r}")
    return time.perf_counter() - start


def run_scrapers(host: str, port: int, clients: int, seconds: float) -> tuple[list[float], int]:
    """``clients`` concurrent scrapers, each scraping back to back for ``seconds``."""
    latencies: list[float] = []
    failures = 0

    async def loop(end: float) -> None:
        nonlocal failures
        while time.monotonic() < end:
            try:
                latencies.append(await asyncio.wait_for(_scrape(host, port), 30))
            except Exception:
                failures += 1

    async def main() -> None:
        end = time.monotonic() + seconds
        await asyncio.gather(*(loop(end) for _ in range(clients)))

    asyncio.run(main())
    return latencies, failures


class Drippers:
    """``count`` clients that send a request head one line per second and reconnect when cut off."""

    def __init__(self, host: str, port: int, count: int) -> None:
        self.host, self.port, self.count = host, port, count
        self.cut = 0
        self.stop = threading.Event()
        self.socks: list[socket.socket | None] = [None] * count
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _connect(self, i: int) -> None:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=5)
            sock.setblocking(False)
            sock.send(b"GET /metrics HTTP/1.1\r\n")
            self.socks[i] = sock
        except OSError:
            self.socks[i] = None

    def _run(self) -> None:
        for i in range(self.count):
            self._connect(i)
        while not self.stop.wait(1.0):
            for i, sock in enumerate(self.socks):
                try:
                    if sock is None:
                        raise OSError
                    try:
                        if sock.recv(1) == b"":  # the server hung up: the deadline cut this client
                            raise OSError
                    except BlockingIOError:
                        pass
                    sock.send(b"X-Drip: 1\r\n")
                except OSError:
                    self.cut += sock is not None
                    if sock is not None:
                        sock.close()
                    self._connect(i)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for sock in self.socks:
            if sock is not None:
                sock.close()


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def row(name: str, latencies: list[float], failures: int, extra: str = "") -> str:
    ms = sorted(x * 1000 for x in latencies)
    if not ms:
        return f"| {name} | 0 | {failures} | - | - | - | - | - | {extra} |"

    def q(p: float) -> float:
        return ms[min(len(ms) - 1, int(len(ms) * p))]

    return (f"| {name} | {len(ms)} | {failures} | {statistics.median(ms):.1f} | {statistics.fmean(ms):.1f} | "
            f"{q(0.95):.1f} | {q(0.99):.1f} | {ms[-1]:.1f} | {extra} |")


class Demo:
    """``mcp-token-otel demo`` from a source tree, serving /metrics on a free port while its sessions run."""

    def __init__(self, tree: Path) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mcp_token_otel.cli", "demo", "--metrics-port", "0", "--duration", "0", "--quiet"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=tree,
        )
        assert self.process.stdout is not None
        first = self.process.stdout.readline()
        match = re.search(r"metrics at (\S+)", first)
        if not match:
            self.close()
            raise SystemExit(f"demo from {tree} did not start: {first!r}")
        url = urlsplit(match.group(1))
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 0

    @property
    def pid(self) -> int:
        return self.process.pid

    def size(self) -> int:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        conn.request("GET", "/metrics")
        size = len(conn.getresponse().read())
        conn.close()
        return size

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def drip_arm(demo: Demo, drips: int, seconds: float) -> tuple[list[float], int, int, int]:
    """One scraper while ``drips`` slow-drip clients hold connections: latencies, failures, peak threads, cuts."""
    clients = Drippers(demo.host, demo.port, drips)
    clients.start()
    time.sleep(2)
    peak = threads_of(demo.pid)
    sampler_stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not sampler_stop.wait(0.2):
            peak = max(peak, threads_of(demo.pid))

    sampler = threading.Thread(target=sample)
    sampler.start()
    lat, fail = run_scrapers(demo.host, demo.port, 1, seconds)
    sampler_stop.set()
    sampler.join()
    clients.close()
    return lat, fail, peak, clients.cut


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each arm (per round)")
    parser.add_argument("--scrapers", type=int, default=50)
    parser.add_argument("--drips", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=1, help="runs of every arm, interleaved across trees")
    parser.add_argument(
        "--baseline", type=Path, default=None,
        help="another source tree (e.g. `git worktree add /tmp/base REV`): its demo runs beside this one and "
        "every arm alternates between the two, so both are measured in the same conditions",
    )
    args = parser.parse_args()

    root = Path(__file__).resolve().parent.parent
    trees = {"this tree": root}
    if args.baseline is not None:
        trees = {"baseline": args.baseline.resolve(), **trees}
    demos: dict[str, Demo] = {}
    try:
        for name, tree in trees.items():
            demos[name] = Demo(tree)
        time.sleep(3)  # let the demos' sessions fill every family
        for name, demo in demos.items():
            print(f"{name}: demo /metrics {demo.size():,} bytes; demo process threads at rest: {threads_of(demo.pid)}")
        print()
        arms = ("idle (1 scraper)", f"{args.scrapers} scrapers", f"1 scraper + {args.drips} drip clients")
        results: dict[tuple[str, str], tuple[list[float], int, int, int]] = {
            (arm, name): ([], 0, 0, 0) for arm in arms for name in demos
        }
        for _ in range(args.rounds):
            for arm in arms:
                for name, demo in demos.items():  # interleaved: each tree's run of an arm follows the other's
                    lat, fail, peak, cut = results[arm, name]
                    if arm == arms[2]:
                        more, failed, top, cuts = drip_arm(demo, args.drips, args.seconds)
                        results[arm, name] = (lat + more, fail + failed, max(peak, top), cut + cuts)
                    else:
                        clients = 1 if arm == arms[0] else args.scrapers
                        more, failed = run_scrapers(demo.host, demo.port, clients, args.seconds)
                        results[arm, name] = (lat + more, fail + failed, max(peak, threads_of(demo.pid)), cut)
        print("| arm | tree | scrapes | failed | median ms | mean ms | p95 ms | p99 ms | max ms | server threads |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for arm in arms:
            for name in demos:
                lat, fail, peak, _ = results[arm, name]
                threads = f"peak {peak}" if arm == arms[2] else str(peak)
                print(row(arm, lat, fail, threads).replace(f"| {arm} |", f"| {arm} | {name} |", 1), flush=True)
        print()
        for name in demos:
            cut = results[arms[2], name][3]
            print(f"{name}: drip clients cut by the server's request deadline (and reconnected): {cut}")
    finally:
        for demo in demos.values():
            demo.close()


if __name__ == "__main__":
    main()
