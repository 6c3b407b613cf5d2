"""What a remedy would save: estimates of the peak after bf16 autocast, activation
checkpointing, gradient accumulation, ``zero_grad(set_to_none=True)`` and a smaller batch,
from the memory by category (parameters, gradients, optimizer state, activations).

Every number here is an *estimate* from a simple model of where the peak comes from, and
each result states the assumption it rests on (``docs/report.md`` lists them). The model:
the peak is parameters + gradients + optimizer state + activations + other, where "other"
(the allocation in flight at an OOM, temporaries) is left unchanged by every remedy.
``torch.compile`` is never credited with a saving: it can lower the peak or raise it
(pytorch/pytorch#122512), so the estimate says "measure it".

Pure functions, no torch: used by the text report and the HTML report.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Callable, Optional

from oomsight.analysis import remedies
from oomsight.analysis.units import format_bytes as fb
from oomsight.wire.schema import Categories, DeviceSnapshot, OomEvent

CAUSE_LEAK = "leak"
ORDER = ("checkpointing", "autocast", "accumulation", "smaller_batch", "set_to_none", "compile")
"""Tie-break among equal savings: the least intrusive change first."""


@dataclasses.dataclass(frozen=True)
class Footprint:
    """Memory at one peak, by category, and what the allocator could use (all bytes)."""

    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int
    peak_bytes: int
    """The peak to lower: at least the sum of the categories."""
    capacity_bytes: int
    """The device total, the ``set_per_process_memory_fraction`` cap, or what was usable at an OOM."""
    job: Optional[Mapping[str, Any]] = None
    """What the job already does (the hook's detection): remedies in use are not estimated."""
    oom: bool = False
    """True for the footprint of an OOM that happened: it never "fits, nothing needed"."""
    frozen_bytes: int = 0
    """Of the parameters, the frozen ones (a LoRA base, a teacher): static bytes with no gradient, no
    optimizer state and no autocast copy (autocast caches casts only of leaves that require grad)."""

    @property
    def static_bytes(self) -> int:
        """Parameters, gradients and optimizer state: what no activation remedy touches."""
        return self.parameters_bytes + self.gradients_bytes + self.optimizer_state_bytes

    @property
    def other_bytes(self) -> int:
        """Peak bytes outside the four categories; every remedy leaves them as they are."""
        return max(self.peak_bytes - self.static_bytes - self.activations_bytes, 0)


@dataclasses.dataclass(frozen=True)
class Assumptions:
    """The numbers the estimates rest on; each is stated next to its estimate."""

    autocast_activation_ratio: float = 0.5
    """Activation bytes under bf16 autocast per byte now: fp32 → bf16 halves them (assumes fp32 now)."""
    autocast_weight_copy_ratio: float = 0.5
    """Autocast keeps a bf16 copy of each fp32 weight for backward: half the parameter bytes more."""
    checkpoint_blocks: int = 16
    """n equal blocks checkpointed in √n segments keep about 1/√n of the activations."""
    accumulation_steps: int = 4
    """k micro-batches of batch/k each: activations divided by k, the same effective batch."""
    batch_ratio: float = 0.5
    """A smaller batch as a share of the current one: activations scale with it."""
    margin_ratio: float = 0.05
    """Share of the capacity kept free (allocator caching, fragmentation): a peak fits below the rest."""


@dataclasses.dataclass(frozen=True)
class Estimate:
    """What one remedy is estimated to do to the peak."""

    remedy: str
    """Key: ``checkpointing``, ``autocast``, ``accumulation``, ``smaller_batch``, ``set_to_none``, ``compile``."""
    title: str
    saving_bytes: Optional[int]
    """Estimated drop of the peak (negative: a rise); None when it cannot be estimated: measure it."""
    peak_bytes: Optional[int]
    """Estimated peak after the remedy; None with ``saving_bytes``."""
    fits: Optional[bool]
    """Whether that peak stays below capacity minus the margin; None when not estimated."""
    assumption: str
    cost: str


@dataclasses.dataclass(frozen=True)
class Choice:
    """The advice that fits, for a report."""

    target_bytes: int
    """Capacity minus the margin: the peak must stay below this."""
    excess_bytes: int
    """How far the peak is above the target (zero or negative: it fits already)."""
    fitting: list[Estimate]
    """Remedies estimated to fit on their own, largest saving first."""
    accumulation_steps: Optional[int]
    """The fewest micro-batches per step that fit, if accumulation can fit at all."""
    message: str
    judged: bool = True
    """False when the estimates cannot be trusted to say what fits (the peak includes a leak)."""


def footprint(categories: Categories, capacity_bytes: int, peak_bytes: Optional[int] = None) -> Optional[Footprint]:
    """A :class:`Footprint` from a category breakdown; None before activations are known."""
    activations = categories["activations_bytes"]
    if activations is None:
        return None
    params, grads, state = (
        max(categories["parameters_bytes"], 0),
        max(categories["gradients_bytes"], 0),
        max(categories["optimizer_state_bytes"], 0),
    )
    # all-gathered FSDP parameters are not in parameters_bytes: at a peak they are transient bytes no
    # activation remedy touches, so they count as "other", not as activations
    gathered = max(int(categories.get("unsharded_parameters_bytes") or 0), 0)
    acts = max(activations - gathered, 0)
    total = params + grads + state + acts
    peak = max(total + min(gathered, max(activations, 0)), peak_bytes or 0)
    frozen = min(max(int(categories.get("frozen_parameters_bytes") or 0), 0), params)
    return Footprint(params, grads, state, acts, peak, max(capacity_bytes, 0), frozen_bytes=frozen)


def at_oom(event: OomEvent) -> Optional[Footprint]:
    """The footprint of an OOM: the peak it needed (allocated plus the failing request) against
    what the allocator could use then (reserved plus free, from the diagnosis), else its total.
    Before the first step completed the categories come from the model states read at the OOM."""
    cat = event.get("categories") or _categories_from_states(event)
    if not cat:
        return None
    facts = event["diagnosis"].get("facts")
    usable = facts.get("usable_bytes") if isinstance(facts, dict) else None
    if not isinstance(usable, int) or isinstance(usable, bool) or usable <= 0:
        usable = event["device_total_bytes"]
    fp = footprint(cat, usable, event["allocated_bytes"] + event["requested_bytes"])
    return dataclasses.replace(fp, job=event.get("job"), oom=True) if fp is not None else None


def _categories_from_states(event: OomEvent) -> Optional[Categories]:
    ms = event.get("model_states")
    if not isinstance(ms, dict):
        return None
    try:
        params, grads, state = (int(ms[k]) for k in ("parameters_bytes", "gradients_bytes", "optimizer_state_bytes"))
    except (KeyError, TypeError, ValueError):
        return None
    cat = Categories(
        parameters_bytes=params,
        gradients_bytes=grads,
        optimizer_state_bytes=state,
        activations_bytes=max(event["allocated_bytes"] - params - grads - state, 0),
        basis="at_oom",
        measured_at=event["time"],
    )
    for key in ("frozen_parameters_bytes", "unsharded_parameters_bytes"):
        if isinstance(ms.get(key), int):
            cat[key] = ms[key]
    return cat


def of_device(device: DeviceSnapshot, events: list[OomEvent]) -> Optional[Footprint]:
    """The footprint of a device's latest category breakdown against its capacity."""
    cat = device.get("categories")
    cap = capacity(device, events)[0]
    return footprint(cat, cap) if cat and cap else None


def capacity(device: Optional[DeviceSnapshot], events: list[OomEvent]) -> tuple[Optional[int], str]:
    """(bytes, what they are) the allocator can use on a device: the process cap, else the limit
    an OOM on it reported when below the device (a cap the snapshot did not record), else the total."""
    if device is not None and device.get("limit_bytes"):
        return device["limit_bytes"], "process cap"
    total = device_total(device)
    at_oom = [e["device_total_bytes"] for e in events if e["device_total_bytes"] > 0]
    if at_oom and (total is None or min(at_oom) < total):
        return min(at_oom), "limit at the OOM"
    return total, "device capacity"


def device_total(device: Optional[DeviceSnapshot]) -> Optional[int]:
    if device is None:
        return None
    nvml = device["nvml"]
    total = device.get("total_bytes") or (nvml["total_bytes"] if nvml else None)
    return int(total) if total else None


def target_bytes(fp: Footprint, a: Assumptions) -> int:
    return int(fp.capacity_bytes * (1.0 - a.margin_ratio))


def autocast(fp: Footprint, a: Assumptions) -> Estimate:
    trainable = fp.parameters_bytes - fp.frozen_bytes  # frozen weights get no cached bf16 copy
    saving = round(fp.activations_bytes * (1 - a.autocast_activation_ratio)) - round(
        trainable * a.autocast_weight_copy_ratio
    )
    known = fp.job is not None and fp.job.get("autocast") is False
    now = (
        "activations are fp32 now (autocast not seen in this job)"
        if known
        else ("activations are fp32 now (whether the job uses autocast was not detected yet)")
    )
    return _estimate(
        fp,
        a,
        "autocast",
        saving,
        f"{now} and become bf16 (times {a.autocast_activation_ratio:g}); autocast keeps a "
        f"bf16 copy of the trainable fp32 weights for backward (+ {a.autocast_weight_copy_ratio:g} of their bytes)",
    )


def checkpointing(fp: Footprint, a: Assumptions) -> Estimate:
    n = max(a.checkpoint_blocks, 1)
    saving = round(fp.activations_bytes * (1 - 1 / math.sqrt(n)))
    return _estimate(
        fp,
        a,
        "checkpointing",
        saving,
        f"the model is {n} equal blocks checkpointed in √{n} segments: about 1/√{n} = "
        f"{1 / math.sqrt(n):.0%} of the activations stay",
    )


def accumulation(fp: Footprint, a: Assumptions) -> Estimate:
    k = max(a.accumulation_steps, 1)
    saving = fp.activations_bytes - math.ceil(fp.activations_bytes / k)
    now = fp.job.get("accumulation_steps") if fp.job else None
    if isinstance(now, int) and now > 1:
        text = f"the job accumulates {now} micro-batches now; {k} times as many, each 1/{k} of the size (÷ {k})"
    else:
        text = f"{k} micro-batches of batch/{k}: activations scale with the batch (÷ {k})"
    return _estimate(fp, a, "accumulation", saving, text)


def set_to_none(fp: Footprint, a: Assumptions) -> Estimate:
    saving = min(fp.activations_bytes, fp.gradients_bytes)
    return _estimate(
        fp,
        a,
        "set_to_none",
        saving,
        "gradients are kept between steps now (set_to_none=False): freed, they return only in backward as "
        "activations are freed, so the peak holds max(activations, gradients) instead of both; "
        "no saving if set_to_none=True already (the default since torch 2.0)",
    )


def smaller_batch(fp: Footprint, a: Assumptions) -> Estimate:
    saving = round(fp.activations_bytes * (1 - a.batch_ratio))
    return _estimate(
        fp,
        a,
        "smaller_batch",
        saving,
        f"the batch shrinks to {a.batch_ratio:.0%} of its size and activations shrink with it",
    )


def compile_(fp: Footprint, a: Assumptions) -> Estimate:
    del fp, a  # no model: torch.compile can lower or raise the peak
    return Estimate(
        "compile",
        TITLES["compile"],
        None,
        None,
        None,
        "none: measure it. Fusion can drop temporaries, but compiled graphs can also raise the peak "
        "(pytorch/pytorch#122512); compare the peak with and without it",
        COSTS["compile"],
    )


TITLES = {
    "checkpointing": "activation checkpointing",
    "autocast": "bf16 autocast",
    "accumulation": "gradient accumulation",
    "smaller_batch": "smaller batch",
    "set_to_none": "zero_grad(set_to_none=True)",
    "compile": "torch.compile",
}
COSTS = {
    "checkpointing": "one more forward pass in backward: roughly a third more compute per step",
    "autocast": "usually faster on tensor cores; check the loss for bf16 precision effects",
    "accumulation": "the same effective batch in more, smaller steps: less parallel work per kernel",
    "smaller_batch": "changes the optimisation: retune the learning rate, or keep the batch with accumulation",
    "set_to_none": "none",
    "compile": "compile time at start; recompiles on new shapes",
}
RULES: tuple[Callable[[Footprint, Assumptions], Estimate], ...] = (
    checkpointing,
    autocast,
    accumulation,
    smaller_batch,
    set_to_none,
    compile_,
)


def _estimate(fp: Footprint, a: Assumptions, remedy: str, saving: int, assumption: str) -> Estimate:
    peak = fp.peak_bytes - saving
    return Estimate(remedy, TITLES[remedy], saving, peak, peak <= target_bytes(fp, a), assumption, COSTS[remedy])


IN_USE_KEYS = {
    "checkpointing": "checkpointing",
    "autocast": "autocast",
    "set_to_none": "set_to_none",
    "compile": "compile",
}
"""Estimate -> the remedy key (``analysis.remedies``) that says whether the job already does it."""


def estimate_all(fp: Footprint, a: Optional[Assumptions] = None) -> list[Estimate]:
    """Every remedy's estimate the job does not already use, largest saving first; ``torch.compile``
    (not estimated) last."""
    a = a or Assumptions()
    found = [rule(fp, a) for rule in RULES if not _in_use(rule.__name__.rstrip("_"), fp.job)]
    return sorted(found, key=lambda e: (e.saving_bytes is None, -(e.saving_bytes or 0), ORDER.index(e.remedy)))


def _in_use(name: str, job: Optional[Mapping[str, Any]]) -> bool:
    key = IN_USE_KEYS.get(name)
    check = remedies.IN_USE.get(key) if key else None
    return bool(job and check and check(job))


def accumulation_steps_to_fit(fp: Footprint, a: Assumptions, max_steps: int = 64) -> Optional[int]:
    """The fewest micro-batches k (2..max_steps) for which the activations ÷ k fit; None if none does."""
    room = target_bytes(fp, a) - fp.static_bytes - fp.other_bytes
    if room <= 0 or fp.activations_bytes <= 0:
        return None
    k = max(math.ceil(fp.activations_bytes / room), 2)
    return k if k <= max_steps else None


def choose(fp: Footprint, estimates: list[Estimate], a: Optional[Assumptions] = None, cause: str = "") -> Choice:
    """Pick the remedies estimated to fit on their own, and say why when none does."""
    a = a or Assumptions()
    target = target_bytes(fp, a)
    excess = fp.peak_bytes - target
    steps = accumulation_steps_to_fit(fp, a)
    fitting = [e for e in estimates if e.fits and (e.saving_bytes or 0) > 0]
    if cause == CAUSE_LEAK:
        msg = (
            "the diagnosis is a leak: the activations figure includes the leaked tensors, so fix the leak first; "
            "these estimates assume the peak is the work of one step"
        )
        return Choice(target, excess, [], None, msg, judged=False)
    if excess <= 0 and fp.oom:
        msg = (
            f"by these categories the peak is {fb(-excess)} below the target, yet this step ran out of memory: "
            "what the estimate cannot see decided it (memory outside the allocator, other processes, a cache "
            "that had no block large enough, or more of the step still to come); the diagnosis above says which"
        )
        return Choice(target, excess, [], None, msg, judged=False)
    if excess <= 0:
        return Choice(target, excess, [], None, f"the peak fits: {fb(-excess)} below the target, nothing needed")
    if fp.static_bytes + fp.other_bytes > target:
        msg = (
            f"parameters, gradients and optimizer state ({fb(fp.static_bytes)}) leave no room below the target "
            f"({fb(target)}): no activation remedy fits; {_static_remedy(fp)}"
        )
        return Choice(target, excess, [], None, msg)
    if fitting:
        names = ", ".join(e.title for e in fitting)
        return Choice(target, excess, fitting, steps, f"{fb(excess)} must go; estimated to fit alone: {names}")
    msg = f"{fb(excess)} must go and no single remedy is estimated to fit: combine them (activation savings multiply)"
    if steps is not None:
        msg += f"; accumulating {steps} micro-batches per step would fit"
    return Choice(target, excess, [], steps, msg)


def _static_remedy(fp: Footprint) -> str:
    """What shrinks static bytes that leave no room, by what they are and how the job is laid out."""
    if fp.frozen_bytes * 2 >= fp.static_bytes:
        return (
            f"{fb(fp.frozen_bytes)} of them are frozen weights: load them quantised (4-bit or 8-bit), offload "
            "them to the CPU, or use a smaller frozen model"
        )
    if fp.job and remedies.sharded(fp.job):
        return (
            "they are sharded already: offload the optimizer state to the CPU, shard over more GPUs, keep them "
            "in bf16, or use a lighter optimizer state"
        )
    return "shard them (FSDP/ZeRO), keep them in bf16, or use a lighter optimizer state"
