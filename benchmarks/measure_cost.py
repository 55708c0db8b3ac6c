"""Per-call cost of the pure measurement (measure_result, measure_request, estimate_tokens), this checkout
against another revision, arms interleaved in the same process.

The other revision's ``mcp_token_otel`` is taken with ``git archive`` into a temporary directory and imported
under another name, so both arms run in one interpreter on the same data; blocks of calls alternate between
the arms. Every case first checks that both arms give the same Measurement (the figures must not change).

Cases: the commonest ``tools/call`` result (a text block and MCPServer's ``{"result": text}``, ``isError``) in
its legacy shape and with the 2026 protocol's ``resultType`` and ``_meta``, for 2 KB of prose (no digits),
JSON and CJK/Cyrillic text; the estimate alone for the same texts; a ``tools/call`` request with empty and
small arguments. Also the Python function calls per call (cProfile; deterministic, unlike the times).

    python benchmarks/measure_cost.py                # against HEAD
    python benchmarks/measure_cost.py --base 0335a6a --rounds 20
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import json
import pstats
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROSE = ("lorem ipsum dolor sit amet, " * 80)[:2048]
JSON = json.dumps([{"id": i, "Name": f"Item{i}", "price": i * 1.5, "tags": ["A1", "b"]} for i in range(60)])[:2048]
NON_ASCII = ("Привет мир, 你好世界 ✓ héllo " * 80)[:2048]
META = {"io.modelcontextprotocol/serverInfo": {"name": "bench", "version": "2.3.0"}}


def _result(text: str, shape: str) -> dict[str, Any]:
    copy = "".join(list(text))  # equal, not identical: as after JSON parsing
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "structuredContent": {"result": copy},
                              "isError": False}
    if shape == "2026":
        result.update(resultType="complete", _meta=META)
    return result


def cases(pkg: str) -> dict[str, Callable[[], Any]]:
    measure = importlib.import_module(f"{pkg}.core.measure")
    estimate = importlib.import_module(f"{pkg}.core.estimation").estimate_tokens
    out: dict[str, Callable[[], Any]] = {}
    for name, text in (("prose", PROSE), ("json", JSON), ("non-ascii", NON_ASCII)):
        for shape in ("legacy", "2026"):
            result = _result(text, shape)
            out[f"measure_result {name} {shape}"] = lambda r=result: measure.measure_result("tools/call", r,
                                                                                            tool_name="fetch")
        out[f"estimate_tokens {name}"] = lambda t=text: estimate(t)
    for label, args in (("{}", {}), ("small", {"url": "https://example.com/a", "max": 5})):
        params = {"name": "fetch", "arguments": args}
        out[f"measure_request {label}"] = lambda p=params: measure.measure_request("tools/call", p)
    return out


def _base_package(rev: str, into: Path) -> str:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "mcp_token_otel"], capture_output=True,
                             check=True).stdout
    target = into / "archive.tar"
    target.write_bytes(archive)
    with tarfile.open(target) as tar:
        tar.extractall(into, filter="data")
    (into / "mcp_token_otel").rename(into / "mcp_token_otel_base")
    sys.path.insert(0, str(into))
    return "mcp_token_otel_base"


def _block(fn: Callable[[], Any], calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - start) / 1000)
    return times


def _calls(fn: Callable[[], Any], n: int = 200) -> float:
    """Python function calls per call of ``fn``, not counting ``fn`` itself (a lambda around the call)."""

    def loop() -> None:
        for _ in range(n):
            fn()

    def nothing() -> None:
        pass

    counts = []
    for target in (loop, nothing):
        profile = cProfile.Profile()
        profile.runcall(target)
        counts.append(pstats.Stats(profile).total_calls)  # type: ignore[attr-defined]
    return (counts[0] - counts[1] - n) / n


def _same(a: Any, b: Any) -> bool:
    return a == b if isinstance(a, int) else a.to_dict() == b.to_dict()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="HEAD", help="git revision to compare with (default HEAD)")
    ap.add_argument("--rounds", type=int, default=10, help="blocks per arm and case")
    ap.add_argument("--calls", type=int, default=1000, help="calls per block")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = cases(_base_package(args.base, Path(tmp)))
        head = cases("mcp_token_otel")
        print(f"µs per call, {args.rounds} interleaved blocks of {args.calls} per arm; base = {args.base}")
        print(f"{'case':36} {'base med':>9} {'new med':>8} {'change':>7} {'base mean':>9} {'new mean':>8} "
              f"{'base p99':>8} {'new p99':>8} {'calls base':>10} {'calls new':>9}")
        for name, new_fn in head.items():
            old_fn = base[name]
            if not _same(old_fn(), new_fn()):
                print(f"{name}: MEASUREMENTS DIFFER")
                continue
            old: list[float] = []
            new: list[float] = []
            for _ in range(args.rounds):
                old += _block(old_fn, args.calls)
                new += _block(new_fn, args.calls)
            mo, mn = statistics.median(old), statistics.median(new)
            po, pn = (statistics.quantiles(x, n=100)[98] for x in (old, new))
            print(f"{name:36} {mo:9.2f} {mn:8.2f} {(mn - mo) / mo:+7.0%} {statistics.fmean(old):9.2f} "
                  f"{statistics.fmean(new):8.2f} {po:8.2f} {pn:8.2f} {_calls(old_fn):10.0f} {_calls(new_fn):9.0f}")


if __name__ == "__main__":
    main()
