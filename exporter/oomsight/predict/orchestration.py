"""What ``oomsight predict`` computes for a ``PredictJob`` and its spec: the prediction, then what the job
asks beside it (``--generate``'s cache, ``--gpu``'s card, the per-rank peak of ``--parallel``, the largest
batch, the fewest GPUs) and, where the job does not fit, the cheapest change that does (``change``).

``result`` is the dict ``--json`` prints and ``prose`` renders. A step that cannot be traced raises; its
reason in one line is ``untraceable``.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import asdict, fields, replace
from typing import Any, Optional

from oomsight.predict import optimizer
from oomsight.predict.job import DTYPES, PredictJob, layout
from oomsight.predict.spec import adapted, first_line, spec_of

CATEGORY_ORDER = ("parameters", "buffers", "gradients", "optimizer_state", "activations", "temporaries", "workspace")
"""The categories of a prediction in the order of a training step's life: what the model holds,
then what backward and the optimizer add, then what a step makes and frees; every one shown,
a category at 0 too (GPT-2's gradients are freed before its peak: 0 says so, a gap would not)."""
DATA_DEPENDENT = ("_local_scalar_dense", "DataDependentOutputException", "data-dependent")
"""Signs that the step read a tensor's value (``.item()``, ``.tolist()``, ``if tensor:``)."""


def result(job: PredictJob, spec: dict[str, Any]) -> dict[str, Any]:
    """The prediction and what the job asks beside it; with a capacity the job as given does not fit
    (training, not ``--generate``), the cheapest change that does, under ``changes``."""
    found = predicted(job, spec)
    if job.capacity_bytes is not None and not job.generate and not _fits(job, found):
        found["changes"] = _changes(job, spec)
    return found


def untraceable(exc: BaseException) -> str:
    """Why the step could not be traced, in one line: the cause first where it is known."""
    text = f"{type(exc).__name__}: {exc}"
    if any(sign in text for sign in DATA_DEPENDENT):
        return (
            "the step has data-dependent control flow (.item(), .tolist(), if on a tensor's value), which a "
            "trace on fake tensors cannot follow: move it out of the step or give --module a 'step' without it "
            f"({first_line(text)})"
        )
    where = _user_frame(exc)
    return f"the step could not be traced on fake tensors{where}: {first_line(text)}"


def _user_frame(exc: BaseException) -> str:
    """`` at FILE:LINE`` of the innermost frame outside torch and oomsight, if any."""
    skip = (os.sep + "torch" + os.sep, os.sep + "oomsight" + os.sep, os.sep + "transformers" + os.sep, "<frozen")
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not any(s in f.filename for s in skip)]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def _fits(job: PredictJob, found: dict[str, Any]) -> bool:
    """Whether the job as given fits: per rank, or on one GPU its peak reserved within the budget."""
    if "parallel" in found:
        return bool(found["parallel"].get("fits", True))
    return int(found["prediction"]["peak_reserved_bytes"]) <= _budget(job, 1)


def _changes(job: PredictJob, spec: dict[str, Any]) -> dict[str, Any]:
    """The cheapest change that fits (``change.py``): each predicted with the job's other settings."""
    from oomsight.predict import change

    settings = {f.name: getattr(job, f.name) for f in fields(job)}
    described = {**settings, "own_optimizer": bool(spec.get("optimizer")), "own_step": bool(spec.get("step")),
                 "config": "config" in spec}  # fmt: skip

    def peak_of(overrides: dict[str, Any]) -> int:
        variant = replace(job, **{**overrides, "gpus_needed": False, "largest_batch": False})
        return _job_peak(variant, spec_of(variant) if "checkpointing" in overrides else spec)

    world = job.world_size
    found = change.search(change.candidates(described), peak_of, _budget(job, world), _usable(job, world))
    return {**found.to_dict(), "margin": job.margin}


def _job_peak(job: PredictJob, spec: dict[str, Any]) -> int:
    """The peak reserved per rank of the job, with no search."""
    from oomsight.predict import predict_peak, sharded

    if job.parallel and sharded.traced(layout(job)):
        return int(_per_rank(job, spec, {})["per_rank_peak_reserved_bytes"])
    make_optimizer = spec.get("optimizer") or optimizer_of(job)
    p = predict_peak(spec["build"], lambda n: spec["batch"](n, "cpu"), job.batch, make_optimizer, spec.get("step"),
                     **trace_settings(job))  # fmt: skip
    if not job.parallel:
        return p.peak_reserved_bytes
    return int(_per_rank(job, spec, in_order(p.to_dict()))["per_rank_peak_reserved_bytes"])


