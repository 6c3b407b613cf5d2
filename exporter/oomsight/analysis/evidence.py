"""The closed set of OOM causes and the evidence every diagnosis rule reads (:class:`Evidence`: the
numbers of one OOM, computed once; the thresholds are ``analysis.thresholds``). The rules are in
``analysis.diagnosis``."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from oomsight.analysis import remedies, trend
from oomsight.analysis import thresholds as th
from oomsight.analysis.oomfacts import (
    OomFacts,
    frozen_modules,
    layout,
    leak_growth,
    outside,
    parallelism,
    states,
    trains,
)
from oomsight.analysis.wording import say
from oomsight.wire.schema import Diagnosis


def census_facts(census: Any) -> dict[str, Any]:
    """What every diagnosis states of the census (wire 1.11): whether it ran whole, its largest holders by name."""
    if not isinstance(census, Mapping):
        return {}
    out: dict[str, Any] = {"census_complete": bool(census.get("complete"))}
    if census.get("cut_short"):
        out["census_cut_short"] = census.get("cut_short")
    found = census.get("holders") or []
    if isinstance(found, Sequence) and found:
        out["census_holders"] = [
            f"{h.get('name')}: {int(h.get('bytes') or 0)} bytes" for h in list(found)[:3] if isinstance(h, Mapping)
        ]
    return out


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

CHECKPOINT_FRAME = "torch/utils/checkpoint.py"
"""A frame of torch's checkpointing on the failing stack: the OOM came in a checkpointed block
(forward, or its recomputation in backward), so the job uses activation checkpointing."""


class Evidence:
    """The numbers every rule reads, computed once."""

    def __init__(self, f: OomFacts) -> None:
        self.f = f
        self.total = max(int(f.get("device_total_bytes", 0)), 1)
        self.requested = int(f.get("requested_bytes", 0))
        self.allocated = int(f.get("allocated_bytes", 0))
        self.reserved = int(f.get("reserved_bytes", 0))
        self.free = int(f.get("device_free_bytes", 0))
        self.private = int(f.get("private_pool_bytes") or 0)
        """Reserved in private pools (CUDA graphs, MemPool): the default pool cannot use their free bytes."""
        self.cached_free = max(self.reserved - self.allocated - int(f.get("private_pool_free_bytes") or 0), 0)
        self.usable = self.reserved + self.free
        self.need = self.allocated + self.requested
        self.job = _job(f)
        self._read_the_layout(f)
        rows = list(f.get("steps_memory") or [])
        self.trend = trend.analyse(rows, self.total)
        full = [r for r in rows if len(r) > trend.PEAK]
        self.prior_peak = max((int(r[trend.PEAK]) for r in full), default=None)
        self.prior_transient = max((int(r[trend.PEAK] - r[trend.FLOOR]) for r in full), default=None)
        """The most any earlier step needed on top of what survives between steps."""
        self.step_need = self.need - int(full[-1][trend.FLOOR]) if full else None
        """What the failing step needs on top of the last floor: a leak raises the floor, not this."""
        self.short_leak = None if self.trend.leak else trend.leak_before_oom(rows, self.total)
        self.outside_leak = trend.outside_leak(rows, self.total)
        """Memory outside the allocator that rose along the step rows as a leak does (wire 1.6)."""
        self.forward_pile = trend.forward_pile(forward_rows(f, self.job), self.total)
        """Memory that rose forward after forward, each keeping its graph, with no optimizer step since
        (wire 1.7): in a process with no optimizer, or in a training job's pause (an evaluation)."""
        self.piled = self.forward_pile or piled(f, self.trend.seconds_per_step, self.total)
        """Memory that piled up over many forwards since the last optimizer step (or with none)."""
        self.states = states(f)
        self.training = trains(f)
        """An optimizer exists or has stepped: a training job (else inference, evaluation, or a
        training step before any optimizer was made)."""
        self._read_the_forward(f)
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
            "frozen_parameters_bytes": self.frozen or None,
            "frozen_modules": self.frozen_modules or None,
            "unsharded_parameters_bytes": self.unsharded or None,
            "private_pool_bytes": self.private or None,
            "outside_growth_bytes": self.outside_leak,
            "allocator_backend": f.get("allocator_backend") or None,
        }
        cap_bound = int(f.get("physical_free_bytes", self.free)) >= self.requested
        self.outside, self.others = (None, None) if cap_bound else outside(f, self.reserved)
        self.facts.update(outside_bytes=self.outside, other_processes_bytes=self.others)
        self.legacy_leak = None if rows else leak_growth(f.get("trend") or [], self.total)
        self.facts.update(census_facts(f.get("census")))

    def _read_the_layout(self, f: OomFacts) -> None:
        """How the parameters are laid out (wire 1.6; 0 and {} for older events)."""
        self.layout = parallelism(f)
        self.strategy = str(self.layout.get("strategy") or "none")
        self.frozen = layout(f, "frozen_parameters_bytes")
        self.frozen_modules = frozen_modules(f)
        self.unsharded = layout(f, "unsharded_parameters_bytes")
        self.buckets = layout(f, "gradient_buckets_bytes")
        self.untrained_grads = layout(f, "untrained_gradients_bytes")
        self.experts = layout(f, "expert_parameters_bytes")
        """Parameters of a mixture of experts' experts (wire 1.10; 0: none, or an older writer)."""
        """Gradients of a model no optimizer trains (left with requires_grad on): bytes kept for nothing."""
        self.no_allocator_detail = f.get("allocator_backend") in ("cudaMallocAsync", "pluggable")
        """A back-end without block sizes, split or retry counts: fragmentation cannot be seen."""

    def _read_the_forward(self, f: OomFacts) -> None:
        """What the failing forward was: without autograd, after a loop of forwards, evaluation."""
        self.no_grad = (
            f.get("phase") in ("forward", None)
            and f.get("grad_enabled") is False
            and not on_stack(f, (FUNCTION_FRAME,))
        )
        """The failing forward ran without autograd (no_grad, inference_mode): nothing is kept for a
        backward, so checkpointing cannot help. (Backward itself runs with grad mode off, and so does
        the forward of an ``autograd.Function``: a compiled graph's, a reentrant checkpoint's, whose
        caller may well be recording.)"""
        self.earlier_forwards = (
            None if self.training or f.get("phase") not in ("forward", None) else _forwards_peak(f)
        )
        """In a process that never trains: the highest reading of the forwards that completed before
        the failing one (``trend.forwards_peak``), None without such a loop."""
        self.window_kept = trend.kept_in_window(f.get("backwards_memory") or [], self.total)
        """(bytes, backwards): the memory left after each backward of this accumulation window rose steadily
        (wire 1.10): each micro-batch's outputs kept until the optimizer step."""
        self.consumed = f.get("most_forwards_per_backward")
        """The most forwards whose graphs one backward of this job consumed (wire 1.8; None: none seen)."""
        self.pending = f.get("forwards_since_backward")
        """The forwards that recorded a graph since a backward last consumed one (wire 1.8)."""
        in_step_forward = self.training and f.get("phase") == "forward"
        self.frozen_forward = in_step_forward and f.get("module_frozen") is True
        """The forward of a model with no trainable parameter (a distillation teacher, an RLHF reference
        or reward model) in a training job: its activations, not an evaluation of the trained model."""
        self.kept_for_backward = (
            consumed_known(f) and (self.pending or 0) >= 1 and (self.consumed or 0) > 1 and not unconsumed(f)
        )
        """Forwards keep their graphs for a backward, as this job's backwards consume several together
        (summed micro-batch losses, an episode, a BPTT window): the failing forward is one of them."""
        self.evaluating = (
            in_step_forward
            and f.get("module_training") is False
            and not self.frozen_forward
            and not self.kept_for_backward
        )
        """A forward of a model in eval mode (``model.eval()``) in a training job: evaluation, not a
        training step (whose memory the step rows describe), unless its graphs are kept for a backward
        as the job's own steps keep theirs (dropout-free fine-tuning summing micro-batch losses)."""
        self.trains_nothing = (
            self.no_grad
            or self.frozen_forward
            or (not self.training and self.consumed is None and f.get("phase") in ("forward", None))
        )
        """The evidence shows the failing forward trains nothing: it runs without autograd, its model has
        no trainable parameter, or the process has no optimizer and no backward ever ran through its model.
        Only then may a remedy that changes what the job computes come first (``remedies.CHANGES``)."""

    @property
    def routing(self) -> bool:
        """In a model with experts, the step's own memory rose through the step rows while its input stayed the
        same, or the failing step outgrew every earlier one at an input no larger than theirs (wire 1.10): the
        routing grew it (tokens concentrating on an expert), not what the step takes in."""
        d = self.trend.demand
        if self.experts <= 0:
            return False
        if d is not None:
            return d.input_rose is False
        return self.outgrew(self.step_need) and self.same_input is not None

    @property
    def same_input(self) -> Optional[int]:
        """The failing step's input (elements one forward took) where it is known and no larger than what every
        earlier step row says the forwards took, else None."""
        rows = list(self.f.get("steps_memory") or [])
        now = int(self.f.get("input_elements", -1) or -1)
        earlier = [r[trend.INPUT] for r in rows if len(r) > trend.INPUT and r[trend.INPUT] > 0]
        if now <= 0 or not rows or len(earlier) < len(rows):
            return None
        return now if now <= max(earlier) * (1 + th.value("demand_margin")) else None

    def shown(self) -> set[str]:
        """What the evidence shows a result-changing remedy changes (``remedies.LEADS_WHEN``)."""
        return {tag for tag, seen in (("frozen", self.frozen > 0), ("routing", self.routing)) if seen}

    def outgrew(self, needed: Optional[int]) -> bool:
        """Whether ``needed`` (bytes on top of the last floor) is more than any earlier step needed."""
        if needed is None or self.prior_transient is None:
            return False
        margin = th.value("demand_margin")
        return needed > self.prior_transient * (1 + margin) + th.value("demand_slack_share") * self.total

    def result(self, cause: Cause, keys: Sequence[str], summary: str) -> Diagnosis:
        if self.no_grad:
            keys = [remedies.WITHOUT_GRAD.get(k, k) for k in keys]
        if not self.training:  # no optimizer: no advice about optimizer.step() or accumulating its gradients
            keys = [remedies.WITHOUT_OPTIMIZER.get(k, k) for k in keys]
        picked = remedies.pick([k for k in keys if k], self.job)
        if not self.trains_nothing:
            picked = remedies.harmless_first(picked, self.shown())
        elif self.training:  # a forward that trains nothing in a job that trains: its remedies may lead, no other
            picked = remedies.harmless_first(picked, self.shown() | {"forward"})
        self.facts["remedies"] = picked
        self.facts["changes_result"] = remedies.changes(picked)
        used = self.facts["in_use"]
        if used:
            summary += say("in_use", used=", ".join(used))
        if self.no_allocator_detail:
            summary += say("no_allocator_detail", backend=self.f.get("allocator_backend") or "non-native")
        return Diagnosis(cause=cause.value, summary=summary, remedies=remedies.texts(picked), facts=self.facts)


