"""``oomsight.probe_batch_size``: the largest batch that keeps a safety margin, found by
measuring a few small batches and fitting the memory model — not by provoking OOMs.

Lightning's ``BatchSizeFinder`` doubles the batch until it crashes; accelerate's
``find_executable_batch_size`` shrinks it after each crash. This probe runs
``step_fn(batch)`` for doubling batches (each twice: the first run creates optimizer state,
cuBLAS workspaces and cached blocks), records the peak reserved bytes of the second run
until the peaks grow like a line (at small batches the optimizer's temporaries often set
the peak), fits ``peak = fixed + per_sample * batch`` on the last points and answers the batch whose predicted peak
leaves ``margin`` of the capacity free. It then runs that batch once to check; if that
still fails (a model far from linear), it recovers cleanly — frees what the failed step
left — and bisects between the last measured batch and the prediction (a few tries),
never leaving the process in an OOM state.

It resets the allocator's peak counters (``torch.cuda.reset_peak_memory_stats``) while it
runs: you call it explicitly, before training.
"""

from __future__ import annotations

import functools
import gc
import logging
import math
import time
from typing import Any, Callable, Optional

from oomsight.wire.schema import BatchAdvice

logger = logging.getLogger(__name__)

VERIFY_TRIES = 8
MAX_DOUBLINGS = 16
HALF = 0.5
LINEAR_TOLERANCE = 1.5
"""Consecutive doublings whose bytes-per-sample differ by more than this are not yet linear."""


class Memory:
    """The allocator facts the probe needs, over real ``torch.cuda`` (tests pass a fake)."""

    def __init__(self, torch: Any, device: int) -> None:
        self.torch = torch
        self.device = device

    def capacity(self) -> int:
        """Bytes this process could hold: its reserved bytes plus what is free, within any cap."""
        cuda = self.torch.cuda
        free, total = cuda.mem_get_info(self.device)
        usable = int(free) + int(cuda.memory_reserved(self.device))
        get = getattr(cuda, "get_per_process_memory_fraction", None)
        if get is not None and float(get(self.device)) < 1.0:
            usable = min(usable, int(float(get(self.device)) * int(total)))
        return usable

    def measure(self, fn: Callable[[], None]) -> int:
        """Peak reserved bytes while ``fn`` runs."""
        cuda = self.torch.cuda
        cuda.synchronize(self.device)
        cuda.reset_peak_memory_stats(self.device)
        fn()
        cuda.synchronize(self.device)
        return int(cuda.max_memory_reserved(self.device))

    def measure_window(self, fn: Callable[[], None], steps: int) -> tuple[int, int, float]:
        """(peak allocated, peak reserved, seconds per step) over ``steps`` runs of ``fn``."""
        cuda = self.torch.cuda
        cuda.synchronize(self.device)
        cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        cuda.synchronize(self.device)
        seconds = (time.perf_counter() - t0) / steps
        return int(cuda.max_memory_allocated(self.device)), int(cuda.max_memory_reserved(self.device)), seconds

    def release(self) -> None:
        gc.collect()
        self.torch.cuda.empty_cache()

    def is_oom(self, exc: BaseException) -> bool:
        return isinstance(exc, self.torch.cuda.OutOfMemoryError)


class NoCudaDevice(RuntimeError):
    """The measuring functions were called where torch sees no CUDA device."""


def cuda_torch(caller: str) -> Any:
    """``torch``, when it sees a CUDA device; ``NoCudaDevice`` saying what to do otherwise."""
    import torch

    if not torch.cuda.is_available():
        raise NoCudaDevice(
            f"oomsight.{caller} measures a CUDA device and torch sees none here "
            f"(torch {torch.__version__}, torch.cuda.is_available() is False); without a GPU, "
            "oomsight.predict_peak and oomsight.largest_batch predict the same on the CPU"
        )
    return torch


def fit(points: list[tuple[int, int]]) -> tuple[float, float]:
    """Least-squares ``peak = fixed + per_sample * batch``."""
    n = len(points)
    mean_b = sum(b for b, _ in points) / n
    mean_p = sum(p for _, p in points) / n
    var = sum((b - mean_b) ** 2 for b, _ in points)
    per_sample = sum((b - mean_b) * (p - mean_p) for b, p in points) / var if var else 0.0
    return mean_p - per_sample * mean_b, per_sample


