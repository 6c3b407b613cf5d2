"""The background sampler: reads the allocator counters of the devices this process
uses every ``interval_seconds`` and publishes a snapshot every ``publish_interval_seconds``
(its settings group, :class:`~oomsight.config.SamplingSettings`).

A tick costs one ``_cuda_memoryStats`` call per used device (about 20 µs on an
H200) and touches no GPU work, so training never waits for it. NVML is queried
only at publish time.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, Callable, Optional, cast

from oomsight.config import SamplingSettings
from oomsight.hook.cuda import CudaApi, Reading
from oomsight.hook.errors import ErrorBook
from oomsight.hook.nvml import Nvml
from oomsight.wire.fields import STATES_LAYOUT
from oomsight.wire.schema import (
    KIND_SNAPSHOT,
    SCHEMA_VERSION,
    AllocatorSample,
    Categories,
    DeviceSnapshot,
    NvmlSample,
    ProcessInfo,
    Snapshot,
    StepInfo,
)
from oomsight.wire.spool import SpoolWriter, timeline_row

logger = logging.getLogger(__name__)

DISCOVERY_INTERVAL_SECONDS = 5.0
"""How often every visible device is checked for allocator activity."""
TREND_POINTS_PER_WINDOW = 6
"""The between-steps trough trend (leak detection) gets a point every window/6 seconds."""
TREND_POINTS = 64
RECENT_SAMPLES = 128
"""The last readings kept per device (12.8 s at 10 Hz), copied into an OOM event: what memory did
in the seconds before it, also where no optimizer step marks time (evaluation, inference)."""


class DeviceState:
    """What the sampler keeps about one device between publishes."""

    def __init__(self, index: int, uuid: str, name: str, total: int, handle: Any) -> None:
        self.index = index
        self.uuid = uuid
        self.name = name
        self.total = total
        self.limit: Optional[int] = None
        self.nvml_handle = handle
        self.last: Optional[Reading] = None
        self.bucket: Optional[list[int]] = None  # [max allocated, max reserved, min allocated]
        self.marked_peak: Optional[int] = None  # max allocated since mark_peak(), for profiling windows
        self.interval_max: Optional[int] = None  # max allocated since take_interval_max(), for step rows
        self.window: collections.deque[tuple[float, int, int, int]] = collections.deque()
        self.trend: collections.deque[list[float]] = collections.deque(maxlen=TREND_POINTS)
        self.trend_min: Optional[int] = None
        self.trend_started = 0.0
        self.nvml: Optional[NvmlSample] = None
        self.recent: collections.deque[list[float]] = collections.deque(maxlen=RECENT_SAMPLES)
        """[time, allocated_bytes] of the sampler's last ticks."""

    def observe(self, r: Reading) -> None:
        self.last = r
        if self.marked_peak is not None and r.allocated_bytes > self.marked_peak:
            self.marked_peak = r.allocated_bytes
        if self.interval_max is None or r.allocated_bytes > self.interval_max:
            self.interval_max = r.allocated_bytes
        b = self.bucket
        if b is None:
            self.bucket = [r.allocated_bytes, r.reserved_bytes, r.allocated_bytes]
            return
        if r.allocated_bytes > b[0]:
            b[0] = r.allocated_bytes
        if r.reserved_bytes > b[1]:
            b[1] = r.reserved_bytes
        if r.allocated_bytes < b[2]:
            b[2] = r.allocated_bytes

    def take_interval_max(self) -> Optional[int]:
        """The sampled maximum of allocated bytes since the last call (None: no sample since)."""
        value, self.interval_max = self.interval_max, None
        return value

    def roll(self, now: float, window_seconds: float, steps: int) -> tuple[int, int, int]:
        """Close the current bucket; return the window's (peak alloc, peak reserved, min alloc)."""
        if self.bucket is not None:
            b = self.bucket
            self.window.append((now, b[0], b[1], b[2]))
            self.bucket = None
        while self.window and self.window[0][0] < now - window_seconds:
            self.window.popleft()
        if not self.window:
            r = self.last
            assert r is not None
            return r.allocated_bytes, r.reserved_bytes, r.allocated_bytes
        peak_a = max(w[1] for w in self.window)
        peak_r = max(w[2] for w in self.window)
        low_a = min(w[3] for w in self.window)
        self._trend(now, self.window[-1][3], steps, window_seconds / TREND_POINTS_PER_WINDOW)
        return peak_a, peak_r, low_a

    def _trend(self, now: float, bucket_min: int, steps: int, interval: float) -> None:
        self.trend_min = bucket_min if self.trend_min is None else min(self.trend_min, bucket_min)
        if not self.trend_started:
            self.trend_started = now
        if now - self.trend_started >= interval:
            self.trend.append([round(now, 3), float(self.trend_min), float(steps)])
            self.trend_min = None
            self.trend_started = now


