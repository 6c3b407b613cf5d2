"""The spool documents as ``TypedDict`` s, each top-level document after the objects it is the first
to nest. GENERATED from ``oomsight.wire.fields`` by ``python -m oomsight.wire.rendering``:
edit the table, not this file. Optional keys are ``NotRequired``: a reader sees the table's
default in their place (``oomsight.wire.schema.validate(doc, fill_defaults=True)``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, TypedDict

if TYPE_CHECKING:
    from typing_extensions import NotRequired

__all__ = [
    "AllocatorSample",
    "BatchAdvice",
    "Categories",
    "Census",
    "CensusHolder",
    "CensusModule",
    "CensusProcess",
    "CensusProcesses",
    "DeviceSnapshot",
    "Diagnosis",
    "JobSetup",
    "LeakFinding",
    "ModelStates",
    "NvmlSample",
    "OomEvent",
    "Parallelism",
    "PeakPrediction",
    "ProcessInfo",
    "Profile",
    "ProfileOp",
    "ProfileRequestDocument",
    "Snapshot",
    "StepInfo",
    "StepPeak",
    "StepTrend",
]


class ProcessInfo(TypedDict):
    """Who wrote the document: one process start."""

    #: unique per process start: "<pid>-<8 random hex digits>"
    id: str
    #: the process id in its container's PID namespace
    pid: int
    #: the host (pod) name
    hostname: NotRequired[str]
    #: RANK of torch.distributed (0 without it)
    rank: int
    #: LOCAL_RANK (0 without it)
    local_rank: int
    #: WORLD_SIZE (1 without it)
    world_size: NotRequired[int]
    #: when the hook started, Unix seconds
    started_at: float
    #: the program's file name
    argv0: NotRequired[str]
    #: torch.__version__
    torch_version: NotRequired[str]
    #: torch.version.cuda
    cuda_version: NotRequired[str]
    #: the hook's oomsight version
    oomsight_version: NotRequired[str]
    #: "native" or "cudaMallocAsync"
    allocator_backend: NotRequired[str]
    #: PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True
    expandable_segments: NotRequired[bool]


class AllocatorSample(TypedDict):
    """torch.cuda.memory_stats() of one device, all in bytes or counts."""

    #: bytes in live tensors (allocated_bytes.all.current)
    allocated_bytes: int
    #: bytes held by the caching allocator
    reserved_bytes: int
    #: bytes in active blocks, frees awaiting other streams included
    active_bytes: int
    #: bytes tensors asked for, before rounding
    requested_bytes: int
    #: free bytes inside split segments: fragmentation
    inactive_split_bytes: int
    #: lifetime peak (since the last reset by anybody)
    peak_allocated_bytes: int
    #: lifetime peak of reserved bytes
    peak_reserved_bytes: int
    #: maximum sampled within the sliding window
    window_peak_allocated_bytes: int
    #: maximum sampled reserved bytes within the window
    window_peak_reserved_bytes: int
    #: trough within the window: persistent memory
    window_min_allocated_bytes: int
    #: cudaMalloc failures after which the allocator freed its cache
    alloc_retries: int
    #: OOMs the allocator counted
    ooms: int
    #: cudaMalloc calls
    device_allocs: int
    #: cudaFree calls
    device_frees: int
    #: bytes ever allocated (allocated_bytes.all) (since 1.5)
    allocated_total_bytes: NotRequired[int]


class NvmlSample(TypedDict):
    """What NVML says about the device."""

    #: device memory (NVML total)
    total_bytes: int
    #: device memory in use by anybody
    used_bytes: int
    #: device memory free
    free_bytes: int
    #: driver/firmware reserved (nvmlMemory_v2)
    reserved_bytes: NotRequired[Optional[int]]
    #: GPU utilization, 0..1
    utilization_ratio: NotRequired[Optional[float]]
    #: this process's own NVML entry, when its PID is visible
    process_used_bytes: NotRequired[Optional[int]]
    #: NVML lists this process (same PID namespace)
    process_visible: bool
    #: compute processes NVML lists besides this one
    other_processes: NotRequired[Optional[int]]


class Categories(TypedDict):
    """Device memory by category, summed from the optimizers' tensors."""

    #: parameters of the optimizers' groups
    parameters_bytes: int
    #: their .grad tensors
    gradients_bytes: int
    #: the optimizers' state tensors
    optimizer_state_bytes: int
    #: peak minus the three above; null before a peak is known
    activations_bytes: Optional[int]
    #: "step_peak" (opt-in, exact) or "window_peak" (sampled, a lower bound)
    basis: str
    #: when the categories were summed
    measured_at: NotRequired[float]
    #: state bytes the optimizers will hold once initialised (null: unknown) (since 1.2)
    optimizer_state_expected_bytes: NotRequired[Optional[int]]
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
    #: of the parameters, a mixture of experts' experts (named expert...) (since 1.10)
    expert_parameters_bytes: NotRequired[int]
    #: of the gradients, those of parameters no optimizer trains (a model left with requires_grad on) (since
    #: 1.6)
    untrained_gradients_bytes: NotRequired[int]
    #: top-level modules whose parameters are all frozen, largest first (at most 8) (since 1.6)
    frozen_modules: NotRequired[list[str]]


