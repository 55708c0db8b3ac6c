"""Accuracy and speed of every token estimator against tiktoken o200k_base.

    python benchmarks/estimator_accuracy.py              # text report
    python benchmarks/estimator_accuracy.py --markdown   # Markdown table for the README
    python benchmarks/estimator_accuracy.py --json       # machine-readable
    python benchmarks/estimator_accuracy.py --real DIR   # add every text file under DIR (kind "real")

Accuracy is measured on the held-out split of benchmarks/corpus.py (seeds and files the
default estimator was not fitted on). Errors are (estimate - exact) / exact per sample.
Needs the [exact] extra for the reference; runs fully offline.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corpus import Sample, build_corpus, gen_json, gen_mcp_envelope, iter_kinds, load_dir

from mcp_token_otel.core.estimators import ESTIMATOR_NAMES, get_estimator

REFERENCE = "tiktoken:o200k_base"


def accuracy(samples: list[Sample], name: str, truth: list[int]) -> dict[str, dict[str, float]]:
    est = get_estimator(name)
    rows: dict[str, dict[str, float]] = {}
    every: list[float] = []
    for kind, group in [*iter_kinds(samples)]:
        errs = [(est(s.text) - truth[i]) / truth[i] * 100 for i, s in enumerate(samples) if s.kind == kind]
        every += errs
        rows[kind] = _stats(errs)
        del group
    rows["overall"] = _stats(every)
    return rows


def _stats(errs: list[float]) -> dict[str, float]:
    return {
        "n": len(errs),
        "mean_signed_pct": sum(errs) / len(errs),
        "mean_abs_pct": sum(abs(e) for e in errs) / len(errs),
        "worst_pct": max(errs, key=abs),
    }


def _best_of(fn: Callable[[], object], number: int, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def payload(size: int, seed: int = 7) -> str:
    """A realistic MCP-ish payload of exactly `size` characters (JSON envelopes + records)."""
    rng = random.Random(seed)
    parts: list[str] = []
    total = 0
    while total < size:
        p = gen_mcp_envelope(rng) if rng.random() < 0.5 else gen_json(rng, pretty=rng.random() < 0.5)
        parts.append(p)
        total += len(p)
    return "\n".join(parts)[:size]


def speed(name: str) -> dict[str, float]:
    est = get_estimator(name)
    small, kb64, mb1, mb10 = payload(2048), payload(64 * 1024), payload(1 << 20), payload(10 << 20)
    out = {"us_per_call_2kb": _best_of(lambda: est(small), 2000) * 1e6}
    # 64 KB is the largest size the default estimator scans whole; above it, it samples.
    for label, text, n in (("mb_per_s_64kb", kb64, 20), ("mb_per_s_1mb", mb1, 5), ("mb_per_s_10mb", mb10, 1)):
        out[label] = len(text.encode()) / 1e6 / _best_of(partial(est, text), n, repeat=3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--real", metavar="DIR", help="also measure every text file under DIR")
    ap.add_argument("--per-kind", type=int, default=40)
    ap.add_argument("--no-speed", action="store_true")
    args = ap.parse_args()

    samples = build_corpus(args.per_kind, splits=("test",))
    if args.real:
        samples += load_dir(args.real)
    ref = get_estimator(REFERENCE)
    truth = [ref(s.text) for s in samples]
    keep = [i for i, y in enumerate(truth) if y > 0]
    samples, truth = [samples[i] for i in keep], [truth[i] for i in keep]

    names = [n for n in ESTIMATOR_NAMES if n != REFERENCE]
    result = {
        "reference": REFERENCE,
        "samples": len(samples),
        "accuracy": {n: accuracy(samples, n, truth) for n in names},
        "speed": {} if args.no_speed else {n: speed(n) for n in [*names, REFERENCE]},
    }
    if args.json:
        print(json.dumps(result, indent=2))
    elif args.markdown:
        print_markdown(result)
    else:
        print_text(result)


def print_markdown(r: dict) -> None:
    names = list(r["accuracy"])
    print(
        f"Error vs `{r['reference']}` on {r['samples']} held-out samples: "
        "mean signed % / mean absolute % / worst %.\n"
    )
    print("| kind | " + " | ".join(f"`{n}`" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for kind in r["accuracy"][names[0]]:
        cells = []
        for n in names:
            s = r["accuracy"][n][kind]
            cells.append(f"{s['mean_signed_pct']:+.1f} / {s['mean_abs_pct']:.1f} / {s['worst_pct']:+.0f}")
        label = f"**{kind}**" if kind == "overall" else kind
        print(f"| {label} | " + " | ".join(cells) + " |")
    if r["speed"]:
        print("\n| estimator | µs per 2 KB call | MB/s on 64 KB (full scan) | MB/s on 1 MB | MB/s on 10 MB |")
        print("|---|---|---|---|---|")
        for n, s in r["speed"].items():
            print(
                f"| `{n}` | {s['us_per_call_2kb']:.1f} | {s['mb_per_s_64kb']:.0f} | {s['mb_per_s_1mb']:.0f} "
                f"| {s['mb_per_s_10mb']:.0f} |"
            )


def print_text(r: dict) -> None:
    for n, rows in r["accuracy"].items():
        print(f"\n{n}  (vs {r['reference']}): kind, n, mean signed %, mean abs %, worst %")
        for kind, s in rows.items():
            print(
                f"  {kind:15} {s['n']:4} {s['mean_signed_pct']:+8.2f} {s['mean_abs_pct']:8.2f} "
                f"{s['worst_pct']:+9.2f}"
            )
    if r["speed"]:
        print("\nspeed: µs per 2 KB call, MB/s on 64 KB (full scan), 1 MB, 10 MB")
        for n, s in r["speed"].items():
            print(
                f"  {n:22} {s['us_per_call_2kb']:9.1f} {s['mb_per_s_64kb']:9.1f} {s['mb_per_s_1mb']:9.1f} "
                f"{s['mb_per_s_10mb']:9.1f}"
            )


if __name__ == "__main__":
    main()
