"""``oomsight.predict_peak``: a training step's peak CUDA memory, predicted without a GPU.

A trace of the step on fake tensors (``tracing``) gives the order of every allocation and
free; the caching-allocator model (``oomsight.predict.allocator``) replays it into what
``torch.cuda.max_memory_allocated()`` and ``max_memory_reserved()`` would report, and the
live bytes by category at the peak. ``largest_batch`` searches the batch size whose step
still fits under a capacity less a margin — fitting meaning what the allocator itself
decides: under a cap torch returns cached segments before it fails, so the allocated peak
must fit, less a margin for the fragmentation it cannot undo (``DEFAULT_MARGIN``).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Optional

from oomsight.predict.allocator import CachingAllocator, SimulatedOom

CUBLAS_WORKSPACE_SM90 = 4096 * 1024 * 8
"""cuBLAS workspace per handle and stream on compute capability 9.0 (H100, H200): 32 MiB
(``CublasHandlePool.cpp``); measured on the H200 in ``benchmarks/results/predict.json``."""
CUBLAS_WORKSPACE_OTHER = 4096 * 1024 * 2 + 16 * 1024 * 8
"""The default elsewhere: ``CUBLAS_WORKSPACE_CONFIG=:4096:2:16:8`` (8.125 MiB)."""
DEFAULT_MARGIN = 0.10
"""Share of the capacity a batch must leave free. Under a cap the allocator returns cached
segments before it fails, so what decides is the allocated peak and the fragmentation it
cannot undo: on the H200 the first failing batch's allocated peak was 90-100 % of the cap
(``benchmarks/results/predict.json``, ``pressure``)."""


@dataclass(frozen=True)
class Prediction:
    """What one batch size's training step is predicted to need."""

    batch_size: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    by_category_bytes: dict[str, int]
    """Live bytes of each category at the moment of the peak allocated."""
    step_peak_allocated_bytes: list[int]
    steps: int
    expandable_segments: bool
    workspace_bytes: int
    seconds: float
    fits: Optional[bool] = None
    """With a capacity: whether the peak allocated stays within it (see ``DEFAULT_MARGIN``)."""
    oom_in_replay: Optional[bool] = None
    """With a capacity: whether the allocator model, replayed under it as a cap, ran out
    (a stricter test than the real allocator turned out to be: docs/prediction.md)."""
    notes: list[str] = field(default_factory=list)
    moments: dict[str, Any] = field(default_factory=dict)
    """The step's moments apart: ``forward_backward`` (its peak allocated and the live bytes by category
    then, outside every optimizer step) and ``optimizer_step_transient_bytes`` (the most an
    ``optimizer.step()`` allocates above what was alive when it began: its foreach temporaries)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BatchSearch:
    """The largest batch whose step fits under ``capacity_bytes * (1 - margin)``."""

    max_batch_size: int
    capacity_bytes: int
    margin: float
    prediction: Optional[Prediction]
    tried: list[tuple[int, bool]]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def workspace_default(capability: Optional[tuple[int, int]]) -> int:
    """cuBLAS workspace bytes per handle: ``CUBLAS_WORKSPACE_CONFIG`` if set, else the default of the arch."""
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG", "")
    pairs = re.findall(r":(\d+):(\d+)", config)
    if pairs:
        return sum(int(kib) * 1024 * int(count) for kib, count in pairs)
    return CUBLAS_WORKSPACE_SM90 if capability == (9, 0) else CUBLAS_WORKSPACE_OTHER


def expandable_default() -> bool:
    """Whether ``PYTORCH_CUDA_ALLOC_CONF`` (or ``PYTORCH_ALLOC_CONF``) turns expandable segments on."""
    conf = os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or ""
    return bool(re.search(r"expandable_segments\s*:\s*true", conf, re.IGNORECASE))


def replay(trace: Any, cap: Optional[int] = None, expandable: bool = False) -> dict[str, Any]:
    """Replay a trace through the allocator model: peaks, per-step peaks, categories at the peak."""
    from oomsight.predict.tracing import HOST

    alloc = CachingAllocator(cap=cap, expandable_segments=expandable)
    handles: dict[int, int] = {}
    sizes: dict[int, int] = {}
    peak_at, step_peaks, step_max, oom = -1, [], 0, False
    ends = set(trace.step_ends)
    windows = getattr(trace, "optimizer_windows", [])
    in_step = _in_optimizer_step(len(trace.events), windows)
    level: list[int] = []  # allocated after each event
    held = _StatesHeld(trace)
    for i, (aid, size) in enumerate(trace.events):
        if aid > 0:
            if trace.categories.get(aid) == HOST:
                level.append(alloc.stats.allocated)
                continue
            before = alloc.stats.peak_allocated
            try:
                handles[aid] = alloc.malloc(size)
            except SimulatedOom:
                oom = True
                break
            sizes[aid] = size
            held.born(aid, size)
            step_max = max(step_max, alloc.stats.allocated)
            if alloc.stats.peak_allocated > before:
                peak_at = i
        elif -aid in handles:
            alloc.free(handles.pop(-aid))
            held.died(-aid, sizes[-aid])
        level.append(alloc.stats.allocated)
        if not in_step[i]:
            held.seen(i, alloc.stats.allocated)
        if i + 1 in ends:
            step_peaks.append(step_max)
            step_max = alloc.stats.allocated
    return {
        "peak_allocated": alloc.stats.peak_allocated,
        "peak_reserved": alloc.stats.peak_reserved,
        "step_peaks": step_peaks,
        "by_category": _live_by_category(trace, sizes, peak_at),
        "oom": oom,
        "moments": {
            "peak_in_optimizer_step": bool(0 <= peak_at < len(in_step) and in_step[peak_at]),
            "forward_backward": _forward_backward(trace, level, sizes, in_step),
            "optimizer_step_transient_bytes": _optimizer_step_transient(level, windows),
            "last_step": _last_step(trace, level, sizes),
            "outside_states": held.moments(lambda at: _live_by_category(trace, sizes, at)),
        },
    }


def _in_optimizer_step(events: int, windows: list[tuple[int, int]]) -> list[bool]:
    """Per event (and one past the last): whether it falls inside an optimizer step's window."""
    in_step = [False] * (events + 1)
    for first, end in windows:
        in_step[first:end] = [True] * (end - first)
    return in_step


