"""One scrape target per host: the figures of every stdio proxy of a user, in one directory.

Each measuring process writes prometheus-client's multiprocess files (``PROMETHEUS_MULTIPROC_DIR`` semantics)
into a per-user state directory (``prometheus.state_dir``, default ``$XDG_STATE_HOME/mcp-token-otel/metrics``
or ``~/.local/state/mcp-token-otel/metrics``; mode 0700, files 0600), under a name of its own
(``<pid>-<random>``, so a reused pid never continues a dead process's files). It holds an exclusive ``flock``
on ``<name>.lock`` for its lifetime: the kernel releases it when the process ends, even by SIGKILL, so a lock
that can be taken marks a process that is gone, whatever became of its pid.

``mcp-token-otel serve`` (:mod:`.host_collector`) merges the files on each scrape. The files of processes that
are gone are compacted into one archive file per type (``counter_archive.db``...): counters, histograms and
``sum`` gauges added up, ``livesum`` gauges kept at 0 (a process that is gone has no live sessions, and a
series seen once stays), other live gauges dropped, other gauges (``max``: tool definitions, rate budgets) kept
at the value of the last process that wrote them. A measuring
process compacts its own files when it ends, so the directory holds the live processes' files and the
archive, with or without ``serve`` running. Compaction and scrape rendering take one exclusive lock
(``.compact.lock``), so a scrape never sees a figure twice or not at all; a journal makes a compaction that
was interrupted (its process killed at any point) finish on the next one, never half done. Nothing is
fsynced: like the live files, which prometheus-client never syncs, an operating-system crash may lose the
last figures; a process crash loses nothing.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: no flock, no host store
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

#: The name under which a writing process's files live: its pid and a random part.
IDENT = re.compile(r"^[0-9]+-[0-9a-f]{8}$")
ARCHIVE = "archive"
COMPACT_LOCK = ".compact.lock"
SERVE_LOCK = "serve.lock"
JOURNAL = ".journal"
#: Gauge modes whose values belong to live processes only (prometheus-client's ``live*`` modes).
LIVE_MODES = frozenset({"liveall", "livemin", "livemax", "livesum", "livemostrecent"})
#: Gauge modes that add up across processes, dead ones included.
SUMMED_MODES = frozenset({"sum"})


class StoreError(Exception):
    """The state directory cannot be used (one line, naming the directory and why)."""


def default_state_dir(env: Mapping[str, str] | None = None) -> str:
    """``$XDG_STATE_HOME/mcp-token-otel/metrics``, else ``~/.local/state/mcp-token-otel/metrics``."""
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME", "")
    if not os.path.isabs(base):  # the XDG spec: a relative value is invalid and ignored
        base = os.path.join(env.get("HOME") or os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "mcp-token-otel", "metrics")


def state_dir(configured: str, env: Mapping[str, str] | None = None) -> str:
    """The directory in use: ``prometheus.state_dir`` when set, else the default (absolute either way)."""
    return os.path.abspath(os.path.expanduser(configured)) if configured else default_state_dir(env)


def prepare(path: str) -> str:
    """Create ``path`` (mode 0700) if needed and check that it is this user's alone; its absolute path."""
    if fcntl is None:
        raise StoreError("the host metrics store needs POSIX file locks (Linux, macOS)")
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise StoreError(f"cannot keep metrics in {path}: not a directory")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.stat(path)
        if info.st_uid != os.getuid():
            raise StoreError(f"cannot keep metrics in {path}: it belongs to another user (uid {info.st_uid})")
        if info.st_mode & 0o077:  # another user could read this user's figures: make it private
            os.chmod(path, 0o700)
        if not os.access(path, os.W_OK | os.X_OK):
            raise StoreError(f"cannot keep metrics in {path}: not writable")
    except OSError as exc:
        raise StoreError(f"cannot keep metrics in {path}: {exc.strerror or exc}") from None
    return path


def _try_lock(path: str, *, shared: bool = False, create: bool = True) -> int | None:
    """An fd holding a non-blocking flock on ``path`` (created 0600 if missing and ``create``), or None when
    another process holds it."""
    flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | (os.O_CREAT if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


# ------------------------------------------------------------------ the writing side (a measuring process)


@dataclass
class Writer:
    """This process's share of the store: its name, the lock it holds while it lives, and its files."""

    path: str
    ident: str
    _lock_fd: int | None = field(default=None, repr=False)

    @classmethod
    def attach(cls, path: str, name: str = "") -> Writer:
        """Make this process write its prometheus-client values into ``path``: call before the first metric
        is made. Sets ``PROMETHEUS_MULTIPROC_DIR`` (for this process and the ones it starts from now on) and
        a umask of 077 (the files are this user's alone)."""
        path = prepare(path)
        os.umask(0o077)
        ident = f"{os.getpid()}-{secrets.token_hex(4)}"
        # Published locked: the lock file appears under its name only once locked, so a compactor that finds
        # it unlocked knows its writer is gone.
        temp = os.path.join(path, f".{ident}.lock.tmp")
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, json.dumps({"pid": os.getpid(), "started": time.time(), "name": name}).encode())
            os.rename(temp, os.path.join(path, f"{ident}.lock"))
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
        from prometheus_client import values

        values.ValueClass = values.MultiProcessValue(lambda: ident)
        return cls(path, ident, fd)

    def close(self, timeout: float = 5.0) -> None:
        """Move this process's figures into the archive (its last act: later values would be lost)."""
        if self._lock_fd is None:
            return
        try:
            Store(self.path).compact(also=(self.ident,), timeout=timeout)
        except Exception:  # serve, or the next proxy to end, compacts them instead
            logger.debug("mcp_token_otel: compaction at exit failed", exc_info=True)
        finally:  # the files stay mapped until exit: a straggling write lands in a deleted file, harmlessly
            os.close(self._lock_fd)
            self._lock_fd = None


