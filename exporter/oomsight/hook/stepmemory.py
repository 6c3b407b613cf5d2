"""Step-resolved memory: at optimizer-step boundaries, the floor (allocated right after
``optimizer.step()``) and the step's peak, kept per device as a bounded series indexed by
step. The sampler thread judges each device's rows (``analysis.trend``) once after every new
row and publishes the verdict with only the last row; the training thread only appends.

Torch's peak counters are never reset. The step's peak is exact when the lifetime peak rose
since the previous row (the new lifetime peak happened in between); otherwise it is the
sampler thread's maximum over the interval, a lower bound. One read costs one raw allocator
call (~20 µs on an H200), so rows are taken at most every ``min_interval_seconds``: every
step when steps are slower than that, every k-th step when they are faster.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, TypeVar

from oomsight.analysis import trend
from oomsight.hook import accounting
from oomsight.hook.cuda import CudaApi, Reading
from oomsight.hook.errors import ErrorBook
from oomsight.hook.sampler import Sampler
from oomsight.wire.schema import NvmlSample

T = TypeVar("T")

MAX_ROWS = 256
"""Rows kept per device; when full, the older half is thinned to every other row."""
MIN_INTERVAL_SECONDS = 0.04
"""At most 25 reads a second: 0.05 % of a training thread's time at 20 µs a read."""


def outside_bytes(nvml: Optional[NvmlSample], r: Reading) -> int:
    """This process's memory outside its caching allocator (CUDA context, NCCL, an extension's own
    cudaMalloc) at the sampler's last NVML reading: its own NVML entry minus what the allocator
    reserves; -1 where NVML cannot see this process (another PID namespace)."""
    if nvml is None or not nvml.get("process_visible") or nvml.get("process_used_bytes") is None:
        return -1
    return max(int(nvml["process_used_bytes"] or 0) - r.reserved_bytes, 0)


class RowBook:
    """Rows per device, oldest first, at most ``most`` each: when full, the older half is thinned to
    every other row (the training thread appends; readers take copies). With ``even``, half the book
    is the latest rows and the other half every k-th row before them, k doubling whenever that half
    is full: the rows span the whole run evenly however long it is (the time-to-OOM forecast needs
    hours of history; halving only the older half again and again leaves the first row and the last
    few hundred steps)."""

    def __init__(self, most: int = MAX_ROWS, even: bool = False) -> None:
        self.most = most
        self.even = even
        self._history: dict[int, list[list[Any]]] = {}
        self._stride: dict[int, tuple[int, int]] = {}
        """(every k-th row is kept in the history, rows that left the latest half since)"""
        self.rows: dict[int, list[list[Any]]] = {}
        self.appended: dict[int, int] = {}
        """Rows ever appended per device (a verdict is judged again only after a new one)."""
        self._lifetime: dict[int, int] = {}
        self._judged: dict[int, tuple[tuple[int, int], Any]] = {}

    def new_peak(self, index: int, peak_allocated_bytes: int) -> bool:
        """Whether the allocator's lifetime peak rose since this device's previous read (then the
        peak of what ran in between is exact); the first read counts as one."""
        previous = self._lifetime.get(index)
        self._lifetime[index] = peak_allocated_bytes
        return previous is None or peak_allocated_bytes > previous

    def judged(self, index: int, capacity_bytes: int, judge: Callable[[list[list[float]]], T]) -> T:
        """``judge(rows)`` of a device, judged again only once a row was added or the capacity changed
        (sampler thread: at most once a publish)."""
        stamp = (self.appended.get(index, 0), capacity_bytes)
        kept = self._judged.get(index)
        if kept is not None and kept[0] == stamp:
            return kept[1]  # type: ignore[no-any-return]
        found = judge(self.series(index))
        self._judged[index] = (stamp, found)
        return found

    def append(self, index: int, row: list[Any]) -> None:
        rows = self.rows.setdefault(index, [])
        rows.append(row)
        self.appended[index] = self.appended.get(index, 0) + 1
        if self.even and len(rows) > self.most // 2:
            self._keep(index, rows.pop(0))
        elif len(rows) > self.most:
            half = self.most // 2
            rows[:] = rows[:half:2] + rows[half:]

    def _keep(self, index: int, row: list[Any]) -> None:
        """A row that left the latest half: into the history if it is the k-th."""
        every, passed = self._stride.get(index, (1, 0))
        history = self._history.setdefault(index, [])
        if passed % every == 0:
            history.append(row)
            if len(history) > self.most // 2:
                history[:] = history[::2]
                every, passed = every * 2, 0
        self._stride[index] = (every, passed + 1)

    def series(self, index: int) -> list[list[float]]:
        """The rows of a device, oldest first (a copy: the training thread appends meanwhile)."""
        older = list(self._history.get(index, []))  # list(): one atomic copy under the GIL
        return [list(r) for r in older + list(self.rows.get(index, []))]

    def last(self, index: int) -> list[list[float]]:
        """The last row of a device (a copy), or none."""
        rows = self.rows.get(index)
        return [list(rows[-1])] if rows else []


