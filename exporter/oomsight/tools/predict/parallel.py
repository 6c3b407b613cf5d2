"""The peak per rank of a step sharded over ``world_size`` GPUs, computed from the model's layout.

The single-GPU trace gives the peak and what is alive at it by category. Per rank, the model states
are laid out as each framework lays them out (/work/shared/reference/distributed-memory.md §1-4),
and the rest of the peak (activations, temporaries, workspaces, buffers: the same micro-batch on
every rank) is kept as traced:

| layout | parameters | gradients | optimizer state | what the layout adds |
| --- | --- | --- | --- | --- |
| ddp | full | full | full | buckets = trained gradient bytes (0 with a bucket view, grads then always alive) |
| zero1 | full | full | 1/N (+ fp32 master 1/N for 16-bit params) | one IPG bucket |
| zero2 | full | 1/N, kept | as zero1 | one IPG bucket |
| zero3 | 1/N | 1/N, kept | as zero1 | the unit in flight + one prefetched, gathered; one IPG bucket |
| fsdp, fsdp2 | padded shards | 1/N | 1/N | the unit in flight + one prefetched; the reduce-scatter input of
  the largest unit; fsdp2's root unit stays gathered (its ``reshard_after_forward`` is False) |

``--no-reshard`` keeps every unit gathered from its forward to its backward (FSDP2
``reshard_after_forward=False``, FSDP1 ``SHARD_GRAD_OP``). ``--offload optimizer`` puts optimizer
state, fp32 master and (ZeRO-2/3) the gradient partition on the host; ``--offload params`` (FSDP's
``CPUOffloadPolicy``, ZeRO-3's ``offload_param``) also the parameter shards and, for FSDP, the
gradients. A unit is a module whose class is in ``_no_split_modules`` (transformers' own list of
the blocks FSDP wraps: ``LlamaDecoderLayer``...), else each module holding parameters directly;
the root unit is every parameter left over.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

PARALLEL = ("ddp", "fsdp", "fsdp2", "zero1", "zero2", "zero3")
OFFLOAD = ("optimizer", "params")
ZERO_REDUCE_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's ``reduce_bucket_size`` default (``runtime/zero/config.py``): elements of one IPG bucket."""
GATHERED_UNITS = 2
"""Units gathered at once: the one computing and one prefetched (FSDP1's limiter allows 2 all-gathers
in flight; FSDP2 prefetches one; ZeRO-3's prefetch bucket is of the same order)."""


@dataclass(frozen=True)
class Layout:
    """How the job is spread: ``parallel`` over ``world_size`` ranks."""

    world_size: int
    parallel: str
    reshard: bool = True
    offload: Optional[str] = None
    bucket_view: bool = False
    shard_size: Optional[int] = None
    """Hybrid sharding (HSDP): shards over groups of ``shard_size`` ranks, replicated across them."""

    @property
    def shards(self) -> int:
        """The ranks one parameter is sharded over."""
        return self.shard_size or self.world_size


@dataclass(frozen=True)
class Unit:
    """One wrapped module's parameters: full bytes, this rank's padded shard, the trained part."""

    name: str
    param_bytes: int
    shard_bytes: int
    flat_shard_bytes: int
    trained_bytes: int
    trained_numel: int
    trained_shard_bytes: int
    """The padded shards of the trained parameters: what a rank's gradients and optimizer state scale with."""
    largest_module_numel: int = 0
    """The most parameters one module of the unit holds directly (DeepSpeed's ``largest_layer_params``)."""


def units(model: nn.Module, world_size: int) -> list[Unit]:
    """The units FSDP/ZeRO would wrap, each parameter once (a tied weight in its first unit), root last."""
    wrapped = _wrapped_modules(model)
    seen: set[int] = set()
    found = []
    for name, module in [*wrapped, ("", model)]:
        params = [p for p in module.parameters() if id(p) not in seen]
        seen.update(id(p) for p in params)
        if params or not name:
            mine = {id(p) for p in params}
            largest = max((sum(p.numel() for p in m.parameters(recurse=False) if id(p) in mine)
                           for m in module.modules()), default=0)  # fmt: skip
            found.append(dataclasses.replace(_unit(name or "(root)", params, world_size), largest_module_numel=largest))
    return found


