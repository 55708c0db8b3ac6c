"""Fit the weights of the default estimator (mcp_token_otel/estimation.py).

    python benchmarks/fit_estimator.py            # fit, print weights + train/held-out errors

Target: the exact o200k_base count (tiktoken, offline, via the [exact] extra).
Features: counts of character-class patterns (see estimation.CANDIDATE_PATTERNS).
Method, plain Python (no numpy needed):
  * non-negative least squares on *relative* error (each row divided by its true count),
    so small and large samples count alike; non-negative weights keep the estimate
    monotone under appending (every feature is a count that can only grow);
  * non-negativity by backward elimination: solve, drop the most negative weight, repeat;
  * a few rounds of iteratively reweighted least squares so the fit minimises mean
    *absolute* relative error (what the benchmark reports) rather than squared error;
  * per-kind balancing: every content kind gets the same total weight (times --kind-weight KIND=W);
  * class weights put on the estimator's grid (1/WEIGHT_MAX), rounding chosen by the same objective (quantise).
The fitted weights are printed as Python, to paste into estimation.py (WEIGHTS).
Train and held-out samples come from benchmarks/corpus.py (disjoint seeds and files).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corpus import Sample, build_corpus, iter_kinds

from mcp_token_otel.core.estimation import (
    ASCII_PATTERNS,
    CANDIDATE_PATTERNS,
    PATTERNS,
    WEIGHT_MAX,
    features,
    raw_features,
)
from mcp_token_otel.core.estimators import get_estimator

Matrix = list[list[float]]


def solve(a: Matrix, b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (a is small and square)."""
    n = len(a)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        if abs(m[col][col]) < 1e-12:
            continue
        for r in range(n):
            if r != col and m[r][col]:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] if abs(m[i][i]) > 1e-12 else 0.0 for i in range(n)]


def weighted_ls(xs: Matrix, ys: list[float], ws: list[float], active: list[int], ridge: float) -> list[float]:
    k = len(active)
    ata = [[0.0] * k for _ in range(k)]
    atb = [0.0] * k
    for x, y, w in zip(xs, ys, ws, strict=True):
        row = [x[j] for j in active]
        for i in range(k):
            if row[i]:
                wi = w * row[i]
                atb[i] += wi * y
                ai = ata[i]
                for j in range(k):
                    ai[j] += wi * row[j]
    for i in range(k):
        ata[i][i] += ridge * (ata[i][i] + 1e-9)
    return solve(ata, atb)


def nnls(xs: Matrix, ys: list[float], ws: list[float], ridge: float = 1e-6) -> list[float]:
    """Non-negative weighted least squares by backward elimination of negative weights."""
    active = list(range(len(xs[0])))
    while True:
        coef = weighted_ls(xs, ys, ws, active, ridge)
        worst = min(range(len(active)), key=lambda i: coef[i])
        if coef[worst] >= 0:
            break
        active.pop(worst)
    full = [0.0] * len(xs[0])
    for i, j in enumerate(active):
        full[j] = coef[i]
    return full


def fit(
    samples: list[Sample], truth: list[int], rounds: int = 0, kind_weights: dict[str, float] | None = None
) -> list[float]:
    # Relative error: scale each row by 1/y, so the target becomes 1.
    xs = [[v / y for v in features(s.text)] for s, y in zip(samples, truth, strict=True)]
    ys = [1.0] * len(xs)
    per_kind = {k: len(g) for k, g in iter_kinds(samples)}
    # Each kind weighs the same in total, times its --kind-weight.
    base = [(kind_weights or {}).get(s.kind, 1.0) / per_kind[s.kind] for s in samples]
    ws = base[:]
    coef = nnls(xs, ys, ws)
    for _ in range(rounds):  # IRLS towards L1: weight each row by 1/|residual|
        res = [abs(sum(c * v for c, v in zip(coef, x, strict=True)) - 1.0) for x in xs]
        ws = [b / max(r, 0.01) for b, r in zip(base, res, strict=True)]
        coef = nnls(xs, ys, ws)
    return coef