class StepPeak(TypedDict):
    """The exact peak of the last step (OOMSIGHT_STEP_PEAKS=1)."""

    #: peak allocated bytes
    allocated_bytes: int
    #: peak reserved bytes
    reserved_bytes: int


class PeakPrediction(TypedDict):
    """The peak a prediction gave for the job's training step (oomsight predict), carried by the job."""

    #: predicted max_memory_allocated() of the training steps
    peak_allocated_bytes: int
    #: predicted max_memory_reserved() (null: not given, e.g. a bare size)
    peak_reserved_bytes: NotRequired[Optional[int]]
    #: "env" (OOMSIGHT_PREDICTION) or "api" (oomsight.record_prediction)
    source: str
    #: the model it was made for, where known
    model: NotRequired[Optional[str]]
    #: the batch size it was made for, where known
    batch_size: NotRequired[Optional[int]]
    #: when the hook took it
    recorded_at: float


class StepTrend(TypedDict):
    """The hook's verdict on every step row it keeps (oomsight.analysis.trend), judged at each publish."""

    #: rows judged (past warm-up)
    points: int
    #: the between-steps floor rises step after step and the step's own memory does not
    leak: bool
    #: bytes per step the floor rose, least squares over the judged rows
    floor_slope_bytes: float
    #: growth of the floor over the judged rows
    floor_growth_bytes: int
    #: steps until the peak reaches capacity (central); null: no forecast, or one too noisy to time
    #: (no_forecast_reason)
    steps_to_oom: Optional[float]
    #: the same in seconds at the current step time
    seconds_to_oom: Optional[float]
    #: the earliest plausible seconds to OOM, from the rows' own noise (at most seconds_to_oom); also given
    #: where the central time is not ("too_noisy": when the OOM comes is chance beyond the bar); null: no
    #: forecast (since 1.9)
    earliest_seconds_to_oom: NotRequired[Optional[float]]
    #: what the forecast is made for: "steady_leak", "stair_leak" or "growing_demand" (readers accept others);
    #: "" without a forecast (one too noisy to time keeps its kind), or from a writer older than 1.9 (since 1.9)
    forecast_kind: NotRequired[str]
    #: why there is no forecast: "too_short", "too_noisy" (the slope not told from noise, or, with an earliest
    #: time, when the OOM comes is chance beyond the bar), "no_rise" or "no_step_time" (readers accept others);
    #: "" with one, or from a writer older than 1.9 (since 1.9)
    no_forecast_reason: NotRequired[str]


