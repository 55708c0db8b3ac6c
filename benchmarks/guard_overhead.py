"""Per-message cost of the guard engine (pure core), arms interleaved in the same process.

A message is one ``tools/call``: ``on_request`` with the session's budget, then ``on_result`` on an
MCPServer-shaped result (a text block and the same text as ``structuredContent.result``) of 2 KB or
200 KB of real source text (stdlib files). The recorder measures every result anyway, so its
Measurement is handed in (the integration contract); the ``measure`` arm shows what that measurement
itself costs, for scale.

Arms:
    off            guard.mode off (the default): both calls return at once
    observe        every policy on in observe mode (cap below the result size, so the cap decides
                   "would truncate"; session hard limit, warning note, rate limit, depth, padding, annotation,
                   cost): decisions and findings only, nothing changes
    enforce-fit    every policy on in enforce mode, cap above the result size: padding scan, annotation
                   (copies the result), cost
    enforce-cut    the same with the cap at half the result: the cut itself (binary search on the estimator,
                   the text and structuredContent cut once, the notice), measured again, annotated
    measure        measure_result alone (not a guard arm; the recorder's own cost)

    python benchmarks/guard_overhead.py [--blocks 20] [--calls 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcp_token_otel.core.budget import SessionBudget
from mcp_token_otel.core.guard import GuardEngine, GuardSettings
from mcp_token_otel.core.measure import DEFAULT_POLICY, measure_result

SIZES = {"2 KB": 2 * 1024, "200 KB": 200 * 1024}


def corpus(size: int) -> str:
    text = ""
    for path in sorted(Path(json.__file__).parent.parent.glob("*.py")):
        text += path.read_text(encoding="utf-8", errors="replace")
        if len(text) >= size:
            break
    return text[:size]


def all_policies(mode: str, cap: int) -> GuardSettings:
    return GuardSettings(
        mode=mode, max_response_tokens=cap, session_hard_limit=True, session_warning_note=True,
        annotate_meta=True, rate_limit=True, calls_per_minute=10**9, max_chain_depth=5, model="gpt-5.5",
    )


def arms(text: str) -> dict[str, Callable[[], Any]]:
    result = {"content": [{"type": "text", "text": text}], "structuredContent": {"result": text}}
    params = {"name": "fetch", "arguments": {"path": "a.py"}}
    budget = SessionBudget(10**9)
    budget.record(10)
    m = measure_result("tools/call", result, tool_name="fetch", policy=DEFAULT_POLICY)
    engines = {
        "off": GuardEngine(GuardSettings()),
        "observe": GuardEngine(all_policies("observe", max(1, m.data_tokens // 2))),
        "enforce-fit": GuardEngine(all_policies("enforce", m.data_tokens * 2)),
        "enforce-cut": GuardEngine(all_policies("enforce", max(1, m.data_tokens // 2))),
    }

    def message(engine: GuardEngine) -> Callable[[], Any]:
        def run() -> Any:
            engine.on_request("tools/call", params, session_id="s", budget=budget)
            return engine.on_result("tools/call", result, tool="fetch", arguments=params["arguments"],
                                    budget=budget, measurement=m)
        return run

    out: dict[str, Callable[[], Any]] = {name: message(e) for name, e in engines.items()}
    out["measure"] = lambda: measure_result("tools/call", result, tool_name="fetch", policy=DEFAULT_POLICY)
    # Sanity: off returns the very object, observe changes nothing.
    assert out["off"]().result is result and out["observe"]().result is result
    assert out["enforce-cut"]().result is not result
    return out


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    print(f"{'size':>7} {'arm':>12} {'median us':>10} {'mean us':>9} {'p99 us':>9} {'added (median) us':>18}")
    for label, size in SIZES.items():
        runs = arms(corpus(size))
        calls = args.calls if size < 100_000 else max(10, args.calls // 5)
        times: dict[str, list[float]] = {name: [] for name in runs}
        for block in range(args.blocks):
            order = list(runs.items())
            if block % 2:
                order.reverse()  # arms interleaved, alternating which goes first
            for name, run in order:
                run()  # warm
                for _ in range(calls):
                    start = time.perf_counter_ns()
                    run()
                    times[name].append((time.perf_counter_ns() - start) / 1000)
        base = statistics.median(times["off"])
        for name, values in times.items():
            med = statistics.median(values)
            added = f"{med - base:18.1f}" if name not in ("off", "measure") else f"{'-':>18}"
            print(f"{label:>7} {name:>12} {med:10.1f} {statistics.fmean(values):9.1f} {p99(values):9.1f} {added}")


if __name__ == "__main__":
    main()
