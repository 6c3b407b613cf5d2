"""Training steps, seen through the global optimizer step hook.

Per step (in the training thread) the hook only counts and takes a timestamp.
Every ``categories_interval_seconds`` it also walks the tensors of the
optimizers it has seen: parameters, gradients and optimizer state, summed per
device, each storage counted once. With ``peaks`` (opt-in) it reads and resets
the allocator peak after each step (its settings group: :class:`~oomsight.config.StepSettings`).
"""

from __future__ import annotations

import importlib
import time
import weakref
from typing import Any, Callable, Optional

from oomsight.config import StepSettings
from oomsight.hook.cuda import CudaApi
from oomsight.hook.errors import ErrorBook
from oomsight.hook.jobsetup import dominant_dtype
from oomsight.wire.schema import StepInfo, StepPeak

PARAMS, GRADS, STATE = 0, 1, 2


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
        """Sum parameter, gradient and optimizer-state bytes per CUDA device."""
        totals, dtypes, _expected = walk_optimizers(list(self._optimizers))
        self.param_dtypes = dtypes
        stamp = self.wall()
        self.categories = {dev: (t[0], t[1], t[2], stamp) for dev, t in totals.items()}

    def info(self) -> StepInfo:
        return StepInfo(
            count=self.count,
            duration_seconds_total=self.duration_total,
            last_duration_seconds=self.last_duration,
            last_step_time=self.last_step_wall,
        )


def _add(t: Any, slot: int, totals: dict[int, list[int]], seen: set[tuple[int, int]]) -> int:
    """Add ``t``'s storage bytes to its device's ``slot``; the bytes added (0: seen or not CUDA)."""
    if not getattr(t, "is_cuda", False):
        return 0
    index = t.device.index
    try:
        storage = t.untyped_storage()
        key, size = (index, storage.data_ptr()), storage.nbytes()
    except Exception:  # tensor subclasses without a plain storage (e.g. DTensor)
        key, size = (index, id(t)), t.numel() * t.element_size()
    if key in seen:
        return 0
    seen.add(key)
    totals.setdefault(index, [0, 0, 0])[slot] += size
    return int(size)


STATE_FACTORS = {"Adam": 2, "AdamW": 2, "NAdam": 2, "RAdam": 2, "Adamax": 2, "Adadelta": 2, "Rprop": 2, "Adagrad": 1}
"""Optimizer state per parameter byte, by class: Adam keeps exp_avg and exp_avg_sq, ..."""


def state_factor(opt: Any) -> Optional[float]:
    """Expected optimizer-state bytes per trainable parameter byte; None for an unknown kind."""
    groups = getattr(opt, "param_groups", [{}])
    for cls in type(opt).__mro__:
        name = cls.__name__
        if name in STATE_FACTORS:
            return STATE_FACTORS[name] + (1 if any(g.get("amsgrad") for g in groups) else 0)
        if name == "SGD":
            return 1.0 if any(g.get("momentum") for g in groups) else 0.0
        if name == "RMSprop":
            return 1.0 + any(g.get("momentum") for g in groups) + any(g.get("centered") for g in groups)
    return None


def walk_optimizers(optimizers: list[Any]) -> tuple[dict[int, list[int]], dict[str, int], dict[int, Optional[int]]]:
    """(per device [params, grads, state] bytes, parameter bytes by dtype, per device expected state)."""
    totals: dict[int, list[int]] = {}
    dtypes: dict[str, int] = {}
    expected: dict[int, Optional[int]] = {}
    seen: set[tuple[int, int]] = set()
    for opt in optimizers:
        factor = state_factor(opt)
        for group in opt.param_groups:
            for p in group["params"]:
                size = _add(p, PARAMS, totals, seen)
                if size:
                    key = str(getattr(p, "dtype", "unknown")).replace("torch.", "")
                    dtypes[key] = dtypes.get(key, 0) + size
                    index = p.device.index
                    if factor is None or expected.get(index, 0) is None:
                        expected[index] = None
                    elif getattr(p, "requires_grad", True):
                        expected[index] = (expected.get(index) or 0) + int(factor * size)
                if p.grad is not None:
                    _add(p.grad, GRADS, totals, seen)
        for state in opt.state.values():
            for value in state.values():
                if hasattr(value, "untyped_storage"):
                    _add(value, STATE, totals, seen)
    return totals, dtypes, expected


def find_live(gc_module: Any, optimizer_type: Any, parameter_type: Any) -> tuple[list[Any], list[Any]]:
    """(every live optimizer, every live parameter) in one pass over the garbage collector's
    objects: at an OOM of a process that has stepped no optimizer (before the first step, or
    inference, which has none)."""
    optimizers: list[Any] = []
    parameters: list[Any] = []
    for o in gc_module.get_objects():
        t = type(o)  # type(), not isinstance(): no lazy object's __class__ property runs
        if issubclass(t, parameter_type):
            parameters.append(o)
        elif issubclass(t, optimizer_type):
            optimizers.append(o)
    return optimizers, parameters


def model_states(optimizers: list[Any], torch: Any, device: int, gc_module: Any) -> Optional[dict[str, Any]]:
    """At an OOM: parameters, gradients and optimizer state on ``device`` (``ModelStates``), from the
    optimizers seen stepping, else from the live ones, else from the live parameters (no optimizer:
    inference); None when there is no parameter at all."""
    parameters: list[Any] = []
    if not optimizers:
        optimizers, parameters = find_live(gc_module, torch.optim.Optimizer, torch.nn.Parameter)
    walked = optimizers or ([Unstepped(parameters)] if parameters else [])
    if not walked:
        return None
    totals, dtypes, expected = walk_optimizers(walked)
    params, grads, state = totals.get(device, [0, 0, 0])
    return {
        "parameters_bytes": params,
        "gradients_bytes": grads,
        "optimizer_state_bytes": state,
        "optimizer_state_expected_bytes": expected.get(device) if optimizers else 0,
        "optimizers": len(optimizers),
        "param_dtype": dominant_dtype(dtypes),
    }


class Unstepped:
    """Parameters that no optimizer holds, walked like an optimizer's (``walk_optimizers``)."""

    def __init__(self, parameters: list[Any]) -> None:
        self.param_groups = [{"params": parameters}]
        self.state: dict[Any, Any] = {}