def _wrapped_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    blocks: set[str] = set()
    for m in model.modules():
        blocks.update(getattr(m, "_no_split_modules", None) or ())
    chosen = [(n, m) for n, m in model.named_modules() if n and type(m).__name__ in blocks]
    if chosen:
        return chosen
    return [(n, m) for n, m in model.named_modules() if n and any(True for _ in m.parameters(recurse=False))]


def _unit(name: str, params: Sequence[torch.Tensor], world: int) -> Unit:
    def shard(p: torch.Tensor) -> int:  # FSDP2: dim 0 padded to a multiple of the world
        rows = p.shape[0] if p.dim() else 1
        return math.ceil(rows / world) * (p.numel() // max(rows, 1)) * p.element_size()

    total = sum(p.numel() * p.element_size() for p in params)
    itemsize = params[0].element_size() if params else 1  # FSDP1 flattens one dtype per unit
    trained = [p for p in params if p.requires_grad]
    return Unit(
        name=name,
        param_bytes=total,
        shard_bytes=sum(shard(p) for p in params),
        flat_shard_bytes=math.ceil(math.ceil(total / itemsize) / world) * itemsize,  # FSDP1/ZeRO: one flat buffer
        trained_bytes=sum(p.numel() * p.element_size() for p in trained),
        trained_numel=sum(p.numel() for p in trained),
        trained_shard_bytes=sum(shard(p) for p in trained),
    )


def check(layout: Layout) -> Optional[str]:
    """What is wrong with the layout, in one line, or None."""
    if layout.world_size < 1:
        return "--world-size must be at least 1"
    if layout.offload and layout.parallel == "ddp":
        return "--offload needs fsdp, fsdp2 or zero1-3 (DDP keeps everything on the GPU)"
    if layout.offload == "params" and layout.parallel in ("zero1", "zero2"):
        return "--offload params needs zero3, fsdp or fsdp2 (ZeRO-1/2 keep the full parameters)"
    if layout.offload == "optimizer" and layout.parallel == "fsdp2":  # CPUOffloadPolicy has no optimizer-only form
        return "--offload optimizer: FSDP2 offloads parameters, gradients and optimizer state together (use params)"
    if not layout.reshard and layout.parallel not in ("fsdp", "fsdp2"):
        return "--no-reshard applies to fsdp and fsdp2"
    if layout.bucket_view and layout.parallel != "ddp":
        return "--bucket-view applies to ddp"
    if layout.shard_size is not None:
        if layout.parallel not in ("fsdp", "fsdp2"):
            return "--shard-size (hybrid sharding) applies to fsdp and fsdp2"
        if layout.shard_size < 1 or layout.world_size % layout.shard_size:
            return "--shard-size must divide --world-size"
    return None


def per_rank(prediction: dict[str, Any], model_units: list[Unit], layout: Layout) -> dict[str, Any]:
    """The peak allocated bytes of one rank and its parts, moment by moment (see the module's table).

    Two moments of the one-GPU trace are laid out apart and the larger is the rank's peak: the
    forward/backward peak (its activations and temporaries kept, the model states as the layout
    holds them then, the gathered units and communication buffers added) and the optimizer step
    (the states, and the step's own temporaries for this rank's share of the parameters). A sum of
    peaks of different moments (the one-GPU step's unsharded foreach temporary beside gathered
    layers) is never taken. A prediction without ``moments`` is one moment, its peak."""
    moments = prediction.get("moments") or {}
    whole = {k: prediction[k] for k in ("peak_allocated_bytes", "by_category_bytes")}
    fb = moments.get("forward_backward") or whole
    transient = int(moments.get("optimizer_step_transient_bytes", 0))
    at_fb = _laid_out(fb, model_units, layout, step_transient=None)
    at_step = _laid_out(fb, model_units, layout, step_transient=transient) if transient else None
    peak, parts, moment = at_fb[0], at_fb[1], "forward_backward"
    if at_step and at_step[0] > peak:
        peak, parts, moment = at_step[0], at_step[1], "optimizer_step"
    moments_bytes = {"forward_backward": at_fb[0], "optimizer_step": at_step[0] if at_step else 0}
    return {**asdict(layout), "per_rank_peak_allocated_bytes": peak, "parts_bytes": parts, "moment": moment,
            "moments_bytes": moments_bytes,
            "units": len(model_units), "largest_unit_bytes": max(u.param_bytes for u in model_units)}  # fmt: skip


def _laid_out(
    fb: dict[str, Any], model_units: list[Unit], layout: Layout, step_transient: Optional[int]
) -> tuple[int, dict[str, int]]:
    """One moment's bytes on a rank: ``step_transient`` None is the forward/backward peak, else the
    optimizer step with that one-GPU temporary (shared out as the optimizer state is)."""
    cats = fb["by_category_bytes"]
    params_c, grads_c, opt_c = (int(cats.get(k, 0)) for k in ("parameters", "gradients", "optimizer_state"))
    kind = layout.parallel
    trained = sum(u.trained_bytes for u in model_units)
    trained_numel = sum(u.trained_numel for u in model_units)
    grad_itemsize = trained // trained_numel if trained_numel else 4
    if step_transient is None:
        parts: dict[str, int] = {"rest_of_step": int(fb["peak_allocated_bytes"]) - params_c - grads_c - opt_c}
    else:  # the optimizer step: every gradient exists; the activations are gone
        parts = {"workspace": int(cats.get("workspace", 0)), "buffers": int(cats.get("buffers", 0))}
        grads_c = trained
    if kind == "ddp":
        parts.update(parameters=params_c, optimizer_state=opt_c)
        parts["gradients"] = trained if layout.bucket_view else grads_c
        parts["ddp_buckets"] = 0 if layout.bucket_view else trained
        share = 1.0
    elif kind.startswith("zero"):
        parts.update(_zero(kind, params_c, grads_c, opt_c, model_units, layout, trained_numel, grad_itemsize))
        share = (4 / grad_itemsize) / layout.world_size  # DeepSpeed steps on fp32 partitions
        if step_transient is None:
            parts["gathered_parameters"] = (
                sum(u.param_bytes for u in _gathered(model_units)) if kind == "zero3" else 0
            )
            parts["ipg_bucket"] = min(ZERO_REDUCE_BUCKET_ELEMENTS, trained_numel) * grad_itemsize
    else:
        parts.update(_fsdp(kind, grads_c, opt_c, model_units, layout, during_step=step_transient is not None))
        if layout.shards < layout.world_size and step_transient is None:  # HSDP: all-reduce across replicas
            parts["replica_all_reduce_buffer"] = max(u.trained_shard_bytes for u in model_units)
        share = sum(u.trained_shard_bytes for u in model_units) / trained if trained else 0.0
    if step_transient is not None:
        parts["optimizer_step_temporaries"] = 0 if layout.offload else math.ceil(step_transient * share)
    return sum(parts.values()), parts


def _gathered(model_units: list[Unit], count: int = GATHERED_UNITS) -> list[Unit]:
    return sorted(model_units, key=lambda u: u.param_bytes, reverse=True)[:count]


def largest_layer_numel(model: nn.Module) -> int:
    """DeepSpeed's ``largest_layer_params``: the most parameters one module holds directly."""
    return max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)