class Sampler:
    """Owns the device states, the sampling thread and the snapshot file."""

    def __init__(
        self,
        settings: SamplingSettings,
        cuda: CudaApi,
        nvml: Optional[Nvml],
        writer: SpoolWriter,
        process: ProcessInfo,
        errors: ErrorBook,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.cuda = cuda
        self.nvml = nvml
        self.writer = writer
        self.process = process
        self.errors = errors
        self.clock = clock
        self.devices: dict[int, DeviceState] = {}
        self.main_device: Optional[int] = None
        self.sources: dict[str, bool] = {"allocator": False, "nvml": False}
        self.extra: Callable[[], dict[str, Any]] = dict
        self.before_publish: Callable[[], None] = lambda: None
        """Set by the hook: returns steps, per-device categories and step peaks, sources."""
        self.seq = 0
        self.state = "running"
        self.exit_reason: Optional[str] = None
        self._publish_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._next_discovery = 0.0
        self._next_publish = 0.0

    # ----------------------------------------------------------------- thread
    def start_thread(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="oomsight-sampler", daemon=True)
        self._thread.start()

    def stop_thread(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        interval = self.settings.interval_seconds
        while not self._stop.wait(interval):
            try:
                self.tick()
            except Exception as exc:  # never let the thread die silently
                self.errors.record("sampler", exc)

    # ------------------------------------------------------------ sampling
    def tick(self) -> None:
        """One sample of every used device; publishes when the publish interval is due."""
        if not self.cuda.is_initialized():
            return
        now = self.clock()
        if now >= self._next_discovery:
            self._discover()
            self._next_discovery = now + DISCOVERY_INTERVAL_SECONDS
        ok = True
        for dev in self.devices.values():
            try:
                r = self.cuda.read(dev.index)
                dev.observe(r)
                dev.recent.append([round(now, 3), r.allocated_bytes, r.peak_allocated_bytes, r.allocated_total_bytes])
            except Exception as exc:
                ok = False
                self.errors.record("allocator", exc)
        self.sources["allocator"] = ok and bool(self.devices)
        if now >= self._next_publish:
            self._next_publish = now + self.settings.publish_interval_seconds
            self.publish()

    def _discover(self) -> None:
        for index in range(self.cuda.device_count()):
            if index in self.devices:
                continue
            try:
                r = self.cuda.read(index)
            except Exception as exc:
                self.errors.record("allocator", exc)
                continue
            if index == self.main_device or r.peak_reserved_bytes > 0 or r.device_allocs > 0:
                self._add_device(index, r)

    def _add_device(self, index: int, first: Reading) -> None:
        try:
            uuid, name, total = self.cuda.device_identity(index)
        except Exception as exc:
            self.errors.record("device_identity", exc)
            uuid, name, total = "", "", 0
        handle = self.nvml.handle(uuid, index) if self.nvml is not None else None
        dev = DeviceState(index, uuid, name, total, handle)
        dev.observe(first)
        self.devices[index] = dev

    def device(self, index: int) -> Optional[DeviceState]:
        """The state of a device, added on the spot if the sampler has not seen it yet."""
        if index not in self.devices:
            try:
                self._add_device(index, self.cuda.read(index))
            except Exception as exc:
                self.errors.record("allocator", exc)
                return None
        return self.devices[index]

    def refresh(self) -> None:
        """Read every known device now (before a final or OOM-time publish)."""
        for dev in self.devices.values():
            try:
                dev.observe(self.cuda.read(dev.index))
            except Exception as exc:
                self.errors.record("allocator", exc)

    def mark_peak(self) -> None:
        for dev in self.devices.values():
            dev.marked_peak = dev.last.allocated_bytes if dev.last is not None else 0

    def read_peak(self) -> tuple[int, int]:
        """(device, max sampled allocated bytes since ``mark_peak``) of the main device."""
        self.refresh()
        dev = self.devices.get(self.main_device if self.main_device is not None else -1)
        dev = dev or next(iter(self.devices.values()), None)
        if dev is None:
            return -1, 0
        peak, dev.marked_peak = dev.marked_peak or 0, None
        return dev.index, peak

    def nvml_sample(self, dev: DeviceState) -> Optional[NvmlSample]:
        if self.nvml is None or dev.nvml_handle is None:
            return None
        sample = self.nvml.sample(dev.nvml_handle, self.process["pid"])
        self.sources["nvml"] = sample is not None
        return sample

    def publish_soon(self) -> None:
        """Have the sampler thread publish at its next tick (never blocks the caller)."""
        self._next_publish = 0.0

    # ------------------------------------------------------------ publishing
    def publish(self) -> None:
        """Write the snapshot now (thread-safe; also called on OOM and at exit)."""
        with self._publish_lock:
            try:
                self.before_publish()
            except Exception as exc:
                self.errors.record("requests", exc)
            try:
                doc = self.build()
                self.writer.write_snapshot(doc)
                self.writer.append_timeline(timeline_row(doc))
            except Exception as exc:
                self.errors.record("spool_write", exc, f"check that {self.writer.root} is writable")

    def build(self) -> Snapshot:
        now = self.clock()
        extra = self.extra()
        steps: StepInfo = extra.get("steps") or StepInfo(
            count=0, duration_seconds_total=0.0, last_duration_seconds=None, last_step_time=None
        )
        devices = [
            self._device_doc(dev, now, steps["count"], extra)
            for dev in sorted(self.devices.values(), key=lambda d: d.index)
            if dev.last is not None
        ]
        self.seq += 1
        return Snapshot(
            schema_version=SCHEMA_VERSION,
            kind=KIND_SNAPSHOT,
            process=self.process,
            time=now,
            seq=self.seq,
            state=self.state,
            exit_reason=self.exit_reason,
            devices=devices,
            steps=steps,
            sources={**self.sources, **extra.get("sources", {})},
            errors=dict(self.errors.counts),
            oom_events_unwritten=int(extra.get("oom_events_unwritten", 0)),
            leak=extra.get("leak"),
            batch_advice=extra.get("batch_advice"),
            profiling=extra.get("profiling"),
            job=extra.get("job"),
        )

    def _device_doc(self, dev: DeviceState, now: float, steps: int, extra: dict[str, Any]) -> DeviceSnapshot:
        r = dev.last
        assert r is not None
        peak_a, peak_r, low_a = dev.roll(now, self.settings.window_seconds, steps)
        dev.nvml = self.nvml_sample(dev)
        try:
            dev.limit = self.cuda.memory_limit(dev.index)
        except Exception as exc:
            self.errors.record("memory_limit", exc)
        step_peak = extra.get("step_peaks", {}).get(dev.index)
        doc = DeviceSnapshot(
            index=dev.index,
            uuid=dev.uuid,
            name=dev.name,
            total_bytes=dev.total,
            limit_bytes=dev.limit,
            allocator=cast(
                AllocatorSample,
                {
                    **r._asdict(),  # every counter the Reading carries, by its wire name
                    "window_peak_allocated_bytes": max(peak_a, r.allocated_bytes),
                    "window_peak_reserved_bytes": max(peak_r, r.reserved_bytes),
                    "window_min_allocated_bytes": min(low_a, r.allocated_bytes),
                },
            ),
            nvml=dev.nvml,
            categories=categories_with_activations(
                extra.get("categories", {}).get(dev.index),
                step_peak["allocated_bytes"] if step_peak else None,
                max(peak_a, r.allocated_bytes),
                extra.get("layout_states", {}).get(dev.index),
            ),
            step_peak=step_peak,
            trend=[] if dev.index in extra.get("step_trend", {}) else list(dev.trend),  # judged by the step rows
            steps_memory=extra.get("steps_memory", {}).get(dev.index, []),
            step_trend=extra.get("step_trend", {}).get(dev.index),
            prediction=extra.get("predictions", {}).get(dev.index),
        )
        pile = extra.get("forward_piles", {}).get(dev.index)
        if pile:  # wire 1.7: only where the hook judged one
            doc["forward_pile_bytes"] = pile
        return doc


def categories_with_activations(
    static: Optional[tuple[int, int, int, float]],
    step_peak: Optional[int],
    window_peak: int,
    layout: Optional[Mapping[str, Any]] = None,
) -> Optional[Categories]:
    """Parameters (trainable and frozen), gradients, optimizer state (measured) and activations (the
    peak minus those); ``layout`` adds what the walk found of the parameters' layout."""
    if static is None:
        return None
    params, grads, state, measured_at = static
    peak, basis = (step_peak, "step_peak") if step_peak is not None else (window_peak, "window_peak")
    found = Categories(
        parameters_bytes=params,
        gradients_bytes=grads,
        optimizer_state_bytes=state,
        activations_bytes=max(peak - params - grads - state, 0),
        basis=basis,
        measured_at=measured_at,
    )
    for key, value in (layout or {}).items():
        if key in LAYOUT_KEYS:
            found[key] = value  # type: ignore[literal-required]
    return found


LAYOUT_KEYS = frozenset(f.name for f in STATES_LAYOUT) | {"optimizer_state_expected_bytes"}
"""The keys of a walk's layout that a snapshot's categories carry (``wire.fields.STATES_LAYOUT``)."""
