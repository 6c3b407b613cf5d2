"""Why a CUDA OOM happened, and the remedy that fits: a pure function of the facts.

The causes form a closed set (:class:`Cause`), checked in this order (``docs/diagnosis.md``):

``other_process``       other processes on the GPU hold a large share of it
``non_pytorch_memory``  this process holds a large share outside the caching allocator
``leak``                the memory that survives between steps rose step after step, the step's own did not
``model_states``        parameters, gradients and optimizer state alone (nearly) fill the device
``oversized_request``   one request is more than half of all this process could use, in an otherwise normal step
``growing_demand``      the failing step needed more than any earlier step's peak: larger batch, longer sequence
``fragmentation``       the step needed no more than before and the bytes existed, but in no block large enough
``activations``         a steady step whose activations do not fit: the job is simply too big as configured
``exhaustion``          out of memory with too little known to say more (no step and no optimizer seen)

Each diagnosis states its evidence in numbers (``facts``) and names remedies the job
does not already use (``remedies.pick``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Optional

from oomsight.analysis import remedies, trend
from oomsight.analysis.oomfacts import ModelStates, OomFacts, facts_from_event, leak_growth, outside, states
from oomsight.analysis.units import format_bytes as fb
from oomsight.wire.schema import Diagnosis

__all__ = ["CAUSES", "Cause", "ModelStates", "OomFacts", "diagnose", "facts_from_event", "leak_growth"]


class Cause(str, enum.Enum):
    OTHER_PROCESS = "other_process"
    NON_PYTORCH_MEMORY = "non_pytorch_memory"
    LEAK = "leak"
    MODEL_STATES = "model_states"
    OVERSIZED_REQUEST = "oversized_request"
    GROWING_DEMAND = "growing_demand"
    FRAGMENTATION = "fragmentation"
    ACTIVATIONS = "activations"
    EXHAUSTION = "exhaustion"


CAUSES = tuple(c.value for c in Cause)

OUTSIDE_SHARE = 0.25
"""Memory outside this process's allocator above this share of the device is a cause."""
DECISIVE_SHARE = 0.05
"""Other processes holding less than OUTSIDE_SHARE are still the cause when they hold at least
this share and the job's own known need (this OOM's, earlier steps' peaks) fits without them."""
OVERSIZED_SHARE = 0.5
FRAGMENTATION_MIN_SHARE = 0.05
"""Cached-but-unallocated bytes below this share of the device are noise, not the cause."""
MODEL_STATES_SHARE = 0.7
"""Parameters, gradients and (expected) optimizer state above this share of capacity leave
activations too little room for any activation remedy to help."""
DEMAND_MARGIN = 0.1
"""The failing step needs more than earlier steps when its own memory (on top of the last floor)
exceeds the most any earlier step needed on top of its floor by this share..."""
DEMAND_SLACK_SHARE = 0.01
"""... plus this share of capacity (steps that need almost nothing of their own)."""


CHECKPOINT_FRAME = "torch/utils/checkpoint.py"
"""A frame of torch's checkpointing on the failing stack: the OOM came in a checkpointed block
(forward, or its recomputation in backward), so the job uses activation checkpointing."""


def diagnose(f: OomFacts) -> Diagnosis:
    """Classify one OOM from the numbers recorded at the moment it happened."""
    ev = _Evidence(f)
    for rule in (_outside_rule, _leak_rule, _model_states_rule, _oversized_rule, _demand_rule, _fragmentation_rule):
        found = rule(ev)
        if found is not None:
            return found
    return _fallback(ev)