class DeviceSnapshot(TypedDict):
    """One CUDA device the process uses."""

    #: the CUDA device index
    index: int
    #: the GPU's UUID (GPU-...)
    uuid: str
    #: the GPU model
    name: NotRequired[str]
    #: capacity as torch sees it (get_device_properties().total_memory)
    total_bytes: NotRequired[int]
    #: cap of set_per_process_memory_fraction; null if unset (since 1.1)
    limit_bytes: NotRequired[Optional[int]]
    #: the caching allocator's statistics
    allocator: AllocatorSample
    #: null when NVML is unavailable
    nvml: NotRequired[Optional[NvmlSample]]
    #: null before the optimizers are known
    categories: NotRequired[Optional[Categories]]
    #: null unless OOMSIGHT_STEP_PEAKS=1
    step_peak: NotRequired[Optional[StepPeak]]
    #: rows [time, window_min_allocated_bytes, steps], oldest first, at most 64; since 1.5 none with step_trend
    trend: NotRequired[list[list[float]]]
    #: by step, oldest first: rows [step, time, floor_bytes, peak_bytes, reserved_bytes, exact] and, since 1.6,
    #: outside_bytes (NVML process memory minus reserved; -1: unknown); since 1.10, held_bytes (gradients and
    #: optimizer state the optimizers hold; -1: unknown) and input_elements (the most elements one forward of
    #: the outermost model took in since the row before; -1: unknown); since 1.5 only the last row, judged in
    #: step_trend (since 1.2)
    steps_memory: NotRequired[list[list[float]]]
    #: the job's predicted peak on this device (since 1.3)
    prediction: NotRequired[Optional[PeakPrediction]]
    #: the hook's verdict on its step rows (since 1.5)
    step_trend: NotRequired[Optional[StepTrend]]
    #: how far the memory left after each forward that recorded an autograd graph rose as a leak makes it rise,
    #: with no optimizer step since (the hook's verdict on its forward rows); absent without a rise (since 1.7)
    forward_pile_bytes: NotRequired[int]


class StepInfo(TypedDict):
    """Optimizer steps seen by the global step hook."""

    #: steps so far
    count: int
    #: sum of the times between consecutive steps
    duration_seconds_total: float
    #: time between the last two steps
    last_duration_seconds: NotRequired[Optional[float]]
    #: when the last step ended
    last_step_time: NotRequired[Optional[float]]


class CensusHolder(TypedDict):
    """What holds tensors on the device outside the model states, the largest first."""

    #: how the job reaches it: "local `all_logits` of validate (train.py:42)", "Model.attn.last"
    name: str
    #: list, tuple, dict, set, frozenset, deque, attribute (one tensor) or kv_cache
    kind: str
    #: the package whose code holds it (transformers), null: the job's own code
    framework: NotRequired[Optional[str]]
    #: tensors it holds that carry an autograd graph
    graph_tensors: int
    #: tensors it holds without a graph
    detached_tensors: int
    #: their storages' bytes
    bytes: int
    #: the container's length
    length: NotRequired[Optional[int]]
    #: a deque's maxlen: it never holds more
    cap: NotRequired[Optional[int]]
    #: every tensor has a parameter's shape and no graph (EMA, snapshots)
    parameter_copies: NotRequired[bool]
    #: how the job reaches it: local, global, module (a model's path), class (only its class: no name of the
    #: job's leads to it), none; empty: not said
    reached_by: NotRequired[str]


class LeakFinding(TypedDict):
    """Tensors that survived an optimizer step still holding their autograd graph."""

    #: when the scan ran
    checked_at: float
    #: the step it ran after
    step: int
    #: CUDA tensors with a grad_fn alive at the step boundary
    graph_tensors: int
    #: their storage bytes, each storage once
    graph_bytes: int
    #: growth of the between-steps floor that triggered the check
    growth_bytes: NotRequired[Optional[int]]
    #: where the largest were allocated (needs history), "file:line in fn"
    sites: list[str]
    #: what held tensors outside the model states at the scan (the census), the largest first, at most 8 (since
    #: 1.11)
    holders: NotRequired[list[CensusHolder]]
    #: a bounded holder (a deque with a maxlen) the census saw holding at least half of the rise: no leak while
    #: the rise stays within its cap (since 1.11)
    bounded_by: NotRequired[Optional[str]]
    #: what that holder holds at its cap (its bytes per item x cap) (since 1.11)
    bounded_cap_bytes: NotRequired[Optional[int]]