def _job(f: OomFacts) -> dict[str, Any]:
    """The job's setup as the hook saw it, completed by what the failing stack shows."""
    job = dict(f.get("job") or {})
    ms: Mapping[str, Any] = f.get("model_states") or {}
    if not job.get("param_dtype") and ms.get("param_dtype"):  # an OOM before the job probe's first window
        job["param_dtype"] = ms.get("param_dtype")
    if not job.get("checkpointing") and any(CHECKPOINT_FRAME in str(frame) for frame in f.get("stack") or []):
        job["checkpointing"] = True
    if layout(f, "quantized_parameters_bytes") > 0:
        job["quantized_base"] = True
    return job


GENERATION_FRAMES = ("/generation/", " in generate")
"""A frame of a generation loop on the failing stack (``transformers``' ``generate``): memory that
piles up there is the key/value cache growing with every token, by design."""
FUNCTION_FRAME = "torch/autograd/function.py"
"""A frame of ``autograd.Function.apply``: its forward runs with grad mode off whatever its caller's."""
MODULE_FRAME = "torch/nn/modules/module.py"
"""A frame of ``nn.Module.__call__``: the failing allocation was made inside a model's forward."""


def on_stack(f: OomFacts, marks: Sequence[str]) -> bool:
    return any(mark in str(frame) for frame in f.get("stack") or [] for mark in marks)