class RowTaker:
    """What both takers of allocator rows are wired with (the step rows, :class:`StepMemory`; the
    forward rows, ``hook.forwards.ForwardMemory``): the allocator, the sampler's devices, the error book
    and their book of rows; each reads the allocator at most once every ``min_interval_seconds``."""

    def __init__(
        self,
        cuda: CudaApi,
        sampler: Sampler,
        errors: ErrorBook,
        book: RowBook,
        *,
        min_interval_seconds: float,
        clock: Callable[[], float],
        wall: Callable[[], float],
    ) -> None:
        self.cuda = cuda
        self.sampler = sampler
        self.errors = errors
        self.min_interval = min_interval_seconds
        self.clock = clock
        self.wall = wall
        self.book = book
        self._last_read = -float("inf")

    def _due(self) -> bool:
        """Whether a read is due (``min_interval`` since the last one); if it is, it counts as done now."""
        now = self.clock()
        if now - self._last_read < self.min_interval:
            return False
        self._last_read = now
        return True


HELD_RISE_SHARE = 0.05
"""Where the optimizers' count of state entries did not change, the gradients and state held are measured
again when the floor rose by this share since they last were (an optimizer that keeps no state, SGD
without momentum, gets gradients as parameters start to train) ..."""
HELD_MIN_SECONDS = 1.0
"""... at most once a second: one pass over the optimizers' parameters, never every step of a leak."""


class Held:
    """The gradients and optimizer state the job's optimizers hold, per device (``accounting.held``), measured
    again only when the optimizers' count of state entries changed (a layer unfrozen, a param group added)
    or the floor rose (:data:`HELD_RISE_SHARE`): attribute reads and ``len`` at every other row."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.steps: Any = None
        """The hook's ``StepTracker``: its torch, optimizers and device type (None: nothing is known)."""
        self.clock = clock
        self._entries = -1
        self._floors: dict[int, int] = {}
        self._at = -float("inf")
        self.bytes: dict[int, int] = {}

    def known(self, floors: dict[int, int]) -> Optional[dict[int, int]]:
        """Per device the bytes held at a row whose floors are ``floors`` (None: unknown)."""
        steps = self.steps
        if steps is None or steps.torch is None:
            return None
        optimizers = steps.optimizers
        entries = accounting.state_entries(optimizers)
        now = self.clock()
        rose = any(f > self._floors.get(i, 0) * (1 + HELD_RISE_SHARE) for i, f in floors.items())
        if entries != self._entries or (rose and now - self._at >= HELD_MIN_SECONDS):
            self.bytes = accounting.held(steps.torch, optimizers, steps.device_type)
            self._entries, self._floors, self._at = entries, dict(floors), now
        return self.bytes


class StepMemory(RowTaker):
    def __init__(
        self,
        cuda: CudaApi,
        sampler: Sampler,
        errors: ErrorBook,
        min_interval_seconds: float = MIN_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.perf_counter,
        wall: Callable[[], float] = time.time,
    ) -> None:
        book = RowBook(even=True)
        super().__init__(cuda, sampler, errors, book, min_interval_seconds=min_interval_seconds, clock=clock, wall=wall)
        self.held = Held(clock)
        """The gradients and optimizer state held (the hook gives it its step tracker)."""
        self.inputs: Callable[[], int] = lambda: -1
        """The most elements one forward took in since the last row (the hook's forward rows; -1: unknown)."""

    def on_step(self, step: int) -> None:
        """After optimizer step ``step`` (training thread, inside the step hook's guard)."""
        if not self._due():
            return
        stamp = round(self.wall(), 3)
        reads = []
        for dev in list(self.sampler.devices.values()):
            try:
                reads.append((dev, self.cuda.read(dev.index)))
            except Exception as exc:
                self.errors.record("step_memory", exc)
        held = self._held({dev.index: r.allocated_bytes for dev, r in reads})
        elements = self._inputs()
        for dev, r in reads:
            sampled = dev.take_interval_max()
            exact = self.book.new_peak(dev.index, r.peak_allocated_bytes)
            peak = r.peak_allocated_bytes if exact else max(sampled or 0, r.allocated_bytes)
            row = [step, stamp, r.allocated_bytes, peak, r.reserved_bytes, int(exact), outside_bytes(dev.nvml, r)]
            row += [held.get(dev.index, 0) if held is not None else -1, elements]
            self.book.append(dev.index, row)  # ints encode fast

    def _held(self, floors: dict[int, int]) -> Optional[dict[int, int]]:
        """The gradients and optimizer state held per device (wire 1.10), None where unknown."""
        try:
            return self.held.known(floors)
        except Exception as exc:
            self.errors.record("step_memory", exc)
            self.held.steps = None  # once: a job whose optimizers cannot be walked rows without it
            return None

    def _inputs(self) -> int:
        try:
            return int(self.inputs())
        except Exception as exc:
            self.errors.record("step_memory", exc)
            return -1

    def series(self, index: int) -> list[list[float]]:
        return self.book.series(index)

    def last(self, index: int) -> list[list[float]]:
        return self.book.last(index)

    def judged(self, index: int, capacity_bytes: int) -> Optional[trend.Trend]:
        """The verdict on a device's rows (sampler thread; None without rows), judged again only
        once a row was added or the capacity changed: at most once a publish, about 0.2 ms."""
        return self.book.judged(
            index, capacity_bytes, lambda rows: trend.analyse(rows, capacity_bytes) if rows else None
        )