def probe_batch_size(
    step_fn: Callable[[int], None],
    start: int = 8,
    points: int = 3,
    margin: float = 0.1,
    max_batch: Optional[int] = None,
    device: int = 0,
    memory: Optional[Any] = None,
) -> BatchAdvice:
    """The largest batch whose peak leaves ``margin`` of the device free.

    ``step_fn(batch)`` must run one complete training step (forward, backward, optimizer
    step, zero_grad) with that batch size.
    """
    if memory is None:
        memory = Memory(cuda_torch("probe_batch_size"), device)
    memory.release()
    capacity = memory.capacity()
    measured = _measure_until_linear(step_fn, memory, start, points, capacity)
    if len(measured) < 2:
        raise RuntimeError(f"probe_batch_size: batches from {start} up did not fit twice; start smaller")
    fixed, per_sample = fit(measured[-points:])
    best = _predict(fixed, per_sample, capacity, margin, max_batch)
    best = _verify(step_fn, memory, best, good=measured[-1][0])
    return BatchAdvice(
        measured_at=time.time(),
        device=device,
        max_batch_size=best,
        margin_ratio=margin,
        capacity_bytes=capacity,
        fixed_bytes=int(fixed),
        bytes_per_sample=per_sample,
        points=[[float(b), float(p)] for b, p in measured],
        source="probe",
    )


def _measure_until_linear(
    step_fn: Callable[[int], None], memory: Any, start: int, points: int, capacity: int
) -> list[tuple[int, int]]:
    """Double the batch from ``start`` until the last ``points`` peaks grow like a line.

    At small batches something else often sets the peak — AdamW's step temporaries, a
    cuBLAS workspace — and the peak does not move with the batch; fitting there would
    predict nonsense. Stops early at half the capacity or at an OOM (recovered).
    """
    measured: list[tuple[int, int]] = []
    batch = start
    for _ in range(MAX_DOUBLINGS):
        peak = _try(memory, functools.partial(_warm_then_measure, step_fn, memory, batch))
        if peak is None:
            break
        measured.append((batch, int(peak)))
        if _linear(measured[-points:], points) or peak > capacity * HALF:
            break
        batch *= 2
    return measured


def _linear(tail: list[tuple[int, int]], points: int) -> bool:
    """Whether the peaks rise and each doubling adds about as much per sample as the last."""
    if len(tail) < points:
        return False
    slopes = [(p1 - p0) / (b1 - b0) for (b0, p0), (b1, p1) in zip(tail, tail[1:])]
    return all(s > 0 for s in slopes) and max(slopes) <= LINEAR_TOLERANCE * min(slopes)


def _warm_then_measure(step_fn: Callable[[int], None], memory: Any, batch: int) -> int:
    # Release first: blocks cached for the previous, smaller batch would otherwise stay in
    # the reserved peak of this one (measured on the H200: twice the true bytes per sample).
    memory.release()
    step_fn(batch)  # creates optimizer state, workspaces and cached blocks of this size
    return int(memory.measure(lambda: step_fn(batch)))


def _predict(fixed: float, per_sample: float, capacity: int, margin: float, max_batch: Optional[int]) -> int:
    if per_sample <= 0:
        return max_batch or 1
    best = math.floor((capacity * (1.0 - margin) - fixed) / per_sample)
    return max(1, min(best, max_batch) if max_batch else best)


def _verify(step_fn: Callable[[int], None], memory: Any, batch: int, good: int) -> int:
    """Run the predicted batch once. If it fails (a model far from linear), recover and bisect
    between the largest measured batch (``good``) and it: at most ``VERIFY_TRIES`` runs."""
    if batch <= good or _try(memory, functools.partial(step_fn, batch)) is not None:
        return batch
    bad = batch
    for _ in range(VERIFY_TRIES):
        if bad - good <= max(1, good // 50):
            break
        mid = (good + bad) // 2
        if _try(memory, functools.partial(step_fn, mid)) is not None:
            good = mid
        else:
            bad = mid
    logger.info("oomsight probe: the linear fit overshot; bisection settled on batch %d", good)
    return good


def _try(memory: Any, fn: Callable[[], Any]) -> Any:
    """Run ``fn``; on an OOM free everything it left behind and return None."""
    try:
        result = fn()
        return True if result is None else result
    except Exception as exc:
        if not memory.is_oom(exc):
            raise
    memory.release()  # outside the except block: the traceback no longer pins the tensors
    return None


def publish(advice: BatchAdvice) -> None:
    """Show the advice in the running hook's snapshot (and so in metrics and reports)."""
    from oomsight.hook import runtime as hook

    running = hook.current()
    if running is not None:
        running.batch_advice = advice
