"""What a read of the spool means: which processes are live, which have exited, and
how many OOMs each (rank, local rank, device, GPU) has seen.

Shared by the Prometheus collector and the text report, so both tell the same story.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Optional

from oomsight.wire.reader import FileKey
from oomsight.wire.schema import (
    OUTCOME_FATAL,
    OUTCOME_PENDING,
    OUTCOME_RECOVERED,
    DeviceSnapshot,
    OomEvent,
    Profile,
    Snapshot,
)
from oomsight.wire.spool import SpoolState

DEFAULT_RETENTION_SECONDS = 300.0
"""An exited process's series stay this long after its last snapshot, then vanish."""
DEFAULT_STALE_AFTER_SECONDS = 30.0
"""A running process whose snapshot is older than this is considered gone (killed)."""

DeviceKey = tuple[str, str, str, str]
"""(rank, local_rank, device, gpu_uuid) as label values."""


@dataclasses.dataclass
class ProcessView:
    """A process as a read at ``now`` sees it: its snapshot, and what the time says of it."""

    snapshot: Snapshot
    up: bool
    age_seconds: float
    exit_reason: Optional[str]
    key: Optional[FileKey] = None
    """The snapshot's file, its path and identity (``SpoolState.snapshot_keys``); None where not known."""

    @functools.cached_property
    def rank_labels(self) -> tuple[str, str]:
        return rank_labels(self.snapshot)


def rank_labels(s: Snapshot) -> tuple[str, str]:
    """(rank, local_rank) of a snapshot, as label values."""
    p = s["process"]
    return str(p["rank"]), str(p["local_rank"])


@dataclasses.dataclass
class OomTally:
    events: int = 0
    fatal: int = 0
    recovered: int = 0
    last: Optional[OomEvent] = None


@dataclasses.dataclass
class EventView:
    event: OomEvent
    outcome: str
    """The recorded outcome, except that a pending event of a process that is gone is fatal."""


@dataclasses.dataclass
class Inventory:
    processes: list[ProcessView]
    ooms: dict[DeviceKey, OomTally]
    events: list[EventView]
    skipped_total: dict[str, int]
    readable: bool
    error: Optional[str]
    profiles: list[Profile] = dataclasses.field(default_factory=list)


def device_key(rank: int, local_rank: int, device: int, uuid: str) -> DeviceKey:
    return str(rank), str(local_rank), str(device), uuid


def take_inventory(
    state: SpoolState,
    now: float,
    retention_seconds: float = DEFAULT_RETENTION_SECONDS,
    stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS,
) -> Inventory:
    keys: Sequence[Optional[FileKey]] = state.snapshot_keys
    if len(keys) != len(state.snapshots):  # a state made without them
        keys = [None] * len(state.snapshots)
    all_views = {s["process"]["id"]: _view(s, now, stale_after_seconds, key) for s, key in zip(state.snapshots, keys)}
    processes = _latest_per_rank([v for v in all_views.values() if v.up or v.age_seconds <= retention_seconds])
    ooms: dict[DeviceKey, OomTally] = {}
    for v in processes:
        for dev in v.snapshot["devices"]:
            ooms.setdefault(device_key(*_ranks(v.snapshot), dev["index"], dev["uuid"]), OomTally())
    events = []
    for ev in sorted(state.events, key=lambda e: e["time"]):
        outcome = _effective_outcome(ev, all_views.get(ev["process"]["id"]), now, stale_after_seconds)
        events.append(EventView(ev, outcome))
        p = ev["process"]
        tally = ooms.setdefault(device_key(p["rank"], p["local_rank"], ev["device"], ev["gpu_uuid"]), OomTally())
        tally.events += 1
        tally.fatal += outcome == OUTCOME_FATAL
        tally.recovered += outcome == OUTCOME_RECOVERED
        tally.last = ev
    return Inventory(processes, ooms, events, state.skipped_total, state.readable, state.error, state.profiles)


def _ranks(s: Snapshot) -> tuple[int, int]:
    return s["process"]["rank"], s["process"]["local_rank"]


def _view(s: Snapshot, now: float, stale_after: float, key: Optional[FileKey]) -> ProcessView:
    s = _unique_devices(s)
    if not math.isfinite(s["time"]):
        return ProcessView(s, False, math.inf, "vanished", key)  # no age: gone at once
    if s["time"] > now + stale_after:
        # not a time this clock wrote: never "up" (a dead process would stay up for ever and
        # shadow its rank's restarted process), shown as gone while retention lasts
        return ProcessView(s, False, 0.0, "vanished", key)
    age = max(now - s["time"], 0.0)
    if s["state"] == "exited":
        return ProcessView(s, False, age, s.get("exit_reason") or "exited", key)
    if age > stale_after:
        return ProcessView(s, False, age, "vanished", key)
    return ProcessView(s, True, age, None, key)


def _unique_devices(s: Snapshot) -> Snapshot:
    """The snapshot with each device index once (the first entry wins): no duplicate series."""
    seen: set[int] = set()
    devices: list[DeviceSnapshot] = []
    for d in s["devices"]:
        if d["index"] not in seen:
            seen.add(d["index"])
            devices.append(d)
    return s if len(devices) == len(s["devices"]) else {**s, "devices": devices}


def _latest_per_rank(views: list[ProcessView]) -> list[ProcessView]:
    """One process per (rank, local_rank): a live one over an exited one, then the newest."""
    best: dict[tuple[int, int], ProcessView] = {}
    for v in views:
        key = _ranks(v.snapshot)
        cur = best.get(key)
        if cur is None or (v.up, v.snapshot["time"]) > (cur.up, cur.snapshot["time"]):
            best[key] = v
    return [best[k] for k in sorted(best)]


def _effective_outcome(ev: OomEvent, owner: Optional[ProcessView], now: float, stale_after: float) -> str:
    if ev["outcome"] != OUTCOME_PENDING:
        return ev["outcome"]
    if owner is not None and owner.up:
        return OUTCOME_PENDING
    if owner is None and now - ev["time"] <= stale_after:
        return OUTCOME_PENDING  # its snapshot may not be written yet
    return OUTCOME_FATAL  # the process ended without surviving it
