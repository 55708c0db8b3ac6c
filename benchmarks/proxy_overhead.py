"""Latency, throughput and CPU the proxy adds, stdio and streamable HTTP, 2 KB and 200 KB results, proxy vs direct.

Both arms run in this one process against the same kind of server, requests interleaved (one to the direct
server, one through the proxy, ...), so machine noise hits both alike. Over stdio the server is an mcp 2.x
``MCPServer`` (what users proxy; the handshake first), or with ``--server line`` a minimal line responder (the
proxy's own cost, without an SDK's); over HTTP a bare ASGI app on uvicorn. The proxy runs as a user runs it
(``mcp-token-otel proxy``, default config, measurement on, /metrics served). Added latency = proxy percentile -
direct percentile. CPU (stdio): user + system time of the proxy and its measuring process per request, from
/proc, over the interleaved requests, in total and split (relay: the proxy process; measuring: its measuring
process). Throughput: sequential requests per second, the arms alternating in
100 ms slices.

``--guard`` adds a third arm: the proxy with every guard policy on in observe mode (GUARD_ENV), where the
proxy measures and guards each message on the relay path (docs/proxy.md, Guards); its added latency is
printed beside the plain proxy's.

``--baseline DIR`` adds an arm running the proxy from another checkout (e.g. ``git worktree add /tmp/base REV``),
interleaved with the others, so before and after are measured in the same conditions on a shared machine.

``--load go`` is the throughput mode: concurrent clients against the Go MCP test server (tests/peers/go, built by
scripts/go-peers; the official Go SDK's by default, ``--go-server mcpgo`` for mcp-go's), each client a loop of
``tools/call`` POSTs over streamable HTTP after its own initialize, driven by a Go load generator
(benchmarks/go/load). Arms: the server directly; the floor, a plain reverse-proxy hop that measures nothing
(benchmarks/go/floor: the standard library's ``httputil.ReverseProxy``, responses flushed as they come); the
proxy as users run it; ``--baseline``'s proxy. Both results, a small structured one (the ``weather`` tool) and a
200-line document (``read_document``), in blocks of ``--block-seconds`` per arm, the arms' order rotating from
block to block. Printed: each arm's calls per second (median of the blocks), its ratio to the floor (the
median of each block's ratio to the floor's run in the same block), latency percentiles (medians of the
blocks'), CPU per call of the relaying processes, and whether the proxy measured every call it relayed. The
Go programs are built with ``go`` into the cache (nothing is fetched: standard library only).

    python benchmarks/proxy_overhead.py [--iterations 2000] [--large-iterations 300] [--transport stdio]
        [--server sdk|line] [--sizes 2000,200000] [--guard] [--baseline DIR] [--markdown]
    python benchmarks/proxy_overhead.py --load go [--clients 8] [--blocks 6] [--block-seconds 3]
        [--go-server gosdk|mcpgo] [--baseline DIR] [--markdown]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from loopback import free_port, wait_listening

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

#: An mcp 2.x server over stdio (what users proxy), one tool returning ``size`` characters.
SDK_SERVER = textwrap.dedent("""
    import sys
    from mcp.server.mcpserver import MCPServer
    text = "x" * int(sys.argv[1])
    server = MCPServer("bench")

    @server.tool()
    def payload(q: str) -> str:
        return text

    server.run("stdio")
