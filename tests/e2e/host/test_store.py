"""The host store: writer processes (real, each its own pid and lock) write prometheus-client files into one
directory; the collector ``serve`` renders merges them, and compaction moves the figures of writers that are
gone into one archive per type without a figure counted twice, lost, or going backwards."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import stat
import struct
import tempfile
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.samples import Sample

from mcp_token_otel.emitters import host_store
from mcp_token_otel.emitters.host_collector import HostCollector
from mcp_token_otel.emitters.host_store import Store, StoreError, prepare

from .conftest import Scrape, Writer, files, has, value


def collect(path: Path, collector: HostCollector | None = None) -> Scrape:
    out: Scrape = {}
    for metric in (collector or HostCollector(str(path))).collect():
        for s in metric.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_figures_of_ended_writers_stay_and_their_files_go(store: Path) -> None:
    a, b = Writer(store, "s"), Writer(store, "s")
    try:
        a.send("count 3", "observe 0.05", "observe 0.5", "max 10", "live 2")
        b.send("count 4", "max 7", "live 1")
        both = collect(store)
        assert value(both, "hs_calls_total", server="s") == 7
        assert value(both, "hs_seconds_count") == 2 and value(both, "hs_seconds_bucket", le="0.1") == 1
        assert value(both, "hs_definitions") == 10 and value(both, "hs_live") == 3  # max; summed over the live
        assert sum(a.ident in name for name in files(store)) == 5  # four types of files and a lock

        a.close()  # as a proxy ends: its own files go into the archive
        after_a = collect(store)
        assert value(after_a, "hs_calls_total") == 7 and value(after_a, "hs_seconds_count") == 2
        assert value(after_a, "hs_live") == 1  # an ended writer has no live sessions
        assert value(after_a, "hs_definitions") == 7  # the running writer's own value, not an ended one's
        assert not any(a.ident in name for name in files(store))

        b.exit()  # ended without compacting (killed): the next scrape finds its lock free and compacts it
        after_b = collect(store)
        assert value(after_b, "hs_calls_total") == 7 and value(after_b, "hs_seconds_count") == 2
        assert has(after_b, "hs_live") and value(after_b, "hs_live") == 0  # the series stays, at 0
        assert value(after_b, "hs_definitions") == 7  # the last writer's value
        assert files(store) == ["counter_archive.db", "gauge_livesum_archive.db", "gauge_max_archive.db",
                                "histogram_archive.db"]
    finally:
        a.kill()
        b.kill()


def test_a_running_writer_is_never_compacted(store: Path) -> None:
    w = Writer(store)
    try:
        w.send("count 5", "live 1")
        collector = HostCollector(str(store))
        for _ in range(3):
            scrape = collect(store, collector)
            assert value(scrape, "hs_calls_total") == 5 and value(scrape, "hs_live") == 1
        assert collector.last_compaction.merged == []
        w.send("count 1")
        assert value(collect(store, collector), "hs_calls_total") == 6  # still its own file, still written
    finally:
        w.kill()


def test_counters_never_go_backwards_across_exits_and_compactions(store: Path) -> None:
    collector = HostCollector(str(store))
    history: list[Scrape] = []
    writers = [Writer(store) for _ in range(4)]
    try:
        for step, w in enumerate(writers):
            w.send(*(f"count {0.1 * (k + 1) + step / 3}" for k in range(7)),
                   *(f"observe {0.01 * k + 0.3}" for k in range(5)))
            history.append(collect(store, collector))
        for i, w in enumerate(writers):
            (w.close if i % 2 else w.exit)()
            history.append(collect(store, collector))
    finally:
        for w in writers:
            w.kill()
    for before, after in itertools.pairwise(history):
        for key, old in before.items():
            if key[0].startswith(("hs_calls", "hs_seconds")):
                assert after[key] >= old, key
    expected = sum(0.1 * (k + 1) + step / 3 for step in range(4) for k in range(7))
    assert value(history[-1], "hs_calls_total") == pytest.approx(expected, rel=1e-12)
    assert value(history[-1], "hs_seconds_count") == 20


def test_a_sum_rounded_in_another_order_is_served_at_its_highest() -> None:
    """The archive's sum plus the live files' can differ from the sum of every file in the last binary digit:
    served as the higher value (no false counter reset); a real drop (a store wiped) is served as it is."""
    collector = HostCollector("/nonexistent")

    def served(v: float) -> float:
        metric = Metric("hs_seconds", "h", "histogram")
        metric.samples = [Sample("hs_seconds_sum", {"server": "s"}, v)]
        return collector._monotonic(metric).samples[0].value

    high = 0.1 + 0.2 + 0.3  # 0.6000000000000001
    assert served(high) == high
    assert served(0.1 + (0.2 + 0.3)) == high  # 0.6: one digit lower, rounding
    assert served(0.7) == 0.7
    assert served(0.01) == 0.01  # a reset


def _crash(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    original = getattr(Store, method)
    calls = {"n": 0}

    def crashing(self: Store, *args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            if method == "_apply":  # half applied: the archive renamed, the dead files still there
                journal = args[0]
                for temp, final in journal["rename"]:
                    os.replace(os.path.join(self.path, temp), os.path.join(self.path, final))
            raise OSError("crash")
        return original(self, *args)

    monkeypatch.setattr(Store, method, crashing)


@pytest.mark.parametrize("where", ["_write_archive", "_apply"])
def test_an_interrupted_compaction_never_counts_twice_or_loses(store: Path, monkeypatch: pytest.MonkeyPatch,
                                                               where: str) -> None:
    first, second = Writer(store), Writer(store)
    first.send("count 2", "observe 0.5")
    first.close()
    second.send("count 3", "observe 0.05")
    second.exit()
    _crash(monkeypatch, where)
    with pytest.raises(OSError, match="crash"):
        Store(str(store)).compact()
    scrape = collect(store)  # the next compaction finishes (journal written) or redoes (not) the interrupted one
    assert value(scrape, "hs_calls_total") == 5 and value(scrape, "hs_seconds_count") == 2
    assert not [n for n in os.listdir(store) if n.endswith(".tmp") or n == ".journal"]
    assert not any(second.ident in name for name in files(store))


def test_a_damaged_file_does_not_stop_scrapes(store: Path) -> None:
    w = Writer(store)
    w.send("count 4")
    w.close()
    prepare(str(store))
    (store / "counter_1-deadbeef.db").write_bytes(b"")  # a writer killed while creating its file
    # A header whose one entry claims more bytes than the file says it uses.
    (store / "counter_2-deadbeef.db").write_bytes(struct.pack("<ii", 40, 0) + struct.pack("<i", 1000) + b"x" * 28)
    collector = HostCollector(str(store))
    scrape = collect(store, collector)
    assert value(scrape, "hs_calls_total") == 4
    assert sorted(collector.last_compaction.unreadable) == ["counter_1-deadbeef.db", "counter_2-deadbeef.db"]
    assert files(store) == ["counter_archive.db"]


def test_liveness_is_the_lock_not_the_pid(store: Path) -> None:
    """Files named after a pid that runs now (this test's own), whose lock nobody holds, belong to a writer
    that is gone: a reused pid does not keep them alive."""
    prepare(str(store))
    ident = f"{os.getpid()}-0badc0de"
    (store / f"{ident}.lock").write_text(json.dumps({"pid": os.getpid(), "started": 1}))
    data = MmapedDict(str(store / f"counter_{ident}.db"))
    data.write_value(mmap_key("hs_calls", "hs_calls_total", ["server"], ["s"], "Calls."), 9.0, 0.0)
    data.close()
    assert value(collect(store), "hs_calls_total") == 9
    assert files(store) == ["counter_archive.db"]


def test_files_of_other_programs_are_merged_but_never_compacted(store: Path) -> None:
    """A file whose writer name is not one of ours (a plain pid, as another program in multiprocess mode
    writes) is merged into scrapes but left alone: its liveness cannot be known."""
    prepare(str(store))
    data = MmapedDict(str(store / "counter_4242.db"))
    data.write_value(mmap_key("hs_calls", "hs_calls_total", ["server"], ["x"], "Calls."), 1.0, 0.0)
    data.close()
    for _ in range(2):
        assert value(collect(store), "hs_calls_total", server="x") == 1
    assert files(store) == ["counter_4242.db"]


def test_the_store_is_private(tmp_path: Path) -> None:
    path = tmp_path / "a" / "metrics"
    prepare(str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    w = Writer(path)
    try:
        w.send("count 1", "observe 1", "max 1", "live 1")
        modes = {name: stat.S_IMODE((path / name).stat().st_mode) for name in os.listdir(path)}
        assert modes and set(modes.values()) == {0o600}, modes
    finally:
        w.kill()
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    prepare(str(loose))
    assert stat.S_IMODE(loose.stat().st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")
def test_another_user_can_neither_read_nor_use_this_users_store() -> None:
    """A real second uid (nobody, 65534), in a forked child: it cannot list or read this user's store, and its
    own proxy refuses to write there (it writes to its own store, under its own home)."""
    base = Path(tempfile.mkdtemp(prefix="mcp-token-otel-uid-", dir="/tmp"))
    try:
        _second_user(base)
    finally:
        shutil.rmtree(base)


def _second_user(base: Path) -> None:
    os.chmod(base, 0o755)  # the parents are open to the other user: the store itself is what keeps it out
    path = base / "metrics"
    w = Writer(path)
    w.send("count 1")
    w.close()
    archive = path / "counter_archive.db"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become nobody, try, report
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            report = []
            for what, attempt in (("list", lambda: os.listdir(path)), ("read", lambda: archive.read_bytes())):
                try:
                    attempt()
                    report.append(f"{what}:allowed")
                except PermissionError:
                    report.append(f"{what}:denied")
            try:
                prepare(str(path))
                report.append("use:allowed")
            except StoreError as exc:
                report.append(f"use:refused:{exc}")
            os.write(write, "\n".join(report).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        report = pipe.read().splitlines()
    os.waitpid(pid, 0)
    assert report[:2] == ["list:denied", "read:denied"], report
    assert report[2].startswith("use:refused:") and str(path) in report[2] and "another user" in report[2], report


def test_a_store_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    path = tmp_path / "theirs"
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)
    with pytest.raises(StoreError, match="belongs to another user"):
        prepare(str(path))


def test_the_default_place_follows_xdg() -> None:
    assert host_store.default_state_dir({"XDG_STATE_HOME": "/x/state", "HOME": "/h"}) == \
        "/x/state/mcp-token-otel/metrics"
    assert host_store.default_state_dir({"HOME": "/h"}) == "/h/.local/state/mcp-token-otel/metrics"
    assert host_store.default_state_dir({"XDG_STATE_HOME": "relative", "HOME": "/h"}) == \
        "/h/.local/state/mcp-token-otel/metrics"
