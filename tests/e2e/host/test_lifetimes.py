"""2,000 short proxy lifetimes against one ``serve``: the store's disk use, serve's memory and the scrape stay
flat, and every figure is there exactly once.

Each lifetime is a forked child running what a stdio proxy's measuring process runs (tests/e2e/host/lifetimes.py:
``Telemetry`` with the host store, ``measure_process.serve`` over one session's records, ``Telemetry.close``),
without the relay, the MCP server and the interpreter start, which write nothing to the store; every tenth
child is killed with SIGKILL instead of closing, so serve compacts its files. The scrape times are printed,
not asserted (speed belongs in benchmarks); what a scrape reads, the number of files, is asserted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import Serve, child_env, files, parse, rss_kib, value

DRIVER = Path(__file__).resolve().parent / "lifetimes.py"
LIFETIMES = 2000
BATCH = 250
NAMES = ("alpha", "bravo", "charlie", "delta", "echo")
ARCHIVES = ["counter_archive.db", "gauge_livesum_archive.db", "gauge_max_archive.db", "histogram_archive.db"]


def disk(store: Path) -> tuple[int, int]:
    """(bytes the files say they hold, bytes allocated on disk)."""
    sizes = [os.stat(store / name) for name in os.listdir(store)]
    return sum(s.st_size for s in sizes), sum(s.st_blocks * 512 for s in sizes)


@pytest.mark.slow
def test_two_thousand_lifetimes_leave_the_store_serve_and_scrape_flat(tmp_path: Path) -> None:
    store = tmp_path / "state" / "metrics"
    serve = Serve(store, interval=3600)  # compaction here comes from the exits and the scrapes alone
    driver = subprocess.Popen([sys.executable, str(DRIVER), str(store), str(LIFETIMES), str(BATCH)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env())
    assert driver.stdin is not None and driver.stdout is not None
    rows = []
    try:
        for done in range(BATCH, LIFETIMES + 1, BATCH):
            assert driver.stdout.readline().strip() == f"batch {done}", "the driver failed"
            started = time.perf_counter()
            text = serve.text()  # compacts the killed children's files, then renders
            seconds = time.perf_counter() - started
            scrape = parse(text)
            rows.append({"lifetimes": done, "scrape_s": seconds, "scrape_bytes": len(text), "samples": len(scrape),
                         "files": files(store), "disk": disk(store), "rss_kib": rss_kib(serve.proc.pid),
                         "scrape": scrape})
            driver.stdin.write("\n")
            driver.stdin.flush()
        assert driver.stdout.readline().strip() == f"done {LIFETIMES}"
        assert driver.wait(60) == 0
    finally:
        if driver.poll() is None:
            driver.kill()
        serve.stop()
    print("\nlifetimes  scrape ms  scrape bytes  files  disk bytes (size/allocated)  serve RSS KiB")
    for row in rows:
        size, allocated = row["disk"]
        print(f"{row['lifetimes']:>9}  {row['scrape_s'] * 1000:>9.1f}  {row['scrape_bytes']:>12}  "
              f"{len(row['files']):>5}  {size:>10}/{allocated:<10}  {row['rss_kib']:>13}")
    for row in rows:
        # After each batch every lifetime has ended: only the archives (and serve's lock) remain.
        assert row["files"] == [*ARCHIVES, "serve.lock"], row["files"]
        assert row["samples"] == rows[0]["samples"]  # the same series, however many lifetimes
        assert row["scrape_bytes"] <= rows[0]["scrape_bytes"] * 1.05  # (their values have more digits)
    early, last = rows[1], rows[-1]
    assert last["disk"][0] <= early["disk"][0] and last["disk"][1] <= early["disk"][1] * 1.1 + 65536
    assert last["rss_kib"] - early["rss_kib"] <= 8 * 1024, (early["rss_kib"], last["rss_kib"])
    # Every lifetime's figures, once: two tools/call responses each (the killed ones' too, measured before the
    # kill); a session end for each that closed (the killed ones' ends are recorded before the kill as well).
    scrape = last["scrape"]
    assert value(scrape, "mcp_token_responses_total", side="proxy", method="tools/call") == 2 * LIFETIMES
    assert value(scrape, "mcp_token_proxy_messages_total", kind="response") == 3 * LIFETIMES
    for i, name in enumerate(NAMES):
        assert value(scrape, "mcp_token_session_utilization_ratio_count", side="proxy", server=name) == \
            len(range(i, LIFETIMES, len(NAMES)))
    assert value(scrape, "mcp_token_sessions") == 0