def _forward_backward(trace: Any, level: list[int], sizes: dict[int, int], in_step: list[bool]) -> dict[str, Any]:
    """The highest moment outside every optimizer step: its allocated bytes and their categories."""
    outside = [i for i in range(len(level)) if not in_step[i]]
    fb_at = max(outside, key=lambda i: level[i]) if outside else -1
    return {
        "peak_allocated_bytes": level[fb_at] if fb_at >= 0 else 0,
        "by_category_bytes": _live_by_category(trace, sizes, fb_at),
    }


def _optimizer_step_transient(level: list[int], windows: list[tuple[int, int]]) -> int:
    """The largest rise of allocated bytes inside an optimizer step over the level just before it."""
    transient = 0
    # a later step's rise only: the first one's also makes the optimizer's state, which a layout counts apart
    for first, end in windows[1:] or windows:
        inside = level[first:end]
        if inside:
            transient = max(transient, max(inside) - (level[first - 1] if first else 0))
    return transient


STATES = ("parameters", "gradients", "optimizer_state")
"""The model states: what a sharded layout lays out anew on each rank; the rest of a moment (activations,
temporaries, workspaces, buffers) is the same micro-batch's on every rank."""


class _StatesHeld:
    """Outside every optimizer step, the moments where what is not a model state (``rest``: activations,
    temporaries, workspaces, buffers) is highest beside the gradients a layout keeps of it: none (ZeRO-2/3
    with every gradient reduced: ``rest``), the one gradient not yet moved into a reduce bucket (ZeRO-2/3:
    ``rest_and_one_gradient``, the largest gradient at most) and all of them (ZeRO-1: ``rest_and_gradients``).
    A layout takes its own moment, so the loss backward (every activation and the logits' gradients alive,
    no gradient yet) is not hidden behind a one-GPU peak late in the backward where gradients pile up."""

    def __init__(self, trace: Any) -> None:
        self.category = trace.categories
        grads = [size for aid, size in trace.events if aid > 0 and trace.categories.get(aid) == STATES[1]]
        self.largest_gradient = max(grads, default=0)
        self.states = 0
        self.gradients = 0
        self.best: dict[str, tuple[int, int, int, int]] = {}  # name: (value, event, rest, gradients)

    def born(self, aid: int, size: int) -> None:
        self._count(aid, size)

    def died(self, aid: int, size: int) -> None:
        self._count(aid, -size)

    def _count(self, aid: int, size: int) -> None:
        cat = self.category.get(aid)
        if cat in STATES:
            self.states += size
            if cat == STATES[1]:
                self.gradients += size

    def seen(self, at: int, allocated: int) -> None:
        rest, grads = allocated - self.states, self.gradients
        for name, value in (("rest", rest), ("rest_and_one_gradient", rest + min(grads, self.largest_gradient)),
                            ("rest_and_gradients", rest + grads)):  # fmt: skip
            if value > self.best.get(name, (-1,))[0]:
                self.best[name] = (value, at, rest, grads)

    def moments(self, by_category: Callable[[int], dict[str, int]]) -> dict[str, Any]:
        found: dict[str, Any] = {"largest_gradient_bytes": self.largest_gradient}
        for name, (_value, at, rest, grads) in self.best.items():
            found[name] = {"rest_bytes": rest, "gradients_bytes": grads, "by_category_bytes": by_category(at)}
        return found


