"""What the framework callbacks log: this process's memory, read from the spool its hook
writes (the same documents the sidecar reads), as flat ``oomsight/...`` numbers.

Every value is a finite float: GiB for memory (what people read in a training log), 0/1
for flags, counts as whole numbers. A value the snapshot does not have (no CUDA device
yet, NVML off, no forecast) is left out, never NaN. The keys (``docs/integrations.md``):

``oomsight/hook_running``            1 when this process's hook has published, else 0
``oomsight/headroom_gib``            memory left at the window peak (the lowest of its devices)
``oomsight/headroom_ratio``          the same as a share of capacity (or of the process cap)
``oomsight/peak_allocated_gib``      lifetime peak of live tensors (the highest device)
``oomsight/peak_reserved_gib``       lifetime peak held by the caching allocator
``oomsight/window_peak_reserved_gib``  sampled peak of the last window (OOMSIGHT_WINDOW_SECONDS)
``oomsight/allocated_gib``, ``oomsight/reserved_gib``  now
``oomsight/step_peak_allocated_gib`` peak of the last optimizer step (opt-in OOMSIGHT_STEP_PEAKS)
``oomsight/leak_suspected``          1 once the hook found tensors holding their graph past a step
``oomsight/oom_events``              CUDA OOMs this process has seen
``oomsight/last_oom_cause/<cause>``  1 for the cause of the newest OOM (leak, fragmentation, ...)
``oomsight/forecast/<name>``         the OOM forecast's numbers, where the snapshot or analysis has one
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Mapping
from typing import Any, Callable, Optional

from oomsight.analysis import trend
from oomsight.metrics.family import headroom_bytes
from oomsight.wire.schema import DeviceSnapshot, OomEvent, Snapshot
from oomsight.wire.spool import SpoolReader

PREFIX = "oomsight/"
GIB = float(1 << 30)
DEFAULT_INTERVAL_SECONDS = 1.0
"""Read the spool at most this often (the hook publishes once a second by default)."""

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Reading:
    values: dict[str, float]
    """Flat ``oomsight/...`` keys, finite floats only."""
    last_oom: Optional[OomEvent] = None
    """The newest OOM event of this process, if any."""


@dataclasses.dataclass(frozen=True)
class Source:
    """Where this process's documents are: the spool and the process id of its hook."""

    spool_dir: str
    process_id: str


def running_hook_source() -> Optional[Source]:
    """The spool and process id of the hook running in this process (None when it is not)."""
    from oomsight.hook import runtime

    hook = runtime.current()
    if hook is None:
        return None
    return Source(hook.settings.spool.dir, str(hook.process["id"]))


def ensure_hook(**settings: Any) -> bool:
    """Start the hook unless it already runs (no second-start warning); True when it runs."""
    from oomsight.hook import runtime

    if runtime.current() is not None:
        return True
    return runtime.start(**settings)


