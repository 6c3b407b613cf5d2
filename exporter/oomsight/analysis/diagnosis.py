"""Why a CUDA OOM happened, and the remedy that fits: a pure function of the facts.

The causes, checked in this order (``docs/diagnosis.md`` explains each):

``oversized_request``   one request is more than half of all memory this process could use
``other_process``       other processes on the GPU hold a large share of it
``non_pytorch_memory``  this process holds a large share outside the caching allocator
``leak``                the memory that survives between steps grew step after step
``fragmentation``       the bytes exist (cached-but-unallocated plus free) but not in one block
``exhaustion``          the job simply needs more than the device has
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional, TypedDict

from oomsight.analysis.units import format_bytes as fb
from oomsight.wire.schema import Categories, Diagnosis, NvmlSample

CAUSES = (
    "oversized_request",
    "other_process",
    "non_pytorch_memory",
    "leak",
    "fragmentation",
    "exhaustion",
)

OUTSIDE_SHARE = 0.25
"""Memory outside this process's allocator above this share of the device is a cause."""
OVERSIZED_SHARE = 0.5
FRAGMENTATION_MIN_SHARE = 0.05
"""Cached-but-unallocated bytes below this share of the device are noise, not the cause."""
LEAK_MIN_POINTS = 5
LEAK_MONOTONE_SHARE = 0.8
LEAK_MIN_GROWTH_SHARE = 0.05


class OomFacts(TypedDict):
    requested_bytes: int
    device_total_bytes: int
    device_free_bytes: int
    physical_free_bytes: int  # free on the device, before any per-process cap
    allocated_bytes: int
    reserved_bytes: int
    inactive_split_bytes: int
    nvml: Optional[NvmlSample]
    categories: Optional[Categories]
    trend: Sequence[Sequence[float]]
    expandable_segments: bool


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
    "leak": "Do not keep tensors that carry their autograd graph across steps: log loss.item() "
    "or loss.detach(), not loss; clear lists of outputs; check hooks and caches.",
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
    "shard": "Parameters, gradients and optimizer state dominate: shard them (FSDP/ZeRO), keep "
    "parameters in bf16, or use a lighter optimizer state (e.g. 8-bit Adam).",
}


def diagnose(f: OomFacts) -> Diagnosis:
    """Classify one OOM from the numbers recorded at the moment it happened."""
    total = max(f["device_total_bytes"], 1)
    cached_free = max(f["reserved_bytes"] - f["allocated_bytes"], 0)
    free = f["device_free_bytes"]
    usable = f["reserved_bytes"] + free
    facts: dict[str, Any] = {
        "requested_bytes": f["requested_bytes"],
        "usable_bytes": usable,
        "reserved_unallocated_bytes": cached_free,
    }
    # If the device still had room, a per-process cap refused the request: memory
    # outside this allocator did not cause it.
    cap_bound = f["physical_free_bytes"] >= f["requested_bytes"]
    outside, others = (None, None) if cap_bound else _outside(f)
    facts.update(outside_bytes=outside, other_processes_bytes=others)
    growth = leak_growth(f["trend"], total)
    facts["leak_growth_bytes"] = growth

    if f["requested_bytes"] > OVERSIZED_SHARE * usable:
        return _result(
            "oversized_request",
            facts,
            [REMEDY["oversized"], REMEDY["batch"]],
            f"One request of {fb(f['requested_bytes'])} is more than half of the "
            f"{fb(usable)} this process could use (reserved plus free).",
        )
    if others is not None and others >= OUTSIDE_SHARE * total:
        return _result(
            "other_process",
            facts,
            [REMEDY["other_process"]],
            f"Other processes hold {fb(others)} of the {fb(total)} GPU.",
        )
    if outside is not None and outside >= OUTSIDE_SHARE * total:
        if others is None:  # NVML cannot see our PID (containers): it may be other tenants too
            return _result(
                "non_pytorch_memory",
                facts,
                [REMEDY["non_pytorch"], REMEDY["other_process"]],
                f"{fb(outside)} of the GPU is used outside this process's PyTorch allocator: "
                "by its CUDA context, NCCL and libraries, or by other processes (NVML cannot "
                "see process IDs here to tell them apart).",
            )
        return _result(
            "non_pytorch_memory",
            facts,
            [REMEDY["non_pytorch"]],
            f"{fb(outside)} of the GPU is used by this process outside PyTorch's allocator.",
        )
    if growth is not None:
        return _result(
            "leak",
            facts,
            [REMEDY["leak"], REMEDY["set_to_none"], REMEDY["history"]],
            f"The memory that survives between steps grew by {fb(growth)} step after "
            "step before the OOM: something keeps tensors alive.",
        )
    if cached_free + free >= f["requested_bytes"] and cached_free >= FRAGMENTATION_MIN_SHARE * total:
        fix = REMEDY["split"] if f["expandable_segments"] else REMEDY["expandable"]
        return _result(
            "fragmentation",
            facts,
            [fix, REMEDY["shapes"]],
            f"{fb(f['requested_bytes'])} were requested while {fb(cached_free)} sat "
            f"reserved but unallocated and {fb(free)} were free: "
            "enough bytes, no block large enough (fragmentation).",
        )
    return _result(
        "exhaustion",
        facts,
        _exhaustion_remedies(f["categories"]),
        f"The job needs more than the {fb(total)} device: {fb(f['allocated_bytes'])} "
        f"allocated and {fb(f['requested_bytes'])} more requested.",
    )


