"""The ``TypedDict`` s of the ``oom_event`` document and of the objects first nested in it.
GENERATED from ``oomsight.wire.fields`` by ``python -m oomsight.wire.rendering``: edit the
table, not this file. Import them from ``oomsight.wire.documents``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, TypedDict

from oomsight.wire.documents_snapshot import Categories, JobSetup, NvmlSample, ProcessInfo

if TYPE_CHECKING:
    from typing_extensions import NotRequired

__all__ = [
    "Diagnosis",
    "ModelStates",
    "OomEvent",
]


class Diagnosis(TypedDict):
    """Why the OOM happened (docs/diagnosis.md)."""

    #: the diagnosed cause
    cause: str
    #: one sentence
    summary: str
    #: what to try, best first
    remedies: list[str]
    #: the numbers the diagnosis used
    facts: NotRequired[dict[str, Any]]


class ModelStates(TypedDict):
    """Memory of the model's states at the OOM, from the optimizers (or, with none, the live parameters)."""

    #: parameters
    parameters_bytes: NotRequired[int]
    #: gradients
    gradients_bytes: NotRequired[int]
    #: optimizer state held now
    optimizer_state_bytes: NotRequired[int]
    #: optimizer state once initialised (null: unknown)
    optimizer_state_expected_bytes: NotRequired[Optional[int]]
    #: optimizers found (0: none, the parameters were found as live tensors); null: unknown (since 1.4)
    optimizers: NotRequired[Optional[int]]
    #: the dtype holding most parameter bytes, e.g. "bfloat16" (since 1.4)
    param_dtype: NotRequired[Optional[str]]
    #: of the parameters, those no optimizer trains (requires_grad false) (since 1.6)
    frozen_parameters_bytes: NotRequired[int]
    #: of the parameters, those in a quantised storage (since 1.6)
    quantized_parameters_bytes: NotRequired[int]
    #: of the gradients, DDP's bucket copies (0: gradients are views of them) (since 1.6)
    gradient_buckets_bytes: NotRequired[int]
    #: all-gathered (unsharded) FSDP parameters alive besides the shards (since 1.6)
    unsharded_parameters_bytes: NotRequired[int]
    #: of the parameters, adapter (LoRA) weights (since 1.6)
    adapter_parameters_bytes: NotRequired[int]
    #: top-level modules whose parameters are all frozen, largest first (at most 8) (since 1.6)
    frozen_modules: NotRequired[list[str]]


class OomEvent(TypedDict):
    """One CUDA OOM (events/<process id>.oom-<seq:05d>.json), rewritten once its outcome is known."""

    #: 1
    schema_version: int
    #: "oom_event"
    kind: str
    #: who wrote it
    process: ProcessInfo
    #: 1, 2, ... per process
    seq: int
    #: Unix time of the OOM
    time: float
    #: the failing device
    device: int
    #: its UUID
    gpu_uuid: str
    #: size of the failing allocation (after the allocator's rounding)
    requested_bytes: int
    #: what the process could still get, as the allocator's observer saw it
    device_free_bytes: int
    #: the device total (the cap under set_per_process_memory_fraction)
    device_total_bytes: int
    #: allocator state at the OOM
    allocated_bytes: int
    #: allocator state at the OOM
    reserved_bytes: int
    #: allocator state at the OOM
    inactive_split_bytes: NotRequired[int]
    #: reserved minus allocated at the OOM
    reserved_unallocated_bytes: NotRequired[int]
    #: optimizer steps completed before the OOM
    step: NotRequired[int]
    #: as in the snapshot, at the OOM
    nvml: NotRequired[Optional[NvmlSample]]
    #: as in the snapshot, at the OOM
    categories: NotRequired[Optional[Categories]]
    #: torch.cuda.memory_summary(abbreviated=True), at most 8 KiB
    allocator_summary: NotRequired[str]
    #: the Python stack of the failing allocation, "file:line in function"
    stack: NotRequired[list[str]]
    #: cause, summary, remedies, facts
    diagnosis: Diagnosis
    #: file name in artifacts/ of the memory snapshot pickle
    snapshot_artifact: NotRequired[Optional[str]]
    #: pending of a process that is gone reads as fatal
    outcome: str
    #: when the outcome was decided
    outcome_time: NotRequired[Optional[float]]
    #: by step, oldest first: rows [step, time, floor_bytes, peak_bytes, reserved_bytes, exact] and, since 1.6,
    #: outside_bytes (NVML process memory minus reserved; -1: unknown) (since 1.2)
    steps_memory: NotRequired[list[list[float]]]
    #: "forward", "backward", "optimizer" or "unknown" (since 1.2)
    phase: NotRequired[Optional[str]]
    #: the largest free block of the allocator (since 1.2)
    largest_free_block_bytes: NotRequired[Optional[int]]
    #: how the job is set up (since 1.2)
    job: NotRequired[Optional[JobSetup]]
    #: model states at the OOM (since 1.2)
    model_states: NotRequired[Optional[ModelStates]]
    #: free on the device before any per-process cap (since 1.2)
    physical_free_bytes: NotRequired[Optional[int]]
    #: cap of set_per_process_memory_fraction; null if unset (since 1.2)
    limit_bytes: NotRequired[Optional[int]]
    #: autograd was recording in the failing thread (false: no_grad, inference_mode) (since 1.4)
    grad_enabled: NotRequired[Optional[bool]]
    #: the sampler's last readings, oldest first: [time, allocated_bytes] and, since 1.5, peak_allocated_bytes
    #: and allocated_total_bytes (since 1.4)
    sampled_allocated: NotRequired[list[list[float]]]
    #: Unix time the last optimizer step completed (since 1.4)
    last_step_time: NotRequired[Optional[float]]
    #: the outermost nn.Module trains (false: eval) (since 1.5)
    module_training: NotRequired[Optional[bool]]
    #: the outermost nn.Module on the failing stack has no trainable parameter (since 1.6)
    module_frozen: NotRequired[Optional[bool]]
    #: reserved bytes in private pools (CUDA graphs, MemPool) at the OOM (since 1.6)
    private_pool_bytes: NotRequired[Optional[int]]
    #: of those, bytes not allocated (since 1.6)
    private_pool_free_bytes: NotRequired[Optional[int]]
    #: observer (the allocator's OOM observer) or exception (the OutOfMemoryError) (since 1.6)
    captured_by: NotRequired[str]
