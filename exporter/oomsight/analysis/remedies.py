"""The remedies a diagnosis can name, which of them change what the job computes, and which fit a
job that already does what.

A remedy is a key with one sentence of advice. :func:`pick` drops the remedies the job
already uses (bf16 autocast, activation checkpointing, gradient accumulation,
``expandable_segments``, ``torch.compile``, ``zero_grad(set_to_none=True)``, and, wire 1.6, the
parallelism's sharding, resharding, ZeRO stage, offload and DDP bucket views, a quantised base) as
the hook detected them (``JobSetup``), so advice never tells a job to do what it does.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Optional

REMEDY = {
    "batch": "Lower the batch size and keep the effective batch with gradient accumulation "
    "(accumulate N micro-batches before optimizer.step()).",
    "autocast": "Run forward and loss under torch.autocast('cuda', dtype=torch.bfloat16): "
    "activations are stored in 2 bytes instead of 4.",
    "checkpointing": "Use activation checkpointing (torch.utils.checkpoint.checkpoint on the "
    "largest blocks): recompute activations in backward instead of storing them.",
    "compile": "Try torch.compile and measure its peak: it can fuse away temporaries, but it "
    "can also raise the peak (pytorch/pytorch#122512).",
    "expandable": "Set PYTORCH_ALLOC_CONF=expandable_segments:True (PYTORCH_CUDA_ALLOC_CONF "
    "before torch 2.9) so freed blocks can be reused across segments.",
    "split": "Expandable segments are already on (the allocator then ignores any maximum split size): add "
    "garbage_collection_threshold:0.8 to PYTORCH_ALLOC_CONF so cached blocks are released before the cache "
    "fills, or call torch.cuda.empty_cache() around phase changes (training to evaluation, a new input shape).",
    "shapes": "Keep tensor shapes stable between steps (pad or bucket variable-length inputs).",
    "bound_input": "Bound what one forward takes in at what fitted before: split a larger batch into micro-batches "
    "of at most that many samples (a max-tokens-per-micro-batch sampler for variable lengths) and accumulate their "
    "gradients before optimizer.step(), each loss scaled by its share of the batch: the same effective batch and "
    "the same gradients (only batch-statistics layers, BatchNorm, see the smaller micro-batch); "
    "oomsight.probe_batch_size() finds the largest micro-batch that keeps a margin. Truncating sequences or "
    "episodes bounds it too, but changes what the job learns from.",
    "kept_outputs": "Do not keep each micro-batch's outputs until the optimizer step: reduce them as they come "
    "(a metric's running counts, loss.item(), logits.argmax(-1)), or keep .detach().cpu() copies: every output "
    "kept on the GPU holds its logits (and, not detached, the node of its graph) through the whole accumulation "
    "window. The metric and the training stay the same.",
    "backward_each": "Call backward on each micro-batch's loss as it comes (scaled by 1/N) instead of summing "
    "the losses before one backward: the gradients are the same sums, and each forward's graph is freed at its "
    "backward instead of all of them living until the last.",
    "leak": "Do not keep tensors alive across steps, above all not ones that carry their autograd "
    "graph: log loss.item() or loss.detach(), not loss; clear lists of outputs; check hooks and caches.",
    "detach_kept": "Keep no autograd graph in what outlives its use: store .detach() (or .detach().cpu(), "
    ".item()) of the tensor a module attribute, list or dict keeps (attention maps for plots, logits for a metric, "
    "losses for a log). The kept values are the same; only the activations their graphs hold alive go.",
    "eval_accumulation": "In transformers' Trainer, set eval_accumulation_steps (e.g. 8) so the evaluation loop "
    "moves the predictions it gathers to the CPU every N steps instead of keeping every batch's logits on the GPU "
    "until compute_metrics, and/or preprocess_logits_for_metrics to keep only what the metric reads (the argmax). "
    "The metrics stay the same.",
    "worker_cuda": "Keep CUDA out of the job's child processes: DataLoader workers (and helpers it starts) should "
    "return CPU tensors from the dataset and collate_fn; set pin_memory=True and move each batch to the GPU in the "
    "main process (batch.to('cuda', non_blocking=True)). Every child that touches CUDA holds a context of its own "
    "(hundreds of MB) plus what it allocates. The batches and the training stay the same.",
    "bound_batch": "Split what one call takes in: run generate() or the forward over fewer sequences at a time "
    "(micro-batches of what fitted) and concatenate the outputs, which stay the same; fewer beams, a lower "
    "max_new_tokens or shorter inputs bound it too, but change the outputs.",
    "set_to_none": "Free gradients between steps with optimizer.zero_grad(set_to_none=True) "
    "(the default since torch 2.0; check your framework does not override it).",
    "history": "Record allocation history (OOMSIGHT_RECORD_HISTORY=1) and open the OOM snapshot "
    "in https://pytorch.org/memory_viz to see where the surviving tensors were created.",
    "other_process": "Another process uses this GPU: give the job a GPU of its own, or lower the "
    "other tenant's share (MIG slice, MPS limit, time-slicing off).",
    "non_pytorch": "Memory outside PyTorch's allocator (CUDA context, NCCL buffers, cuBLAS/cuDNN "
    "workspaces, other libraries) is large: lower NCCL_BUFFSIZE or the number of NCCL "
    "channels, and check other CUDA libraries (CuPy, JAX, TensorRT) in the process.",
    "oversized": "Split the one huge tensor: chunk the loss/logits over the sequence or "
    "vocabulary, or use a memory-efficient kernel (scaled_dot_product_attention).",
    "light_optimizer": "Give the optimizer a lighter state: Adafactor (torch.optim.Adafactor: a factored "
    "second moment and no momentum, a few % of the parameters), 8-bit Adam (bitsandbytes), or SGD with "
    "momentum (one buffer instead of Adam's two).",
    "shard": "Shard parameters, gradients and optimizer state across GPUs (FSDP, DeepSpeed ZeRO-3), "
    "or offload the optimizer state to the CPU.",
    "no_grad": "If this forward trains nothing (inference, evaluation), run it under "
    "torch.inference_mode() or torch.no_grad(): autograd then keeps no activations for a backward.",
    "eval_batch": "Lower the batch size of this forward (evaluation and inference batches can be "
    "processed in smaller chunks), and move outputs you keep to the CPU (.cpu()) as you go.",
    "half_precision": "Run the forward in bf16 (model.to(torch.bfloat16), or torch.autocast): half "
    "the bytes for weights and activations.",
    "fused_optimizer": "Step the optimizer with fused=True (Adam, AdamW, SGD on CUDA) or foreach=False: "
    "the default foreach implementation allocates temporaries as large as a whole parameter group.",
    "bf16_params": "Keep the parameters in bf16 (model.to(torch.bfloat16), or FSDP mixed precision): "
    "half the bytes for parameters, gradients and the optimizer state.",
    "quantize_base": "Load the frozen base in fewer bits: bf16 instead of fp32 halves it, 8-bit or 4-bit NF4 "
    "(bitsandbytes, torchao; QLoRA) takes a half or a quarter of bf16, while the adapters still train.",
    "offload_frozen": "Offload the frozen weights to the CPU and bring them in layer by layer (accelerate's "
    "device_map / cpu_offload, FSDP CPUOffload), or put the frozen model on a GPU of its own.",
    "smaller_base": "Use a smaller frozen model (base, teacher or reference): its weights are most of the memory.",
    "freeze_untrained": "Freeze the model no optimizer trains (model.requires_grad_(False), and run it under "
    "torch.no_grad()): autograd computes and keeps its gradients, and its activations for them, for nothing.",
    "frozen_no_grad": "Run the frozen model's forward under torch.no_grad() (or torch.inference_mode()) and "
    "use its outputs as constants: it needs no gradient, so autograd need keep none of its activations.",
    "precompute_frozen": "Precompute the frozen model's outputs (teacher logits, reference log-probabilities) "
    "in a pass of their own and load them, so it never shares the GPU with the training step.",
    "frozen_half": "Run the frozen model in bf16 or quantised (8-bit, 4-bit): it trains nothing, so its "
    "precision only touches the accuracy of its outputs.",
    "reshard_after_forward": "Reshard after forward (FSDP2 fully_shard(..., reshard_after_forward=True), the "
    "default): each block's gathered parameters are freed after its forward and gathered again in backward, "
    "instead of all staying unsharded until backward.",
    "full_shard": "Use ShardingStrategy.FULL_SHARD instead of SHARD_GRAD_OP: parameters are resharded after "
    "each unit's forward instead of kept unsharded until backward.",
    "next_zero_stage": "Move to the next DeepSpeed ZeRO stage (stage 1 to 2 shards the gradients, 2 to 3 the "
    "parameters too): each rank then keeps 1/N of them.",
    "cpu_offload": "Offload the optimizer state (and, if needed, the parameters) to the CPU: DeepSpeed "
    "offload_optimizer, FSDP2 CPUOffloadPolicy, FSDP CPUOffload(offload_params=True).",
    "more_ranks": "Shard over more GPUs: each rank keeps 1/N of the sharded parameters, gradients and state.",
    "bucket_view": "Construct DDP with gradient_as_bucket_view=True: gradients become views of the "
    "communication buckets, which saves one copy of the gradient bytes.",
    "graph_pools": "CUDA-graph private pools hold this memory: compile without CUDA graphs (mode='default' or "
    "'max-autotune-no-cudagraphs'), keep fewer distinct input shapes (each records its own graph) and call "
    "torch.compiler.cudagraph_mark_step_begin() between iterations, or set "
    "torch._inductor.config.triton.cudagraph_trees = False.",
    "outside_leak": "Memory outside PyTorch's allocator grows every step: free what a CUDA extension allocates "
    "itself (cudaMalloc without cudaFree), and create process groups and NCCL communicators once, never per "
    "step (dist.new_group in the loop); NVML's memory of the process shows the rise.",
    "expert_capacity": "Cap the tokens one expert takes (a capacity factor, 1.0-1.25 in Switch/GShard; the overflow "
    "dropped to the residual path or re-routed), and keep the router balanced (a load-balancing auxiliary loss, "
    "router z-loss): the expert buffers then no longer grow with the routing.",
}

CHANGES: dict[str, str] = {
    "no_grad": "no gradient flows through this forward: whatever it should train learns nothing from it",
    "eval_batch": "in a training forward, the effective batch (fewer samples per optimizer step)",
    "half_precision": "the precision of the weights and activations of this forward",
    "autocast": "the precision of the forward's matmuls and activations (bf16 rounding)",
    "bf16_params": "the precision of the parameters, gradients and optimizer state (bf16 rounding of updates)",
    "quantize_base": "the frozen weights themselves (quantisation error in every output of the base)",
    "frozen_half": "the frozen model's outputs (its precision)",
    "frozen_no_grad": "the gradient through the frozen model: where the trained model's output flows through it "
    "(a discriminator, a frozen decoder) the trained model then learns nothing from it",
    "smaller_base": "the model the job trains on",
    "light_optimizer": "the optimizer's update rule (another optimizer trains differently)",
    "expert_capacity": "the routing: tokens over an expert's capacity skip it (dropped to the residual path) or "
    "go to another expert",
}
"""The remedies that change what the job computes, and what each changes. Every other remedy only
moves memory (recomputes, offloads, shards, frees sooner, splits the same work): the job learns the
same. A remedy here is never first unless the evidence shows the forward trains nothing
(:func:`harmless_first`), and its text always says what it changes (:func:`texts`)."""

FULL_SHARDING = ("FULL_SHARD", "HYBRID_SHARD")
"""Shardings that free the gathered parameters after forward."""
SHARDED = ("fsdp", "fsdp2", "dtensor")


def _par(job: Mapping[str, Any]) -> Mapping[str, Any]:
    found = job.get("parallelism")
    return found if isinstance(found, Mapping) else {}


def sharded(job: Mapping[str, Any]) -> bool:
    """The job shards its parameters already: FSDP, FSDP2, DTensor, ZeRO stage 3, or a shard size above 1
    (a FSDP job with NO_SHARD replicates)."""
    p = _par(job)
    if p.get("strategy") in SHARDED and p.get("sharding") != "NO_SHARD":
        return True
    return p.get("zero_stage") == 3 or int(p.get("shard_size") or 1) > 1


def mixed_precision(job: Mapping[str, Any]) -> bool:
    """The sharding wrapper computes in 16 bits (FSDP2's ``MixedPrecisionPolicy``, FSDP1's ``MixedPrecision``,
    DeepSpeed's bf16/fp16): autocast's saving is taken (wire 1.9 ``parallelism.mixed_precision``)."""
    return _par(job).get("mixed_precision") in ("bfloat16", "float16")


IN_USE: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    "autocast": lambda job: bool(job.get("autocast")) or job.get("param_dtype") in ("bfloat16", "float16")
    or mixed_precision(job),
    # an FSDP or DeepSpeed mixed-precision policy is the remedy's second form, already taken
    "bf16_params": lambda job: job.get("param_dtype") in ("bfloat16", "float16") or mixed_precision(job),
    "half_precision": lambda job: bool(job.get("autocast")) or job.get("param_dtype") in ("bfloat16", "float16")
    or mixed_precision(job),
    "checkpointing": lambda job: bool(job.get("checkpointing")),
    "compile": lambda job: bool(job.get("compiled")),
    "expandable": lambda job: bool(job.get("expandable_segments")),
    "split": lambda job: not job.get("expandable_segments"),
    "set_to_none": lambda job: job.get("set_to_none") is True,
    "shard": sharded,
    "reshard_after_forward": lambda job: _par(job).get("reshard_after_forward") is True
    or _par(job).get("sharding") in FULL_SHARDING,
    "full_shard": lambda job: _par(job).get("sharding") in FULL_SHARDING,
    "next_zero_stage": lambda job: _par(job).get("zero_stage") == 3,
    "cpu_offload": lambda job: _par(job).get("offload") is True,
    "offload_frozen": lambda job: _par(job).get("offload") is True,
    "bucket_view": lambda job: _par(job).get("gradient_as_bucket_view") is True,
    "quantize_base": lambda job: bool(job.get("quantized_base")),
    "frozen_half": lambda job: bool(job.get("quantized_base")) or job.get("param_dtype") in ("bfloat16", "float16"),
}
"""Remedy key -> whether the job already does it (the ``split`` advice needs expandable segments on).
``quantized_base`` is derived by the diagnosis from the model states (quantised parameter bytes)."""


REPLACES = {"expandable": "split"}
"""A remedy in use is replaced by the next one in line (expandable segments on: limit splitting)."""

WITHOUT_GRAD = {"checkpointing": "", "set_to_none": "", "batch": "eval_batch", "autocast": "half_precision"}
WITHOUT_OPTIMIZER = {
    "bound_input": "bound_batch",
    "backward_each": "",
    "fused_optimizer": "",
    "set_to_none": "",
    "batch": "eval_batch",
    "kept_outputs": "detach_kept",
}
"""For a process with no optimizer (inference, generation, evaluation alone): advice about accumulating
gradients before ``optimizer.step()`` takes its inference form, and optimizer advice goes."""
"""For a forward that ran without autograd: what does not apply (nothing is saved for a backward)
goes, and the training advice becomes its inference form."""


def pick(keys: Sequence[str], job: Optional[Mapping[str, Any]]) -> list[str]:
    """``keys`` without the remedies ``job`` already uses (order kept, no duplicates)."""
    known = job or {}
    out: list[str] = []
    for key in keys:
        in_use = IN_USE.get(key)
        if in_use is not None and known and in_use(known):
            key = REPLACES.get(key, "")
            if not key or (IN_USE.get(key) is not None and IN_USE[key](known)):
                continue
        if key not in out:
            out.append(key)
    return out


LEADS_WHEN: dict[str, frozenset[str]] = {
    "quantize_base": frozenset(("frozen",)),
    "frozen_half": frozenset(("frozen", "forward")),
    "expert_capacity": frozenset(("routing",)),
    "no_grad": frozenset(("forward",)),
    "frozen_no_grad": frozenset(("forward",)),
    "eval_batch": frozenset(("forward",)),
    "half_precision": frozenset(("forward",)),
}
"""Result-changing remedies that may still come first where the evidence shows what they change: the
precision of weights the job's own walk shows no optimizer trains (``frozen``: the adapters train as
before), or the routing of a model with experts whose step rows show its memory grew while its input
did not (``routing``: the growth is the routing itself, and an expert's capacity is the model's own
setting for it), or, ``forward``, what only the failing forward computes where the evidence shows that forward
trains nothing (it runs without autograd, or its model has no trainable parameter) in a process that trains:
the remedies of the job's trained state (bf16 parameters, a lighter optimizer) still never lead there. Their texts
still say what they change."""


def harmless_first(keys: Sequence[str], shown: Collection[str] = ()) -> list[str]:
    """``keys`` with a remedy that only moves memory first: the first of them moves to the front where
    a result-changing one led (``CHANGES``) that the evidence (``shown``, the tags of ``LEADS_WHEN``) does
    not allow to lead; where none does, recording the allocation history (which changes nothing) comes
    first. For a forward that may train: no advice may stop a job learning."""
    out = list(keys)
    if not out or out[0] not in CHANGES or LEADS_WHEN.get(out[0], frozenset()) & set(shown):
        return out
    harmless = next((k for k in out if k not in CHANGES), "history")
    return [harmless, *(k for k in out if k != harmless)]


def changes(keys: Sequence[str]) -> list[str]:
    """The keys among ``keys`` that change what the job computes."""
    return [k for k in keys if k in CHANGES]


def texts(keys: Sequence[str]) -> list[str]:
    """Each remedy's advice; a result-changing one says what it changes."""
    return [REMEDY[k] + (f" This changes the result: {CHANGES[k]}." if k in CHANGES else "") for k in keys]


