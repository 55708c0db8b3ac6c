"""What keeping a cut result costs: paging it once (build_spill) and serving one page (read_spill), same process.

Shapes: a ~150,000-token source file (the acceptance case), the same file wrapped as {"content": file} JSON (the
filesystem server's shape), a JSON array of 100,000 small objects, 100,000 tiny items, one 10 MB string, a
10,000-deep JSON text (paged as text). The result's measurement is handed in (the guard has it already), so
``build ms`` is the paging alone; ``read ms`` serves one middle page from the in-memory store. Prints the
median and the worst of ``--runs`` for each, the page count, and the memory the spill is charged.

    python benchmarks/spill_paging.py [--runs 5] [--page-tokens 5000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from mcp_token_otel.core.estimation import estimate_tokens
from mcp_token_otel.core.spill import MemorySpillStore, build_spill, read_spill, spill_uri


def source_text(tokens: int) -> str:
    parts: list[str] = []
    total = 0
    for path in sorted(Path(json.__file__).resolve().parent.parent.glob("*.py")):
        parts.append(path.read_text(encoding="utf-8", errors="replace"))
        total += estimate_tokens(parts[-1])
        if total >= tokens:
            break
    return "".join(parts)


def shapes() -> dict[str, dict[str, Any]]:
    text = source_text(150_000)
    rows = [{"id": i, "name": f"item {i}", "tags": ["a", "b"]} for i in range(100_000)]
    return {
        "150k-token file": {"content": [{"type": "text", "text": text}]},
        "file as {content: file}": {"content": [{"type": "text", "text": json.dumps({"content": text})}],
                                    "structuredContent": {"content": text}},
        "100k objects (4.4 MB)": {"content": [{"type": "text", "text": json.dumps(rows)}]},
        "100k tiny items": {"content": [{"type": "text", "text": json.dumps(list(range(100_000)))}]},
        "one 10 MB string": {"content": [{"type": "text", "text": "0123456789abcdef " * 600_000}]},
        "10k-deep JSON text": {"content": [{"type": "text", "text": "[" * 10_000 + "1" + "]" * 10_000}]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--page-tokens", type=int, default=5000)
    args = parser.parse_args()
    print(f"{'shape':<26}{'pages':>7}{'build med ms':>14}{'build max ms':>14}{'read med ms':>13}{'memory MB':>11}")
    for name, result in shapes().items():
        builds, reads = [], []
        for _ in range(args.runs):
            started = time.perf_counter()
            spill = build_spill(result, args.page_tokens, tokens=0, tool="t")
            builds.append((time.perf_counter() - started) * 1000)
        store = MemorySpillStore(ttl=300, max_bytes=1 << 30)
        spill_id = store.put("session", spill, 0.0).spill_id
        assert spill_id is not None
        middle = spill_uri(spill_id, max(1, spill.page_count // 2))
        for _ in range(args.runs):
            started = time.perf_counter()
            answer = read_spill(store, middle, "session", 1.0)
            reads.append((time.perf_counter() - started) * 1000)
            assert answer.result is not None
        print(f"{name:<26}{spill.page_count:>7,}{statistics.median(builds):>14.1f}{max(builds):>14.1f}"
              f"{statistics.median(reads):>13.2f}{spill.memory / 1e6:>11.1f}")


if __name__ == "__main__":
    main()
