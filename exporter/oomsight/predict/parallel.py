"""The peak per rank of a step sharded over ``world_size`` GPUs, computed from the model's layout.

The single-GPU trace gives the peak and what is alive at it by category. Per rank, the model states
are laid out as each framework lays them out (/work/shared/reference/distributed-memory.md §1-4),
and the rest of the peak (activations, temporaries, workspaces, buffers: the same micro-batch on
every rank) is kept as traced:

| layout | parameters | gradients | optimizer state | what the layout adds |
| --- | --- | --- | --- | --- |
| ddp | full | full | full | buckets = trained gradient bytes (0 with a bucket view, grads then always alive) |
| zero1-3 | DeepSpeed's own buffers, each named (``ZeroBuffers``, ``_zero``): see below | | | |
| fsdp, fsdp2 | padded shards | 1/N | 1/N | the unit in flight + one prefetched; the reduce-scatter input of
  the largest unit; fsdp2's root unit stays gathered (its ``reshard_after_forward`` is False) |

ZeRO (DeepSpeed cannot be installed here, so it is laid out from DeepSpeed's own buffers, not traced),
with ψ the trained elements, N the ranks, g the parameters' item size (2 for bf16); DeepSpeed's names in
brackets, the whole table with its sources in docs/prediction.md ("ZeRO, rank by rank"):

- ``parameters``: full for zero1/2 (``bit16_groups_flat``); zero3 ψ/N·g (``ds_tensor``) and the
  parameters of at most ``param_persistence_threshold`` elements whole;
- ``gathered_parameters`` (zero3): ``max_live_parameters``·g, at least the largest module, fetched whole;
  ``prefetch_bucket`` (zero3): ``prefetch_bucket_size``·g;
- ``gradients`` (zero1): every gradient as it forms (``param.grad`` until the epilogue reduces it);
  ``gradient_in_flight`` (zero2/3): the one gradient a hook has not yet copied into the bucket;
- ``gradient_partition``: ψ/N·g (``averaged_gradients``, ``grads_in_partition``;
  ``grad_partitions_flat_buffer``), zero1 at the step only;
- ``reduce_bucket``: ``reduce_bucket_size``·g, twice for zero1/2 with ``overlap_comm`` (``ipg_buffer``;
  ``__ipg_bucket_flat_buffer``);
- ``fp32_master`` 4ψ/N (``single_partition_of_fp32_groups``; ``fp32_partitioned_groups_flat``),
  ``optimizer_state`` Adam's 8ψ/N on it;
- at the step only: ``fp32_gradients`` 4ψ/N (zero1/2: ``single_grad_partition``), zero3 one sub-group's
  4·min(``sub_group_size``, ψ/N); ``optimizer_step_temporaries``: the one-GPU step's, scaled to the fp32
  elements stepped at once.

The forward/backward moment is taken where the rest of the step (activations, temporaries, workspaces)
is highest beside the gradients the layout keeps of it (``predictor._StatesHeld``): for ZeRO-2/3 that is
the loss backward (every activation and the logits' gradients alive, one gradient in flight), not a
one-GPU peak late in the backward where full gradients pile up. FSDP-style gathered units are never
added beside DeepSpeed's buffers. ``allgather_bucket_size`` (stage 1/2) chunks the all-gather of the
updated partitions into ``bit16_groups_flat`` in place: no memory of its own.

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


@dataclass(frozen=True)
class ZeroBuffers:
    """DeepSpeed's ZeRO settings that size its buffers, at their defaults (``DeepSpeedZeroConfig``,
    ``deepspeed/runtime/zero/config.py``; counts are elements, not bytes)."""

    reduce_bucket_size: int = ZERO_REDUCE_BUCKET_ELEMENTS
    """Elements reduced at a time: one flat IPG buffer of the gradients' dtype (5e8)."""
    allgather_bucket_size: int = 500_000_000
    """Stage 1/2: elements all-gathered at a time after the step, into the flat 16-bit groups in place (5e8)."""
    prefetch_bucket_size: int = 50_000_000
    """``stage3_prefetch_bucket_size``: parameter elements fetched ahead of use (5e7)."""
    max_live_parameters: int = 1_000_000_000
    """``stage3_max_live_parameters``: parameters resident per GPU before releasing (1e9)."""
    param_persistence_threshold: int = 100_000
    """``stage3_param_persistence_threshold``: parameters this small are never partitioned (1e5)."""
    sub_group_size: int = 1_000_000_000
    """Stage 3: elements of the fp32 partition stepped at a time, its fp32 gradients made per sub-group (1e9)."""
    contiguous_gradients: bool = True
    """Gradients copied into one partition buffer as they are produced (stage 2/3)."""
    overlap_comm: Optional[bool] = None
    """None: DeepSpeed's dynamic default, True for stage 3 and False for 1/2; stage 1/2 then keep two IPG buffers."""