def _outside(f: OomFacts) -> tuple[Optional[int], Optional[int]]:
    """(memory outside this allocator, memory of other processes) from NVML, if known."""
    nv = f["nvml"]
    if nv is None:
        return None, None
    outside = max(nv["used_bytes"] - f["reserved_bytes"], 0)
    own = nv["process_used_bytes"]
    if nv["process_visible"] and own is not None:
        return max(own - f["reserved_bytes"], 0), max(nv["used_bytes"] - own, 0)
    return outside, None


def leak_growth(trend: Sequence[Sequence[float]], total: int) -> Optional[int]:
    """Growth of the between-steps trough if it rose steadily while steps ran, else None.

    ``trend`` rows are ``[time, window_min_allocated_bytes, steps]``, oldest first. The
    longest recent stretch in which at least 80 % of the points rose is judged, so a
    healthy start followed by a leak still counts.
    """
    points = [row for row in trend if len(row) >= 3]
    stretch: Optional[list[Sequence[float]]] = None
    for start in range(len(points) - LEAK_MIN_POINTS, -1, -1):
        seg = points[start:]
        rising = sum(1 for a, b in zip(seg, seg[1:]) if b[1] > a[1])
        if rising >= LEAK_MONOTONE_SHARE * (len(seg) - 1):
            stretch = seg
    if stretch is None or stretch[-1][2] <= stretch[0][2]:
        return None
    growth = int(stretch[-1][1] - stretch[0][1])
    return growth if growth >= LEAK_MIN_GROWTH_SHARE * total else None


def _exhaustion_remedies(cat: Optional[Categories]) -> list[str]:
    if cat is None:
        return [REMEDY["batch"], REMEDY["autocast"], REMEDY["checkpointing"], REMEDY["compile"]]
    static = cat["parameters_bytes"] + cat["gradients_bytes"] + cat["optimizer_state_bytes"]
    act = cat["activations_bytes"] or 0
    if static > act:
        return [REMEDY["shard"], REMEDY["set_to_none"], REMEDY["batch"]]
    return [REMEDY["checkpointing"], REMEDY["batch"], REMEDY["autocast"], REMEDY["compile"]]


def _result(cause: str, facts: dict[str, Any], remedies: list[str], summary: str) -> Diagnosis:
    return Diagnosis(cause=cause, summary=summary, remedies=remedies, facts=facts)
