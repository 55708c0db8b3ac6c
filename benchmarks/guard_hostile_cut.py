"""What the response cap costs on hostile JSON shapes (issue 13: the cut must stay bounded), same process.

Each shape is a tools/call result the array-and-string cut alone could not bring under the cap (a 100,000-key
object, 3,000 arrays, a 10,000-deep nesting) or that cannot even be parsed (10,000-deep JSON text). The
recorder measures every result anyway, so its Measurement is handed in (the integration contract); the
``measure`` column is what that measurement itself costs, for scale. Prints, per cap and shape: the median,
mean and p99 of ``cap_result``, the tokens before and after (after <= cap + notice) and ``over`` (tokens left
above the cap: 0 whenever no outputSchema constrains the cut). A result already under the cap is not cut.

    python benchmarks/guard_hostile_cut.py [--runs 7] [--caps 100,8000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from mcp_token_otel.core.guard import cap_result
from mcp_token_otel.core.measure import DEFAULT_POLICY, measure_result


def nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for level in range(depth):
        value = [value, level] if level % 2 else {"d": value, "n": level}
    return value


def shapes() -> dict[str, dict[str, Any]]:
    wide = {f"key{i}": i for i in range(100_000)}
    arrays = {f"k{i}": list(range(30)) for i in range(3_000)}
    deep = {"root": nested(10_000, "x")}
    return {
        "text: 100k-key object": {"content": [{"type": "text", "text": json.dumps(wide)}]},
        "text: 3,000 arrays": {"content": [{"type": "text", "text": json.dumps(arrays)}]},
        "text: 10k-deep (unparseable)": {"content": [{"type": "text", "text": "[" * 10_000 + "1" + "]" * 10_000}]},
        "structured: 100k keys": {"content": [{"type": "text", "text": "see"}], "structuredContent": wide},
        "structured: 10k deep": {"content": [{"type": "text", "text": "see"}], "structuredContent": deep},
        "text = structured: 100k keys": {"content": [{"type": "text", "text": json.dumps(wide)}],
                                         "structuredContent": wide},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--caps", default="100,8000")
    args = parser.parse_args()
    cases = shapes()
    print(f"{'cap':>6}  {'shape':<30}{'median ms':>10}{'mean ms':>9}{'p99 ms':>8}{'measure ms':>11}"
          f"{'tokens':>9}{'after':>7}{'notice':>7}{'over':>5}")
    for cap in (int(c) for c in args.caps.split(",")):
        for name, result in cases.items():
            started = time.perf_counter()
            m = measure_result("tools/call", result, policy=DEFAULT_POLICY)
            measure_ms = (time.perf_counter() - started) * 1000
            times = []
            for _ in range(args.runs):
                started = time.perf_counter()
                new, report = cap_result(result, cap, policy=DEFAULT_POLICY, measurement=m, tool="t")
                times.append((time.perf_counter() - started) * 1000)
            after = measure_result("tools/call", new, policy=DEFAULT_POLICY).data_tokens if new else m.data_tokens
            times.sort()
            p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
            print(f"{cap:>6}  {name:<30}{statistics.median(times):>10.1f}{statistics.fmean(times):>9.1f}{p99:>8.1f}"
                  f"{measure_ms:>11.1f}{m.data_tokens:>9,}{after:>7,}{report.notice_tokens:>7}"
                  f"{report.over_cap_tokens:>5}")


if __name__ == "__main__":
    main()
