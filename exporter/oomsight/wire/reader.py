"""The spool's reader: every process's snapshot, every OOM event and every profile, each
file parsed again only when its identity (inode, size, ``mtime_ns``, ``ctime_ns``) changed.

Every file is untrusted (``oomsight.wire.decoding``): an unusable one is a counted skip, and
nothing is deleted but, when asked, the old temp files of writers killed mid-write. What a spool
can make a reader do is bounded by :class:`Budget` (issue 26; docs/scale.md): entries listed per
folder, documents read per folder, devices per document; beyond it a counted refusal. Skips are
logged a count per reason, one line per :data:`LOG_INTERVAL_SECONDS` (:class:`SkipLog`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import heapq
import json
import logging
import os
import re
import stat as stat_mod
import threading
import time
from typing import Any, NamedTuple, Union

from oomsight.wire import decoding
from oomsight.wire.layout import EVENTS, MAX_FILE_BYTES, PROFILES, SNAPSHOTS, SUBDIRS
from oomsight.wire.layout import SKIP_REASONS as FILE_REASONS
from oomsight.wire.schema import (
    INT_MAX,
    INT_MIN,
    KIND_OOM_EVENT,
    KIND_PROFILE,
    KIND_SNAPSHOT,
    SCHEMA_VERSION,
    OomEvent,
    Profile,
    SchemaError,
    Snapshot,
    validate,
)

logger = logging.getLogger(__name__)

Document = Union[Snapshot, OomEvent, Profile]

TOO_MANY_FILES, TOO_MANY_DEVICES, TOO_MANY_SERIES = "too_many_files", "too_many_devices", "too_many_series"
BUDGET_REASONS = (TOO_MANY_FILES, TOO_MANY_DEVICES, TOO_MANY_SERIES)
"""Refusals at the :class:`Budget`: a file past a folder's listing or document budget, a snapshot listing
more devices than a document may, a process whose series would pass the scrape's series or bytes budget."""
SKIP_REASONS = (*FILE_REASONS, *BUDGET_REASONS)
LOG_INTERVAL_SECONDS = 60.0
"""Skipped files are logged at most once per this interval: a count per reason and the last file's name."""