class BatchAdvice(TypedDict):
    """The answer of oomsight.probe_batch_size (or of observed steps)."""

    #: when it was measured
    measured_at: float
    #: the device
    device: int
    #: largest batch that keeps the margin
    max_batch_size: int
    #: share of capacity kept free
    margin_ratio: float
    #: the capacity it was fitted against
    capacity_bytes: int
    #: fitted peak at batch size 0 (parameters, gradients, optimizer state, ...)
    fixed_bytes: float
    #: fitted peak growth per sample
    bytes_per_sample: float
    #: [[batch_size, peak_bytes], ...] measured
    points: list[list[float]]
    #: "probe" or "observed"
    source: str


class Parallelism(TypedDict):
    """How the job spreads its model over processes, as the hook found it in the live modules."""

    #: ranks of the default process group (1 without torch.distributed)
    world_size: int
    #: the data-parallel wrapper in use
    strategy: str
    #: DeepSpeed ZeRO stage 0-3; 1 also for torch's ZeroRedundancyOptimizer
    zero_stage: NotRequired[Optional[int]]
    #: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or _HYBRID_SHARD_ZERO2 (FSDP2: by its reshard setting)
    sharding: NotRequired[Optional[str]]
    #: ranks one parameter is sharded over
    shard_size: NotRequired[Optional[int]]
    #: FSDP2: true frees the gathered parameters after forward; an integer N reshards them to groups of N ranks,
    #: kept until the backward; false keeps them (bool; an integer since 1.11)
    reshard_after_forward: NotRequired[Optional[Any]]
    #: DDP: gradients are views of the buckets
    gradient_as_bucket_view: NotRequired[Optional[bool]]
    #: parameters or optimizer state live on the CPU
    offload: NotRequired[Optional[bool]]
    #: the dtype the wrapper computes in (FSDP2's MixedPrecisionPolicy.param_dtype, FSDP1's or DDP's
    #: MixedPrecision, DeepSpeed bf16/fp16), e.g. "bfloat16"; null: none (since 1.9)
    mixed_precision: NotRequired[Optional[str]]


class JobSetup(TypedDict):
    """How the job is set up, as far as the hook can tell (null: unknown)."""

    #: steps run under torch.autocast
    autocast: NotRequired[Optional[bool]]
    #: the parameters' dtype, e.g. "torch.bfloat16"
    param_dtype: NotRequired[Optional[str]]
    #: activation checkpointing is in use
    checkpointing: NotRequired[Optional[bool]]
    #: backward passes per optimizer step
    accumulation_steps: NotRequired[Optional[int]]
    #: the model runs under torch.compile
    compiled: NotRequired[Optional[bool]]
    #: zero_grad(set_to_none=True)
    set_to_none: NotRequired[Optional[bool]]
    #: the allocator uses expandable segments
    expandable_segments: NotRequired[Optional[bool]]
    #: class names of the optimizers
    optimizers: NotRequired[list[str]]
    #: saved activations go to the CPU (save_on_cpu) (since 1.6)
    activation_offload: NotRequired[Optional[bool]]
    #: the parallelism in use (since 1.6)
    parallelism: NotRequired[Optional[Parallelism]]
    #: adapter layers (LoRA) train on a frozen base (since 1.6)
    adapters: NotRequired[Optional[bool]]