def predicted(job: PredictJob, spec: dict[str, Any]) -> dict[str, Any]:
    """The prediction and the facts the job asks beside it (no change searched: ``result`` adds that)."""
    from oomsight.predict import largest_batch, predict_peak

    kwargs = trace_settings(job)
    make_optimizer = spec.get("optimizer") or optimizer_of(job)

    def batch(n: int) -> Any:
        return spec["batch"](n, "cpu")

    from oomsight.predict import sharded

    if job.parallel and sharded.traced(layout(job)):  # the rank is traced itself: no one-GPU trace
        return _predict_traced_rank(job, spec)
    p = predict_peak(spec["build"], batch, job.batch, make_optimizer, spec.get("step"), **kwargs)
    out: dict[str, Any] = {"prediction": in_order(p.to_dict())}
    if "seq_len" in spec and not job.generate:
        out["prediction"]["seq_len"] = spec["seq_len"]
    if job.generate:
        out["generate"] = _generate_facts(job, spec)
    if job.gpu:
        out["gpu"] = _gpu_facts(job)
    if job.parallel:
        out["parallel"] = _per_rank(job, spec, out["prediction"])
        if job.largest_batch and "usable_bytes" in out["parallel"]:
            out["largest_batch_per_rank"] = _largest_per_rank(job, spec, batch, make_optimizer, kwargs)
    # one GPU searches whenever it has a capacity; generation (hundreds of forwards a try) when asked
    if job.capacity_bytes is not None and not job.parallel and (job.largest_batch or not job.generate):
        search = largest_batch(
            spec["build"], batch, _usable(job, 1), make_optimizer, spec.get("step"), margin=job.margin,
            start=job.batch, judge="reserved", known={job.batch: p}, **kwargs,
        )  # fmt: skip
        out["largest_batch"] = {k: v for k, v in search.to_dict().items() if k != "prediction"}
    return out


def _predict_traced_rank(job: PredictJob, spec: dict[str, Any]) -> dict[str, Any]:
    """``--parallel fsdp|fsdp2|ddp``: rank 0 traced on a fake process group is the prediction."""
    out: dict[str, Any] = {}
    if job.gpu:
        out["gpu"] = _gpu_facts(job)
    out["parallel"] = _per_rank(job, spec, {})
    rank = out["parallel"]
    out["prediction"] = {
        "batch_size": job.batch, "peak_allocated_bytes": rank["per_rank_peak_allocated_bytes"],
        "peak_reserved_bytes": rank["per_rank_peak_reserved_bytes"], "by_category_bytes": rank["parts_bytes"],
        "rank": 0, "seq_len": spec.get("seq_len"), "workspace_bytes": rank["workspace_bytes"],
        "seconds": rank["trace_seconds"],
    }  # fmt: skip
    if job.largest_batch and "usable_bytes" in rank:
        laid = layout(job)
        out["largest_batch_per_rank"] = _parallel_search(
            lambda b: _line_and_reserved(_traced_rank(job, spec, laid, b)), rank["usable_bytes"], job.batch
        )
    return out


def _parallel_search(peak_of: Any, budget: int, start: int) -> dict[str, Any]:
    from oomsight.predict import parallel

    return parallel.largest_batch(peak_of, budget, start=start)