@dataclasses.dataclass(frozen=True)
class Budget:
    """What one spool may make its reader do (issues 26 and 36): the one table of the sidecar's memory
    budget. A pod runs 1 to 16 ranks of at most 8 GPUs each; every bound is several times that, and the
    worst spool within all of them together stays under 85 % of the chart's sidecar memory limit
    (``helm/oomsight/values.yaml``, ``sidecar.resources.limits.memory``), measured on the real sidecar at
    each bound's corner by ``tests/test_budget.py`` (figures: docs/kubernetes.md, "Sidecar memory")."""

    entries_per_folder: int = 4096
    """Names the writer makes (``*.json``, no dot files) listed per spool folder, the newest first when there
    are more; past it the rest are not listed (100,000 empty files cost 5 s and 50 MB when every one was
    listed, read and logged). Other names are not listed at all and cost nothing but the directory scan."""
    entries_scanned_per_folder: int = 65_536
    """Directory entries looked at per folder, junk included; past it the folder is cut (counted once)."""
    ranks_per_spool: int = 64
    """Snapshots read, the newest first (a live rank publishes every second): 4x a pod's largest."""
    rank_memory_bytes: int = 256 * 1024
    """Memory every rank's parsed snapshot may hold, as :func:`memory_cost` bounds it, whatever the other ranks'
    snapshots hold (issue 44): snapshots are parsed the cheapest first, so each of ``n`` ranks gets at least
    ``snapshot_memory_bytes / n``, which is this at the most ranks. The shipped tape's snapshot with all its step
    rows (a writer before wire 1.5) costs 206 KB, a 1.5 writer's 24 KB a device."""
    events_per_spool: int = 256
    """OOM event files read, the newest first (the hook writes at most OOMSIGHT_MAX_OOM_EVENTS, 100, per process;
    an OOM usually ends its process). Events of the tape's size reach :attr:`event_memory_bytes` first."""
    profiles_per_spool: int = 256
    """Profile files read, the newest first."""
    snapshot_memory_bytes: int = ranks_per_spool * rank_memory_bytes
    """Memory the parsed snapshots may hold together, as :func:`memory_cost` bounds it from their bytes before
    they are parsed: :attr:`rank_memory_bytes` for each of the most ranks (16 MiB; 12 MiB before issue 44, where
    64 ranks of the tape's snapshot as recorded left 3 out). A 1.5 writer's snapshot (3.7 KB a device, costed
    24 KB, holds 12 KB): 64 ranks of 10 devices fit."""
    event_memory_bytes: int = 8 * 1024 * 1024
    """Memory the parsed OOM events may hold together, costed the same way (the tape's 24 KB event is costed
    212 KB and holds 78 KB: the newest 39 such events are read; 1,024 of them held 100 MB before). The Event
    poster reads the events too, so a sidecar in a pod holds up to twice this."""
    profile_memory_bytes: int = 4 * 1024 * 1024
    """Memory the parsed profiles may hold together, costed the same way."""
    devices_per_document: int = 16
    """Devices one snapshot may list (a process sees at most 8 GPUs of a node today); a snapshot with more
    is refused whole (one valid 1 MiB snapshot of 2,893 devices gave 5.4 MB of /metrics)."""
    series_per_scrape: int = 20_000
    """Series of one scrape (16 ranks of 8 GPUs give about 7,000); a process that would pass it is left out."""
    metrics_bytes: int = 4 * 1024 * 1024
    """Bytes of /metrics, estimated from the label values before any text is made (16 ranks of 8 GPUs: about 1 MB)."""

    def documents(self, folder: str) -> int:
        return {SNAPSHOTS: self.ranks_per_spool, EVENTS: self.events_per_spool}.get(folder, self.profiles_per_spool)

    def memory(self, folder: str) -> int:
        """Memory the parsed documents of ``folder`` may hold together (:func:`memory_cost`)."""
        shares = {SNAPSHOTS: self.snapshot_memory_bytes, EVENTS: self.event_memory_bytes}
        return shares.get(folder, self.profile_memory_bytes)


def memory_cost(raw: bytes) -> int:
    """An upper bound of the memory ``json.loads(raw)`` holds, from C passes over the bytes before any
    parsing: 4 bytes a byte (a string with one astral character is 4 bytes a character), 256 a document, 64 a value
    (a separator or an opening bracket: a 2-character string is 59 bytes with its pointer) and 200 an
    object (a small dict is 184). Shapes measured (CPython 3.11, ``tracemalloc``): the tape's event
    holds 0.48 of its cost, a snapshot 0.49, 1 MiB of ``[{}, ...]`` 0.54, of ``[{"a": 1}, ...]`` 0.9, of
    short strings 0.8, of one long string with an emoji 1.0 (``tests/test_budget.py`` checks each)."""
    values = raw.count(b",") + raw.count(b"[") + raw.count(b"{")
    return 256 + 4 * len(raw) + 64 * values + 136 * raw.count(b"{")


