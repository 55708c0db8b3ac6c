"""Latency and throughput the proxy adds, stdio and streamable HTTP, 2 KB and 200 KB results, proxy vs direct.

Both arms run in this one process against the same kind of server, requests interleaved (one to the direct
server, one through the proxy, ...), so machine noise hits both alike. The servers are minimal JSON-RPC
responders (a Python line responder for stdio, a bare ASGI app on uvicorn for HTTP) so that the figures are
the proxy's, not an SDK's. The proxy runs as a user runs it (``mcp-token-otel proxy``, default config,
measurement on). Added latency = proxy percentile - direct percentile. Throughput: sequential requests per
second, the arms alternating in 100 ms slices.

``--guard`` adds a third arm: the proxy with every guard policy on in observe mode (GUARD_ENV), where the
proxy measures and guards each message on the relay path (docs/proxy.md, Guards); its added latency is
printed beside the plain proxy's.

``--baseline DIR`` adds an arm running the proxy from another checkout (e.g. ``git worktree add /tmp/base REV``),
interleaved with the others, so before and after are measured in the same conditions on a shared machine.

    python benchmarks/proxy_overhead.py [--iterations 2000] [--large-iterations 300] [--guard] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
THROUGHPUT_SECONDS = 2.0  # per arm, in 100 ms slices alternating between the arms
#: The guard arm: every policy on, observe mode (nothing changes, everything is decided and counted).
GUARD_ENV = {
    "MCP_TOKEN_OTEL_GUARD_MODE": "observe",
    "MCP_TOKEN_OTEL_GUARD_MAX_RESPONSE_TOKENS": "8000",
    "MCP_TOKEN_OTEL_GUARD_SESSION_HARD_LIMIT": "true",
    "MCP_TOKEN_OTEL_GUARD_SESSION_WARNING_NOTE": "true",
    "MCP_TOKEN_OTEL_GUARD_RATE_LIMIT": "true",
    "MCP_TOKEN_OTEL_GUARD_CALLS_PER_MINUTE": "1000000",
    "MCP_TOKEN_OTEL_GUARD_MAX_CHAIN_DEPTH": "3",
    "MCP_TOKEN_OTEL_GUARD_ANNOTATE_META": "true",
    "MCP_TOKEN_OTEL_GUARD_MODEL": "claude-sonnet-5-5",
}

LINE_SERVER = textwrap.dedent("""
    import json, sys
    size = int(sys.argv[1])
    text = "x" * size
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        rid = json.loads(line)["id"]
        body = {"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": text}]}}
        out.write(json.dumps(body).encode() + b"\\n")
        out.flush()