def _last_step(trace: Any, level: list[int], sizes: dict[int, int]) -> dict[str, Any]:
    """The last step's moments: the most allocated in its forward, at the start of its (last) backward,
    the most in its backward, the most in its optimizer step; the live bytes by category at the
    backward's start."""
    if not trace.backward_starts or not level:
        return {}
    ends = [0, *trace.step_ends]
    first = ends[-2] if len(ends) > 1 and ends[-2] < len(level) else 0
    bwd = max((b for b in trace.backward_starts if b <= len(level)), default=-1)
    if bwd < 0:  # a replay that ran out before any backward
        return {}
    opt = [w for w in trace.optimizer_windows if w[0] >= bwd]
    end_bwd = opt[0][0] if opt else len(level)
    at = max(bwd - 1, 0)
    return {
        "forward_peak_bytes": max(level[first:bwd], default=0),
        "backward_start_bytes": level[at],
        "backward_peak_bytes": max(level[bwd:end_bwd], default=0),
        "optimizer_peak_bytes": max(level[opt[0][0] : opt[0][1]], default=0) if opt else 0,
        "backward_start_by_category_bytes": _live_by_category(trace, sizes, at),
    }


def _live_by_category(trace: Any, sizes: dict[int, int], upto: int) -> dict[str, int]:
    """The bytes by category alive just after event ``upto``."""
    from oomsight.predict.tracing import TEMPORARIES

    live: dict[int, int] = {}
    for aid, size in trace.events[: upto + 1]:
        if aid > 0 and aid in sizes:
            live[aid] = size
        elif aid < 0:
            live.pop(-aid, None)
    by_category: dict[str, int] = {}
    for aid, size in live.items():
        cat = trace.categories.get(aid, TEMPORARIES)
        by_category[cat] = by_category.get(cat, 0) + size
    return dict(sorted(by_category.items()))