ZERO = ZeroBuffers()
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
    numel: int = 0
    """Every parameter's elements, trained or frozen."""
    persistent_bytes: int = 0
    """The parameters of at most ``ZERO.param_persistence_threshold`` elements: ZeRO-3 keeps them whole."""


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
            small = sum(p.numel() * p.element_size() for p in params if p.numel() <= ZERO.param_persistence_threshold)
            found.append(dataclasses.replace(_unit(name or "(root)", params, world_size), largest_module_numel=largest,
                                             persistent_bytes=small))  # fmt: skip
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
        numel=sum(p.numel() for p in params),
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
    if layout.parallel.startswith("zero"):
        return _zero_rank(prediction, model_units, layout)
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


def _zero_rank(prediction: dict[str, Any], model_units: list[Unit], layout: Layout,
               buffers: ZeroBuffers = ZERO) -> dict[str, Any]:  # fmt: skip
    """A ZeRO rank laid out from DeepSpeed's buffers (the module's second table), moment by moment: the
    forward/backward moment where the layout's own rank is highest (``predictor._StatesHeld``) and the
    optimizer step; the larger is the peak."""
    moments = prediction.get("moments") or {}
    held = moments.get("outside_states") or _one_moment(prediction)
    name = "rest_and_gradients" if layout.parallel == "zero1" else "rest_and_one_gradient"
    at = held.get(name) or held["rest"]
    rest = {k: int(v) for k, v in at["by_category_bytes"].items() if k not in ("parameters", "gradients",
                                                                                "optimizer_state")}  # fmt: skip
    in_flight = min(int(at["gradients_bytes"]), int(held["largest_gradient_bytes"]))
    opt_c = max(int(d.get("optimizer_state", 0)) for d in _category_dicts(prediction))
    fb = {**rest, **_zero_states(model_units, layout, buffers, opt_c, at["gradients_bytes"], in_flight)}
    kept = {k: rest.get(k, 0) for k in ("workspace", "buffers")}
    step = {**kept, **_zero_states(model_units, layout, buffers, opt_c, None, 0,
                                   int(moments.get("optimizer_step_transient_bytes", 0)))}  # fmt: skip
    peak, parts, moment = sum(fb.values()), fb, "forward_backward"
    if sum(step.values()) > peak:
        peak, parts, moment = sum(step.values()), step, "optimizer_step"
    return {**asdict(layout), "per_rank_peak_allocated_bytes": peak, "parts_bytes": parts, "moment": moment,
            "moments_bytes": {"forward_backward": sum(fb.values()), "optimizer_step": sum(step.values())},
            "moment_parts_bytes": {"forward_backward": fb, "optimizer_step": step},
            "zero_buffers": asdict(buffers), "units": len(model_units),
            "largest_unit_bytes": max(u.param_bytes for u in model_units)}  # fmt: skip