class Snapshot(TypedDict):
    """One process's state, rewritten every publish (snapshots/<process id>.json)."""

    #: 1
    schema_version: int
    #: "snapshot"
    kind: str
    #: who wrote it
    process: ProcessInfo
    #: Unix time of this snapshot
    time: float
    #: increases with every snapshot of the process
    seq: int
    #: exited: the last snapshot of the process
    state: str
    #: normal, exception, oom, stopped
    exit_reason: NotRequired[Optional[str]]
    #: one object per CUDA device the process uses
    devices: list[DeviceSnapshot]
    #: optimizer steps
    steps: StepInfo
    #: allocator, nvml, oom_observer, step_hook, history, profiler -> works
    sources: NotRequired[dict[str, bool]]
    #: component -> count of swallowed errors
    errors: NotRequired[dict[str, int]]
    #: OOMs beyond the event-file limit
    oom_events_unwritten: NotRequired[int]
    #: the last leak scan's finding (since 1.1)
    leak: NotRequired[Optional[LeakFinding]]
    #: the last batch-size advice (since 1.1)
    batch_advice: NotRequired[Optional[BatchAdvice]]
    #: id of the profile request running now (since 1.1)
    profiling: NotRequired[Optional[str]]
    #: how the job is set up (since 1.2)
    job: NotRequired[Optional[JobSetup]]


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
    #: of the parameters, a mixture of experts' experts (named expert...) (since 1.10)
    expert_parameters_bytes: NotRequired[int]
    #: of the gradients, those of parameters no optimizer trains (a model left with requires_grad on) (since
    #: 1.6)
    untrained_gradients_bytes: NotRequired[int]
    #: top-level modules whose parameters are all frozen, largest first (at most 8) (since 1.6)
    frozen_modules: NotRequired[list[str]]


class CensusModule(TypedDict):
    """Parameter bytes of one top-level module on the device."""

    #: Model.child
    module: str
    #: its parameters' storages on the device
    bytes: int
    #: an optimizer holds at least one of them
    trained: bool


class CensusProcess(TypedDict):
    """Another compute process on the device, as NVML lists it."""

    #: its PID (NVML's, the host's where the namespaces differ)
    pid: int
    #: its used GPU memory (-1: withheld)
    bytes: int
    #: /proc/<pid>/comm
    name: NotRequired[str]


class CensusProcesses(TypedDict):
    """The device's other compute processes by the process tree."""

    #: false: NVML's PIDs are not this namespace's (or no list), nothing was split
    split: bool
    #: this process's descendants (DataLoader workers, helpers)
    children: NotRequired[list[CensusProcess]]
    #: its parent's other descendants (the launcher's other ranks)
    siblings: NotRequired[list[CensusProcess]]
    #: other tenants
    others: NotRequired[list[CensusProcess]]


