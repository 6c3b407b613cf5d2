"""Training steps, seen through the global optimizer step hook.

Per step (in the training thread) the hook only counts and takes a timestamp.
Every ``categories_interval_seconds`` it also measures the layout of the models
the job probe saw called (``hook.layout``, found by ``hook.discovery``: every parameter, trainable and frozen,
by its local storage) and of the optimizers it has seen: parameters, gradients and
optimizer state, summed per device, each storage counted once. With ``peaks`` (opt-in) it reads and resets
the allocator peak after each step (its settings group: :class:`~oomsight.config.StepSettings`).
"""

from __future__ import annotations

import gc
import importlib
import time
import weakref
from typing import Any, Callable, Optional

from oomsight.config import StepSettings
from oomsight.hook import layout
from oomsight.hook.cuda import CudaApi
from oomsight.hook.discovery import LiveModels, roots_of
from oomsight.hook.errors import ErrorBook
from oomsight.hook.jobsetup import dominant_dtype
from oomsight.wire.schema import StepInfo, StepPeak


class StepTracker:
    def __init__(
        self,
        settings: StepSettings,
        cuda: CudaApi,
        errors: ErrorBook,
        clock: Callable[[], float] = time.perf_counter,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.cuda = cuda
        self.errors = errors
        self.clock = clock
        self.wall = wall
        self.count = 0
        self.duration_total = 0.0
        self.last_duration: Optional[float] = None
        self.last_step_wall: Optional[float] = None
        self.categories: dict[int, tuple[int, int, int, float]] = {}
        """Per device (parameters, gradients, optimizer state, when measured), from the last walk."""
        self.layout_states: dict[int, dict[str, Any]] = {}
        """Per device the rest of the last walk's ``ModelStates`` keys (frozen, buckets, ...)."""
        self.layout: Optional[layout.Layout] = None
        self.device_type = "cuda"
        """The device type whose tensors are counted (tests count the CPU's)."""
        self.torch: Any = None
        self._roots: list[weakref.ref[Any]] = []
        self.live = LiveModels()
        """Every live model, found through the garbage collector at the walk's cadence (bounded in time)."""
        self.step_peaks: dict[int, StepPeak] = {}
        self.peak_devices: Callable[[], list[int]] = list
        """Set by the hook: the devices whose peaks to read when ``step_peaks`` is on."""
        self.on_step: Optional[Callable[[], None]] = None
        self._last: Optional[float] = None
        self._next_walk = 0.0
        self._optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._handle: Any = None
        self._pre_handle: Any = None
        self._last_optimizer: Any = None
        self.in_step = False
        """True inside ``optimizer.step()`` (between the pre- and post-step hooks)."""
        self.param_dtypes: dict[str, int] = {}
        """Parameter bytes by dtype, from the last walk."""
        self.active = True

    def register(self, torch: Any) -> bool:
        # torch.optim.optimizer is not always an attribute of torch.optim (2.13): import it
        self.torch = torch
        module = importlib.import_module(f"{torch.__name__}.optim.optimizer")
        register = getattr(module, "register_optimizer_step_post_hook", None)
        if register is None:
            return False
        self._handle = register(self.post_step)
        pre = getattr(module, "register_optimizer_step_pre_hook", None)
        if pre is not None:
            self._pre_handle = pre(self.pre_step)
        return True

    def unregister(self) -> None:
        self.active = False
        for handle in (self._handle, self._pre_handle):
            if handle is not None:
                handle.remove()
        self._handle = self._pre_handle = None
        self._last_optimizer = None  # a stopped hook keeps none of the job's objects alive

    def pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The global pre-step hook: one attribute write; the first time, learn the optimizer."""
        self.in_step = True
        if optimizer is not self._last_optimizer:
            self._learn(optimizer)

    def _learn(self, optimizer: Any) -> None:
        self._last_optimizer = optimizer  # most jobs step one optimizer: skip the WeakSet lookup
        if optimizer not in self._optimizers:
            self._optimizers.add(optimizer)
            self._next_walk = 0.0

    @property
    def optimizers(self) -> list[Any]:
        return list(self._optimizers)

    @property
    def roots(self) -> list[Any]:
        """The live models the last scan found (an EMA copy, a teacher never called in a window), then the
        outermost modules the job probe saw called (models: trained, frozen, teachers), alive."""
        return list({id(m): m for m in [*self.live.roots, *(r() for r in self._roots)] if m is not None}.values())

    def set_roots(self, roots: list[Any]) -> None:
        """Learn the models (from the job probe's window); the next step measures them."""
        known = {id(m) for m in self.roots}
        if {id(m) for m in roots} - known:
            self._roots = [weakref.ref(m) for m in {id(m): m for m in [*self.roots, *roots]}.values()]
            self._next_walk = 0.0

    def post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The global post-step hook. Must never raise into the optimizer."""
        if not self.active:
            return
        self.in_step = False
        try:
            now = self.clock()
            if self._last is not None:
                self.last_duration = now - self._last
                self.duration_total += self.last_duration
            self._last = now
            self.count += 1
            self.last_step_wall = self.wall()
            if optimizer is not self._last_optimizer:
                self._learn(optimizer)
            if self.settings.peaks:
                self._read_peaks()
            if now >= self._next_walk:
                self._next_walk = now + self.settings.categories_interval_seconds
                self.walk()
            if self.on_step is not None:
                self.on_step()
        except Exception as exc:
            self.errors.record("step_hook", exc)

    def _read_peaks(self) -> None:
        for index in self.peak_devices():
            r = self.cuda.read(index)
            self.step_peaks[index] = StepPeak(
                allocated_bytes=r.peak_allocated_bytes, reserved_bytes=r.peak_reserved_bytes
            )
            self.cuda.reset_peak(index)

    def walk(self) -> None:
        """Measure parameters (trainable and frozen), gradients and optimizer state per device."""
        if self.torch is None:
            return
        self.live.scan(gc, self.torch.nn.Module)
        found = layout.measure(self.torch, self.roots, list(self._optimizers), self.device_type)
        self.layout = found
        self.param_dtypes = found.dtypes
        stamp = self.wall()
        self.categories = {dev: (t.parameters, t.gradients, t.state, stamp) for dev, t in found.devices.items()}
        self.layout_states = {dev: found.states(dev) for dev in found.devices}

    def walked_at_oom(self, found: layout.Layout) -> None:
        """The layout an OOM's walk measured, in a process that never walked (no optimizer step:
        inference, an evaluation-only process): it stands as the last walk's, so the OOM's job carries
        its parallelism (no sharding advised to an FSDP inference)."""
        if self.layout is None:
            self.layout = found

    def info(self) -> StepInfo:
        return StepInfo(
            count=self.count,
            duration_seconds_total=self.duration_total,
            last_duration_seconds=self.last_duration,
            last_step_time=self.last_step_wall,
        )


def find_live(gc_module: Any, optimizer_type: Any, module_type: Any) -> tuple[list[Any], list[Any]]:
    """(every live optimizer, every live module) in one pass over the garbage collector's objects: at
    an OOM of a process whose models the hook has not seen called yet (before the job probe's first
    window, or inference, which steps no optimizer)."""
    optimizers: list[Any] = []
    modules: list[Any] = []
    for o in gc_module.get_objects():
        t = type(o)  # type(), not isinstance(): no lazy object's __class__ property runs
        if issubclass(t, module_type):
            modules.append(o)
        elif issubclass(t, optimizer_type):
            optimizers.append(o)
    return optimizers, modules


def model_states(
    optimizers: list[Any],
    roots: list[Any],
    torch: Any,
    device: int,
    gc_module: Any,
    device_type: str = "cuda",
    seen: Optional[Callable[[layout.Layout], None]] = None,
) -> Optional[dict[str, Any]]:
    """At an OOM: parameters (trainable and frozen), gradients and optimizer state on ``device``
    (``ModelStates``), from the models and optimizers seen, else from the live ones found through the
    garbage collector; None when there is no parameter at all. ``seen`` gets the layout measured."""
    if not roots or not optimizers:
        live_optimizers, modules = find_live(gc_module, torch.optim.Optimizer, torch.nn.Module)
        optimizers = optimizers or live_optimizers
        roots = roots or roots_of(modules)
    found = layout.measure(torch, roots, optimizers, device_type)
    if seen is not None:
        seen(found)
    if not found.devices:
        return None
    states = found.states(device)
    if not optimizers:
        states["optimizer_state_expected_bytes"] = 0
    return {**states, "optimizers": len(optimizers), "param_dtype": dominant_dtype(found.dtypes)}
