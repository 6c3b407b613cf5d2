"""The remedies a diagnosis can name, and which of them fit a job that already does what.

A remedy is a key with one sentence of advice. :func:`pick` drops the remedies the job
already uses (bf16 autocast, activation checkpointing, gradient accumulation,
``expandable_segments``, ``torch.compile``, ``zero_grad(set_to_none=True)``) as the hook
detected them (``JobSetup``), so advice never tells a job to do what it does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    "split": "Expandable segments are already on: try PYTORCH_ALLOC_CONF="
    "garbage_collection_threshold:0.8 or max_split_size_mb to limit splitting of large blocks.",
    "shapes": "Keep tensor shapes stable between steps (pad or bucket variable-length inputs).",
    "bound_input": "Bound what one step takes in: cap the batch size or the sequence length "
    "(truncate, bucket by length, a max-tokens-per-batch sampler) at what fitted before; "
    "oomsight.probe_batch_size() finds the largest batch that keeps a margin.",
    "leak": "Do not keep tensors alive across steps, above all not ones that carry their autograd "
    "graph: log loss.item() or loss.detach(), not loss; clear lists of outputs; check hooks and caches.",
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
}

IN_USE = {
    "autocast": lambda job: bool(job.get("autocast")) or job.get("param_dtype") in ("bfloat16", "float16"),
    "bf16_params": lambda job: job.get("param_dtype") in ("bfloat16", "float16"),
    "half_precision": lambda job: bool(job.get("autocast")) or job.get("param_dtype") in ("bfloat16", "float16"),
    "checkpointing": lambda job: bool(job.get("checkpointing")),
    "compile": lambda job: bool(job.get("compiled")),
    "expandable": lambda job: bool(job.get("expandable_segments")),
    "split": lambda job: not job.get("expandable_segments"),
    "set_to_none": lambda job: job.get("set_to_none") is True,
}
"""Remedy key -> whether the job already does it (the ``split`` advice needs expandable segments on)."""

REPLACES = {"expandable": "split"}
"""A remedy in use is replaced by the next one in line (expandable segments on: limit splitting)."""

WITHOUT_GRAD = {"checkpointing": "", "set_to_none": "", "batch": "eval_batch", "autocast": "half_precision"}
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


def texts(keys: Sequence[str]) -> list[str]:
    return [REMEDY[k] for k in keys]


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
    steps = job.get("accumulation_steps")
    if isinstance(steps, int) and steps > 1:
        found.append(f"gradient accumulation over {steps} micro-batches")
    return found
