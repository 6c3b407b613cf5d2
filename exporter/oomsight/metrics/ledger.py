"""OOM counters that never go backwards, and OOM series that leave (issue 26).

A read of the spool gives each (rank, local rank, device, GPU) a tally of its OOM event files.
The ledger makes those tallies counters:

* **An outcome once decided sticks.** A pending OOM whose process went silent is fatal; if the
  process comes back and later marks it recovered, it stays fatal in the counts (a counter cannot
  give it back), so ``events >= fatal + recovered`` always: pending is never negative.
* **Never below the last scrape** while the series lives: a count falls only if event files are
  removed or cannot be read, and then the last count is served.
* **Series leave.** A key whose files are gone (no process within retention lists the device, no
  event file names it) keeps its last counts for ``retention_seconds``, then is forgotten: the
  ledger holds the keys of the spool's recent past only, never every key it has seen.
* **Through restarts** of the reader when given a ``path`` (the sidecar's
  ``<spool>/sidecar/oom-ledger.json``): the decided outcomes of the event files present and the
  counts of the live keys, written when they change and read back at start (a key read back keeps
  its series for a retention from then).
* **A ledger can only help** (issue 36). The file is as untrusted as every spool file: it is read and
  written only inside a real folder (never through a symbolic link), a row must be possible (counts
  whole numbers up to :data:`MAX_COUNT`, what a spool's listing can hold; fatal plus recovered at most
  events), and anything else in it is a lost ledger, replaced at once. A lost ledger cannot say what
  the counters were, so they restart as an honest reset: the event files present then are not counted
  (they are kept in the ledger as ``uncounted``), every counter starts again at 0 and its OpenMetrics
  ``_created`` is the time of the reset. Counting those files again could serve a lower non-zero
  value (events 3 -> 2 when one file went), which Prometheus reads as a reset followed by new OOMs.
  A ledger that is simply missing is a first start: the files are counted.
* **A lost ledger is restored from its copy, and said** (issue 49). Every write of the ledger writes its copy
  (``<path>.copy``) after it; at a start, a ledger missing or unusable beside a usable copy is read from the copy,
  so a ledger deleted between two runs (3 OOMs, one event file gone) still serves 3. Only where neither can be
  used is it a reset. Every loss is logged and exported as ``oomsight_oom_ledger_lost_timestamp_seconds`` by what
  was done (``restored``, ``reset``, ``put_back``), and a reset's time stays in the ledger through restarts
  (docs/metrics.md says how a dashboard reads it). Limit: the ledger and its copy both deleted with the reader
  stopped read as a first start, which counts the files present.
* **A ledger taken away is put back** (issue 44). While the reader runs, its counts are the high-water
  mark of every key; the file is checked at each apply (one ``stat``) and written again from them when it
  is gone or is not the one last written. A ledger deleted while event files remain, and then the
  sidecar restarted, would otherwise count only the files left (3 OOMs, one file gone: 2), which
  Prometheus reads as a reset followed by 2 new OOMs.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import stat as stat_mod
from typing import Any, Optional

from oomsight.analysis.inventory import DeviceKey, Inventory, OomTally
from oomsight.wire import decoding
from oomsight.wire.reader import Budget
from oomsight.wire.schema import OUTCOME_FATAL, OUTCOME_PENDING, OUTCOME_RECOVERED, OomEvent

logger = logging.getLogger(__name__)

FileIdentity = tuple[int, int, int, int]
COPY = ".copy"
"""The ledger's copy is its path with this added (:meth:`Ledger._restore`)."""
LEDGER_MAX_BYTES = 1024 * 1024
"""The ledger file holds at most the spool's event ids and its live keys: far below this."""
MAX_COUNT = Budget().entries_per_folder
"""The most OOM events one key can count: the event files one listing of the spool holds."""
_OPEN_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
_OPEN_FILE = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