class _Evidence:
    """The numbers every rule reads, computed once."""

    def __init__(self, f: OomFacts) -> None:
        self.f = f
        self.total = max(int(f.get("device_total_bytes", 0)), 1)
        self.requested = int(f.get("requested_bytes", 0))
        self.allocated = int(f.get("allocated_bytes", 0))
        self.reserved = int(f.get("reserved_bytes", 0))
        self.free = int(f.get("device_free_bytes", 0))
        self.cached_free = max(self.reserved - self.allocated, 0)
        self.usable = self.reserved + self.free
        self.need = self.allocated + self.requested
        self.job = _job(f)
        rows = list(f.get("steps_memory") or [])
        self.trend = trend.analyse(rows, self.total)
        full = [r for r in rows if len(r) > trend.PEAK]
        self.prior_peak = max((int(r[trend.PEAK]) for r in full), default=None)
        self.prior_transient = max((int(r[trend.PEAK] - r[trend.FLOOR]) for r in full), default=None)
        """The most any earlier step needed on top of what survives between steps."""
        self.step_need = self.need - int(full[-1][trend.FLOOR]) if full else None
        """What the failing step needs on top of the last floor: a leak raises the floor, not this."""
        self.short_leak = None if self.trend.leak else trend.leak_before_oom(rows, self.total)
        self.piled = _piled(f, self.trend.seconds_per_step, self.total)
        """Memory that piled up over many forwards since the last optimizer step (or with none)."""
        self.states = states(f)
        self.training = self.states is not None or f.get("categories") is not None or bool(full)
        """An optimizer exists or has stepped: a training job (else inference, evaluation, or a
        training step before any optimizer was made)."""
        self.no_grad = f.get("phase") in ("forward", None) and f.get("grad_enabled") is False
        """The failing forward ran without autograd (no_grad, inference_mode): nothing is kept for a
        backward, so checkpointing cannot help. (Backward itself runs with grad mode off.)"""
        self.facts: dict[str, Any] = {
            "requested_bytes": self.requested,
            "usable_bytes": self.usable,
            "reserved_unallocated_bytes": self.cached_free,
            "need_bytes": self.need,
            "prior_step_peak_bytes": self.prior_peak,
            "largest_free_block_bytes": f.get("largest_free_block_bytes"),
            "phase": f.get("phase"),
            "model_states_bytes": self.states,
            "floor_growth_bytes": self.trend.floor_growth_bytes if self.trend.leak else None,
            "prior_step_transient_bytes": self.prior_transient,
            "step_need_bytes": self.step_need,
            "in_use": remedies.in_use(self.job),
        }
        cap_bound = int(f.get("physical_free_bytes", self.free)) >= self.requested
        self.outside, self.others = (None, None) if cap_bound else outside(f, self.reserved)
        self.facts.update(outside_bytes=self.outside, other_processes_bytes=self.others)
        self.legacy_leak = None if rows else leak_growth(f.get("trend") or [], self.total)

    def outgrew(self, needed: Optional[int]) -> bool:
        """Whether ``needed`` (bytes on top of the last floor) is more than any earlier step needed."""
        if needed is None or self.prior_transient is None:
            return False
        return needed > self.prior_transient * (1 + DEMAND_MARGIN) + DEMAND_SLACK_SHARE * self.total

    def result(self, cause: Cause, keys: Sequence[str], summary: str) -> Diagnosis:
        if self.no_grad:
            keys = [remedies.WITHOUT_GRAD.get(k, k) for k in keys]
        picked = remedies.pick([k for k in keys if k], self.job)
        self.facts["remedies"] = picked
        used = self.facts["in_use"]
        if used:
            summary += f" Already in use: {', '.join(used)}."
        return Diagnosis(cause=cause.value, summary=summary, remedies=remedies.texts(picked), facts=self.facts)