class SkipLog:
    """Skipped files, logged a count per reason at most once per ``interval_seconds``: a spool of 100,000
    bad files gives one line a minute, not one per file. Names are written with ``repr``: a file name
    holding a newline cannot split a log line."""

    def __init__(self, what: str, interval_seconds: float = LOG_INTERVAL_SECONDS, clock: Any = time.monotonic) -> None:
        self.what = what
        self.interval_seconds = interval_seconds
        self.clock = clock
        self.counts: dict[str, int] = {}
        self.last = ""
        self._logged_at = -float("inf")

    def add(self, reason: str, name: str, detail: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        self.last = f"{name!r} ({reason}: {detail})"[:500]
        self.flush()

    def flush(self) -> None:
        """One line for what was added since the last, if the interval has passed since that one."""
        now = self.clock()
        if not self.counts or now - self._logged_at < self.interval_seconds:
            return
        counts = ", ".join(f"{n} {reason}" for reason, n in sorted(self.counts.items()))
        logger.warning("oomsight: %s: %s; last: %s; they are left in place", self.what, counts, self.last)
        self.counts, self._logged_at = {}, now


@dataclasses.dataclass
class SpoolState:
    """What one read of the spool found."""

    snapshots: list[Snapshot]
    events: list[OomEvent]
    skipped_total: dict[str, int]
    """Cumulative count of distinct unusable files (a file counts again only if it changes)."""
    readable: bool
    error: str | None = None
    profiles: list[Profile] = dataclasses.field(default_factory=list)
    root: str = ""
    unreadable_folders: list[str] = dataclasses.field(default_factory=list)
    """Folders that could not be listed this time; their last good documents are given instead."""
    snapshot_keys: list[FileKey | None] = dataclasses.field(default_factory=list)
    """The file each of ``snapshots`` was parsed from, in the same order (empty where not known): what is
    built from one snapshot document alone is kept by it (``oomsight.metrics.collector.Kept``)."""
    hidden_snapshots: list[Claim] = dataclasses.field(default_factory=list)
    """The (rank, local rank) each snapshot file refused at the budget now names (:func:`claim`, read off the
    file's first :data:`CLAIM_HEAD_BYTES` where it was not parsed; ("", "") where it does not say): a rank left
    out is never silent (issue 44)."""
    unlisted_snapshots: int = 0
    """Snapshot names past the folder's listing budget (``Budget.entries_per_folder``), not listed at all: counted,
    each as a rank that is not named (issue 49; a folder cut at ``entries_scanned_per_folder`` holds more)."""


Claim = tuple[str, str]
"""(rank, local rank) as label values."""
Identity = tuple[int, int, int, int, int]
"""(device, inode, size, ``mtime_ns``, ``ctime_ns``) of a file (:func:`identity`)."""
FileKey = tuple[str, Identity]
"""A file's path and identity: the reader's key of what it parsed (parsed again when the identity changes)."""


class _Seen(NamedTuple):
    """A file as last read: its identity and what it gave."""

    identity: Identity
    """(device, inode, size, ``mtime_ns``, ``ctime_ns``): the file is parsed again only when one of these changed."""
    doc: Document | None
    reason: str | None
    cost: int
    """What its parsed document holds at most (:func:`memory_cost`); 0 when it was not read."""
    claim: Claim = ("", "")
    """The rank it names, for a file refused at the memory budget (:func:`claim`)."""


TEMP_MAX_AGE_SECONDS = 600.0
"""A writer's dot-temp file this old belongs to a writer that was killed mid-write."""
WRITER_NAME = re.compile(r"[0-9]+-[0-9a-z]+(\.oom-[0-9]+|\.profile-[0-9A-Za-z-]+)?\.json")
"""The names the hook gives its documents (``<pid>-<hex>.json``, ``.oom-<seq>.json``, ``.profile-<id>.json``):
listed before other ``*.json`` names when a folder holds more than its budget."""


def identity(st: os.stat_result) -> Identity:
    """What says a file changed: a writer's rename gives a new inode; a write in place moves the size or
    ``mtime_ns``, and ``ctime_ns`` too, which no writer can set back (``os.utime`` moves it again; issue 44).
    Limit: two writes of the same size in place within one tick of the filesystem's clock (a jiffy where
    timestamps are coarse), the first of them read between the two, leave the second unseen until the
    file changes again; the hook never writes in place."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


CLAIM_HEAD_BYTES = 8192
"""Bytes read from the start of a snapshot refused by the count of documents, for the rank it names: the hook
writes its flat ``process`` object third, within the first hundred bytes."""
_PROCESS = re.compile(rb'"process"\s*:\s*(\{[^{}]{0,4096}\})')
"""A document's flat ``process`` object, found in its bytes without parsing the rest."""


def claim(raw: bytes) -> Claim:
    """The (rank, local rank) the first ``process`` object of ``raw`` names, as label values, read off its bytes
    alone (a bounded search, one small parse): what a snapshot refused unparsed says it is; ("", "") where it
    says nothing readable. A hostile file can name any rank: the claim is only ever shown as a refusal's."""
    found = _PROCESS.search(raw)
    try:
        process = json.loads(found.group(1)) if found else {}
    except ValueError:
        return ("", "")
    ranks = [process.get(k) for k in ("rank", "local_rank")]
    if all(type(r) is int and INT_MIN <= r <= INT_MAX for r in ranks):
        return (str(ranks[0]), str(ranks[1]))
    return ("", "")


class SpoolReader:
    """Reads every process's snapshot and every OOM event, re-parsing only changed files.

    Every file is untrusted (``oomsight.wire.decoding``): an unusable one is a counted skip with
    one log line, and a file or folder that cannot be read for a passing reason (no file
    descriptors left) gives its last good document. ``sweep_temp_after_seconds`` (the sidecar
    sets it) removes writers' temp files older than that; by default nothing is deleted. Parsed
    documents are kept by file identity (:func:`identity`), as ``prometheus_client.multiprocess`` keeps
    what it parsed: an unchanged file costs a ``stat``; a file that goes takes its entry with it.
    ``cache=False`` parses every file at every read (the behaviour before issue 25, for benchmarks).
    """

    def __init__(
        self,
        root: str,
        max_file_bytes: int = MAX_FILE_BYTES,
        sweep_temp_after_seconds: float | None = None,
        budget: Budget = Budget(),
        cache: bool = True,
        folders: tuple[str, ...] = (SNAPSHOTS, EVENTS, PROFILES),
    ) -> None:
        self.root = root
        self.folders = folders
        """The folders read (the sidecar's Event poster reads ``events`` alone)."""
        self.max_file_bytes = max_file_bytes
        self.sweep_temp_after_seconds = sweep_temp_after_seconds
        self.budget = budget
        self.cache = cache
        self.log = SkipLog("skipped spool files")
        self._refused: set[str] = set()
        """Files refused at the budget now (each counted once while it is)."""
        self._cut: set[str] = set()
        """Folders whose listing stopped at the budget now."""
        self._unlisted: dict[str, int] = {}
        """Folder -> the writer's names in it past the listing budget now."""
        self._heads: dict[str, tuple[Identity, Claim]] = {}
        """Snapshots refused by the count of documents: the rank each names, read off its head once per identity."""
        self._seen: dict[str, _Seen] = {}
        self._skipped = dict.fromkeys(SKIP_REASONS, 0)
        self._bad_dirs: set[str] = set()
        self._transient: set[str] = set()
        self._swept_at = 0.0
        self._lock = threading.Lock()
        self.parsed = 0
        """Files opened and parsed so far; an unchanged file is not parsed again."""

    def read(self) -> SpoolState:
        with self._lock:
            if not os.path.isdir(self.root):
                return SpoolState([], [], dict(self._skipped), False, f"{self.root} is not a directory")
            out: dict[str, list[tuple[Any, FileKey | None]]] = {
                KIND_SNAPSHOT: [],
                KIND_OOM_EVENT: [],
                KIND_PROFILE: [],
            }
            present: set[str] = set()
            unreadable: list[str] = []
            refused: set[str] = set()
            for sub, kind in ((SNAPSHOTS, KIND_SNAPSHOT), (EVENTS, KIND_OOM_EVENT), (PROFILES, KIND_PROFILE)):
                if sub not in self.folders:
                    continue
                folder = os.path.join(self.root, sub)
                paths = self._files(folder)
                if paths is None:  # cannot list it now: keep what it held
                    unreadable.append(sub)
                    paths = sorted(p for p in self._seen if os.path.dirname(p) == folder)
                present.update(paths)
                out[kind] = self._read_folder(paths, sub, kind, refused)
            for gone in set(self._seen) - present:
                del self._seen[gone]
            for gone in set(self._heads) - refused:
                del self._heads[gone]
            self._refused = refused
            snapshots = os.path.join(self.root, SNAPSHOTS)
            hidden = [self._claim(p) for p in sorted(refused) if os.path.dirname(p) == snapshots]
            self._sweep_all()
            self.log.flush()
            docs = {kind: [doc for doc, _ in found] for kind, found in out.items()}
            return SpoolState(
                docs[KIND_SNAPSHOT],
                docs[KIND_OOM_EVENT],
                dict(self._skipped),
                True,
                f"cannot list {', '.join(unreadable)}" if unreadable else None,
                docs[KIND_PROFILE],
                self.root,
                unreadable,
                [key for _, key in out[KIND_SNAPSHOT]],
                hidden,
                self._unlisted.get(snapshots, 0),
            )

    def _read_folder(
        self, paths: list[str], sub: str, kind: str, refused: set[str]
    ) -> list[tuple[Any, FileKey | None]]:
        """The documents of ``paths``, the hook's own names and then the newest first, while they fit the
        folder's budget of documents (:meth:`Budget.documents`) and of memory (:meth:`Budget.memory`); the
        rest refused, each counted once while it stays refused. In path order, each with the key of the file
        it was parsed from (:meth:`_key_of`)."""
        stats: dict[str, os.stat_result | OSError] = {}
        for path in paths:
            try:
                stats[path] = os.lstat(path)
            except FileNotFoundError:
                continue  # vanished between the listing and the stat: a rename in flight
            except OSError as exc:
                stats[path] = exc
        newest = sorted(stats, key=lambda p: (WRITER_NAME.fullmatch(os.path.basename(p)) is None, -_mtime(stats[p]), p))
        most, memory = self.budget.documents(sub), self.budget.memory(sub)
        for path in newest[most:]:
            self._refuse(path, refused, f"more than {most} documents in its folder (the newest are read)")
            if sub == SNAPSHOTS:
                self._head(path, stats[path])
        chosen = newest[:most]
        if sub == SNAPSHOTS:  # one rank each: the cheapest first, so no rank's size can hide another (issue 44)
            chosen.sort(key=lambda p: self._cost(p, stats[p]))
        found: dict[str, Any] = {}
        for path in chosen:
            st = stats[path]
            doc, cost = self._load(path, kind, st, memory) if isinstance(st, os.stat_result) else self._failed(path, st)
            if doc is None and cost > memory:
                self._refuse(path, refused, f"its document would hold {cost} bytes, over the {memory} left")
                continue
            memory -= cost
            if doc is not None:
                found[path] = doc
        return [(found[p], self._key_of(p, found[p])) for p in sorted(found)]

    def _key_of(self, path: str, doc: Any) -> FileKey | None:
        """The path and identity of the file ``doc`` was parsed from: the identity it is kept under, which a
        file that cannot be read now (its last good document given) has not replaced; None if not kept."""
        seen = self._seen.get(path)
        return (path, seen.identity) if seen is not None and seen.doc is doc else None

    def _cost(self, path: str, st: os.stat_result | OSError) -> int:
        """What the document at ``path`` would hold (:func:`memory_cost`): its last cost while its identity stands,
        else read off its bytes now (read again if it is parsed); 0 for a file that cannot be read."""
        if not isinstance(st, os.stat_result):
            return 0
        seen = self._seen.get(path)
        if self.cache and seen is not None and seen.identity == identity(st):
            return seen.cost
        if not stat_mod.S_ISREG(st.st_mode) or st.st_size > self.max_file_bytes:
            return 0
        try:
            return memory_cost(decoding.read_file(path, self.max_file_bytes)[0])
        except (OSError, decoding.Unusable):
            return 0

    def _claim(self, path: str) -> Claim:
        """The rank the file at ``path`` names: its document's, where it was parsed, else its claim (of its
        whole bytes, or of its head for a file refused by the count)."""
        seen = self._seen.get(path)
        if seen is not None and seen.doc is not None:
            p = seen.doc["process"]
            return (str(p["rank"]), str(p["local_rank"]))
        if seen is None and path in self._heads:
            return self._heads[path][1]
        return seen.claim if seen is not None else ("", "")

    def _head(self, path: str, st: os.stat_result | OSError) -> None:
        """Remember the rank a snapshot refused by the count names, read off its first :data:`CLAIM_HEAD_BYTES`
        once per identity (issue 49: 4,032 of 5,000 ranks were named only as ``rank=""``)."""
        if not isinstance(st, os.stat_result) or not stat_mod.S_ISREG(st.st_mode):
            return
        known = self._heads.get(path)
        if known is not None and known[0] == identity(st):
            return
        found: Claim = ("", "")
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
            try:
                found = claim(os.read(fd, CLAIM_HEAD_BYTES))
            finally:
                os.close(fd)
        self._heads[path] = (identity(st), found)

    def _read_claim(self, path: str) -> Claim:
        """The rank a file refused unparsed names (:func:`claim`): read once per identity, a hostile file's cost."""
        try:
            return claim(decoding.read_file(path, self.max_file_bytes)[0])
        except (OSError, decoding.Unusable):
            return ("", "")

    def _refuse(self, path: str, refused: set[str], detail: str) -> None:
        refused.add(path)
        if path not in self._refused:
            self._skip(path, TOO_MANY_FILES, detail)

    def _files(self, folder: str) -> list[str] | None:
        """The paths to read in ``folder``: the names the writer makes (``*.json``, no dot files), at most
        the budget's entries, the hook's own names and then the newest first when there are more; None if
        it cannot be listed now. A folder that is a symbolic link is not followed (a foreign folder, no files)."""
        self._unlisted[folder] = 0
        try:
            fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return []
        except OSError as exc:
            return self._bad_dir(folder, exc)
        try:
            names, scanned_all, self._unlisted[folder] = self._scan(fd)
        except OSError as exc:
            return self._bad_dir(folder, exc)
        finally:
            os.close(fd)
        self._bad_dirs.discard(folder)
        if scanned_all and len(names) <= self.budget.entries_per_folder:
            self._cut.discard(folder)
        elif folder not in self._cut:  # counted once while it stays cut
            self._cut.add(folder)
            self._skip(
                folder, TOO_MANY_FILES, f"more than {self.budget.entries_per_folder} entries: the rest are not listed"
            )
        return [os.path.join(folder, n) for n in sorted(names)]

    def _scan(self, fd: int) -> tuple[list[str], bool, int]:
        """The names of the ``*.json`` entries (no dot files: writes in flight) of the folder open as ``fd``,
        at most the budget's entries, the hook's own names and then the newest first when there are more;
        whether that was all of them (every entry looked at, none left out); and how many such names were
        left out (of the entries looked at)."""
        most, limit = self.budget.entries_per_folder, self.budget.entries_scanned_per_folder
        names: list[str] = []  # names alone: a DirEntry each held 22 MB at 40,000 entries (issue 49)
        scanned = 0
        with os.scandir(fd) as it:
            for entry in it:
                scanned += 1
                if scanned > limit:
                    break
                if entry.name.endswith(".json") and not entry.name.startswith("."):
                    names.append(entry.name)
        if len(names) <= most:
            return names, scanned <= limit, 0
        ranked = heapq.nsmallest(most, names, key=lambda n: (WRITER_NAME.fullmatch(n) is None, -_mtime_at(fd, n), n))
        return ranked, False, len(names) - most

    def _bad_dir(self, folder: str, exc: OSError) -> list[str] | None:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a symbolic link, or not a folder: never followed
            if folder not in self._bad_dirs:
                self._bad_dirs.add(folder)
                self._skip(folder, "foreign", "not a folder (a symbolic link is not followed)")
            return []
        if folder not in self._bad_dirs:
            self._bad_dirs.add(folder)
            self._skip(folder, "unreadable", str(exc))
        return None

    def _sweep_all(self) -> None:
        """At most once a minute, when asked: remove every folder's old writers' temp files."""
        now = time.time()
        if self.sweep_temp_after_seconds is None or now - self._swept_at < 60:
            return
        self._swept_at = now
        cutoff = now - self.sweep_temp_after_seconds
        for sub in (*SUBDIRS, "sidecar"):
            folder = os.path.join(self.root, sub)
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                if name.startswith(".") and ".tmp-" in name:
                    self._sweep(os.path.join(folder, name), cutoff)

    def _sweep(self, path: str, cutoff: float) -> None:
        with contextlib.suppress(OSError):
            st = os.lstat(path)
            if stat_mod.S_ISREG(st.st_mode) and st.st_mtime < cutoff:
                os.unlink(path)
                logger.info("oomsight: removed %s, a temp file of a writer killed mid-write", path)

    def _load(self, path: str, kind: str, st: os.stat_result, memory: int) -> tuple[Document | None, int]:
        """The document at ``path`` (statted as ``st``) and what it holds, or None: a counted skip, or a
        file whose document would hold more than ``memory`` (then its cost; not parsed, not counted here)."""
        seen = self._seen.get(path)
        if self.cache and seen is not None and seen.identity == identity(st):
            if seen.cost > memory:  # over the memory left now: not kept
                self._seen[path] = seen._replace(doc=None, reason=None)
                return None, seen.cost
            if seen.doc is not None or seen.reason is not None:
                return seen.doc, seen.cost
        try:
            doc, reason, detail, st, cost = self._parse(path, st, kind, seen.doc if seen is not None else None, memory)
        except FileNotFoundError:
            return None, 0
        except decoding.Unusable as exc:
            if exc.transient:
                return self._keep(path, seen, True, exc.detail), 0
            doc, reason, detail, cost = None, exc.reason, exc.detail, 0
        except Exception as exc:  # a file never fails a read: a defect of ours, counted like a bad file
            doc, reason, detail, cost = None, "corrupt", f"{type(exc).__name__}: {exc}", 0
        self._transient.discard(path)
        if reason == TOO_MANY_FILES:  # over the memory left: not parsed, its cost and claim remembered
            self._seen[path] = _Seen(identity(st), None, None, cost, self._read_claim(path))
            return None, cost
        self._seen[path] = _Seen(identity(st), doc, reason, cost if doc is not None else 0)
        if reason is not None:
            self._skip(path, reason, detail)
        return doc, (cost if doc is not None else 0)

    def _keep(self, path: str, seen: _Seen | None, transient: bool, detail: str) -> Document | None:
        """A file that cannot be read now: its last good document when the cause is passing."""
        if path not in self._transient:
            self._transient.add(path)
            self._skip(path, "unreadable", detail)
        return seen.doc if seen is not None and transient else None

    def _failed(self, path: str, exc: OSError) -> tuple[Document | None, int]:
        return self._keep(path, self._seen.get(path), exc.errno in decoding.TRANSIENT_ERRNOS, str(exc)), 0

    def _parse(
        self, path: str, st: os.stat_result, kind: str, previous: Document | None, memory: int
    ) -> tuple[Document | None, str | None, str, Any, int]:
        """The file's document and what it holds, or why not; the parts equal to ``previous`` (its last
        version) are taken from it instead of checked again. A file whose document would hold more than
        ``memory`` is not parsed (``too_many_files`` with its cost)."""
        if not stat_mod.S_ISREG(st.st_mode) or not path.endswith(".json"):
            return None, "foreign", "not a regular .json file", st, 0
        if st.st_size > self.max_file_bytes:
            return None, "oversized", f"{st.st_size} bytes > {self.max_file_bytes}", st, 0
        raw, st = decoding.read_file(path, self.max_file_bytes)
        cost = memory_cost(raw)
        if cost > memory:
            return None, TOO_MANY_FILES, "", st, cost
        self.parsed += 1
        doc = decoding.decode(raw, max_depth=None)  # validated below, which bounds the nesting
        del raw
        if not isinstance(doc, dict) or "schema_version" not in doc or "kind" not in doc:
            return None, "foreign", "no schema_version/kind", st, 0
        version = doc["schema_version"]
        if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
            return None, "future_version", f"schema_version {version} > {SCHEMA_VERSION}; upgrade the reader", st, 0
        try:
            found = validate(doc, fill_defaults=True, known=previous)
        except SchemaError as exc:
            return None, "invalid", str(exc), st, 0
        if found != kind:
            return None, "foreign", f"a {found} document in the {kind} folder", st, 0
        devices = len(doc["devices"]) if kind == KIND_SNAPSHOT else 0
        if devices > self.budget.devices_per_document:
            return None, TOO_MANY_DEVICES, f"{devices} devices > {self.budget.devices_per_document}", st, 0
        return doc, None, "", st, cost  # type: ignore[return-value]

    def _skip(self, path: str, reason: str, detail: str) -> None:
        self._skipped[reason] += 1
        self.log.add(reason, path, detail)


def _mtime(st: os.stat_result | OSError) -> int:
    return st.st_mtime_ns if isinstance(st, os.stat_result) else 0


def _mtime_at(folder_fd: int, name: str) -> int:
    try:
        return os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mtime_ns
    except OSError:
        return 0