class MemoryReader:
    """Reads this process's snapshot and OOM events; throttled, cached, never raises."""

    def __init__(
        self,
        source: Optional[Source] = None,
        interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        find: Callable[[], Optional[Source]] = running_hook_source,
    ) -> None:
        self.source = source
        self._given = source is not None
        self.interval_seconds = interval_seconds
        self.clock = clock
        self._find = find
        self._reader: Optional[SpoolReader] = None
        self._next = float("-inf")
        self._last = Reading({PREFIX + "hook_running": 0.0})
        self.failures = 0
        """Reads that raised (logged once, then counted): the training loop never sees them."""

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (Lightning's ddp_spawn pickles callbacks): the spool reader, which holds a
        lock, is left behind and made again."""
        state = dict(self.__dict__)
        state.update(_reader=None, _next=float("-inf"))
        return state

    def read(self, force: bool = False) -> Reading:
        now = self.clock()
        if not force and now < self._next:
            return self._last
        self._next = now + self.interval_seconds
        try:
            self._last = self._read()
        except Exception as exc:
            self.failures += 1
            if self.failures == 1:
                logger.warning("oomsight: cannot read the spool for the training log (%s); values stay stale", exc)
        return self._last

    def _read(self) -> Reading:
        source = self.source if self._given else self._find()  # a restarted hook has a new process id
        if source is None:
            return Reading({PREFIX + "hook_running": 0.0})
        if self._reader is None or self._reader.root != source.spool_dir:
            self._reader = SpoolReader(source.spool_dir)
        state = self._reader.read()
        mine = [s for s in state.snapshots if s["process"]["id"] == source.process_id]
        events = sorted((e for e in state.events if e["process"]["id"] == source.process_id), key=lambda e: e["seq"])
        values = {PREFIX + "hook_running": 1.0 if mine else 0.0}
        if mine:
            values.update(snapshot_values(mine[0]))
        values.update(oom_values(events))
        return Reading(values, events[-1] if events else None)


def snapshot_values(s: Snapshot) -> dict[str, float]:
    """The memory numbers of one snapshot (see the module doc for the keys)."""
    out: dict[str, Optional[float]] = {PREFIX + "leak_suspected": 1.0 if s.get("leak") else 0.0}
    devices = s["devices"]
    if devices:
        out.update(_device_values(devices))
        out.update(forecast_values(s))
    return {k: float(v) for k, v in out.items() if v is not None and _finite(v)}


def _device_values(devices: list[DeviceSnapshot]) -> dict[str, Optional[float]]:
    def top(key: str) -> float:
        return int(max(d["allocator"][key] for d in devices)) / GIB  # type: ignore[literal-required]

    rooms = [(headroom_bytes(d), d.get("limit_bytes") or _capacity(d)) for d in devices]
    known = [(room, cap) for room, cap in rooms if room is not None]
    peaks = [d["step_peak"]["allocated_bytes"] for d in devices if d.get("step_peak")]  # type: ignore[index]
    values: dict[str, Optional[float]] = {
        PREFIX + "peak_allocated_gib": top("peak_allocated_bytes"),
        PREFIX + "peak_reserved_gib": top("peak_reserved_bytes"),
        PREFIX + "window_peak_reserved_gib": top("window_peak_reserved_bytes"),
        PREFIX + "allocated_gib": top("allocated_bytes"),
        PREFIX + "reserved_gib": top("reserved_bytes"),
        PREFIX + "step_peak_allocated_gib": max(peaks) / GIB if peaks else None,
    }
    if known:
        room, cap = min(known, key=lambda rc: rc[0])
        values[PREFIX + "headroom_gib"] = room / GIB
        values[PREFIX + "headroom_ratio"] = room / cap if cap else None
    return values


def _capacity(d: DeviceSnapshot) -> Optional[int]:
    nv = d["nvml"]
    return nv["total_bytes"] if nv is not None else d.get("total_bytes") or None


def oom_values(events: list[OomEvent]) -> dict[str, float]:
    out = {PREFIX + "oom_events": float(len(events))}
    if events:
        out[f"{PREFIX}last_oom_cause/{events[-1]['diagnosis']['cause']}"] = 1.0
    return out


def forecast_values(s: Snapshot) -> dict[str, float]:
    """The OOM forecast of the step-resolved memory (``analysis.trend``): steps and seconds to
    OOM and the floor's slope, the soonest over the process's devices. Nothing without a rise."""
    found: dict[str, float] = {}
    for d in s["devices"]:
        t = trend.device_verdict(d)
        if t is None:
            continue
        raw = {
            "steps": t["steps_to_oom"],
            "seconds": t["seconds_to_oom"],
            "floor_slope_bytes_per_step": t["floor_slope_bytes"],
        }
        for name, value in _numbers(raw).items():
            key = f"{PREFIX}forecast/{name}"
            found[key] = min(found.get(key, value), value)  # the soonest, the least room
    return found


def _numbers(raw: Any) -> dict[str, float]:
    if isinstance(raw, Mapping):
        return {str(k): float(v) for k, v in raw.items() if _finite(v)}
    if _finite(raw):
        return {"value": float(raw)}
    return {}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def describe_oom(event: OomEvent) -> str:
    d = event["diagnosis"]
    remedy = f" First remedy: {d['remedies'][0]}" if d["remedies"] else ""
    return (
        f"oomsight: CUDA out of memory on cuda:{event['device']} at step {event['step']} "
        f"({event['outcome']}): {d['cause']}: {d['summary']}{remedy}"
    )


class LogFeed:
    """What a framework callback needs: start the hook once, then the values to log, and one
    warning per new OOM with its cause (the numbers carry it as ``last_oom_cause/<cause>``)."""

    def __init__(self, reader: Optional[MemoryReader] = None, settings: Optional[dict[str, Any]] = None) -> None:
        self.reader = reader or MemoryReader()
        self.settings = dict(settings or {})
        self.hook_started: Optional[bool] = None
        self._told: set[tuple[str, int]] = set()

    def start(self) -> bool:
        if self.hook_started is None:
            self.hook_started = ensure_hook(**self.settings)
        return self.hook_started

    def values(self, force: bool = False) -> dict[str, float]:
        reading = self.reader.read(force)
        ev = reading.last_oom
        if ev is not None and (ev["process"]["id"], ev["seq"]) not in self._told:
            self._told.add((ev["process"]["id"], ev["seq"]))
            logger.warning("%s", describe_oom(ev))
        return dict(reading.values)