class Census(TypedDict):
    """What holds the device's bytes at the OOM, read from the job's objects (bounded; cut_short says why not whole)."""

    #: the walk finished within its budget
    complete: bool
    #: time or objects: the budget that cut it short; failed: it raised
    cut_short: NotRequired[Optional[str]]
    #: what it took, in the failing thread
    seconds: float
    #: garbage-collected objects walked
    objects: NotRequired[int]
    #: tensors on the device with an autograd graph, outside the model states
    graph_tensors: NotRequired[int]
    #: their storages' bytes
    graph_bytes: NotRequired[int]
    #: tensors on the device without a graph, outside the model states
    detached_tensors: NotRequired[int]
    #: their storages' bytes
    detached_bytes: NotRequired[int]
    #: of those, held by running frames as plain locals
    in_flight_tensors: NotRequired[int]
    #: their bytes
    in_flight_bytes: NotRequired[int]
    #: what holds the rest, the largest first, at most 8
    holders: NotRequired[list[CensusHolder]]
    #: parameters by top-level module, the largest first, at most 8
    modules: NotRequired[list[CensusModule]]
    #: the device's other compute processes
    processes: NotRequired[Optional[CensusProcesses]]


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
    #: outside_bytes (NVML process memory minus reserved; -1: unknown); since 1.10, held_bytes (gradients and
    #: optimizer state the optimizers hold; -1: unknown) and input_elements (the most elements one forward of
    #: the outermost model took in since the row before; -1: unknown) (since 1.2)
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
    #: after forwards of the outermost model that recorded an autograd graph, with no optimizer step since they
    #: began (none yet, or a training job's pause), oldest first, at most 128: rows [forward, time,
    #: allocated_bytes, peak_bytes, start_bytes] (peak -1: the forward set no new lifetime peak; start:
    #: allocated as the forward began, -1 or absent: not read) (since 1.7)
    forwards_memory: NotRequired[list[list[float]]]
    #: forwards of the outermost model that recorded a graph since a backward last consumed one (since 1.8)
    forwards_since_backward: NotRequired[Optional[int]]
    #: the most forwards whose graphs one backward consumed together (null: no backward ran through the model)
    #: (since 1.8)
    most_forwards_per_backward: NotRequired[Optional[int]]
    #: the most elements one forward of the outermost model took in since the last step row: the failing step's
    #: forwards so far (-1: none seen) (since 1.10)
    input_elements: NotRequired[int]
    #: after each backward through the outermost model since the last optimizer step (an accumulation window),
    #: oldest first, at most 64: rows [backward, time, allocated_bytes] (backward: its number in the process)
    #: (since 1.10)
    backwards_memory: NotRequired[list[list[float]]]
    #: the fewest forwards whose graphs one backward consumed together (equal to the most: fixed windows) (since
    #: 1.11)
    least_forwards_per_backward: NotRequired[Optional[int]]
    #: what holds the device's bytes at the OOM (null: not taken) (since 1.11)
    census: NotRequired[Optional[Census]]


class ProfileOp(TypedDict):
    """One operator row of a profiling window."""

    #: operator name ("other" sums the rest)
    op: str
    #: calls in the window
    calls: int
    #: memory the op itself allocated on the device (negative: frees)
    self_cuda_memory_bytes: int
    #: self CUDA time, microseconds
    self_cuda_time_us: float
    #: CUDA time including children, microseconds
    cuda_time_us: float
    #: CPU time, microseconds
    cpu_time_us: float


class Profile(TypedDict):
    """One on-demand torch.profiler window of N optimizer steps in one process."""

    #: 1
    schema_version: int
    #: "profile"
    kind: str
    #: who wrote it
    process: ProcessInfo
    #: the request it answers (scheduled-<unix s> for a scheduled window)
    request_id: str
    #: profiling began after this optimizer step (the same on every rank)
    start_step: int
    #: the window's length in steps
    steps: int
    #: when the window began
    started_at: float
    #: when the window ended
    ended_at: float
    #: the device
    device: int
    #: peak allocated bytes inside the window (from the sampler)
    peak_allocated_bytes: int
    #: top ops by self CUDA memory, then "other"
    top_by_memory: list[ProfileOp]
    #: top ops by self CUDA time; empty for a memory-only window
    top_by_time: list[ProfileOp]
    #: false: a memory-only window, CUDA time not traced
    cuda_time: NotRequired[bool]
    #: the profiler's key_averages() table, in artifacts/
    table_artifact: NotRequired[Optional[str]]
    #: the gzipped Chrome trace, in artifacts/
    trace_artifact: NotRequired[Optional[str]]


class ProfileRequestDocument(TypedDict):
    """A request for a profiling window (requests/profile-<id>.json), by the admin endpoint or oomsight profile."""

    #: 1
    schema_version: NotRequired[int]
    #: "profile_request"
    kind: str
    #: letters, digits and -
    id: str
    #: the window's length in optimizer steps, 1 to 100
    steps: int
    #: start after this optimizer step (or at once when already past it)
    start_step: NotRequired[int]
    #: when it was written; a process handles requests created after it started
    created_at: float
    #: false asks for a memory-only window
    cuda_time: NotRequired[bool]
