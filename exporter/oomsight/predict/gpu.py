"""GPUs by name for ``oomsight predict --gpu``: capacity, compute capability, and what the process
holds outside PyTorch's allocator (the CUDA context, NCCL's buffers), subtracted from the capacity.

The figures and their sources (docs/prediction.md, "GPUs"):

- ``total_bytes``: the total ``nvidia-smi`` (and ``torch.cuda.get_device_properties().total_memory``)
  reports for the board, in MiB; **not measured by us** except where ``measured`` says so.
- ``CUDA_CONTEXT_BYTES``: the CUDA context with the libraries a training step loads lazily (cuBLAS,
  cuDNN kernels): 300-600 MB by the PyTorch issues collected in
  /work/shared/reference/distributed-memory.md §8 (pytorch/pytorch#28113, #37250); the upper end is
  taken, so a job predicted to fit is not one that only fits on a lean driver. Unverified on our GPUs.
- ``NCCL_BYTES_2`` / ``NCCL_BYTES_MORE``: one communicator's device buffers, 544 MB for a 2-GPU group
  and 688 MB beyond (NVIDIA/nccl#964, 4 x A100 over NVLink; version- and topology-dependent). One
  communicator is counted (a data-parallel group); HSDP, TP and PP groups add their own.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
CUDA_CONTEXT_BYTES = 600 * 10**6
NCCL_BYTES_2 = 544 * 10**6
NCCL_BYTES_MORE = 688 * 10**6


@dataclass(frozen=True)
class Gpu:
    name: str
    total_bytes: int
    capability: tuple[int, int]
    attention: str
    """The SDPA kernel torch 2.11-2.13 picks for bf16/fp16 on this capability."""


FLASH = "flash attention (sm80-sm89: FlashAttention-2 first)"
CUDNN = "cuDNN attention (sm90 and later: measured on the H200, benchmarks/results/predict.json)"
EFFICIENT = "memory-efficient attention (no FlashAttention-2 below sm80)"

GPUS: dict[str, Gpu] = {
    g.name.lower(): g
    for g in (
        Gpu("A100-40GB", 40960 * MIB, (8, 0), FLASH),
        Gpu("A100-80GB", 81920 * MIB, (8, 0), FLASH),
        Gpu("A10G", 23028 * MIB, (8, 6), FLASH),
        Gpu("L4", 23034 * MIB, (8, 9), FLASH),
        Gpu("L40S", 46068 * MIB, (8, 9), FLASH),
        Gpu("RTX-4090", 24564 * MIB, (8, 9), FLASH),
        Gpu("V100-32GB", 32768 * MIB, (7, 0), EFFICIENT),
        Gpu("H100", 81559 * MIB, (9, 0), CUDNN),
        Gpu("H200", 143771 * MIB, (9, 0), CUDNN),
        Gpu("B200", 183359 * MIB, (10, 0), CUDNN),
    )
}


def get(name: str) -> Gpu:
    """The GPU of that name (any case); ``KeyError`` with the known names."""
    try:
        return GPUS[name.lower()]
    except KeyError:
        known = ", ".join(g.name for g in GPUS.values())
        raise KeyError(f"--gpu {name}: unknown GPU; known: {known} (or give --capacity)") from None


def outside_allocator_bytes(world_size: int, communicators: int = 1) -> dict[str, int]:
    """What a rank's process holds on its GPU besides PyTorch's allocator (``communicators``: the
    process groups it talks in, each with its own NCCL buffers; HSDP has two)."""
    nccl = 0 if world_size <= 1 else (NCCL_BYTES_2 if world_size == 2 else NCCL_BYTES_MORE)
    return {"cuda_context": CUDA_CONTEXT_BYTES, "nccl": nccl * communicators}


def usable_bytes(total: int, world_size: int, counted: bool = True, communicators: int = 1) -> int:
    """The bytes left to the allocator: ``total`` less the context and NCCL (``counted``)."""
    return total - (sum(outside_allocator_bytes(world_size, communicators).values()) if counted else 0)
