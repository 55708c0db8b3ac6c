"""Time to measure hostile payloads (issue: bounded cost), next to one linear pass over their JSON.

For each payload: the time of ``measure_result``/``measure_message`` and of ``json.dumps`` of the same
value (the floor any measurement that reads everything pays), median of ``--runs``; and the 50,000-row
case's estimate against the estimate of its serialised JSON.

    python benchmarks/hostile_payloads.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from mcp_token_otel.core.estimation import estimate_tokens
from mcp_token_otel.core.measure import measure_message, measure_result


def timed(fn: Callable[[], Any], runs: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(runs):
        start = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rows = [{"id": i, "name": f"user {i}", "email": f"u{i}@example.com", "score": i / 7} for i in range(50_000)]
    cases: list[tuple[str, Any, Callable[[Any], Any]]] = [
        ("100k content blocks", {"content": [{"type": "text", "text": f"line {i}"} for i in range(100_000)]},
         lambda v: measure_result("tools/call", v)),
        ("1M-key structuredContent", {"content": [], "structuredContent": {f"k{i}": i for i in range(1_000_000)}},
         lambda v: measure_result("tools/call", v)),
        ("measure_message, 3M-key dict", {f"k{i}": "v" for i in range(3_000_000)}, measure_message),
        ("50,000-row structuredContent", {"content": [], "structuredContent": {"rows": rows}},
         lambda v: measure_result("tools/call", v)),
    ]
    print("| payload | measure ms | json.dumps ms | tokens | reason |")
    print("|---|---|---|---|---|")
    for label, value, fn in cases:
        ms, m = timed(lambda fn=fn, value=value: fn(value), args.runs)  # type: ignore[misc]
        dump_ms, _ = timed(lambda value=value: json.dumps(value, separators=(",", ":")), args.runs)  # type: ignore[misc]
        print(f"| {label} | {ms:.0f} | {dump_ms:.0f} | {m.total_tokens:,} | {m.reason or ''} |")
    measured = measure_result("tools/call", {"structuredContent": rows}).total_tokens
    reference = estimate_tokens(json.dumps(rows, separators=(",", ":")))
    print(f"\n50,000 rows: measured {measured:,} tokens, serialised JSON {reference:,} "
          f"({(measured / reference - 1) * 100:+.1f}%)")


if __name__ == "__main__":
    main()