RESTORED, RESET, PUT_BACK = "restored", "reset", "put_back"
"""What was done about a lost ledger (``oomsight_oom_ledger_lost_timestamp_seconds``): read back from its copy (no
count falls), the counters restarted at 0 (neither could be used), written again from the counts served (taken
away or replaced while the reader ran)."""


class Lost(Exception):
    """The ledger is there but cannot be used: the counters restart as an honest reset."""


@dataclasses.dataclass
class Tally(OomTally):
    """An OOM tally with the time its counters (re)started, where the ledger knows it (after a reset)."""

    created: Optional[float] = None


@dataclasses.dataclass
class Kept:
    """A key's last counts and when its files were last seen."""

    events: int
    fatal: int
    recovered: int
    seen: float
    last: Optional[OomEvent] = None


class Ledger:
    """``apply(inventory, now)`` after every read; see the module's description."""

    def __init__(self, retention_seconds: float, path: Optional[str] = None) -> None:
        self.retention_seconds = retention_seconds
        self.path = path
        self.decided: dict[str, str] = {}
        """OOM event id -> the outcome it was first counted with (fatal or recovered)."""
        self.kept: dict[DeviceKey, Kept] = {}
        self.uncounted: set[str] = set()
        """Ids of the event files present when a lost ledger was reset: never counted."""
        self.reset_at: Optional[float] = None
        """When the counters restarted after a lost ledger (their ``_created``); None if never."""
        self.losses: dict[str, float] = {}
        """What was last done about a lost ledger (:data:`RESTORED`, :data:`RESET`, :data:`PUT_BACK`) -> when."""
        self._restored = False
        self._lost = False
        self._written: Any = None
        self._on_disk: Optional[tuple[Optional[FileIdentity], ...]] = None
        """(inode, size, ``mtime_ns``, ``ctime_ns``) of the file and of its copy as last written: another is put
        back."""
        self._loaded = False
        self._now = 0.0
        if path is not None:
            self._load(path)

    def apply(self, inv: Inventory, now: float) -> None:
        """Give ``inv`` decided outcomes and counters that never go backwards, and drop the keys past retention."""
        if self._loaded:  # keys read back from the file: their retention starts now
            for kept in self.kept.values():
                kept.seen = now
            self._loaded = False
        if self._lost:  # an honest reset: what is there now is not counted, the counters start at 0
            self.uncounted, self.reset_at, self._lost = {event_id(v.event) for v in inv.events}, now, False
        if self._restored:
            self.losses[RESTORED], self._restored = now, False
        if self.reset_at is not None:
            self.losses[RESET] = self.reset_at
        self._now = now
        ids = self._decide(inv)
        if inv.error is None:  # every folder listed: ids not read now are files gone
            self.decided = {k: v for k, v in self.decided.items() if k in ids}
            self.uncounted &= ids
        self._floor(inv.ooms, now)
        self._save()

    def _decide(self, inv: Inventory) -> set[str]:
        ids = set()
        for view in inv.events:
            oom = event_id(view.event)
            ids.add(oom)
            decided = self.decided.get(oom)
            if decided is not None:
                view.outcome = decided
            elif view.outcome != OUTCOME_PENDING:
                self.decided[oom] = view.outcome
        inv.ooms = {key: Tally(last=t.last, created=self.reset_at) for key, t in inv.ooms.items()}
        for view in inv.events:
            p = view.event["process"]
            key = (str(p["rank"]), str(p["local_rank"]), str(view.event["device"]), view.event["gpu_uuid"])
            tally = inv.ooms.setdefault(key, Tally(created=self.reset_at))
            if event_id(view.event) in self.uncounted:
                continue
            tally.events += 1
            tally.fatal += view.outcome == OUTCOME_FATAL
            tally.recovered += view.outcome == OUTCOME_RECOVERED
        return ids

    def _floor(self, ooms: dict[DeviceKey, OomTally], now: float) -> None:
        present = set(ooms)  # keys of the files read now: a process within retention, an event file
        for key, kept in list(self.kept.items()):
            if key not in present and now - kept.seen > self.retention_seconds:
                del self.kept[key]  # its files are gone and so is its retention
                continue
            tally = ooms.setdefault(key, Tally(last=kept.last, created=self.reset_at))
            tally.events, tally.fatal = max(tally.events, kept.events), max(tally.fatal, kept.fatal)
            tally.recovered = max(tally.recovered, kept.recovered)
            tally.last = tally.last if tally.last is not None else kept.last
        for key, tally in ooms.items():
            tally.events = min(max(tally.events, tally.fatal + tally.recovered), MAX_COUNT)
            tally.fatal, tally.recovered = min(tally.fatal, tally.events), min(tally.recovered, tally.events)
            seen = now if key in present else self.kept[key].seen
            self.kept[key] = Kept(tally.events, tally.fatal, tally.recovered, seen, tally.last)

    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "decided": dict(sorted(self.decided.items())),
            "kept": sorted([*key, k.events, k.fatal, k.recovered] for key, k in self.kept.items()),
        }
        if self.reset_at is not None:
            state.update(uncounted=sorted(self.uncounted), reset_at=self.reset_at)
        return state

    def _save(self, force: bool = False) -> None:
        if self.path is None:
            return
        state = self._state()
        on_disk = self._identities()
        if state == self._written and not force and on_disk == self._on_disk:
            return
        if state == self._written and self._written and not force:
            logger.warning(
                "oomsight: the OOM ledger %s or its copy was removed or replaced while the reader ran; written again "
                "from the counts served",
                self.path,
            )
            self.losses[PUT_BACK] = self._now
        try:
            data = json.dumps(state).encode()
            _write(self.path, data)
            _write(self.path + COPY, data)
            self._written, self._on_disk = state, self._identities()
        except (OSError, Lost) as exc:
            if self._written is not False:
                logger.warning(
                    "oomsight: cannot keep the OOM ledger in %s (%s); counters may reset if the sidecar restarts",
                    self.path,
                    exc,
                )
            self._written = False

    def _identities(self) -> tuple[Optional[FileIdentity], ...]:
        assert self.path is not None
        return _identity(self.path), _identity(self.path + COPY)

    def _use(self, path: str) -> None:
        state = _read(path)
        if not isinstance(state, dict):
            raise Lost("not an object")
        self.decided, self.kept = _decided(state.get("decided")), _kept(state.get("kept"))
        self.uncounted, self.reset_at = _uncounted(state.get("uncounted", [])), _time(state.get("reset_at"))
        self._loaded = True

    def _load(self, path: str) -> None:
        try:
            self._use(path)
        except FileNotFoundError:
            if not self._restore(path, "missing"):
                return  # a first start: the event files are counted
        except (OSError, Lost, decoding.Unusable) as exc:
            if self._restore(path, str(exc)):
                return
            logger.warning(
                "oomsight: the OOM ledger %s cannot be used (%s); replaced, and the OOM counters restart at 0 "
                "(an honest reset: their _created moves)",
                path,
                exc,
            )
            self.decided, self.kept, self.uncounted, self._lost = {}, {}, set(), True
            self._save(force=True)  # repaired at once

    def _restore(self, path: str, why: str) -> bool:
        """Read the ledger's copy in its place (and write both again); False where the copy cannot be used either."""
        try:
            self._use(path + COPY)
        except (OSError, Lost, decoding.Unusable):
            self.decided, self.kept, self.uncounted, self.reset_at, self._loaded = {}, {}, set(), None, False
            return False
        logger.warning(
            "oomsight: the OOM ledger %s cannot be used (%s); read back from its copy, no OOM counter falls", path, why
        )
        self._restored = True
        self._save(force=True)
        return True