def serve_running(path: str) -> dict[str, Any] | None:
    """What the ``serve`` serving ``path`` wrote of itself (pid, url) if one runs, else None."""
    lock = os.path.join(path, SERVE_LOCK)
    if fcntl is None or not os.path.exists(lock):
        return None
    try:
        fd = _try_lock(lock, shared=True)
    except OSError:
        return None
    if fd is not None:  # nobody holds it
        os.close(fd)
        return None
    try:
        with open(lock, encoding="utf-8") as f:
            info = json.loads(f.read() or "{}")
    except (OSError, ValueError):
        info = {}
    return info if isinstance(info, dict) else {}


# ------------------------------------------------------------------ compaction


def parse_name(name: str) -> tuple[str, str] | None:
    """(file prefix, writer name) of a prometheus-client file: ``gauge_max_123-ab12cd34.db`` ->
    (``gauge_max``, ``123-ab12cd34``); None for anything else (temporary files start with a dot)."""
    if not name.endswith(".db") or name.startswith("."):
        return None
    parts = name[:-3].split("_")
    if parts[0] == "gauge":
        return (f"gauge_{parts[1]}", parts[2]) if len(parts) == 3 else None
    return (parts[0], parts[1]) if len(parts) == 2 else None


def merge_kind(prefix: str) -> str:
    """How a dead process's file of this prefix is compacted: ``sum``, ``latest``, ``zero`` (``livesum``: its
    series stay, at 0, as a single process keeps a series it has seen) or ``drop`` (other live modes)."""
    if not prefix.startswith("gauge_"):
        return "sum"
    mode = prefix[len("gauge_"):]
    if mode == "livesum":
        return "zero"
    return "drop" if mode in LIVE_MODES else "sum" if mode in SUMMED_MODES else "latest"


def readable(path: str) -> bool:
    """Whether prometheus-client can read the file (one killed while creating it may be empty)."""
    from prometheus_client.mmap_dict import MmapedDict

    try:
        for _ in MmapedDict.read_all_values_from_file(path):
            pass
    except Exception:
        return False
    return True


@dataclass
class Compaction:
    """What one compaction did (for logs and tests)."""

    merged: list[str] = field(default_factory=list)  # writers whose files went into the archive
    unreadable: list[str] = field(default_factory=list)  # files that could not be read (their values lost)