def quantise(
    coef: list[float], samples: list[Sample], truth: list[int], kind_weights: dict[str, float]
) -> list[float]:
    """Put each class weight on the estimator's grid (WEIGHT_TABLE: 1/WEIGHT_MAX of the largest byte weight).

    The estimator sums the rounded weights, so the rounding is chosen by the fit's objective (per-kind mean
    absolute error on the training split): one step down, none or one step up, class by class, twice over.
    ASCII classes keep distinct grid values (the ASCII fast path counts pairs on the weight bytes).
    """
    rows = [features(s.text) for s in samples]
    per_kind = {k: len(g) for k, g in iter_kinds(samples)}
    row_weight = [kind_weights.get(s.kind, 1.0) / per_kind[s.kind] / y for s, y in zip(samples, truth, strict=True)]
    singles = [j for j, p in enumerate(PATTERNS, 1) if len(p) == 1]
    top = max(singles, key=lambda j: coef[j])
    scale = WEIGHT_MAX / (coef[0] + coef[top])
    grid = {j: round((coef[0] + coef[j]) * scale) for j in singles}

    def loss(g: dict[int, int]) -> float:
        c = coef[:]
        for j, q in g.items():
            c[j] = q / scale - coef[0]
        return sum(
            w * abs(sum(a * v for a, v in zip(c, x, strict=True)) - y)
            for x, y, w in zip(rows, truth, row_weight, strict=True)
        )

    for _ in range(2):
        for j in singles:
            if j == top:
                continue  # the largest weight sets the grid
            taken = {q for i, q in grid.items() if i != j and PATTERNS[i - 1] in ASCII_PATTERNS}
            if PATTERNS[j - 1] not in ASCII_PATTERNS:
                taken = set()
            steps = (grid[j] - 1, grid[j], grid[j] + 1)
            options = [q for q in steps if q / scale >= coef[0] and q <= WEIGHT_MAX and q not in taken]
            grid[j] = min(options, key=lambda q: loss({**grid, j: q}))
    out = coef[:]
    for j, q in grid.items():
        out[j] = q / scale - coef[0]
    return out


def report(name: str, samples: list[Sample], estimate: Callable[[str], float]) -> float:
    print(f"\n{name}: kind, mean signed %, mean abs %, worst %")
    all_abs: list[float] = []
    for kind, group in iter_kinds(samples):
        errs = [(estimate(s.text) - s_truth[id(s)]) / s_truth[id(s)] * 100 for s in group]
        abs_errs = [abs(e) for e in errs]
        all_abs += abs_errs
        worst = max(errs, key=abs)
        print(f"  {kind:15} {sum(errs) / len(errs):+7.2f} {sum(abs_errs) / len(errs):7.2f} {worst:+8.2f}")
    overall = sum(all_abs) / len(all_abs)
    print(f"  {'overall':15} {'':7} {overall:7.2f}")
    return overall


s_truth: dict[int, int] = {}  # id(sample) -> exact o200k_base count


def kind_errors(
    coef: list[float], rows: Sequence[Sequence[float]], truth: list[int], kinds: list[str]
) -> dict[str, float]:
    acc: dict[str, list[float]] = {}
    for x, y, k in zip(rows, truth, kinds, strict=True):
        est = sum(c * v for c, v in zip(coef, x, strict=True))
        acc.setdefault(k, []).append(abs(est - y) / y)
    return {k: 100 * sum(v) / len(v) for k, v in acc.items()}


def pattern_cost(p: bytes) -> float:
    """Rough µs per bytes.count on 2 KB of ASCII (measured on CPython 3.11). Single classes are free
    (a weight in WEIGHT_TABLE), and so are non-ASCII patterns on ASCII text (counted only when it is not)."""
    if any(c in b"mpckex" for c in p):
        return 0.0
    if len(p) == 1:
        return 0.0  # a single class is a weight in WEIGHT_TABLE, not a count
    return 2.8 if p.endswith(b"a") else 2.3 if len(p) == 2 else 1.5