def zero_model_states(
    stage: int, total_numel: int, largest_layer: int, world: int, offload: Optional[str] = None
) -> int:
    """Bytes of model states per GPU by DeepSpeed's own estimators (16-bit parameters, Adam):
    ``estimate_zero2_model_states_mem_needs`` 2P + 18P/N (offloaded: 2P) and
    ``estimate_zero3_model_states_mem_needs`` 4L + 18P/N (optimizer offloaded: 4L + 2P/N; parameters
    too: 4L), where 18 = 16-bit gradients 2 + fp32 gradients 4 + fp32 master 4 + Adam state 8."""
    if stage == 2:
        return 2 * total_numel + (0 if offload else int(18 * total_numel / world))
    if offload == "params":
        return 4 * largest_layer
    return 4 * largest_layer + int((2 if offload else 18) * total_numel / world)


def _zero(kind: str, params_c: int, grads_c: int, opt_c: int, model_units: list[Unit], layout: Layout,
          trained_numel: int, grad_itemsize: int) -> dict[str, int]:  # fmt: skip
    """ZeRO's states by DeepSpeed's partition rules: Adam state in fp32 (the one-GPU state rescaled to
    4 bytes an element), an fp32 gradient partition and an fp32 master partition for 16-bit
    parameters, a 16-bit gradient partition (stage 2/3; stage 1 keeps the full gradients)."""
    w, off = layout.world_size, layout.offload
    sixteen_bit = grad_itemsize < 4
    part = math.ceil(trained_numel / w)
    parts = {
        "optimizer_state": 0 if off else math.ceil(opt_c * (4 / grad_itemsize) / w),
        "fp32_master": 0 if off or not sixteen_bit else 4 * part,
        "fp32_gradient_partition": 0 if off or not sixteen_bit else 4 * part,
        "gradients": grads_c if kind == "zero1" else (0 if off else part * grad_itemsize),
    }
    if kind == "zero3":
        # stage 3 converts the 16-bit gradients to fp32 per sub-group at the step; DeepSpeed's estimate
        # (18P/N with the 16-bit parameter shard inside) leaves 2 bytes a parameter for them
        parts["fp32_gradient_partition"] = 0 if off or not sixteen_bit else 2 * part
        parts["parameters"] = 0 if off == "params" else sum(u.flat_shard_bytes for u in model_units)
        parts["largest_layer_buffer"] = 4 * max((u.largest_module_numel for u in model_units), default=0)
    else:
        parts["parameters"] = params_c
    return parts