def _outside_rule(ev: _Evidence) -> Optional[Diagnosis]:
    if ev.others is not None and _decisive(ev, ev.others, ev.outside or 0):
        return _other_process(ev, ev.others, f"Other processes hold {fb(ev.others)} of the {fb(ev.total)} GPU.")
    if ev.outside is None:
        return None
    nv = ev.f.get("nvml")
    listed = nv.get("other_processes") if nv else None
    if ev.others is None and listed is not None and listed >= 2 and _decisive(ev, ev.outside, 0):
        # NVML lists processes but not under our PID (a container): we are one of them
        return _other_process(
            ev,
            ev.outside,
            f"NVML lists {listed} processes on this GPU and {fb(ev.outside)} of it is used outside this "
            "process's PyTorch allocator: by the other processes (and this process's CUDA context).",
        )
    if ev.outside < OUTSIDE_SHARE * ev.total:
        return None
    if ev.others is None:  # NVML cannot see our PID (containers): it may be other tenants too
        return ev.result(
            Cause.NON_PYTORCH_MEMORY,
            ["non_pytorch", "other_process"],
            f"{fb(ev.outside)} of the GPU is used outside this process's PyTorch allocator: by its CUDA "
            "context, NCCL and libraries, or by other processes (NVML cannot see process IDs here to tell "
            "them apart).",
        )
    return ev.result(
        Cause.NON_PYTORCH_MEMORY,
        ["non_pytorch"],
        f"{fb(ev.outside)} of the GPU is used by this process outside PyTorch's allocator.",
    )


def _decisive(ev: _Evidence, held: int, own_outside: int) -> bool:
    """Whether ``held`` bytes of other processes are the cause: a large share of the GPU, or enough
    to matter while the job's own known need (plus its memory outside the allocator) fits alone."""
    if held >= OUTSIDE_SHARE * ev.total:
        return True
    own = max(ev.need, ev.prior_peak or 0) + own_outside
    return held >= DECISIVE_SHARE * ev.total and own <= ev.total


def _other_process(ev: _Evidence, held: int, summary: str) -> Diagnosis:
    own = max(ev.need, ev.prior_peak or 0)
    if own <= ev.total:
        summary += f" This job's own known need ({fb(own)}) would fit the GPU alone."
    return ev.result(Cause.OTHER_PROCESS, ["other_process"], summary)


def _leak_rule(ev: _Evidence) -> Optional[Diagnosis]:
    t = ev.trend
    if t.leak:
        summary = (
            f"The memory that survives between optimizer steps rose by {fb(t.floor_growth_bytes)} "
            f"({fb(int(t.floor_slope))} a step) while each step's own working memory stayed the same: "
            "something keeps tensors alive from every step."
        )
    elif ev.short_leak is not None:
        summary = (
            f"The memory that survives between optimizer steps rose by {fb(ev.short_leak)} at every step "
            "since the first one while each step's own working memory stayed the same: something keeps "
            "tensors alive from every step (here so much that it ran out within a few steps)."
        )
        ev.facts["floor_growth_bytes"] = ev.short_leak
    elif ev.piled is not None:
        return _piled_rule(ev, ev.piled)
    elif ev.legacy_leak is not None:
        summary = (
            f"The memory that survives between steps grew by {fb(ev.legacy_leak)} step after step "
            "before the OOM: something keeps tensors alive."
        )
        ev.facts["floor_growth_bytes"] = ev.legacy_leak
    else:
        return None
    return ev.result(Cause.LEAK, ["leak", "history"], summary)


def _piled(f: OomFacts, per_step: Optional[float], total: int) -> Optional[int]:
    """``trend.piled_up`` where the OOM came in a forward long after the last optimizer step (at
    least 3 step times and 3 s), or in a process that never stepped one."""
    if f.get("phase") not in ("forward", None):
        return None
    last, now = f.get("last_step_time"), f.get("time")
    if last is not None and now is not None:
        quiet = max(trend.PILE_STEP_TIMES * (per_step or 0.0), trend.PILE_MIN_SECONDS)
        if now - last < quiet:
            return None
    return trend.piled_up(f.get("sampled_allocated") or [], last, total)


GENERATION_FRAMES = ("/generation/", " in generate")
"""A frame of a generation loop on the failing stack (``transformers``' ``generate``): memory that
piles up there is the key/value cache growing with every token, by design."""


