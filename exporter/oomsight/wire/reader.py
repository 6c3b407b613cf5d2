"""The spool's reader: every process's snapshot, every OOM event and every profile, each
file parsed again only when its identity (inode, size, ``mtime_ns``) changed.

Every file is untrusted (``oomsight.wire.decoding``): an unusable one is a counted skip with one
log line, and nothing is deleted but, when asked, the old temp files of writers killed mid-write.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import stat as stat_mod
import threading
import time
from typing import Any, NamedTuple, Union

from oomsight.wire import decoding
from oomsight.wire.layout import EVENTS, MAX_FILE_BYTES, PROFILES, SKIP_REASONS, SNAPSHOTS, SUBDIRS
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
        return doc, None, "", st  # type: ignore[return-value]

    def _skip(self, path: str, reason: str, detail: str) -> None:
        self._skipped[reason] += 1
        logger.warning("oomsight: skipping spool file %s (%s: %s); it is left in place", path, reason, detail)