def predict_peak(
    model: Callable[[], Any],
    batch: Callable[[int], Any],
    batch_size: int,
    optimizer: Optional[Callable[[Any], Any]] = None,
    step: Optional[Callable[[Any, Any, Any], Any]] = None,
    *,
    autocast: Any = None,
    accumulation: int = 1,
    keep_outputs: bool = False,
    steps: int = 3,
    capacity: Optional[int] = None,
    expandable_segments: Optional[bool] = None,
    workspace_bytes: Optional[int] = None,
    capability: Optional[tuple[int, int]] = (9, 0),
    materializer: Any = None,
    host_states: bool = False,
) -> Prediction:
    """Predict the peak memory of ``steps`` training steps at ``batch_size``.

    ``model()`` builds the model (it runs on the meta device: no weights are made);
    ``batch(batch_size)`` makes one input (a tensor, tuple or dict; on the default device);
    ``optimizer(model.parameters())`` builds the optimizer (default ``torch.optim.AdamW``);
    ``step(model, batch, optimizer)`` runs one step (default: forward — under
    ``torch.autocast("cuda", autocast)`` when given — backward on ``.loss`` or the output's
    mean, ``accumulation`` micro-batches, ``optimizer.step()``, ``zero_grad(set_to_none=True)``;
    ``keep_outputs``: the outputs kept until the next forward returns, as a hand-written loop keeps them).
    """
    import torch

    from oomsight.predict import tracing

    started = time.perf_counter()
    make_opt = optimizer or torch.optim.AdamW
    step_fn = step or tracing.default_step(accumulation=accumulation, autocast=autocast, keep_outputs=keep_outputs)
    expandable = expandable_default() if expandable_segments is None else expandable_segments
    workspace = workspace_default(capability) if workspace_bytes is None else workspace_bytes
    trace = _traced(
        capability,
        model,
        lambda: batch(batch_size),
        lambda m: make_opt(m.parameters()),
        step_fn,
        steps=steps,
        workspace_bytes=workspace,
        materializer=materializer,
        host_states=host_states,
    )
    return _replayed(trace, batch_size, steps, capacity, expandable, workspace, started)


def _replayed(
    trace: Any, batch_size: int, steps: int, capacity: Optional[int], expandable: bool, workspace: int, started: float
) -> Prediction:
    """The prediction of a trace: replayed through the allocator model (and again under ``capacity``)."""
    result = replay(trace, expandable=expandable)
    fits = None if capacity is None else result["peak_allocated"] <= capacity
    oom = None if capacity is None else bool(replay(trace, cap=capacity, expandable=expandable)["oom"])
    return Prediction(
        batch_size=batch_size,
        peak_allocated_bytes=result["peak_allocated"],
        peak_reserved_bytes=result["peak_reserved"],
        by_category_bytes=dict(sorted(result["by_category"].items())),
        step_peak_allocated_bytes=result["step_peaks"],
        steps=steps,
        expandable_segments=expandable,
        workspace_bytes=workspace,
        seconds=round(time.perf_counter() - started, 3),
        fits=fits,
        oom_in_replay=oom,
        notes=trace.notes,
        moments=result["moments"],
    )


def _traced(capability: Optional[tuple[int, int]], *args: Any, **kwargs: Any) -> Any:
    """``tracing.trace_steps`` with the attention kernels that ``capability`` selects emulated."""
    from oomsight.predict import emulation, tracing

    emulated = emulation.CAPABILITY.set(capability or (9, 0))
    try:
        return tracing.trace_steps(*args, **kwargs)
    finally:
        emulation.CAPABILITY.reset(emulated)