def event_id(ev: OomEvent) -> str:
    """``<process id>.oom-<seq>``, the event file's name without ``.json``."""
    return f"{ev['process']['id']}.oom-{ev['seq']:05d}"


def _decided(found: Any) -> dict[str, str]:
    if not isinstance(found, dict) or len(found) > MAX_COUNT:
        raise Lost("decided is not an object of at most a spool's events")
    outcomes = (OUTCOME_FATAL, OUTCOME_RECOVERED)
    if not all(isinstance(k, str) and v in outcomes for k, v in found.items()):
        raise Lost("decided holds an entry that is not an event id and an outcome")
    return dict(found)


def _uncounted(found: Any) -> set[str]:
    if not isinstance(found, list) or len(found) > MAX_COUNT or not all(isinstance(x, str) for x in found):
        raise Lost("uncounted is not a list of at most a spool's event ids")
    return set(found)


def _time(found: Any) -> Optional[float]:
    if found is None:
        return None
    if type(found) not in (int, float) or not 0 <= found < 2**40:
        raise Lost(f"reset_at is not a time: {found!r:.50}")
    return float(found)


def _kept(found: Any) -> dict[DeviceKey, Kept]:
    if not isinstance(found, list) or len(found) > MAX_COUNT:
        raise Lost("kept is not a list of at most a spool's keys")
    kept = {}
    for row in found:
        if not isinstance(row, list) or len(row) != 7 or not all(isinstance(x, str) for x in row[:4]):
            raise Lost(f"a row that is not (rank, local rank, device, GPU, events, fatal, recovered): {row!r:.200}")
        events, fatal, recovered = row[4:]
        if not all(_count(x) for x in row[4:]) or fatal + recovered > events:
            raise Lost(f"a row with impossible counts (at most {MAX_COUNT}, fatal + recovered <= events): {row!r:.200}")
        kept[tuple(row[:4])] = Kept(events, fatal, recovered, 0.0)
    return kept