""")

HTTP_SERVER = textwrap.dedent("""
    import json, sys, uvicorn
    size, port = int(sys.argv[1]), int(sys.argv[2])
    text = "x" * size
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        rid = json.loads(body)["id"]
        out = json.dumps({"jsonrpc": "2.0", "id": rid,
                          "result": {"content": [{"type": "text", "text": text}]}}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out})
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
""")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_open(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listening on {port}")


def _env(extra: dict[str, str] | None = None, tree: Path = ROOT) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **(extra or {})}


def _proxy(*args: str) -> list[str]:
    return [sys.executable, "-m", "mcp_token_otel.cli", "proxy", *args]


def _request(rid: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                       "params": {"name": "payload", "arguments": {"q": "benchmark"}}}).encode()


class StdioArm:
    def __init__(self, argv: list[str], env: dict[str, str] | None = None, tree: Path = ROOT) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_env(env, tree))
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.rid = 0

    def call(self) -> int:
        self.rid += 1
        self.stdin.write(_request(self.rid) + b"\n")
        self.stdin.flush()
        line = self.stdout.readline()
        assert line.endswith(b"\n")
        return len(line)

    def close(self) -> None:
        self.stdin.close()
        self.proc.wait(timeout=30)


class HttpArm:
    def __init__(self, url: str) -> None:
        import httpx2

        self.client = httpx2.Client(timeout=30)
        self.url = url
        self.rid = 0

    def call(self) -> int:
        self.rid += 1
        response = self.client.post(self.url, content=_request(self.rid), headers={"content-type": "application/json"})
        return len(response.content)

    def close(self) -> None:
        self.client.close()


def _interleaved(arms: dict[str, Any], iterations: int, warmup: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in arms}
    clock = time.perf_counter_ns
    for i in range(warmup + iterations):
        order = list(arms.items()) if i % 2 else list(reversed(arms.items()))  # neither arm always goes first
        for name, arm in order:
            start = clock()
            arm.call()
            elapsed = (clock() - start) / 1000.0
            if i >= warmup:
                times[name].append(elapsed)
    return times


def _throughput(arms: dict[str, Any], seconds: float, slice_s: float = 0.1) -> dict[str, float]:
    """Sequential requests per second of each arm, over ``seconds`` per arm in interleaved slices."""
    done = {name: 0 for name in arms}
    spent = {name: 0.0 for name in arms}
    while min(spent.values()) < seconds:
        for name, arm in arms.items():
            start = time.perf_counter()
            while time.perf_counter() - start < slice_s:
                arm.call()
                done[name] += 1
            spent[name] += time.perf_counter() - start
    return {name: done[name] / spent[name] for name in arms}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


#: Arms beside direct and proxy: every guard policy on; the proxy of another checkout.
EXTRA_ARMS = ("guard", "baseline")


def _row(transport: str, size: int, times: dict[str, list[float]], rps: dict[str, float]) -> dict[str, Any]:
    d, p = times["direct"], times["proxy"]
    extra: dict[str, Any] = {}
    for name in EXTRA_ARMS:
        if name in times:
            g = times[name]
            extra |= {f"{name}_p50_us": _pct(g, 0.5), f"{name}_added_p50_us": _pct(g, 0.5) - _pct(d, 0.5),
                      f"{name}_added_p95_us": _pct(g, 0.95) - _pct(d, 0.95), f"{name}_mean_us": statistics.fmean(g),
                      f"{name}_p99_us": _pct(g, 0.99), f"{name}_rps": rps[name]}
    return {**extra,
        "transport": transport, "result": f"{size // 1000} KB",
        "direct_p50_us": _pct(d, 0.5), "proxy_p50_us": _pct(p, 0.5),
        "added_p50_us": _pct(p, 0.5) - _pct(d, 0.5), "added_p95_us": _pct(p, 0.95) - _pct(d, 0.95),
        "direct_mean_us": statistics.fmean(d), "proxy_mean_us": statistics.fmean(p),
        "direct_p99_us": _pct(d, 0.99), "proxy_p99_us": _pct(p, 0.99),
        "ratio_p50": _pct(p, 0.5) / _pct(d, 0.5),
        "direct_rps": rps["direct"], "proxy_rps": rps["proxy"],
    }


def bench_stdio(size: int, iterations: int, warmup: int, guard: bool = False,
                baseline: Path | None = None) -> dict[str, Any]:
    server = [sys.executable, "-c", LINE_SERVER, str(size)]
    arms = {"direct": StdioArm(server), "proxy": StdioArm(_proxy("--name", "bench", "--", *server))}
    if guard:
        arms["guard"] = StdioArm(_proxy("--name", "bench", "--", *server), GUARD_ENV)
    if baseline is not None:
        arms["baseline"] = StdioArm(_proxy("--name", "bench", "--", *server), tree=baseline)
    try:
        times = _interleaved(arms, iterations, warmup)
        rps = _throughput(arms, THROUGHPUT_SECONDS)
    finally:
        for arm in arms.values():
            arm.close()
    return _row("stdio", size, times, rps)


def bench_http(size: int, iterations: int, warmup: int, guard: bool = False,
               baseline: Path | None = None) -> dict[str, Any]:
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-c", HTTP_SERVER, str(size), str(port)], env=_env())
    proxies: list[subprocess.Popen[bytes]] = []
    arms: dict[str, Any] = {"direct": HttpArm(f"http://127.0.0.1:{port}/mcp")}
    wanted = [("proxy", None, ROOT), *([("guard", GUARD_ENV, ROOT)] if guard else []),
              *([("baseline", None, baseline)] if baseline is not None else [])]
    try:
        _wait_open(port)
        for name, env, tree in wanted:
            listen = _free_port()
            proxies.append(subprocess.Popen(_proxy("--listen", f"127.0.0.1:{listen}", "--upstream",
                                                   f"http://127.0.0.1:{port}/mcp"), env=_env(env, tree)))
            _wait_open(listen)
            arms[name] = HttpArm(f"http://127.0.0.1:{listen}/mcp")
        times = _interleaved(arms, iterations, warmup)
        rps = _throughput(arms, THROUGHPUT_SECONDS)
    finally:
        for arm in arms.values():
            arm.close()
        for proc in (*proxies, server):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)
    return _row("HTTP", size, times, rps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=2000, help="interleaved requests per arm at 2 KB")
    parser.add_argument("--large-iterations", type=int, default=300, help="interleaved requests per arm at 200 KB")
    parser.add_argument("--transport", choices=("stdio", "http", "both"), default="both")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    parser.add_argument("--guard", action="store_true", help="add the arm with every guard policy on (observe)")
    parser.add_argument("--baseline", type=Path, metavar="DIR", help="add the arm of the proxy in another checkout")
    args = parser.parse_args()
    runs: list[tuple[Callable[..., dict[str, Any]], int, int]] = []
    if args.transport in ("stdio", "both"):
        runs += [(bench_stdio, 2_000, args.iterations), (bench_stdio, 200_000, args.large_iterations)]
    if args.transport in ("http", "both"):
        runs += [(bench_http, 2_000, args.iterations), (bench_http, 200_000, args.large_iterations)]
    load_before = os.getloadavg()[0]
    rows = [bench(size, n, max(50, n // 10), args.guard, args.baseline) for bench, size, n in runs]
    print(f"{os.cpu_count()} CPUs, load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; "
          f"times in microseconds per request (round trip), {args.iterations} / {args.large_iterations} per arm")
    print(f"{'transport':<10}{'result':>8}{'direct p50':>12}{'proxy p50':>11}{'added p50':>11}{'added p95':>11}"
          f"{'direct mean':>13}{'proxy mean':>12}{'direct p99':>12}{'proxy p99':>11}{'p50 ratio':>11}"
          f"{'direct req/s':>14}{'proxy req/s':>13}")
    for r in rows:
        print(f"{r['transport']:<10}{r['result']:>8}{r['direct_p50_us']:>10.0f}us{r['proxy_p50_us']:>9.0f}us"
              f"{r['added_p50_us']:>9.0f}us{r['added_p95_us']:>9.0f}us{r['direct_mean_us']:>11.0f}us"
              f"{r['proxy_mean_us']:>10.0f}us{r['direct_p99_us']:>10.0f}us{r['proxy_p99_us']:>9.0f}us"
              f"{r['ratio_p50']:>10.2f}x{r['direct_rps']:>14.0f}{r['proxy_rps']:>13.0f}")
    titles = {"guard": "guard arm (every policy, observe mode; measured and guarded on the relay path):",
              "baseline": f"baseline arm (the proxy of {args.baseline}):"}
    for name in (n for n in EXTRA_ARMS if f"{n}_p50_us" in rows[0]):
        print(titles[name])
        print(f"{'transport':<10}{'result':>8}{name + ' p50':>13}{'added p50':>11}{'added p95':>11}"
              f"{name + ' mean':>14}{name + ' p99':>13}{name + ' req/s':>15}  (this proxy: added p50, req/s)")
        for r in rows:
            print(f"{r['transport']:<10}{r['result']:>8}{r[f'{name}_p50_us']:>11.0f}us"
                  f"{r[f'{name}_added_p50_us']:>9.0f}us{r[f'{name}_added_p95_us']:>9.0f}us"
                  f"{r[f'{name}_mean_us']:>12.0f}us{r[f'{name}_p99_us']:>11.0f}us{r[f'{name}_rps']:>15.0f}"
                  f"  ({r['added_p50_us']:.0f}us, {r['proxy_rps']:.0f})")
    limits = {"stdio": 300.0, "HTTP": 1000.0}
    for r in rows:
        if r["result"] == "2 KB":
            met = r["added_p50_us"] <= limits[r["transport"]]
            print(f"target {r['transport']} 2 KB added p50 <= {limits[r['transport']]:.0f} us: "
                  f"{'met' if met else 'MISSED'}")
        else:
            print(f"target {r['transport']} 200 KB p50 <= 2x direct: {'met' if r['ratio_p50'] <= 2 else 'MISSED'}")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