def _piled_rule(ev: _Evidence, growth: int) -> Diagnosis:
    when = (
        "with no optimizer step in this process"
        if ev.f.get("last_step_time") is None
        else (f"{ev.f.get('time', 0.0) - (ev.f.get('last_step_time') or 0.0):.0f} s after the last optimizer step")
    )
    if any(mark in str(frame) for frame in ev.f.get("stack") or [] for mark in GENERATION_FRAMES):
        ev.facts["piled_up_bytes"] = growth
        return ev.result(
            Cause.GROWING_DEMAND,
            ["bound_input", "eval_batch", "half_precision"],
            f"In generation, {when}, memory rose by {fb(growth)} over the last seconds, forward after "
            "forward: the key/value cache grows with every token. Bound the new tokens or the batch.",
        )
    ev.facts["floor_growth_bytes"] = growth
    graphs = bool(ev.f.get("grad_enabled"))
    summary = (
        f"In a loop of forwards {when} (evaluation, inference), even the lowest memory rose by "
        f"{fb(growth)} over the last seconds: something keeps tensors from every batch"
        + (", with their autograd graphs (autograd is recording)." if graphs else ".")
    )
    return ev.result(Cause.LEAK, ["no_grad", "leak", "eval_batch"] if graphs else ["leak", "eval_batch"], summary)


def _model_states_rule(ev: _Evidence) -> Optional[Diagnosis]:
    states = ev.states
    in_step = ev.f.get("phase") == "optimizer"
    if states is None or (states < MODEL_STATES_SHARE * ev.total and not in_step):
        return None
    if states < MODEL_STATES_SHARE * ev.total:  # activations are gone by optimizer.step()
        return ev.result(
            Cause.MODEL_STATES,
            ["fused_optimizer", *_model_states_order(ev)],
            f"The OOM came inside optimizer.step(), where activations are already freed: parameters, "
            f"gradients and optimizer state ({fb(states)}) and the optimizer's own temporaries did not "
            f"fit in the {fb(ev.total)} capacity ({fb(ev.allocated)} allocated, {fb(ev.requested)} "
            "requested).",
        )
    where = " in optimizer.step()" if in_step else ""
    return ev.result(
        Cause.MODEL_STATES,
        _model_states_order(ev),
        f"Parameters, gradients and optimizer state need {fb(states)} of the {fb(ev.total)} capacity "
        f"(the OOM came{where} at {fb(ev.allocated)} allocated): no batch size or activation remedy can "
        "make room.",
    )


def _model_states_order(ev: _Evidence) -> list[str]:
    """On one GPU, first the single-GPU change whose estimate fits; sharding first where there
    are several ranks to shard over, or where no single-GPU change fits."""
    p = _parameters(ev.f)
    fits = MODEL_STATES_SHARE * ev.total
    light = 3 * p if p else None  # parameters + gradients + one momentum buffer
    half = (ev.states or 0) / 2
    single = [key for key, est in (("light_optimizer", light), ("bf16_params", half)) if est and est < fits]
    if int(ev.f.get("world_size") or 1) > 1 or not single:
        return ["shard", "light_optimizer", "bf16_params"]
    return [*single, "shard", *[k for k in ("light_optimizer", "bf16_params") if k not in single]]


def _parameters(f: OomFacts) -> int:
    ms = f.get("model_states") or f.get("categories")
    return int(ms["parameters_bytes"]) if ms else 0


def _oversized_rule(ev: _Evidence) -> Optional[Diagnosis]:
    if ev.requested <= OVERSIZED_SHARE * ev.usable:
        return None
    if ev.step_need is not None and ev.outgrew(ev.step_need - ev.requested):
        return None  # the step had already outgrown earlier ones: growing demand
    return ev.result(
        Cause.OVERSIZED_REQUEST,
        ["oversized", "bound_input"],
        f"One request of {fb(ev.requested)} is more than half of the {fb(ev.usable)} this process could "
        "use (reserved plus free).",
    )


