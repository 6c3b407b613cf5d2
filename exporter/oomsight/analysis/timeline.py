"""Memory over time, per rank and device, from the spool's timelines: what the HTML report
plots, with each panel's capacity, OOM marks and profiling windows. No matplotlib here.

Timeline rows are read from files (untrusted): a row or device entry that is not made of
finite numbers is skipped, and a process id that could name a path outside the spool is
never read.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable
from typing import Any, Optional

from oomsight.analysis.advice import capacity
from oomsight.analysis.inventory import EventView
from oomsight.wire.schema import OUTCOMES, DeviceSnapshot, OomEvent, Profile, Snapshot
from oomsight.wire.spool import SpoolState, read_timeline

_SAFE_ID = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")

PanelKey = tuple[int, int, int]
"""(rank, local_rank, device index)."""


@dataclasses.dataclass
class Segment:
    """One process's timeline on one device: seconds since the report's origin, and bytes."""

    seconds: list[float] = dataclasses.field(default_factory=list)
    allocated_bytes: list[float] = dataclasses.field(default_factory=list)
    reserved_bytes: list[float] = dataclasses.field(default_factory=list)
    window_peak_bytes: list[float] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class MemoryPanel:
    title: str
    segments: list[Segment]
    capacity_bytes: Optional[int]
    capacity_label: str
    ooms: list[tuple[float, str]]
    """(seconds, label) of each OOM on this rank and device."""
    windows: list[tuple[float, float]]
    """(start, end) seconds of each profiling window of this rank on this device."""


def read_all(spool_dir: str, snapshots: Iterable[Snapshot]) -> dict[str, list[list[Any]]]:
    """Every listed process's timeline rows, by process id; unsafe ids are left out."""
    out: dict[str, list[list[Any]]] = {}
    for s in snapshots:
        pid = s["process"]["id"]
        if _SAFE_ID.match(pid) and pid not in out:
            out[pid] = read_timeline(spool_dir, pid)[0]
    return out


def origin(state: SpoolState, timelines: dict[str, list[list[Any]]], default: float) -> float:
    """The earliest time anything in the spool happened: zero on the time axis."""
    times = [float(row[0]) for rows in timelines.values() for row in rows if _finite(row[0])]
    times += [e["time"] for e in state.events] + [p["started_at"] for p in state.profiles]
    return min(times, default=default)


def panels(
    state: SpoolState, events: list[EventView], timelines: dict[str, list[list[Any]]], t0: float
) -> list[MemoryPanel]:
    """One panel per (rank, local rank, device), in that order; OOMs marked with their
    effective outcome (``inventory``: a pending OOM of a process that is gone is fatal)."""
    segments: dict[PanelKey, list[Segment]] = {}
    latest: dict[PanelKey, DeviceSnapshot] = {}
    for s in sorted(state.snapshots, key=lambda s: (s["process"]["started_at"], s["time"])):
        p = s["process"]
        for d in s["devices"]:
            latest[(p["rank"], p["local_rank"], d["index"])] = d
        for device, seg in _segments(timelines.get(p["id"], []), t0).items():
            segments.setdefault((p["rank"], p["local_rank"], device), []).append(seg)
    out = []
    for key in sorted(set(segments) | set(latest)):
        rank, local_rank, device = key
        cap, label = capacity(latest.get(key), events_on(state.events, key))
        out.append(
            MemoryPanel(
                f"rank {rank} (local {local_rank}) cuda:{device}",
                segments.get(key, []),
                cap,
                label,
                [(v.event["time"] - t0, _oom_label(v)) for v in events if _key(v.event) == key],
                [(p["started_at"] - t0, p["ended_at"] - t0) for p in profiles_on(state.profiles, key)],
            )
        )
    return out


def _segments(rows: list[list[Any]], t0: float) -> dict[int, Segment]:
    out: dict[int, Segment] = {}
    for row in rows:
        if not _finite(row[0]):
            continue
        for entry in row[2]:
            if not (isinstance(entry, list) and len(entry) >= 4 and all(_finite(v) for v in entry[:4])):
                continue
            seg = out.setdefault(int(entry[0]), Segment())
            seg.seconds.append(float(row[0]) - t0)
            seg.allocated_bytes.append(float(entry[1]))
            seg.reserved_bytes.append(float(entry[2]))
            seg.window_peak_bytes.append(float(entry[3]))
    return out


def events_on(events: list[OomEvent], key: PanelKey) -> list[OomEvent]:
    return [e for e in events if _key(e) == key]


def _key(e: OomEvent) -> PanelKey:
    return e["process"]["rank"], e["process"]["local_rank"], e["device"]


def _oom_label(v: EventView) -> str:
    return f"OOM {v.outcome if v.outcome in OUTCOMES else 'unknown'}"


def profiles_on(profiles: list[Profile], key: PanelKey) -> list[Profile]:
    return [p for p in profiles if (p["process"]["rank"], p["process"]["local_rank"], p["device"]) == key]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