""")
#: The handshake an MCP client sends first over stdio (the SDK server answers nothing before it).
HANDSHAKE = (
    b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},'
    b'"clientInfo":{"name":"bench","version":"1"}}}\n',
    b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n',
)

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


def _env(extra: dict[str, str] | None = None, tree: Path = ROOT) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **(extra or {})}


def _proxy(*args: str) -> list[str]:
    return [sys.executable, "-m", "mcp_token_otel.cli", "proxy", *args]


def _request(rid: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                       "params": {"name": "payload", "arguments": {"q": "benchmark"}}}).encode()


class StdioArm:
    def __init__(self, argv: list[str], env: dict[str, str] | None = None, tree: Path = ROOT,
                 handshake: bool = False) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_env(env, tree),
                                     cwd=tree)  # ``python -m`` looks in the working directory first
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.rid = 0
        if handshake:
            self.stdin.write(HANDSHAKE[0])
            self.stdin.flush()
            self.stdout.readline()
            self.stdin.write(HANDSHAKE[1])
            self.stdin.flush()

    def cpu_seconds(self, server: list[str]) -> dict[str, float]:
        """CPU (user + system) of the proxy process and of its measuring process (every other process of this
        arm's tree but the server); the direct arm: none."""
        command = " ".join(server)
        split = {"relay": 0.0, "measuring": 0.0}
        for pid in _tree(self.proc.pid):
            if not _cmdline(pid).startswith(command):
                split["relay" if pid == self.proc.pid else "measuring"] += _cpu(pid)
        return split

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


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc's children lists)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(child) for child in task.read_text().split()]
    return out


def _cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


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
    items = list(arms.items())
    for i in range(warmup + iterations):
        # Each arm in each place in turn: an arm called twice in a row (its processes still warm, on a CPU) is
        # faster and cheaper the second time, so a fixed order such as A B C, C B A favours the outer arms.
        order = items[i % len(items):] + items[:i % len(items)]
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
        "added_p99_us": _pct(p, 0.99) - _pct(d, 0.99),
        "direct_mean_us": statistics.fmean(d), "proxy_mean_us": statistics.fmean(p),
        "direct_p99_us": _pct(d, 0.99), "proxy_p99_us": _pct(p, 0.99),
        "ratio_p50": _pct(p, 0.5) / _pct(d, 0.5),
        "direct_rps": rps["direct"], "proxy_rps": rps["proxy"],
    }


def bench_stdio(size: int, iterations: int, warmup: int, guard: bool = False,
                baseline: Path | None = None, server_kind: str = "sdk") -> dict[str, Any]:
    script = SDK_SERVER if server_kind == "sdk" else LINE_SERVER
    server = [sys.executable, "-c", script, str(size)]
    wanted = {"proxy": (None, ROOT), **({"guard": (GUARD_ENV, ROOT)} if guard else {}),
              **({"baseline": (None, baseline)} if baseline is not None else {})}
    arms = {"direct": StdioArm(server, handshake=server_kind == "sdk")}
    for name, (env, tree) in wanted.items():
        proxy = _proxy("--name", "bench", "--metrics-port", str(free_port()), "--", *server)  # as users run it
        arms[name] = StdioArm(proxy, env, tree, handshake=server_kind == "sdk")
    try:
        _interleaved(arms, warmup, 0)  # every process started and warm before the CPU clock starts
        time.sleep(1.0)
        before = {name: arm.cpu_seconds(server) for name, arm in arms.items()}
        times = _interleaved(arms, iterations, 0)
        time.sleep(1.0)  # the measuring process's share of the last calls (and one metrics export) lands
        cpu = {}
        for name, arm in arms.items():
            after = arm.cpu_seconds(server)
            for part in ("relay", "measuring"):
                cpu[f"{name}_{part}_cpu_us"] = (after[part] - before[name][part]) / iterations * 1e6
            cpu[f"{name}_cpu_us"] = cpu[f"{name}_relay_cpu_us"] + cpu[f"{name}_measuring_cpu_us"]
        rps = _throughput(arms, THROUGHPUT_SECONDS)
    finally:
        for arm in arms.values():
            arm.close()
    return {**_row("stdio", size, times, rps), **cpu}


