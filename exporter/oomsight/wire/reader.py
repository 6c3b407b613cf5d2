"""The spool's reader: every process's snapshot, every OOM event and every profile, each
file parsed again only when its identity (inode, size, ``mtime_ns``) changed.

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
import logging
import os
import stat as stat_mod
import threading
import time
from typing import Any, NamedTuple, Union

from oomsight.wire import decoding
from oomsight.wire.layout import EVENTS, MAX_FILE_BYTES, PROFILES, SNAPSHOTS, SUBDIRS
from oomsight.wire.layout import SKIP_REASONS as FILE_REASONS
from oomsight.wire.schema import (
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
    """What one spool may make its reader do (issue 26). A pod runs 1 to 16 ranks of at most 8 GPUs
    each; every bound is several times that, and small enough that the worst spool within it is read
    and served within the sidecar's 128 MiB and a second (docs/scale.md, "Budget")."""

    entries_per_folder: int = 4096
    """Directory entries listed per spool folder; past it the rest are not listed (100,000 empty files
    cost 5 s and 50 MB when every one was listed, read and logged)."""
    ranks_per_spool: int = 64
    """Snapshots read, the newest first (a live rank publishes every second): 4x a pod's largest."""
    events_per_spool: int = 1024
    """OOM event files read, the newest first (the hook writes at most OOMSIGHT_MAX_OOM_EVENTS, 100, per process)."""
    profiles_per_spool: int = 256
    """Profile files read, the newest first."""
    devices_per_document: int = 16
    """Devices one snapshot may list (a process sees at most 8 GPUs of a node today); a snapshot with more
    is refused whole (one valid 1 MiB snapshot of 2,893 devices gave 5.4 MB of /metrics)."""
    series_per_scrape: int = 20_000
    """Series of one scrape (16 ranks of 8 GPUs give about 7,000); a process that would pass it is left out."""
    metrics_bytes: int = 8 * 1024 * 1024
    """Bytes of /metrics, estimated from the label values before any text is made (16 ranks of 8 GPUs: about 1 MB)."""

    def documents(self, folder: str) -> int:
        return {SNAPSHOTS: self.ranks_per_spool, EVENTS: self.events_per_spool}.get(folder, self.profiles_per_spool)


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


class _Seen(NamedTuple):
    mtime_ns: int
    size: int
    inode: int
    doc: Document | None
    reason: str | None


TEMP_MAX_AGE_SECONDS = 600.0
"""A writer's dot-temp file this old belongs to a writer that was killed mid-write."""