def _one_moment(prediction: dict[str, Any]) -> dict[str, Any]:
    """A prediction without its moments apart (an older one, or one made by hand): its one forward/backward
    figure, every gradient of it counted as in flight (never fewer bytes than it holds)."""
    fb = (prediction.get("moments") or {}).get("forward_backward") or prediction
    cats = fb["by_category_bytes"]
    grads = int(cats.get("gradients", 0))
    states = sum(int(cats.get(k, 0)) for k in ("parameters", "gradients", "optimizer_state"))
    at = {"rest_bytes": int(fb["peak_allocated_bytes"]) - states, "gradients_bytes": grads, "by_category_bytes": cats}
    if sum(int(v) for v in cats.values()) < int(fb["peak_allocated_bytes"]):  # what no category names
        at["by_category_bytes"] = {**cats, "rest_of_step": int(fb["peak_allocated_bytes"]) - sum(cats.values())}
    return {"largest_gradient_bytes": grads, "rest": at}


def _category_dicts(prediction: dict[str, Any]) -> list[dict[str, Any]]:
    """Every by-category figure of a one-GPU prediction (the optimizer state exists from the first step on)."""
    moments = prediction.get("moments") or {}
    found = [prediction.get("by_category_bytes") or {}]
    found.append((moments.get("forward_backward") or {}).get("by_category_bytes"))
    found.append((moments.get("last_step") or {}).get("backward_start_by_category_bytes"))
    return [d for d in found if d]


def _zero_states(model_units: list[Unit], layout: Layout, buffers: ZeroBuffers, opt_c: int,
                 gradients_now: Optional[int], in_flight: int, step_transient: int = 0) -> dict[str, int]:  # fmt: skip
    """One ZeRO rank's model states and DeepSpeed's buffers: ``gradients_now`` is the one-GPU gradients at a
    forward/backward moment (None: the optimizer step, with the one-GPU step's ``step_transient``)."""
    kind, w, off = layout.parallel, layout.world_size, layout.offload
    trained = sum(u.trained_bytes for u in model_units)
    psi = sum(u.trained_numel for u in model_units)
    g = trained // psi if psi else 2
    part = math.ceil(psi / w)
    stepped = min(buffers.sub_group_size, part) if kind == "zero3" else part  # fp32 elements stepped at once
    overlap = buffers.overlap_comm if buffers.overlap_comm is not None else kind == "zero3"
    parts = {"parameters": sum(u.param_bytes for u in model_units)}
    if kind == "zero3":
        persistent = sum(u.persistent_bytes for u in model_units)
        flat = sum(u.flat_shard_bytes for u in model_units)
        # the small parameters stay whole on every rank (offloaded or not); their shards are in the flat partition
        parts["parameters"] = persistent if off == "params" else flat + persistent - math.ceil(persistent / w)
    states = {
        "gradient_partition": 0 if off or (kind == "zero1" and gradients_now is not None) else part * g,
        "fp32_master": 0 if off else 4 * part,
        "optimizer_state": 0 if off else math.ceil(opt_c * (4 / g) / w),
    }
    if gradients_now is None:  # the optimizer step: fp32 gradients and the optimizer's own temporaries
        states["fp32_gradients"] = 0 if off else 4 * stepped
        share = (4 / g) * stepped / psi if psi else 0.0
        states["optimizer_step_temporaries"] = 0 if off else math.ceil(step_transient * share)
        return {**parts, **states}
    if kind == "zero1":
        parts["gradients"] = int(gradients_now)
    else:
        parts["gradient_in_flight"] = in_flight
    parts["reduce_bucket"] = buffers.reduce_bucket_size * g * (2 if overlap and kind != "zero3" else 1)
    if kind == "zero3":
        total = sum(u.numel for u in model_units)
        itemsize = sum(u.param_bytes for u in model_units) / total if total else 2
        largest = max((u.largest_module_numel for u in model_units), default=0)
        live = max(largest, min(buffers.max_live_parameters, total))
        parts["gathered_parameters"] = math.ceil(live * itemsize)
        parts["prefetch_bucket"] = math.ceil(min(buffers.prefetch_bucket_size, max(0, total - live)) * itemsize)
    return {**parts, **states}


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
    from oomsight.predict.predictor import affine_search

    def measure(b: int) -> tuple[int, int]:
        found = peak_of(b)
        return (found, found) if isinstance(found, int) else (int(found[0]), int(found[1]))

    good, fitted = affine_search(measure, budget, start, limit)
    return {"max_batch_size": good, "budget_bytes": budget, "tried": sorted(fitted.items())}