def bench_http(size: int, iterations: int, warmup: int, guard: bool = False,
               baseline: Path | None = None) -> dict[str, Any]:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", HTTP_SERVER, str(size), str(port)], env=_env())
    proxies: list[subprocess.Popen[bytes]] = []
    arms: dict[str, Any] = {"direct": HttpArm(f"http://127.0.0.1:{port}/mcp")}
    wanted = [("proxy", None, ROOT), *([("guard", GUARD_ENV, ROOT)] if guard else []),
              *([("baseline", None, baseline)] if baseline is not None else [])]
    try:
        wait_listening(port)
        for name, env, tree in wanted:
            listen = free_port()
            proxies.append(subprocess.Popen(_proxy("--listen", f"127.0.0.1:{listen}", "--upstream",
                                                   f"http://127.0.0.1:{port}/mcp"), env=_env(env, tree), cwd=tree))
            wait_listening(listen)
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


def _table(rows: list[dict[str, Any]], arms: list[str], markdown: bool) -> None:
    header = ["transport", "server", "result", "direct p50"]
    for arm in arms:
        header += [f"{arm} p50", "added p50", "added p95", "added p99", f"{arm} CPU/call", "(relay + measuring)",
                   f"{arm} req/s"]
    header.append("direct req/s")
    lines = []
    for r in rows:
        line = [r["transport"], r["server"], r["result"], f"{r['direct_p50_us']:,.0f}"]
        for arm in arms:
            key = "" if arm == "proxy" else f"{arm}_"
            added = {q: r[f"{key}added_{q}_us"] for q in ("p50", "p95")}
            p99 = r["added_p99_us"] if arm == "proxy" else r[f"{arm}_p99_us"] - r["direct_p99_us"]
            cpu = r.get(f"{arm}_cpu_us")
            split = "" if cpu is None else f"{r[f'{arm}_relay_cpu_us']:,.0f} + {r[f'{arm}_measuring_cpu_us']:,.0f}"
            line += [f"{r[f'{arm}_p50_us']:,.0f}", f"{added['p50']:+,.0f}", f"{added['p95']:+,.0f}", f"{p99:+,.0f}",
                     "" if cpu is None else f"{cpu:,.0f}", split, f"{r[f'{arm}_rps']:,.0f}"]
        lines.append([*line, f"{r['direct_rps']:,.0f}"])
    if markdown:
        print("| " + " | ".join(header) + " |\n|" + "|".join("---" for _ in header) + "|")
        for line in lines:
            print("| " + " | ".join(line) + " |")
        return
    widths = [max(len(row[i]) for row in (header, *lines)) for i in range(len(header))]
    for row in (header, *lines):
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))


def _targets(rows: list[dict[str, Any]]) -> None:
    """The targets: stdio 2 KB added p50 <= 150 µs, p99 <= 500 µs, proxy + measuring CPU <= 300 µs a call;
    HTTP 2 KB added p50 <= 1 ms; 200 KB p50 within 2x direct."""
    for r in rows:
        where = f"{r['transport']} ({r['server']} server) {r['result']}"
        if r["result"] != "2 KB":
            checks = [("p50 / direct p50", r["ratio_p50"], 2.0, "x")]
        elif r["transport"] == "stdio":
            checks = [("added p50", r["added_p50_us"], 150.0, " µs"), ("added p99", r["added_p99_us"], 500.0, " µs"),
                      ("proxy + measuring CPU per call", r["proxy_cpu_us"], 300.0, " µs")]
        else:
            checks = [("added p50", r["added_p50_us"], 1000.0, " µs")]
        for what, value, limit, unit in checks:
            verdict = "met" if value <= limit else "MISSED"
            print(f"target {where} {what} <= {limit:g}{unit}: {value:,.1f}{unit} {verdict}")


# ---------------------------------------------------------------------- throughput under concurrent clients (Go)

GO_SOURCES = ROOT / "benchmarks" / "go"
#: The calls of the throughput mode: (label, tool, arguments) of the Go test server's tools.
GO_CALLS = (("small", "weather", "{}"), ("200 lines", "read_document", '{"lines":200}'))