def in_use(job: Optional[Mapping[str, Any]]) -> list[str]:
    """Names of what the job already does, for a diagnosis to say (e.g. "autocast, checkpointing")."""
    if not job:
        return []
    names = {
        "autocast": "bf16/fp16 autocast",
        "checkpointing": "activation checkpointing",
        "compile": "torch.compile",
        "expandable": "expandable_segments",
    }
    found = [label for key, label in names.items() if IN_USE[key](job)]
    if job.get("activation_offload"):
        found.append("activation offload to the CPU (save_on_cpu)")
    if job.get("quantized_base"):
        found.append("quantised weights")
    p = _par(job)
    if p.get("strategy") not in (None, "none"):
        found.append(_parallelism_name(p))
    steps = job.get("accumulation_steps")
    if isinstance(steps, int) and steps > 1:
        found.append(f"gradient accumulation over {steps} micro-batches")
    return found


def _parallelism_name(p: Mapping[str, Any]) -> str:
    """E.g. "fsdp2 over 4 ranks (SHARD_GRAD_OP, offload)"."""
    stage = p.get("zero_stage")
    name = f"ZeRO stage {stage}" if p.get("strategy") == "zero" and stage is not None else str(p.get("strategy"))
    details = [str(p["sharding"])] if p.get("sharding") else []
    if p.get("offload"):
        details.append("offload")
    size = p.get("world_size")
    out = f"{name} over {size} ranks" if isinstance(size, int) and size > 1 else name
    return out + (f" ({', '.join(details)})" if details else "")