def _with_world(layout: Layout, world: int) -> Layout:
    return dataclasses.replace(layout, world_size=world)


PADDING_NOTED = 0.01
"""A layout's padding is named once it adds this share to a rank's parameter shard (1 %): FSDP1's and
ZeRO's flat buffers pad by fewer than N elements a unit, which no one need hear about; FSDP2 pads each
parameter's dim 0, which for a parameter of fewer rows than ranks (Mixtral's fused experts) is most of it."""


def layout_notes(model: nn.Module, layout: Layout) -> list[str]:
    """What the layout pads or replicates, in words (issue 51): where a rank holds more than 1/N."""
    notes = _padding_notes(model, layout)
    kind, n = layout.parallel, layout.shards
    replicated = {
        "ddp": "DDP replicates the model: every rank holds all the parameters, gradients and optimizer state",
        "zero1": "ZeRO-1 replicates the 16-bit parameters and the gradients on every rank; only the optimizer "
        "state and the fp32 master are partitioned",
        "zero2": "ZeRO-2 replicates the 16-bit parameters on every rank; gradients, optimizer state and the "
        "fp32 master are partitioned",
    }
    if kind in replicated:
        notes.append(replicated[kind])
    if kind == "zero3":
        small = [p for p in model.parameters() if p.numel() <= ZERO.param_persistence_threshold]
        if small:
            size = sum(p.numel() * p.element_size() for p in small)
            notes.append(
                f"ZeRO-3 keeps {len(small)} parameters of at most {ZERO.param_persistence_threshold:,} elements "
                f"whole on every rank (stage3_param_persistence_threshold): {size:,} B replicated"
            )
    if layout.shards < layout.world_size:
        notes.append(f"hybrid sharding replicates over {layout.world_size // n} groups: each rank holds 1/{n} of the "
                     f"model, not 1/{layout.world_size}")  # fmt: skip
    return notes


def _padding_notes(model: nn.Module, layout: Layout) -> list[str]:
    kind, n = layout.parallel, layout.shards
    if kind not in ("fsdp2", "fsdp", "zero1", "zero2", "zero3") or n < 2:
        return []
    params = [(name, p) for name, p in model.named_parameters()]
    exact = sum(p.numel() * p.element_size() for _, p in params) / n
    if kind == "fsdp2":
        held = {name: _unit(name, [p], n).shard_bytes for name, p in params}
    else:  # one flat buffer a unit, padded to a multiple of N elements
        held = {u.name: u.flat_shard_bytes for u in units(model, n)}
    extra = sum(held.values()) - exact
    if extra < PADDING_NOTED * exact:
        return []
    if kind != "fsdp2":
        return [f"{kind} pads each unit's flat buffer to a multiple of {n}: {extra:,.0f} B per rank over 1/{n}"]
    few = [(name, p) for name, p in params if p.dim() and p.shape[0] % n and
           held[name] >= 1.5 * p.numel() * p.element_size() / n]  # fmt: skip
    if not few:
        return [f"FSDP2 pads dim 0 of each parameter to a multiple of {n}: {extra:,.0f} B per rank over 1/{n}"]
    name, p = max(few, key=lambda item: item[1].numel())
    rows, kept = p.shape[0], math.ceil(p.shape[0] / n)
    return [f"FSDP2 pads dim 0 to a multiple of {n}: {len(few)} parameters have fewer rows than that, or not a "
            f"multiple of it (the largest: {name}, shape {tuple(p.shape)}: each rank holds {kept} of its {rows} "
            f"rows, {kept}/{rows} of it instead of 1/{n}); {extra:,.0f} B per rank over 1/{n}"]  # fmt: skip