def _go_programs() -> dict[str, str]:
    """Paths of the floor hop, the load generator (built from benchmarks/go into the cache, keyed by their sources
    and the Go version, as scripts/go-peers does) and the Go MCP test servers (scripts/go-peers)."""
    if shutil.which("go") is None:
        raise SystemExit("proxy_overhead.py --load go: 'go' is not on PATH: install Go 1.26 or later "
                         "(https://go.dev/dl/) to build the load generator, the floor hop and the Go test server")
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly", "CGO_ENABLED": "0"}
    digest = hashlib.sha256(subprocess.run(["go", "env", "GOVERSION", "GOOS", "GOARCH"], capture_output=True,
                                           check=True, env=env).stdout)
    for path in sorted(GO_SOURCES.rglob("*")):
        if path.is_file() and (path.suffix == ".go" or path.name == "go.mod"):
            digest.update(str(path.relative_to(GO_SOURCES)).encode() + b"\0" + path.read_bytes())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mcp-token-otel" / "bench-go"
    dest = cache / digest.hexdigest()[:16]
    dest.mkdir(parents=True, exist_ok=True)
    programs = {}
    for name in ("floor", "load"):
        binary = dest / name
        if not os.access(binary, os.X_OK):
            partial = dest / f".{name}.{os.getpid()}"  # renamed when whole: a concurrent run never sees half of it
            subprocess.run(["go", "build", "-trimpath", "-o", str(partial), f"./{name}"], cwd=GO_SOURCES, env=env,
                           check=True)
            partial.replace(binary)
        programs[name] = str(binary)
    peers = subprocess.run([str(ROOT / "scripts" / "go-peers")], capture_output=True, text=True)
    if peers.returncode != 0:
        raise SystemExit(f"proxy_overhead.py --load go: scripts/go-peers failed: {peers.stderr.strip()}")
    programs |= {Path(path).name: path for path in peers.stdout.split()}
    return programs