def _largest_per_rank(job: PredictJob, spec: dict[str, Any], batch: Any, make_optimizer: Any,
                      kwargs: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """The largest micro-batch per rank whose per-rank peak fits the usable capacity less the margin."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from oomsight.predict import parallel, predict_peak

    laid = layout(job)
    with unset_fake_temporarily(), torch.device("meta"):
        laid_units = parallel.units(spec["build"](), laid.shards)

    def peak_of(b: int) -> tuple[int, int]:
        p = predict_peak(spec["build"], batch, b, make_optimizer, spec.get("step"), **kwargs)
        ranked = parallel.per_rank(in_order(p.to_dict()), laid_units, laid)
        slack = max(0, p.peak_reserved_bytes - p.peak_allocated_bytes)  # judged on reserved
        line = ranked["moments_bytes"]["forward_backward"] + slack
        return line, int(ranked["per_rank_peak_allocated_bytes"]) + slack

    budget = int(_usable(job, laid.world_size) * (1.0 - job.margin))
    return parallel.largest_batch(peak_of, budget, start=job.batch)


def trace_settings(job: PredictJob) -> dict[str, Any]:
    """The keywords of ``predict_peak`` the job sets (autocast, accumulation, steps, the GPU's capability)."""
    import torch

    return {
        "autocast": {"bf16": torch.bfloat16, "fp16": torch.float16}.get(job.autocast or ""),
        "accumulation": job.accumulation,
        "keep_outputs": bool(job.keep_outputs),
        "steps": 1 if job.generate else job.steps,
        "expandable_segments": bool(job.expandable_segments) or None,
        "capability": job.gpu_spec.capability if job.gpu_spec else (9, 0),
    }


def _generate_facts(job: PredictJob, spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from oomsight.predict import generation

    assert job.cache is not None  # job_from_args: dynamic where --cache is not given
    itemsize = torch.empty(0, dtype=getattr(torch, DTYPES[job.dtype or "fp32"])).element_size()
    length = job.prompt_tokens + job.new_tokens
    return {
        "prompt_tokens": job.prompt_tokens,
        "new_tokens": job.new_tokens,
        "cache": job.cache,
        "kv_cache_bytes_at_the_end": generation.cache_bytes(spec["config"], job.batch, length, itemsize, job.cache),
        "sliding_window": getattr(spec["config"], "sliding_window", None),
    }


def optimizer_of(job: PredictJob) -> Any:
    """The optimizer ``--optimizer`` and ``--optimizer-impl`` name (``optimizer.factory``)."""
    return optimizer.factory(job.optimizer, job.optimizer_impl)


def _usable(job: PredictJob, world: int) -> int:
    """The allocator's share of the capacity: with ``--gpu``, less the CUDA context and NCCL."""
    from oomsight.predict import gpu

    assert job.capacity_bytes is not None  # only a job with --capacity or --gpu is judged against one
    groups = 2 if job.shard_size and job.shard_size < world else 1  # HSDP: shard and replica groups
    return gpu.usable_bytes(job.capacity_bytes, world, counted=bool(job.gpu), communicators=groups)


def _gpu_facts(job: PredictJob) -> dict[str, Any]:
    from oomsight.predict import gpu

    g = job.gpu_spec
    assert g is not None  # --gpu was checked into its card (job_from_args)
    return {
        "name": g.name,
        "total_bytes": g.total_bytes,
        "capability": list(g.capability),
        "attention_kernel": g.attention,
        "outside_allocator_bytes": gpu.outside_allocator_bytes(
            job.world_size, 2 if job.shard_size and job.shard_size < job.world_size else 1
        ),
        "usable_bytes": _usable(job, job.world_size),
    }


def _per_rank(job: PredictJob, spec: dict[str, Any], prediction: dict[str, Any]) -> dict[str, Any]:
    """The peak per rank of the layout and, with ``--gpus-needed``, the fewest ranks that fit. FSDP, FSDP2
    and DDP are traced rank by rank on a fake process group (``sharded.py``); the others are laid out moment
    by moment from the one-GPU trace (``parallel.per_rank``). The verdict is on the peak reserved."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from oomsight.predict import parallel, sharded

    with unset_fake_temporarily(), torch.device("meta"):
        model = spec["build"]()
    laid = layout(job)
    if sharded.traced(laid):
        found = _traced_rank(job, spec, laid, job.batch)
    else:
        found = parallel.per_rank(prediction, parallel.units(model, laid.shards), laid)
        slack = int(prediction["peak_reserved_bytes"]) - int(prediction["peak_allocated_bytes"])
        found["per_rank_peak_reserved_bytes"] = found["per_rank_peak_allocated_bytes"] + max(0, slack)
    found["notes"] = parallel.layout_notes(model, laid)
    if job.capacity_bytes is not None:
        budget = _budget(job, laid.world_size)
        found["usable_bytes"], found["fits"] = budget, found["per_rank_peak_reserved_bytes"] <= budget
    if job.gpus_needed:
        if sharded.traced(laid):
            search = sharded.gpus_needed(
                lambda w: _peaks(_traced_rank(job, spec, parallel._with_world(laid, w), job.batch)),
                lambda w: _budget(job, w), laid,
            )  # fmt: skip
            found["gpus_needed"], found["gpus_needed_traces"] = search["gpus_needed"], search["traces"]
        else:
            slack = found["per_rank_peak_reserved_bytes"] - found["per_rank_peak_allocated_bytes"]
            found["gpus_needed"] = parallel.gpus_needed(  # judged on reserved: the allocated peak plus its cache
                prediction, lambda w: parallel.units(model, w), laid, lambda w: _budget(job, w) - slack,
            )  # fmt: skip
    return found


def _line_and_reserved(rank: dict[str, Any]) -> tuple[int, int]:
    """A traced rank's forward/backward moment (the part that grows with the batch) and its peak, in reserved bytes."""
    slack = int(rank["per_rank_peak_reserved_bytes"]) - int(rank["per_rank_peak_allocated_bytes"])
    moments = rank.get("moments_bytes") or {}
    line = max(moments.get("forward", 0), moments.get("backward", 0)) or int(rank["per_rank_peak_allocated_bytes"])
    return line + slack, int(rank["per_rank_peak_reserved_bytes"])


def _peaks(rank: dict[str, Any]) -> tuple[int, int]:
    return int(rank["per_rank_peak_allocated_bytes"]), int(rank["per_rank_peak_reserved_bytes"])


def _budget(job: PredictJob, world: int) -> int:
    """What a rank's allocator may reserve: the capacity less the context and NCCL (``--gpu``), less the margin."""
    return int(_usable(job, world) * (1.0 - job.margin))


def _traced_rank(job: PredictJob, spec: dict[str, Any], laid: Any, batch_size: int) -> dict[str, Any]:
    """Rank 0 of layout ``laid`` traced on a fake process group, as ``per_rank``'s dict."""
    from oomsight.predict import hfmodel, sharded

    kwargs = {**trace_settings(job), "steps": 2}
    param_dtype = _dtype(job.mixed_precision)
    make_optimizer = spec.get("optimizer") or optimizer_of(job)

    def batch(n: int) -> Any:
        return spec["batch"](n, "cpu")

    if "config" in spec:
        traced = sharded.predict_config_rank(
            spec["config"], lambda c: adapted(job, hfmodel.builder(c)), batch, batch_size, laid, make_optimizer,
            param_dtype=param_dtype, **kwargs,
        )  # fmt: skip
    else:
        traced = sharded.predict_rank(
            spec["build"], batch, batch_size, laid, make_optimizer, spec.get("step"), param_dtype=param_dtype,
            **kwargs,
        ).to_dict()  # fmt: skip
    return {
        **asdict(laid),
        "per_rank_peak_allocated_bytes": int(traced["peak_allocated_bytes"]),
        "per_rank_peak_reserved_bytes": int(traced["peak_reserved_bytes"]),
        "parts_bytes": traced["by_category_bytes"],
        "moment": traced.get("moment", "traced"),
        "moments_bytes": traced.get("moments_bytes", {}),
        "workspace_bytes": int(traced["workspace_bytes"]),
        "trace_seconds": traced["seconds"],
        "traced": f"rank 0 of {laid.world_size} on a fake process group, {traced.get('layers_traced')} blocks "
        f"traced of {traced.get('layers')}",
    }


def _dtype(name: Optional[str]) -> Any:
    import torch

    return getattr(torch, DTYPES[name]) if name else None


def in_order(prediction: dict[str, Any]) -> dict[str, Any]:
    """The prediction with its categories in ``CATEGORY_ORDER``, zeros kept (any other category
    after them), and the workspace figures told apart: ``workspace_bytes`` is one cuBLAS handle's,
    the ``workspace`` category every handle's the step made (forward and backward each have one,
    and cuBLASLt adds its own)."""
    found = dict(prediction["by_category_bytes"])
    ordered = {name: int(found.pop(name, 0)) for name in CATEGORY_ORDER}
    ordered.update(sorted(found.items()))
    handles = ordered["workspace"] // prediction["workspace_bytes"] if prediction["workspace_bytes"] else 0
    return {
        **prediction,
        "by_category_bytes": ordered,
        "workspace_handles": handles,
    }