def _forwards_peak(f: OomFacts) -> Optional[float]:
    now = f.get("time")
    if not isinstance(now, (int, float)):
        return None
    return trend.forwards_peak(f.get("sampled_allocated") or [], float(now))


def consumed_known(f: OomFacts) -> bool:
    """The event says what the job's backwards consumed of its forwards' graphs (wire 1.8)."""
    return "most_forwards_per_backward" in f


def unconsumed(f: OomFacts) -> bool:
    """The forwards piling their graphs go beyond what this job's own backwards have consumed
    (``trend.unconsumed``): only then is a pile of them a leak rather than the step's activations."""
    training = f.get("module_training")
    return trend.unconsumed(
        f.get("forwards_since_backward"),
        f.get("most_forwards_per_backward"),
        trains(f),
        training,
        f.get("least_forwards_per_backward"),
    )


def forward_rows(f: OomFacts, job: Mapping[str, Any]) -> Sequence[Sequence[float]]:
    """The forward rows to judge: since wire 1.8, where the forwards piling go beyond what the job's
    own backwards have consumed (:func:`unconsumed`). Older events: where an optimizer exists but
    never stepped, none (losses summed over micro-batches before one backward are the first step's
    activations); after a step, the rows of a pause, judged where the failing model is in eval mode or
    where they are more than ``pile_consumed_multiple`` times the job's micro-batches."""
    rows = f.get("forwards_memory") or []
    if rows and consumed_known(f):
        return rows if unconsumed(f) else []
    if not rows or not trains(f):
        return rows
    if f.get("last_step_time") is None:
        return []
    micro = int(job.get("accumulation_steps") or 1)
    beyond = len(rows) > th.value("pile_consumed_multiple") * micro
    return rows if f.get("module_training") is False or beyond else []


def piled(f: OomFacts, per_step: Optional[float], total: int) -> Optional[int]:
    """``trend.piled_up`` where the OOM came in a forward long after the last optimizer step (at
    least 3 step times and 1 s), or in a process that never stepped one. Inside a generation loop
    the readings need not fall back: loading a model never happens there, and the cache's rise of a
    token at a time hides each forward's temporaries between two readings."""
    if f.get("phase") not in ("forward", None):
        return None
    if f.get("grad_enabled") is not False and consumed_known(f) and not unconsumed(f):
        return None  # graphs a backward of this job will consume, as its backwards did: the step's own
    last, now = f.get("last_step_time"), f.get("time")
    quiet = max(th.value("pile_step_times") * (per_step or 0.0), th.value("pile_after_steps_seconds"))
    try:
        if last is not None and now is not None and float(now) - float(last) < quiet:
            return None
    except (TypeError, ValueError, OverflowError):  # numbers no hook wrote: no verdict
        return None
    span = th.value("pile_min_seconds") if last is None else quiet
    generating = on_stack(f, GENERATION_FRAMES)
    return trend.piled_up(f.get("sampled_allocated") or [], last, total, span, falls=not generating)
