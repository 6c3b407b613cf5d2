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
  its series for a retention from then). The file is read as
  untrusted, like every spool file; one that cannot be used starts an empty ledger, said once.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Optional

from oomsight.analysis.inventory import DeviceKey, Inventory, OomTally
from oomsight.wire import decoding
from oomsight.wire.schema import OUTCOME_FATAL, OUTCOME_PENDING, OUTCOME_RECOVERED, OomEvent
from oomsight.wire.spool import write_atomic

logger = logging.getLogger(__name__)

LEDGER_MAX_BYTES = 1024 * 1024
"""The ledger file holds at most the spool's event ids and its live keys: far below this."""


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
        self._written: Any = None
        self._loaded = False
        if path is not None:
            self._load(path)

    def apply(self, inv: Inventory, now: float) -> None:
        """Give ``inv`` decided outcomes and counters that never go backwards, and drop the keys past retention."""
        if self._loaded:  # keys read back from the file: their retention starts now
            for kept in self.kept.values():
                kept.seen = now
            self._loaded = False
        ids = self._decide(inv)
        if inv.error is None:  # every folder listed: ids not read now are files gone
            self.decided = {k: v for k, v in self.decided.items() if k in ids}
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
        for tally in inv.ooms.values():
            tally.events = tally.fatal = tally.recovered = 0
        for view in inv.events:
            p = view.event["process"]
            key = (str(p["rank"]), str(p["local_rank"]), str(view.event["device"]), view.event["gpu_uuid"])
            tally = inv.ooms.setdefault(key, OomTally())
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
            tally = ooms.setdefault(key, OomTally(last=kept.last))
            tally.events, tally.fatal = max(tally.events, kept.events), max(tally.fatal, kept.fatal)
            tally.recovered = max(tally.recovered, kept.recovered)
            tally.last = tally.last if tally.last is not None else kept.last
        for key, tally in ooms.items():
            tally.events = max(tally.events, tally.fatal + tally.recovered)
            seen = now if key in present else self.kept[key].seen
            self.kept[key] = Kept(tally.events, tally.fatal, tally.recovered, seen, tally.last)

    def _save(self) -> None:
        if self.path is None:
            return
        state = {
            "decided": dict(sorted(self.decided.items())),
            "kept": sorted([*key, k.events, k.fatal, k.recovered] for key, k in self.kept.items()),
        }
        if state == self._written:
            return
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            write_atomic(self.path, json.dumps(state).encode(), durable=False)
            self._written = state
        except OSError as exc:
            if self._written is not False:
                logger.warning(
                    "oomsight: cannot keep the OOM ledger in %s (%s); counters may reset if the sidecar restarts",
                    self.path,
                    exc,
                )
            self._written = False

    def _load(self, path: str) -> None:
        try:
            state = decoding.load(path, LEDGER_MAX_BYTES)
            self.decided, self.kept = _decided(state["decided"]), _kept(state["kept"])
            self._loaded = True
        except FileNotFoundError:
            return
        except (decoding.Unusable, KeyError, TypeError, ValueError) as exc:
            logger.warning("oomsight: the OOM ledger %s cannot be used (%s); starting an empty one", path, exc)
            self.decided, self.kept = {}, {}


def event_id(ev: OomEvent) -> str:
    """``<process id>.oom-<seq>``, the event file's name without ``.json``."""
    return f"{ev['process']['id']}.oom-{ev['seq']:05d}"


def _decided(found: Any) -> dict[str, str]:
    if not isinstance(found, dict):
        raise TypeError("decided is not an object")
    outcomes = (OUTCOME_FATAL, OUTCOME_RECOVERED)
    return {k: v for k, v in found.items() if isinstance(k, str) and v in outcomes}


def _kept(found: Any) -> dict[DeviceKey, Kept]:
    if not isinstance(found, list):
        raise TypeError("kept is not a list")
    kept = {}
    for row in found:
        if not isinstance(row, list) or len(row) != 7:
            raise ValueError(
                f"a row that is not (rank, local rank, device, GPU, events, fatal, recovered): {row!r:.200}"
            )
        key, counts = tuple(row[:4]), row[4:]
        if not all(isinstance(x, str) for x in key) or not all(_count(x) for x in counts):
            raise ValueError(
                f"a row that is not (rank, local rank, device, GPU, events, fatal, recovered): {row!r:.200}"
            )
        kept[key] = Kept(counts[0], counts[1], counts[2], 0.0)
    return kept


def _count(x: Any) -> bool:
    return type(x) is int and 0 <= x < 2**53