def _count(x: Any) -> bool:
    return type(x) is int and 0 <= x <= MAX_COUNT


def _identity(path: str) -> Optional[tuple[int, int, int, int]]:
    """(inode, size, ``mtime_ns``, ``ctime_ns``) of the file at ``path`` (not followed), None where there is none."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _folder(path: str, create: bool = False) -> int:
    """The ledger's folder, open (``create``: made where missing); never followed through a symbolic link."""
    folder = os.path.dirname(path)
    try:
        return os.open(folder, _OPEN_DIR)
    except FileNotFoundError:
        if not create:
            raise
        os.makedirs(folder, exist_ok=True)
        return os.open(folder, _OPEN_DIR)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Lost(f"{folder} is not a folder (a symbolic link is not followed)") from None
        raise


def _read(path: str) -> Any:
    dir_fd = _folder(path)
    try:
        try:
            fd = os.open(os.path.basename(path), _OPEN_FILE, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise Lost(f"not a regular file ({exc.strerror})") from None
            raise
        try:
            if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
                raise Lost("not a regular file")
            raw = os.read(fd, LEDGER_MAX_BYTES + 1)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)
    if len(raw) > LEDGER_MAX_BYTES:
        raise Lost(f"over {LEDGER_MAX_BYTES} bytes")
    return decoding.decode(raw)


def _write(path: str, data: bytes) -> None:
    """Replace the ledger atomically inside its real folder; whatever else holds its name (a folder, a FIFO,
    a link) is removed first: the name is the sidecar's."""
    dir_fd = _folder(path, create=True)
    name, tmp = os.path.basename(path), f".{os.path.basename(path)}.tmp-{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644, dir_fd=dir_fd)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat_mod.S_ISDIR(st.st_mode):
                _remove_tree(name, dir_fd)
        except FileNotFoundError:
            pass
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def _remove_tree(name: str, dir_fd: int) -> None:
    """Remove the folder ``name`` (in the folder open as ``dir_fd``) and what it holds, links unfollowed."""
    fd = os.open(name, _OPEN_DIR, dir_fd=dir_fd)
    try:
        for entry in os.scandir(fd):
            if entry.is_dir(follow_symlinks=False):
                _remove_tree(entry.name, fd)
            else:
                os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)
