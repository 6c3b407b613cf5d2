"""The spool directory: how the hook hands its data to the sidecar.

Layout (``docs/spool-format.md``)::

    <spool>/snapshots/<process id>.json           rewritten atomically every publish
    <spool>/events/<process id>.oom-<seq>.json    one per OOM, fsync'd before the error reaches user code
    <spool>/artifacts/<process id>.oom-<seq>.pickle   memory snapshots, oldest evicted first

Writers never leave a partial file under a final name (write a dot-prefixed temp
file, then rename). Readers never crash on what they find: every file they
cannot use is a counted skip with one log line, and nothing is deleted (except, by the
sidecar, the temp files of writers killed mid-write).

The folder names and bounds are in ``oomsight.wire.layout``, the reader in
``oomsight.wire.reader``; both are re-exported here.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from typing import Any

from oomsight.wire import decoding
from oomsight.wire.layout import (
    ARTIFACTS,
    EVENTS,
    MAX_FILE_BYTES,
    PROFILES,
    REQUESTS,
    SNAPSHOTS,
    SUBDIRS,
    TIMELINE_MAX_BYTES,
    TIMELINES,
)
from oomsight.wire.reader import SKIP_REASONS, TEMP_MAX_AGE_SECONDS, Budget, Document, SpoolReader, SpoolState
from oomsight.wire.schema import OomEvent, Snapshot

__all__ = [
    "ARTIFACTS",
    "EVENTS",
    "MAX_FILE_BYTES",
    "PROFILES",
    "REQUESTS",
    "SKIP_REASONS",
    "SNAPSHOTS",
    "SUBDIRS",
    "TEMP_MAX_AGE_SECONDS",
    "TIMELINES",
    "TIMELINE_MAX_BYTES",
    "Budget",
    "Document",
    "SpoolReader",
    "SpoolState",
    "SpoolWriter",
    "artifact_name",
    "artifacts_budget_bytes",
    "artifacts_cap_bytes",
    "event_name",
    "read_timeline",
    "spool_capacity_bytes",
    "timeline_row",
    "write_atomic",
]

ARTIFACTS_SHARE_DIVISOR = 2
"""Artifacts may fill at most 1/2 of the spool: the other half stays for snapshots, OOM
events, timelines and profiles, so a large memory snapshot can never crowd out the event
of the OOM it explains (docs/spool-format.md, "Writing rules")."""


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

    def settle_artifact(self, path: str, max_bytes: int) -> bool:
        """After ``path`` was written into the artifacts folder: the folder back within ``max_bytes``,
        the oldest other artifacts evicted first, and ``path`` itself removed when it alone is larger
        (it can never fit in the artifacts' share: one 7 MiB pickle once took 87.5 % of an 8 MiB spool).
        True when ``path`` is kept."""
        try:
            size = os.lstat(path).st_size
        except OSError:
            return False
        if size > max_bytes:
            _unlink_quietly(path)
            return False
        folder = os.path.join(self.root, ARTIFACTS)
        others = []
        for entry in os.scandir(folder):
            if entry.path != path and entry.is_file(follow_symlinks=False) and not entry.name.startswith("."):
                st = entry.stat(follow_symlinks=False)
                others.append((st.st_mtime_ns, st.st_size, entry.path))
        total = size + sum(n for _, n, _ in others)
        for _, n, other in sorted(others):
            if total <= max_bytes:
                break
            _unlink_quietly(other)
            total -= n
        return True


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