def _fsdp(kind: str, grads_c: int, opt_c: int, model_units: list[Unit], layout: Layout,
          during_step: bool = False) -> dict[str, int]:  # fmt: skip
    offloaded = layout.offload == "params"
    trained = sum(u.trained_bytes for u in model_units)
    share = sum(u.trained_shard_bytes for u in model_units) / trained if trained else 0.0
    shards = sum((u.shard_bytes if kind == "fsdp2" else u.flat_shard_bytes) for u in model_units)
    if during_step:
        gathered_bytes = 0
    elif layout.reshard:
        gathered = _gathered(model_units)
        root = model_units[-1]
        extra_root = kind == "fsdp2" and root not in gathered
        gathered_bytes = sum(u.param_bytes for u in gathered) + (root.param_bytes if extra_root else 0)
    else:
        gathered_bytes = sum(u.param_bytes for u in model_units)
    return {
        "parameters": 0 if offloaded else shards,
        "gathered_parameters": gathered_bytes,
        "gradients": 0 if offloaded else math.ceil(grads_c * share),
        "optimizer_state": 0 if layout.offload else math.ceil(opt_c * share),
        "reduce_scatter_buffer": 0 if during_step else max(u.trained_bytes for u in model_units),
    }


def gpus_needed(
    prediction: dict[str, Any], model_units_of: Any, layout: Layout, usable_of: Any, limit: int = 1024
) -> Optional[int]:
    """The fewest ranks (1, 2, 4, 8, then multiples of 8 up to ``limit``) whose per-rank peak fits
    ``usable_of(world)`` bytes; ``model_units_of(world)`` gives the units laid out over ``world``.
    Hybrid sharding keeps its shard size: more replicas never lower a rank's peak."""
    if layout.shard_size:
        laid = per_rank(prediction, model_units_of(layout.shard_size), layout)
        fits = laid["per_rank_peak_allocated_bytes"] <= usable_of(layout.world_size)
        return layout.shard_size if fits else None
    for world in [1, 2, 4, *range(8, limit + 1, 8)]:
        if world == 1:  # one GPU: nothing is sharded, nothing is bucketed
            found = int(prediction["peak_allocated_bytes"])
        elif layout.parallel == "ddp":
            return None  # DDP replicates: more GPUs never lower a rank's peak
        else:
            laid = per_rank(prediction, model_units_of(world), _with_world(layout, world))
            found = laid["per_rank_peak_allocated_bytes"]
        if found <= usable_of(world):
            return world
    return None


def largest_batch(
    peak_of: Callable[[int], Any], budget: int, start: int = 1, limit: int = 1 << 16
) -> dict[str, Any]:
    """The largest micro-batch whose per-rank peak ``peak_of(batch)`` fits ``budget``: an int (that peak)
    or ``(allocated, reserved)``, the line drawn through the first and the verdict on the second
    (``predictor.affine_search``: four traces where memory is affine in the batch)."""
    from oomsight.tools.predict.predictor import affine_search

    def measure(b: int) -> tuple[int, int]:
        found = peak_of(b)
        return (found, found) if isinstance(found, int) else (int(found[0]), int(found[1]))

    good, fitted = affine_search(measure, budget, start, limit)
    return {"max_batch_size": good, "budget_bytes": budget, "tried": sorted(fitted.items())}


def _with_world(layout: Layout, world: int) -> Layout:
    return dataclasses.replace(layout, world_size=world)