def _demand_rule(ev: _Evidence) -> Optional[Diagnosis]:
    if not ev.outgrew(ev.step_need) and not ev.trend.growing:
        return None
    own = fb(ev.step_need) if ev.step_need is not None else "unknown"
    prior = fb(ev.prior_transient) if ev.prior_transient is not None else "unknown"
    return ev.result(
        Cause.GROWING_DEMAND,
        ["bound_input", "checkpointing", "batch"],
        f"The failing step needed at least {fb(ev.need)} ({fb(ev.allocated)} allocated plus "
        f"{fb(ev.requested)} requested), {own} of it on top of what survives between steps, more than "
        f"any earlier step needed on top of it ({prior}; earlier peaks up to "
        f"{fb(ev.prior_peak) if ev.prior_peak is not None else 'unknown'}): the input grew (batch or "
        "sequence). Defragmenting cannot help; bound the input.",
    )


def _fragmentation_rule(ev: _Evidence) -> Optional[Diagnosis]:
    block = ev.f.get("largest_free_block_bytes")
    bytes_exist = ev.cached_free + ev.free >= ev.requested and ev.cached_free >= FRAGMENTATION_MIN_SHARE * ev.total
    no_block = ev.free < ev.requested and (block is None or block < ev.requested)
    # In a training step that never completed, what the rest of the step needs is unknown: the
    # request may fit a defragmented cache while the step as a whole does not.
    need_known = ev.prior_peak is not None or ev.states is None
    if not (bytes_exist and no_block and need_known):
        return None
    fix = "split" if ev.f.get("expandable_segments") else "expandable"
    return ev.result(
        Cause.FRAGMENTATION,
        [fix, "shapes"],
        f"{fb(ev.requested)} were requested while {fb(ev.cached_free)} sat reserved but unallocated "
        f"(largest free block {fb(block) if block is not None else 'unknown'}) and {fb(ev.free)} were "
        "free, and the step needed no more than earlier steps did: enough bytes, no block large enough.",
    )


def _fallback(ev: _Evidence) -> Diagnosis:
    if not ev.training:
        return _no_training(ev)
    cats = ev.f.get("categories")
    if ev.states is None and cats is None:
        return ev.result(
            Cause.EXHAUSTION,
            ["batch", "autocast", "checkpointing", "compile"],
            f"The job needs more than the {fb(ev.total)} capacity: {fb(ev.allocated)} allocated and "
            f"{fb(ev.requested)} more requested (no optimizer step was seen, so memory by category is unknown).",
        )
    states = ev.states or 0
    return ev.result(
        Cause.ACTIVATIONS,
        ["checkpointing", "autocast", "batch", "compile"],
        f"A steady step does not fit: {fb(ev.need)} needed of {fb(ev.total)}, of which parameters, "
        f"gradients and optimizer state are {fb(states)} and activations and temporaries the rest.",
    )


def _no_training(ev: _Evidence) -> Diagnosis:
    """Out of memory in a process that has no optimizer and never stepped one."""
    needed = f"{fb(ev.allocated)} allocated and {fb(ev.requested)} more requested of {fb(ev.total)}"
    if ev.f.get("grad_enabled") and ev.f.get("phase") in ("forward", None):
        return ev.result(
            Cause.EXHAUSTION,
            ["no_grad", "batch", "autocast", "compile"],
            f"A forward needs more than the capacity ({needed}) with autograd recording, in a process "
            "that has no optimizer: if nothing here is trained (inference, evaluation), every "
            "activation is kept for a backward that never comes.",
        )
    return ev.result(
        Cause.EXHAUSTION,
        ["batch", "autocast", "checkpointing", "compile"],
        f"The job needs more than the capacity: {needed} (no optimizer exists, so memory by category is unknown).",
    )


def _job(f: OomFacts) -> dict[str, Any]:
    """The job's setup as the hook saw it, completed by what the failing stack shows."""
    job = dict(f.get("job") or {})
    if not job.get("checkpointing") and any(CHECKPOINT_FRAME in str(frame) for frame in f.get("stack") or []):
        job["checkpointing"] = True
    return job