def _tree_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of a relaying process (``relay``) and of its descendants (``measuring``)."""
    tree = _tree(pid)
    return {"relay": _cpu(pid), "measuring": sum(_cpu(child) for child in tree if child != pid)}


def _load(program: str, url: str, clients: int, seconds: float, tool: str, arguments: str) -> dict[str, Any]:
    done = subprocess.run([program, "-url", url, "-clients", str(clients), "-duration", f"{seconds}s",
                           "-warmup", "0.5s", "-tool", tool, "-arguments", arguments],
                          capture_output=True, text=True, timeout=seconds + 60)
    try:
        result: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        raise SystemExit(f"load generator failed against {url}: {done.stderr.strip()}") from None
    if result["errors"]:
        print(f"warning: {result['errors']} failed calls against {url}: {done.stderr.strip()}", file=sys.stderr)
    return result


def bench_go_load(clients: int, blocks: int, block_seconds: float, go_server: str,
                  baseline: Path | None) -> list[dict[str, Any]]:
    """Calls per second of each arm (median of ``blocks``), per call of GO_CALLS; arms rotate within a block."""
    programs = _go_programs()
    server_port = free_port()
    origin = f"http://127.0.0.1:{server_port}"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    urls = {"direct": f"{origin}/mcp"}
    try:
        procs["server"] = subprocess.Popen([programs[go_server], "--http", f"127.0.0.1:{server_port}"])
        wait_listening(server_port)
        port = free_port()
        procs["floor"] = subprocess.Popen([programs["floor"], "-listen", f"127.0.0.1:{port}", "-upstream", origin])
        urls["floor"] = f"http://127.0.0.1:{port}/mcp"
        wait_listening(port)
        metrics: dict[str, int] = {}
        for name, tree in (("proxy", ROOT), *([("baseline", baseline)] if baseline is not None else [])):
            metrics[name] = free_port()
            port = free_port()
            procs[name] = subprocess.Popen(  # as users run it: default config, measuring on, /metrics served
                _proxy("--listen", f"127.0.0.1:{port}", "--upstream", f"{origin}/mcp",
                       "--metrics-port", str(metrics[name])), env=_env(None, tree), cwd=tree)
            urls[name] = f"http://127.0.0.1:{port}/mcp"
            wait_listening(port)
        arms = list(urls)
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {(label, arm): [] for label, _, _ in GO_CALLS
                                                              for arm in arms}
        for block in range(blocks):
            for label, tool, arguments in GO_CALLS:
                order = arms[block % len(arms):] + arms[:block % len(arms)]
                for arm in order:
                    pid = procs[arm].pid if arm in procs else None
                    before = _tree_cpu(pid) if pid is not None else None
                    result = _load(programs["load"], urls[arm], clients, block_seconds, tool, arguments)
                    if pid is not None and before is not None and result["calls"]:
                        after = _tree_cpu(pid)
                        # CPU over the whole run (warm-up, handshakes and closing included), per counted call.
                        calls = result["calls"] * (1 + 0.5 / block_seconds)
                        result |= {f"{part}_cpu_us": (after[part] - before[part]) / calls * 1e6 for part in after}
                    runs[label, arm].append(result)
        # Every call relayed was measured (none dropped because the measuring process fell behind)?
        measured = {name: _measured_calls(port, sum(r["answered"] for (_, a), rs in runs.items() if a == name
                                                    for r in rs)) for name, port in metrics.items()}
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    rows = []
    for label, _, _ in GO_CALLS:
        floor = [r["calls_per_s"] for r in runs[label, "floor"]]
        for arm in arms:
            results = runs[label, arm]
            rates = [r["calls_per_s"] for r in results]
            # Each block's ratio to the floor's run of the same block (the two ran seconds apart, under the
            # same load from the rest of the machine); the median of those is the figure.
            ratios = [a / b for a, b in zip(rates, floor, strict=True)]
            row = {"result": label, "arm": arm, "calls_per_s": statistics.median(rates),
                   "min_calls_per_s": min(rates), "max_calls_per_s": max(rates),
                   "x_floor": statistics.median(ratios), "block_ratios": ratios,
                   "p50_us": statistics.median(r["p50_us"] for r in results),
                   "p99_us": statistics.median(r["p99_us"] for r in results),
                   "errors": sum(r["errors"] for r in results),
                   "bytes_per_call": statistics.median(r["bytes_per_call"] for r in results)}
            for part in ("relay", "measuring"):
                if f"{part}_cpu_us" in results[0]:
                    row[f"{part}_cpu_us"] = statistics.median(r[f"{part}_cpu_us"] for r in results)
            if arm in measured:
                row["measured"] = measured[arm]
            rows.append(row)
    return rows


def _measured_calls(metrics_port: int, answered: int) -> tuple[int, int]:
    """(tools/call answers the proxy's /metrics counted, answers the clients got), once the count stops
    growing (the measuring process lags the relay by design; bounded wait)."""
    import urllib.request

    counted, deadline = -1, time.monotonic() + 30
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        now = int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                      if line.startswith("mcp_token_responses_total{") and 'method="tools/call"' in line))
        if now >= answered or now == counted:
            return now, answered
        counted = now
        time.sleep(1.0)
    return counted, answered


def _load_table(rows: list[dict[str, Any]], markdown: bool) -> None:
    header = ["result", "arm", "calls/s", "(blocks' range)", "x floor", "(blocks' range)", "p50 µs", "p99 µs",
              "CPU µs/call", "(relay + measuring)", "failed calls", "calls measured"]
    lines = []
    for r in rows:
        ratios = r["block_ratios"]
        cpu = [r.get("relay_cpu_us"), r.get("measuring_cpu_us")]
        lines.append([
            f"{r['result']} ({r['bytes_per_call'] / 1000:.1f} KB)", r["arm"], f"{r['calls_per_s']:,.0f}",
            f"{r['min_calls_per_s']:,.0f}-{r['max_calls_per_s']:,.0f}", f"{r['x_floor']:.2f}",
            f"{min(ratios):.2f}-{max(ratios):.2f}", f"{r['p50_us']:,.0f}", f"{r['p99_us']:,.0f}",
            "" if cpu[0] is None else f"{cpu[0] + (cpu[1] or 0):,.0f}",
            "" if not cpu[1] else f"{cpu[0]:,.0f} + {cpu[1]:,.0f}", str(r["errors"]),
            "" if "measured" not in r else "all" if r["measured"][0] >= r["measured"][1]
            else f"{r['measured'][0]:,} of {r['measured'][1]:,}"])
    if markdown:
        print("| " + " | ".join(header) + " |\n|" + "|".join("---" for _ in header) + "|")
        for line in lines:
            print("| " + " | ".join(line) + " |")
        return
    widths = [max(len(row[i]) for row in (header, *lines)) for i in range(len(header))]
    for row in (header, *lines):
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))


def _load_targets(rows: list[dict[str, Any]]) -> None:
    """The target: the proxy relays at least 0.8x the floor's calls per second, for each result."""
    for r in rows:
        if r["arm"] == "proxy":
            verdict = "met" if r["x_floor"] >= 0.8 else "MISSED"
            print(f"target {r['result']}: proxy calls/s >= 0.8x the floor's: {r['x_floor']:.2f}x {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=2000, help="interleaved requests per arm at 2 KB")
    parser.add_argument("--large-iterations", type=int, default=300, help="interleaved requests per arm at 200 KB")
    parser.add_argument("--transport", choices=("stdio", "http", "both"), default="both")
    parser.add_argument("--server", choices=("sdk", "line"), default="sdk",
                        help="stdio server: an mcp 2.x MCPServer (default) or a minimal line responder")
    parser.add_argument("--sizes", default="2000,200000", help="result sizes in bytes, comma-separated")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    parser.add_argument("--guard", action="store_true", help="add the arm with every guard policy on (observe)")
    parser.add_argument("--baseline", type=Path, metavar="DIR", help="add the arm of the proxy in another checkout")
    parser.add_argument("--load", choices=("go",), help="throughput mode: concurrent clients (a Go load generator) "
                        "against the Go test server, directly, through a plain Go reverse proxy and the proxy")
    parser.add_argument("--clients", type=int, default=8, help="--load: concurrent clients")
    parser.add_argument("--blocks", type=int, default=6, help="--load: blocks (one run of every arm and result)")
    parser.add_argument("--block-seconds", type=float, default=3.0, help="--load: seconds counted per run")
    parser.add_argument("--go-server", choices=("gosdk", "mcpgo"), default="gosdk",
                        help="--load: the Go test server (official Go SDK: SSE answers; mcp-go: JSON answers)")
    args = parser.parse_args()
    if args.load:
        load_before = os.getloadavg()[0]
        rows = bench_go_load(args.clients, args.blocks, args.block_seconds, args.go_server, args.baseline)
        print(f"{os.cpu_count()} CPUs, load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; "
              f"{args.go_server} server, {args.clients} clients, {args.blocks} blocks of {args.block_seconds:g} s "
              "per arm and result, arms rotating; medians of the blocks")
        _load_table(rows, args.markdown)
        _load_targets(rows)
        if args.json:
            print(json.dumps(rows))
        return
    sizes = [int(size) for size in args.sizes.split(",")]
    load_before = os.getloadavg()[0]
    rows = []
    for size in sizes:
        n = args.iterations if size < 100_000 else args.large_iterations
        if args.transport in ("stdio", "both"):
            row = bench_stdio(size, n, max(50, n // 10), args.guard, args.baseline, args.server)
            rows.append({**row, "server": "mcp 2.x" if args.server == "sdk" else "line"})
        if args.transport in ("http", "both"):
            rows.append({**bench_http(size, n, max(50, n // 10), args.guard, args.baseline), "server": "ASGI"})
    print(f"{os.cpu_count()} CPUs, load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; "
          f"µs per request (round trip), {args.iterations} / {args.large_iterations} requests per arm, interleaved; "
          "CPU: proxy and measuring process per call (stdio)")
    _table(rows, ["proxy", *(n for n in EXTRA_ARMS if f"{n}_p50_us" in rows[0])], args.markdown)
    _targets(rows)
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
