"""The spool directory: how the hook hands its data to the sidecar.

Layout (``docs/spool-format.md``)::

    <spool>/snapshots/<process id>.json           rewritten atomically every publish
    <spool>/events/<process id>.oom-<seq>.json    one per OOM, fsync'd before the error reaches user code
    <spool>/artifacts/<process id>.oom-<seq>.pickle   memory snapshots, oldest evicted first

Writers never leave a partial file under a final name (write a dot-prefixed temp
file, then rename). Readers never crash on what they find: every file they
cannot use is a counted skip with one log line, and nothing is deleted (except, by the
sidecar, the temp files of writers killed mid-write).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import stat as stat_mod
import threading
import time
from typing import Any, Union

from oomsight.wire import decoding
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

SNAPSHOTS = "snapshots"
EVENTS = "events"
ARTIFACTS = "artifacts"
TIMELINES = "timelines"
PROFILES = "profiles"
REQUESTS = "requests"
SUBDIRS = (SNAPSHOTS, EVENTS, ARTIFACTS, TIMELINES, PROFILES, REQUESTS)
TIMELINE_MAX_BYTES = 1024 * 1024
"""A timeline file is rotated to ``<id>.1.jsonl`` at this size: at most 2 MiB per process."""
MAX_FILE_BYTES = 1024 * 1024
"""Snapshots and events are a few KiB; anything over this is not ours."""

ARTIFACTS_SHARE_DIVISOR = 2
"""Artifacts may fill at most 1/2 of the spool: the other half stays for snapshots, OOM
events, timelines and profiles, so a large memory snapshot can never crowd out the event
of the OOM it explains (docs/spool-format.md, "Writing rules")."""

SKIP_REASONS = ("corrupt", "oversized", "foreign", "future_version", "invalid", "unreadable")

Document = Union[Snapshot, OomEvent, Profile]


def event_name(process_id: str, seq: int) -> str:
    return f"{process_id}.oom-{seq:05d}.json"


def artifact_name(process_id: str, seq: int, suffix: str) -> str:
    return f"{process_id}.oom-{seq:05d}.{suffix}"


class SpoolWriter:
    """Writes one process's files. Methods raise ``OSError``; the hook counts and swallows."""

    def __init__(self, root: str, process_id: str) -> None:
        self.root = root
        self.process_id = process_id
        self.snapshot_path = os.path.join(root, SNAPSHOTS, f"{process_id}.json")
        self.timeline_path = os.path.join(root, TIMELINES, f"{process_id}.jsonl")

    def prepare(self) -> None:
        for sub in SUBDIRS:
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)

    def write_snapshot(self, doc: Snapshot) -> None:
        self._write(self.snapshot_path, _encode(doc), durable=False)

    def write_event(self, doc: OomEvent) -> str:
        """Write (or rewrite, to update its outcome) an OOM event durably; return its path."""
        path = os.path.join(self.root, EVENTS, event_name(self.process_id, doc["seq"]))
        self._write(path, _encode(doc), durable=True)
        return path

    def _write(self, path: str, data: bytes, durable: bool) -> None:
        try:
            write_atomic(path, data, durable)
        except FileNotFoundError:  # the spool was created late or wiped: make it and retry once
            self.prepare()
            write_atomic(path, data, durable)

    def append_timeline(self, row: list[Any]) -> None:
        """Append one JSON line (one ``write`` with O_APPEND: readers never see half a line
        from us); rotate the file once it exceeds ``TIMELINE_MAX_BYTES``."""
        data = _encode(row) + b"\n"
        try:
            fd = os.open(self.timeline_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except FileNotFoundError:
            self.prepare()
            fd = os.open(self.timeline_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, data)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size > TIMELINE_MAX_BYTES:
            os.replace(self.timeline_path, self.timeline_path[: -len(".jsonl")] + ".1.jsonl")

    def artifact_path(self, seq: int, suffix: str) -> str:
        return os.path.join(self.root, ARTIFACTS, artifact_name(self.process_id, seq, suffix))

    def evict_artifacts(self, max_bytes: int) -> list[str]:
        """Delete the oldest artifacts until the folder holds at most ``max_bytes``."""
        folder = os.path.join(self.root, ARTIFACTS)
        entries = []
        for entry in os.scandir(folder):
            if entry.is_file(follow_symlinks=False) and not entry.name.startswith("."):
                st = entry.stat(follow_symlinks=False)
                entries.append((st.st_mtime_ns, st.st_size, entry.path))
        entries.sort()
        total = sum(size for _, size, _ in entries)
        evicted = []
        for _, size, path in entries:
            if total <= max_bytes:
                break
            os.unlink(path)
            total -= size
            evicted.append(path)
        return evicted


def artifacts_cap_bytes(spool_bytes: int) -> int:
    """The most the artifacts folder may hold in a spool of ``spool_bytes``: half of it
    (:data:`ARTIFACTS_SHARE_DIVISOR`), at least 1 byte. The webhook sets
    ``OOMSIGHT_ARTIFACTS_MAX_BYTES`` to this from the spool volume's ``sizeLimit``."""
    return max(spool_bytes // ARTIFACTS_SHARE_DIVISOR, 1)


def spool_capacity_bytes(root: str) -> int | None:
    """Size of the filesystem that holds ``root`` (``statvfs``: ``f_blocks * f_frsize``);
    None when it cannot be told (no ``statvfs``, the folder is missing, a size of 0)."""
    try:
        st = os.statvfs(root)
    except (OSError, AttributeError):
        return None
    size = st.f_blocks * st.f_frsize
    return size if size > 0 else None


def artifacts_budget_bytes(root: str, max_bytes: int) -> int:
    """The artifacts bound in force for the spool at ``root``: ``max_bytes`` (the setting),
    lowered to :func:`artifacts_cap_bytes` of its filesystem, so a spool on a tmpfs smaller
    than the setting still keeps room for events."""
    capacity = spool_capacity_bytes(root)
    return max_bytes if capacity is None else min(max_bytes, artifacts_cap_bytes(capacity))


def _encode(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def write_atomic(path: str, data: bytes, durable: bool) -> None:
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.tmp-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError:
        _unlink_quietly(tmp)
        raise
    if durable:
        _fsync_dir(folder)


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the file itself is synced
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


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


@dataclasses.dataclass(frozen=True)
class _Seen:
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
        self, root: str, max_file_bytes: int = MAX_FILE_BYTES, sweep_temp_after_seconds: float | None = None
    ) -> None:
        self.root = root
        self.max_file_bytes = max_file_bytes
        self.sweep_temp_after_seconds = sweep_temp_after_seconds
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
            for sub, kind in ((SNAPSHOTS, KIND_SNAPSHOT), (EVENTS, KIND_OOM_EVENT), (PROFILES, KIND_PROFILE)):
                folder = os.path.join(self.root, sub)
                paths = self._files(folder)
                if paths is None:  # cannot list it now: keep what it held
                    unreadable.append(sub)
                    paths = sorted(p for p in self._seen if os.path.dirname(p) == folder)
                for path in paths:
                    present.add(path)
                    doc = self._load(path, kind)
                    if doc is not None:
                        out[kind].append(doc)
            for gone in set(self._seen) - present:
                del self._seen[gone]
            self._sweep_all()
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
        """The paths to read in ``folder``; None if it cannot be listed now."""
        try:
            names = sorted(os.listdir(folder))
        except FileNotFoundError:
            return []
        except OSError as exc:
            if folder not in self._bad_dirs:
                self._bad_dirs.add(folder)
                self._skip(folder, "unreadable", str(exc))
            return None
        self._bad_dirs.discard(folder)
        return [os.path.join(folder, n) for n in names if not n.startswith(".")]  # dot files: writes in flight

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
            doc, reason, detail, st = self._parse(path, st, kind)
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

    def _parse(self, path: str, st: os.stat_result, kind: str) -> tuple[Document | None, str | None, str, Any]:
        if not stat_mod.S_ISREG(st.st_mode) or not path.endswith(".json"):
            return None, "foreign", "not a regular .json file", st
        if st.st_size > self.max_file_bytes:
            return None, "oversized", f"{st.st_size} bytes > {self.max_file_bytes}", st
        raw, st = decoding.read_file(path, self.max_file_bytes)
        doc = decoding.decode(raw)
        if not isinstance(doc, dict) or "schema_version" not in doc or "kind" not in doc:
            return None, "foreign", "no schema_version/kind", st
        version = doc["schema_version"]
        if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
            return None, "future_version", f"schema_version {version} > {SCHEMA_VERSION}; upgrade the reader", st
        try:
            found = validate(doc, fill_defaults=True)
        except SchemaError as exc:
            return None, "invalid", str(exc), st
        if found != kind:
            return None, "foreign", f"a {found} document in the {kind} folder", st
        return doc, None, "", st  # type: ignore[return-value]

    def _skip(self, path: str, reason: str, detail: str) -> None:
        self._skipped[reason] += 1
        logger.warning("oomsight: skipping spool file %s (%s: %s); it is left in place", path, reason, detail)


def read_timeline(root: str, process_id: str) -> tuple[list[list[Any]], int]:
    """(rows oldest first, lines skipped) of a process's timeline, rotated part included.

    A row is ``[time, steps, [[device, allocated, reserved, window_peak_allocated], ...]]``.
    """
    rows: list[list[Any]] = []
    skipped = 0
    base = os.path.join(root, TIMELINES, process_id)
    for path in (base + ".1.jsonl", base + ".jsonl"):
        try:
            raw, _ = decoding.read_file(path, 4 * TIMELINE_MAX_BYTES)
        except (OSError, decoding.Unusable):
            continue
        for line in raw.splitlines():
            try:
                row = decoding.decode(line)
            except decoding.Unusable:
                skipped += 1
                continue
            if isinstance(row, list) and len(row) == 3 and isinstance(row[2], list):
                rows.append(row)
            else:
                skipped += 1
    return rows, skipped


def timeline_row(doc: Snapshot) -> list[Any]:
    """The compact line a publish appends to the process's timeline."""
    return [
        round(doc["time"], 3),
        doc["steps"]["count"],
        [
            [
                d["index"],
                d["allocator"]["allocated_bytes"],
                d["allocator"]["reserved_bytes"],
                d["allocator"]["window_peak_allocated_bytes"],
            ]
            for d in doc["devices"]
        ],
    ]