def select(train: list[Sample], truth: list[int], budget: float, always: list[int]) -> list[int]:
    """Cost-aware greedy forward selection: add the feature with the best gain per µs
    (gain in mean + max per-kind error), until the time budget for ASCII counts is spent."""
    rows = [raw_features(s.text) for s in train]
    kinds = [s.kind for s in train]
    xs = [[v / y for v in r] for r, y in zip(rows, truth, strict=True)]
    per_kind = {k: kinds.count(k) for k in set(kinds)}
    ws = [1.0 / per_kind[k] for k in kinds]
    chosen = list(always)
    names = ["bytes", "chars", *(p.decode("latin-1") for p in CANDIDATE_PATTERNS)]
    costs = [0.0, 0.0, *(pattern_cost(p) for p in CANDIDATE_PATTERNS)]
    spent = 0.0
    current = 1e9
    while True:
        best = None
        for j in range(len(names)):
            if j in chosen or spent + costs[j] > budget:
                continue
            cols = [*chosen, j]
            sub = nnls([[x[c] for c in cols] for x in xs], [1.0] * len(xs), ws)
            coef = [0.0] * len(names)
            for c, w in zip(cols, sub, strict=True):
                coef[c] = w
            errs = kind_errors(coef, rows, truth, kinds)
            score = sum(errs.values()) / len(errs) + max(errs.values())
            gain = (min(current, 200.0) - score) / (costs[j] + 0.3)
            if best is None or gain > best[3]:
                best = (score, j, errs, gain)
        if best is None or best[3] <= 0.05:
            return chosen
        chosen.append(best[1])
        spent += costs[best[1]]
        current = best[0]
        worst = max(best[2], key=lambda k: best[2][k])
        print(
            f"+ {names[best[1]]!r:12} cost={spent:5.1f} score={best[0]:6.2f} "
            f"mean={sum(best[2].values()) / len(best[2]):5.2f} "
            f"worst={worst} {best[2][worst]:.1f}",
            flush=True,
        )
    return chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-kind", type=int, default=60)
    ap.add_argument("--select", type=float, default=0, help="greedy-select features within this µs budget")
    ap.add_argument(
        "--kind-weight",
        action="append",
        default=[],
        metavar="KIND=W",
        help="weigh a kind W times the others in the fit (repeatable); the shipped weights use logs=1.1",
    )
    args = ap.parse_args()
    kind_weights = {k: float(w) for k, _, w in (kw.partition("=") for kw in args.kind_weight)}

    exact = get_estimator("tiktoken:o200k_base")
    train = build_corpus(args.per_kind, splits=("train",))
    test = build_corpus(args.per_kind, splits=("test",))
    train = [s for s in train if exact(s.text) > 0]
    test = [s for s in test if exact(s.text) > 0]
    for s in train + test:
        s_truth[id(s)] = exact(s.text)
    y_train = [s_truth[id(s)] for s in train]

    if args.select:
        select(train, y_train, args.select, [])
        return
    coef = quantise(fit(train, y_train, kind_weights=kind_weights), train, y_train, kind_weights)
    names = ["bytes", *(p.decode("latin-1") for p in PATTERNS)]

    def estimate(text: str) -> float:
        return sum(c * v for c, v in zip(coef, features(text), strict=True))

    report("train", train, estimate)
    report("held-out", test, estimate)
    print("\n# weights for (bytes, *PATTERNS):")
    print("WEIGHTS = (" + ", ".join(f"{c:.5f}" for c in coef) + ")")
    for n, c in zip(names, coef, strict=True):
        print(f"#   {n!r:12} {c:.5f}")


if __name__ == "__main__":
    main()