class Store:
    """The directory: its files, its lock, and compaction."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _p(self, name: str) -> str:
        return os.path.join(self.path, name)

    @contextlib.contextmanager
    def locked(self, timeout: float) -> Iterator[bool]:
        """Hold the exclusive compaction lock (waiting up to ``timeout``); yields whether it was taken."""
        deadline = time.monotonic() + timeout
        fd = _try_lock(self._p(COMPACT_LOCK))
        while fd is None and time.monotonic() < deadline:
            time.sleep(0.005)
            fd = _try_lock(self._p(COMPACT_LOCK))
        try:
            yield fd is not None
        finally:
            if fd is not None:
                os.close(fd)

    def db_files(self) -> list[tuple[str, str, str]]:
        """(file name, prefix, writer name) of every prometheus-client file, sorted by name."""
        out = []
        with os.scandir(self.path) as entries:
            for entry in entries:
                parsed = parse_name(entry.name)
                if parsed is not None:
                    out.append((entry.name, *parsed))
        return sorted(out)

    def compact(self, also: Iterable[str] = (), timeout: float = 5.0) -> Compaction:
        with self.locked(timeout) as ok:
            if not ok:
                logger.debug("mcp_token_otel: the metrics store is busy; compaction left for later")
                return Compaction()
            return self.compact_locked(also)

    def compact_locked(self, also: Iterable[str] = ()) -> Compaction:
        """Merge the files of writers that are gone (and of ``also``: this process, ending) into the archive.
        The caller holds :meth:`locked`."""
        self._recover()
        files = self.db_files()
        names = {ident for _, _, ident in files if IDENT.match(ident)}
        with os.scandir(self.path) as entries:
            names |= {e.name[:-5] for e in entries if e.name.endswith(".lock") and IDENT.match(e.name[:-5])}
        also = set(also)
        held: list[int] = []
        gone: dict[str, float] = {}  # writer -> when it started (the later one's gauges win)
        try:
            for ident in sorted(names):
                started = self._started(ident)
                if ident in also:
                    gone[ident] = started
                    continue
                try:
                    fd = _try_lock(self._p(f"{ident}.lock"), create=False)
                except FileNotFoundError:
                    fd = -1  # files without a lock: their writer is gone (its lock is published before them)
                except OSError:
                    continue
                if fd is None:
                    continue  # alive
                if fd >= 0:
                    held.append(fd)
                gone[ident] = started
            if not gone:
                return Compaction()
            return self._merge_gone(files, gone)
        finally:
            for fd in held:
                os.close(fd)

    def _started(self, ident: str) -> float:
        try:
            with open(self._p(f"{ident}.lock"), encoding="utf-8") as f:
                return float(json.loads(f.read() or "{}").get("started", 0.0))
        except (OSError, ValueError, TypeError, AttributeError):
            return 0.0

    def _merge_gone(self, files: list[tuple[str, str, str]], gone: dict[str, float]) -> Compaction:
        result = Compaction(merged=sorted(gone))
        rank = {ident: i for i, ident in enumerate(sorted(gone, key=lambda w: (gone[w], w)))}  # oldest first
        by_prefix: dict[str, list[str]] = {}
        for name, prefix, ident in files:
            if ident in gone:
                by_prefix.setdefault(prefix, []).append(name)
        renames: list[tuple[str, str]] = []
        for prefix, names in sorted(by_prefix.items()):
            kind = merge_kind(prefix)
            if kind == "drop":
                continue
            names.sort(key=lambda n: rank[n[len(prefix) + 1:-3]])  # a later writer's gauge values win
            archive = f"{prefix}_{ARCHIVE}.db"
            sources = ([archive] if os.path.exists(self._p(archive)) else []) + names
            good = []
            for source in sources:
                if readable(self._p(source)):
                    good.append(self._p(source))
                else:
                    result.unreadable.append(source)
            temp = f".{archive}.tmp"
            if self._write_archive(self._p(temp), good, kind):
                renames.append((temp, archive))
        deletions = [name for name, _, ident in files if ident in gone]
        deletions += [f"{ident}.lock" for ident in sorted(gone)]
        if result.unreadable:
            logger.warning("mcp_token_otel: unreadable metrics files dropped: %s", ", ".join(result.unreadable))
        journal = {"rename": renames, "delete": deletions}
        with open(self._p(JOURNAL + ".tmp"), "w", encoding="utf-8") as f:
            json.dump(journal, f)
        os.replace(self._p(JOURNAL + ".tmp"), self._p(JOURNAL))  # from here on, the compaction is decided
        self._apply(journal)
        return result

    def _write_archive(self, temp: str, sources: list[str], kind: str) -> bool:
        """The merged values of ``sources`` into the new file ``temp``; False when there was nothing."""
        from prometheus_client.mmap_dict import MmapedDict, mmap_key
        from prometheus_client.multiprocess import MultiProcessCollector

        rows: dict[str, tuple[float, float]] = {}
        if kind in ("latest", "zero"):
            for source in sources:  # in order: a later writer's value replaces an earlier one's
                for key, value, timestamp, _ in MmapedDict.read_all_values_from_file(source):
                    rows[key] = (value, timestamp) if kind == "latest" else (0.0, 0.0)
        else:
            for metric in MultiProcessCollector.merge(sources, accumulate=False):
                for sample in metric.samples:
                    labels = sorted(sample.labels.items())
                    key = mmap_key(metric.name, sample.name, [k for k, _ in labels], [v for _, v in labels],
                                   metric.documentation)
                    rows[key] = (sample.value, 0.0)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        if not rows:
            return False
        out = MmapedDict(temp)
        try:
            for key, (value, timestamp) in rows.items():
                out.write_value(key, value, timestamp)
        finally:
            out.close()
        return True

    def _apply(self, journal: dict[str, Any]) -> None:
        for temp, final in journal.get("rename", []):
            if os.path.exists(self._p(temp)):
                os.replace(self._p(temp), self._p(final))
        for name in journal.get("delete", []):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._p(name))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._p(JOURNAL))

    def _recover(self) -> None:
        """Finish a compaction that was decided (its journal written) but interrupted; drop unfinished ones'
        temporary files."""
        try:
            with open(self._p(JOURNAL), encoding="utf-8") as f:
                journal = json.load(f)
        except FileNotFoundError:
            journal = None
        except (OSError, ValueError):
            journal = {}
        if journal is not None:
            self._apply(journal)
        now = time.time()
        with os.scandir(self.path) as entries:
            for entry in entries:
                if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                    # A writer's lock being published is young and locked; anything else is left over.
                    try:
                        if entry.name.endswith(".lock.tmp") and now - entry.stat().st_mtime < 60:
                            continue
                        fd = _try_lock(entry.path, create=False) if entry.name.endswith(".lock.tmp") else -1
                    except FileNotFoundError:  # published or removed meanwhile
                        continue
                    if fd is None:
                        continue
                    if fd >= 0:
                        os.close(fd)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)


def usable(path: str) -> str | None:
    """Why the store at ``path`` cannot be used from this process, or None."""
    try:
        prepare(path)
    except StoreError as exc:
        return str(exc)
    return None