class SpoolReader:
    """Reads every process's snapshot and every OOM event, re-parsing only changed files.

    Every file is untrusted (``oomsight.wire.decoding``): an unusable one is a counted skip with
    one log line, and a file or folder that cannot be read for a passing reason (no file
    descriptors left) gives its last good document. ``sweep_temp_after_seconds`` (the sidecar
    sets it) removes writers' temp files older than that; by default nothing is deleted.
    """

    def __init__(
        self,
        root: str,
        max_file_bytes: int = MAX_FILE_BYTES,
        sweep_temp_after_seconds: float | None = None,
        budget: Budget = Budget(),
    ) -> None:
        self.root = root
        self.max_file_bytes = max_file_bytes
        self.sweep_temp_after_seconds = sweep_temp_after_seconds
        self.budget = budget
        self.log = SkipLog("skipped spool files")
        self._refused: set[str] = set()
        """Files refused at the budget now (each counted once while it is)."""
        self._cut: set[str] = set()
        """Folders whose listing stopped at the budget now."""
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
            out: dict[str, list[Any]] = {KIND_SNAPSHOT: [], KIND_OOM_EVENT: [], KIND_PROFILE: []}
            present: set[str] = set()
            unreadable: list[str] = []
            refused: set[str] = set()
            for sub, kind in ((SNAPSHOTS, KIND_SNAPSHOT), (EVENTS, KIND_OOM_EVENT), (PROFILES, KIND_PROFILE)):
                folder = os.path.join(self.root, sub)
                paths = self._files(folder)
                if paths is None:  # cannot list it now: keep what it held
                    unreadable.append(sub)
                    paths = sorted(p for p in self._seen if os.path.dirname(p) == folder)
                paths = self._within_budget(paths, self.budget.documents(sub), refused)
                for path in paths:
                    present.add(path)
                    doc = self._load(path, kind)
                    if doc is not None:
                        out[kind].append(doc)
            for gone in set(self._seen) - present:
                del self._seen[gone]
            self._refused = refused
            self._sweep_all()
            self.log.flush()
            return SpoolState(
                out[KIND_SNAPSHOT],
                out[KIND_OOM_EVENT],
                dict(self._skipped),
                True,
                f"cannot list {', '.join(unreadable)}" if unreadable else None,
                out[KIND_PROFILE],
                self.root,
                unreadable,
            )

    def _files(self, folder: str) -> list[str] | None:
        """The paths to read in ``folder``, at most the budget's entries listed; None if it cannot be
        listed now. A folder that is a symbolic link is not followed (a foreign folder, no files)."""
        names: list[str] = []
        try:
            fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return []
        except OSError as exc:
            return self._bad_dir(folder, exc)
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    if len(names) >= self.budget.entries_per_folder:
                        break
                    names.append(entry.name)
        except OSError as exc:
            return self._bad_dir(folder, exc)
        finally:
            os.close(fd)
        self._bad_dirs.discard(folder)
        if len(names) < self.budget.entries_per_folder:
            self._cut.discard(folder)
        elif folder not in self._cut:  # counted once while it stays cut
            self._cut.add(folder)
            self._skip(folder, TOO_MANY_FILES, f"more than {len(names)} entries: the rest are not listed")
        return [os.path.join(folder, n) for n in sorted(names) if not n.startswith(".")]  # dot files: writes in flight

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

    def _within_budget(self, paths: list[str], most: int, refused: set[str]) -> list[str]:
        """``paths`` when there are at most ``most``; else the ``most`` newest (by ``lstat``), the rest
        refused: each counted once while it stays refused."""
        if len(paths) <= most:
            return paths
        mtimes = {}
        for path in paths:
            with contextlib.suppress(OSError):
                mtimes[path] = os.lstat(path).st_mtime_ns
        newest = sorted(mtimes, key=lambda p: (-mtimes[p], p))
        for path in newest[most:]:
            refused.add(path)
            if path not in self._refused:
                self._skip(path, TOO_MANY_FILES, f"more than {most} documents in its folder (the newest are read)")
        return sorted(newest[:most])

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

    def _load(self, path: str, kind: str) -> Document | None:
        seen = self._seen.get(path)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None  # vanished between listdir and stat: a rename in flight
        except OSError as exc:
            return self._keep(path, seen, exc.errno in decoding.TRANSIENT_ERRNOS, str(exc))
        if seen and (seen.mtime_ns, seen.size, seen.inode) == (st.st_mtime_ns, st.st_size, st.st_ino):
            return seen.doc
        self.parsed += 1
        try:
            doc, reason, detail, st = self._parse(path, st, kind, seen.doc if seen is not None else None)
        except FileNotFoundError:
            return None
        except decoding.Unusable as exc:
            if exc.transient:
                return self._keep(path, seen, True, exc.detail)
            doc, reason, detail = None, exc.reason, exc.detail
        except Exception as exc:  # a file never fails a read: a defect of ours, counted like a bad file
            doc, reason, detail = None, "corrupt", f"{type(exc).__name__}: {exc}"
        self._transient.discard(path)
        self._seen[path] = _Seen(st.st_mtime_ns, st.st_size, st.st_ino, doc, reason)
        if reason is not None:
            self._skip(path, reason, detail)
        return doc

    def _keep(self, path: str, seen: _Seen | None, transient: bool, detail: str) -> Document | None:
        """A file that cannot be read now: its last good document when the cause is passing."""
        if path not in self._transient:
            self._transient.add(path)
            self._skip(path, "unreadable", detail)
        return seen.doc if seen is not None and transient else None

    def _parse(
        self, path: str, st: os.stat_result, kind: str, previous: Document | None
    ) -> tuple[Document | None, str | None, str, Any]:
        """The file's document, or why not; the parts equal to ``previous`` (its last version)
        are taken from it instead of checked again."""
        if not stat_mod.S_ISREG(st.st_mode) or not path.endswith(".json"):
            return None, "foreign", "not a regular .json file", st
        if st.st_size > self.max_file_bytes:
            return None, "oversized", f"{st.st_size} bytes > {self.max_file_bytes}", st
        raw, st = decoding.read_file(path, self.max_file_bytes)
        doc = decoding.decode(raw, max_depth=None)  # validated below, which bounds the nesting
        if not isinstance(doc, dict) or "schema_version" not in doc or "kind" not in doc:
            return None, "foreign", "no schema_version/kind", st
        version = doc["schema_version"]
        if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
            return None, "future_version", f"schema_version {version} > {SCHEMA_VERSION}; upgrade the reader", st
        try:
            found = validate(doc, fill_defaults=True, known=previous)
        except SchemaError as exc:
            return None, "invalid", str(exc), st
        if found != kind:
            return None, "foreign", f"a {found} document in the {kind} folder", st
        devices = len(doc["devices"]) if kind == KIND_SNAPSHOT else 0
        if devices > self.budget.devices_per_document:
            return None, TOO_MANY_DEVICES, f"{devices} devices > {self.budget.devices_per_document}", st
        return doc, None, "", st  # type: ignore[return-value]

    def _skip(self, path: str, reason: str, detail: str) -> None:
        self._skipped[reason] += 1
        self.log.add(reason, path, detail)