def affine_search(
    measure: Callable[[int], tuple[int, int]], budget: int, start: int = 1, limit: int = 1 << 20
) -> tuple[int, dict[int, bool]]:
    """The largest batch ``b`` whose judged bytes ``measure(b)[1]`` fit ``budget``, and every batch tried.

    ``measure(b)`` is one trace: ``(line bytes, judged bytes)``. The line (the forward/backward
    moment's peak, in the judged units) is affine in the batch where activations grow with it; the
    optimizer step's moment, constant in the batch, decides only where it is above the line. Two
    traces (``start``, then twice it where it fits, else half) give the line, a third traces the batch
    where it meets the budget and a fourth the batch beside it: four traces. Where the check fails
    (memory is not affine there) the line is redrawn once through the two nearest tries, and the
    bracket left is bisected."""
    tried: dict[int, tuple[int, int]] = {}

    def fits(b: int) -> bool:
        if b not in tried:
            tried[b] = measure(b)
        return tried[b][1] <= budget

    def bounds() -> tuple[int, Optional[int]]:
        good = max((b for b in tried if tried[b][1] <= budget), default=0)
        bad = min((b for b in tried if tried[b][1] > budget and b > good), default=None)
        return good, bad

    lo = max(1, min(start, limit))
    fits(lo)  # the first trace; the second on the side of it where the budget lies
    fits(min(limit, 2 * lo) if tried[lo][1] <= budget else max(1, lo // 2))
    good, bad = bounds()
    for _ in range(2):  # the line through the two tries nearest the bracket, to where it meets the budget
        if bad is not None and bad - good <= 1:
            break
        a, b = sorted(sorted(tried, key=lambda x: min(abs(x - good), abs(x - (bad or good))))[:2])
        slope = (tried[b][0] - tried[a][0]) / (b - a) if b != a else 0.0
        if slope <= 0:
            break
        guess = int(b + (budget - tried[b][0]) / slope)
        guess = max(good + 1, min(bad - 1 if bad is not None else limit, guess))
        if fits(guess):  # then the batch above it, the other side of the answer
            if guess + 1 <= limit and (bad is None or guess + 1 < bad):
                fits(guess + 1)
        elif guess - 1 > good:
            fits(guess - 1)
        good, bad = bounds()
    while bad is None and good < limit:  # nothing tried failed yet: double until one does
        bad = min(limit, 2 * max(good, 1))
        if fits(bad):
            good, bad = bad, None
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good, {b: v[1] <= budget for b, v in tried.items()}


def largest_batch(
    model: Callable[[], Any],
    batch: Callable[[int], Any],
    capacity: int,
    optimizer: Optional[Callable[[Any], Any]] = None,
    step: Optional[Callable[[Any, Any, Any], Any]] = None,
    *,
    margin: float = DEFAULT_MARGIN,
    start: int = 1,
    limit: int = 1 << 20,
    judge: str = "allocated",
    known: Optional[dict[int, Prediction]] = None,
    **kwargs: Any,
) -> BatchSearch:
    """The largest batch whose predicted peak fits ``capacity * (1 - margin)``: the peak allocated, or
    with ``judge="reserved"`` the peak reserved (what runs out, with the CUDA context outside it).

    ``affine_search``: two predictions give the line peak = fixed + per-sample x batch, a third and a
    fourth check the batch where it meets the budget and the one above (each a traced prediction;
    ``known``: predictions already made, by batch, traced again only for their verdict)."""
    started = time.perf_counter()
    budget = int(capacity * (1.0 - margin))
    tried: dict[int, Prediction] = {}
    for b, p in (known or {}).items():
        judged = p.peak_reserved_bytes if judge == "reserved" else p.peak_allocated_bytes
        tried[b] = replace(p, fits=judged <= budget)

    def measure(b: int) -> tuple[int, int]:
        if b not in tried:
            tried[b] = predict_peak(model, batch, b, optimizer, step, capacity=budget, **kwargs)
        p = tried[b]
        reserved = judge == "reserved"
        slack = p.peak_reserved_bytes - p.peak_allocated_bytes if reserved else 0
        line = int((p.moments.get("forward_backward") or {}).get("peak_allocated_bytes", p.peak_allocated_bytes))
        return line + slack, p.peak_reserved_bytes if reserved else p.peak_allocated_bytes

    good, fitted = affine_search(measure, budget, start, limit)
    best = tried.get(good)
    return BatchSearch(
        max_batch_size=good,
        capacity_bytes=capacity,
        margin=margin,
        prediction=best,
        tried=sorted(fitted.items()),
        seconds=round(time.perf_counter() - started, 3),
    )
