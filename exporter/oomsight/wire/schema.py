"""Shapes of the documents in the spool (version 1) and their validation.

The hook writes these as JSON; the sidecar and ``oomsight report`` read them back.
``docs/spool-format.md`` is the prose version of this module. Readers accept
unknown extra keys (so a newer writer of the same version stays readable) and
reject a document that lacks a required key or has one of the wrong type.
"""

from __future__ import annotations

from typing import Any, Optional, TypedDict

SCHEMA_VERSION = 1
KIND_SNAPSHOT = "snapshot"
KIND_OOM_EVENT = "oom_event"
KIND_PROFILE = "profile"
KINDS = (KIND_SNAPSHOT, KIND_OOM_EVENT, KIND_PROFILE)

OUTCOME_PENDING = "pending"
OUTCOME_RECOVERED = "recovered"
OUTCOME_FATAL = "fatal"
OUTCOMES = (OUTCOME_PENDING, OUTCOME_RECOVERED, OUTCOME_FATAL)


class ProcessInfo(TypedDict):
    id: str  # unique per process start: "<pid>-<random hex>"
    pid: int
    hostname: str
    rank: int
    local_rank: int
    world_size: int
    started_at: float  # unix seconds
    argv0: str
    torch_version: str
    cuda_version: str
    oomsight_version: str
    allocator_backend: str  # "native" or "cudaMallocAsync"
    expandable_segments: bool


class AllocatorSample(TypedDict):
    allocated_bytes: int
    reserved_bytes: int
    active_bytes: int
    requested_bytes: int
    inactive_split_bytes: int
    peak_allocated_bytes: int  # lifetime (since the last reset by anybody)
    peak_reserved_bytes: int
    window_peak_allocated_bytes: int  # max sampled within the sliding window
    window_peak_reserved_bytes: int
    window_min_allocated_bytes: int  # trough within the window: persistent memory
    alloc_retries: int
    ooms: int
    device_allocs: int
    device_frees: int


class NvmlSample(TypedDict):
    total_bytes: int
    used_bytes: int
    free_bytes: int
    reserved_bytes: Optional[int]  # driver/firmware reserved (nvmlMemory_v2)
    utilization_ratio: Optional[float]
    process_used_bytes: Optional[int]  # this process's own NVML entry, when its PID is visible
    process_visible: bool
    other_processes: Optional[int]  # compute processes NVML lists besides this one


class Categories(TypedDict):
    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: Optional[int]  # peak minus the three above; None before a peak is known
    basis: str  # "step_peak" (opt-in exact) or "window_peak" (sampled, a lower bound)
    measured_at: float


class StepPeak(TypedDict):
    allocated_bytes: int
    reserved_bytes: int


class DeviceSnapshot(TypedDict):
    index: int
    uuid: str
    name: str
    total_bytes: int  # device capacity as torch sees it (get_device_properties().total_memory)
    limit_bytes: Optional[int]  # cap from torch.cuda.set_per_process_memory_fraction, None if unset
    allocator: AllocatorSample
    nvml: Optional[NvmlSample]
    categories: Optional[Categories]
    step_peak: Optional[StepPeak]
    trend: list[list[float]]  # [[time, window_min_allocated_bytes, steps], ...] oldest first
    steps_memory: list[list[float]]  # [[step, time, floor, peak, reserved, exact], ...] oldest first


class StepInfo(TypedDict):
    count: int
    duration_seconds_total: float
    last_duration_seconds: Optional[float]
    last_step_time: Optional[float]


class LeakFinding(TypedDict):
    """Tensors that survived an optimizer step still holding their autograd graph."""

    checked_at: float
    step: int
    graph_tensors: int  # CUDA tensors with a grad_fn alive at the step boundary
    graph_bytes: int  # their storage bytes, each storage once
    growth_bytes: Optional[int]  # growth of the between-steps floor that triggered the check
    sites: list[str]  # where the largest surviving tensors were allocated (needs history), "file:line in fn"


class BatchAdvice(TypedDict):
    """The answer of ``oomsight.probe_batch_size`` (or of observed steps)."""

    measured_at: float
    device: int
    max_batch_size: int  # largest batch that keeps the margin
    margin_ratio: float  # share of capacity kept free
    capacity_bytes: int
    fixed_bytes: int  # fitted peak at batch size 0 (parameters, gradients, optimizer state, ...)
    bytes_per_sample: float  # fitted peak growth per sample
    points: list[list[float]]  # [[batch_size, peak_bytes], ...] measured
    source: str  # "probe" or "observed"


class Snapshot(TypedDict):
    schema_version: int
    kind: str
    process: ProcessInfo
    time: float
    seq: int
    state: str  # "running" or "exited"
    exit_reason: Optional[str]
    devices: list[DeviceSnapshot]
    steps: StepInfo
    sources: dict[str, bool]
    errors: dict[str, int]
    oom_events_unwritten: int
    leak: Optional[LeakFinding]
    batch_advice: Optional[BatchAdvice]
    profiling: Optional[str]  # id of the profile request running now, else None
    job: Optional[dict[str, Any]]  # what the job already does (hook.jobsetup)


class ProfileOp(TypedDict):
    op: str  # operator name ("other" sums the rest)
    calls: int
    self_cuda_memory_bytes: int  # memory the op itself allocated on the device (can be negative: frees)
    self_cuda_time_us: float
    cuda_time_us: float  # including children
    cpu_time_us: float


class Profile(TypedDict):
    """One on-demand ``torch.profiler`` window of N optimizer steps in one process."""

    schema_version: int
    kind: str
    process: ProcessInfo
    request_id: str
    start_step: int  # the step after which profiling started (aligned across ranks)
    steps: int
    started_at: float
    ended_at: float
    device: int
    peak_allocated_bytes: int
    top_by_memory: list[ProfileOp]  # K ops by self CUDA memory, then "other"
    top_by_time: list[ProfileOp]  # K ops by self CUDA time, then "other"; empty when cuda_time is False
    cuda_time: bool  # False: a memory-only window (CPU activity only; readers treat a missing key as True)
    table_artifact: Optional[str]  # the profiler's own key_averages() table, in artifacts/
    trace_artifact: Optional[str]  # Chrome trace (json.gz), in artifacts/


class Diagnosis(TypedDict):
    cause: str
    summary: str
    remedies: list[str]
    facts: dict[str, Any]


class OomEvent(TypedDict):
    schema_version: int
    kind: str
    process: ProcessInfo
    seq: int
    time: float
    device: int
    gpu_uuid: str
    requested_bytes: int
    device_free_bytes: int
    device_total_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    inactive_split_bytes: int
    reserved_unallocated_bytes: int
    step: int
    nvml: Optional[NvmlSample]
    categories: Optional[Categories]
    allocator_summary: str
    stack: list[str]
    diagnosis: Diagnosis
    snapshot_artifact: Optional[str]
    outcome: str
    outcome_time: Optional[float]
    physical_free_bytes: int  # free on the device before any per-process cap
    limit_bytes: Optional[int]  # the per-process cap, None if unset
    steps_memory: list[list[float]]  # step rows of the device up to the OOM
    phase: Optional[str]  # forward, backward, optimizer
    largest_free_block_bytes: Optional[int]  # largest inactive block in the large pool at the OOM
    job: Optional[dict[str, Any]]  # what the job already does
    model_states: Optional[dict[str, Any]]  # parameters, gradients, optimizer state (and expected) bytes


class SchemaError(ValueError):
    """A document does not have the shape of its declared kind and version."""


_NUM = (int, float)
_INT = (int,)
_STR = (str,)
NONE = type(None)

# key -> (allowed types, required, nested spec for dicts / list items)
Spec = dict[str, tuple[tuple[type, ...], bool, Any]]

_PROCESS: Spec = {
    "id": (_STR, True, None),
    "pid": (_INT, True, None),
    "rank": (_INT, True, None),
    "local_rank": (_INT, True, None),
    "world_size": (_INT, False, None),
    "started_at": (_NUM, True, None),
    "expandable_segments": ((bool,), False, None),
}
_NVML: Spec = {
    "total_bytes": (_INT, True, None),
    "used_bytes": (_INT, True, None),
    "free_bytes": (_INT, True, None),
    "reserved_bytes": ((int, NONE), False, None),
    "utilization_ratio": ((int, float, NONE), False, None),
    "process_used_bytes": ((int, NONE), False, None),
    "process_visible": ((bool,), True, None),
    "other_processes": ((int, NONE), False, None),
}
_CATEGORIES: Spec = {
    "parameters_bytes": (_INT, True, None),
    "gradients_bytes": (_INT, True, None),
    "optimizer_state_bytes": (_INT, True, None),
    "activations_bytes": ((int, NONE), True, None),
    "basis": (_STR, True, None),
}
_STEP_PEAK: Spec = {"allocated_bytes": (_INT, True, None), "reserved_bytes": (_INT, True, None)}
_DEVICE: Spec = {
    "index": (_INT, True, None),
    "uuid": (_STR, True, None),
    "name": (_STR, False, None),
    "total_bytes": (_INT, False, None),
    "limit_bytes": ((int, NONE), False, None),
    "allocator": ((dict,), True, {k: (_INT, True, None) for k in AllocatorSample.__annotations__}),
    "nvml": ((dict, NONE), False, _NVML),
    "categories": ((dict, NONE), False, _CATEGORIES),
    "step_peak": ((dict, NONE), False, _STEP_PEAK),
    "trend": ((list,), False, "numbers"),
    "steps_memory": ((list,), False, "numbers"),
}
_STEPS: Spec = {
    "count": (_INT, True, None),
    "duration_seconds_total": (_NUM, True, None),
    "last_duration_seconds": ((int, float, NONE), False, None),
    "last_step_time": ((int, float, NONE), False, None),
}
_LEAK: Spec = {
    "checked_at": (_NUM, True, None),
    "step": (_INT, True, None),
    "graph_tensors": (_INT, True, None),
    "graph_bytes": (_INT, True, None),
    "growth_bytes": ((int, NONE), False, None),
    "sites": ((list,), True, "strings"),
}
_BATCH_ADVICE: Spec = {
    "measured_at": (_NUM, True, None),
    "device": (_INT, True, None),
    "max_batch_size": (_INT, True, None),
    "margin_ratio": (_NUM, True, None),
    "capacity_bytes": (_INT, True, None),
    "fixed_bytes": (_NUM, True, None),
    "bytes_per_sample": (_NUM, True, None),
    "points": ((list,), True, "numbers"),
    "source": (_STR, True, None),
}
_SNAPSHOT: Spec = {
    "process": ((dict,), True, _PROCESS),
    "time": (_NUM, True, None),
    "seq": (_INT, True, None),
    "state": (_STR, True, None),
    "exit_reason": ((str, NONE), False, None),
    "devices": ((list,), True, _DEVICE),
    "steps": ((dict,), True, _STEPS),
    "sources": ((dict,), False, "flags"),
    "errors": ((dict,), False, "counts"),
    "oom_events_unwritten": (_INT, False, None),
    "leak": ((dict, NONE), False, _LEAK),
    "batch_advice": ((dict, NONE), False, _BATCH_ADVICE),
    "profiling": ((str, NONE), False, None),
    "job": ((dict, NONE), False, None),
}
_PROFILE_OP: Spec = {
    "op": (_STR, True, None),
    "calls": (_INT, True, None),
    "self_cuda_memory_bytes": (_INT, True, None),
    "self_cuda_time_us": (_NUM, True, None),
    "cuda_time_us": (_NUM, True, None),
    "cpu_time_us": (_NUM, True, None),
}
_PROFILE: Spec = {
    "process": ((dict,), True, _PROCESS),
    "request_id": (_STR, True, None),
    "start_step": (_INT, True, None),
    "steps": (_INT, True, None),
    "started_at": (_NUM, True, None),
    "ended_at": (_NUM, True, None),
    "device": (_INT, True, None),
    "peak_allocated_bytes": (_INT, True, None),
    "top_by_memory": ((list,), True, _PROFILE_OP),
    "top_by_time": ((list,), True, _PROFILE_OP),
    "cuda_time": ((bool,), False, None),
    "table_artifact": ((str, NONE), False, None),
    "trace_artifact": ((str, NONE), False, None),
}
_DIAGNOSIS: Spec = {"cause": (_STR, True, None), "summary": (_STR, True, None), "remedies": ((list,), True, "strings")}
_EVENT: Spec = {
    "process": ((dict,), True, _PROCESS),
    "seq": (_INT, True, None),
    "time": (_NUM, True, None),
    "device": (_INT, True, None),
    "gpu_uuid": (_STR, True, None),
    "requested_bytes": (_INT, True, None),
    "device_free_bytes": (_INT, True, None),
    "device_total_bytes": (_INT, True, None),
    "allocated_bytes": (_INT, True, None),
    "reserved_bytes": (_INT, True, None),
    "inactive_split_bytes": (_INT, False, None),
    "step": (_INT, False, None),
    "nvml": ((dict, NONE), False, _NVML),
    "categories": ((dict, NONE), False, _CATEGORIES),
    "diagnosis": ((dict,), True, _DIAGNOSIS),
    "snapshot_artifact": ((str, NONE), False, None),
    "outcome": (_STR, True, None),
    "outcome_time": ((int, float, NONE), False, None),
    "physical_free_bytes": (_INT, False, None),
    "limit_bytes": ((int, NONE), False, None),
    "steps_memory": ((list,), False, "numbers"),
    "phase": ((str, NONE), False, None),
    "largest_free_block_bytes": ((int, NONE), False, None),
    "job": ((dict, NONE), False, None),
    "model_states": ((dict, NONE), False, None),
}
_LEAVES = {
    "numbers": lambda v: (
        isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
    ),
    "strings": lambda v: isinstance(v, str),
    "flags": lambda v: isinstance(v, bool),
    "counts": lambda v: isinstance(v, int) and not isinstance(v, bool),
}


def _check(doc: Any, spec: Spec, where: str) -> None:
    if not isinstance(doc, dict):
        raise SchemaError(f"{where} is not an object")
    for key, (types, required, nested) in spec.items():
        if key not in doc:
            if required:
                raise SchemaError(f"{where}.{key} is missing")
            continue
        value = doc[key]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise SchemaError(f"{where}.{key} is not {'/'.join(t.__name__ for t in types)}")
        if isinstance(nested, dict) and isinstance(value, dict):
            _check(value, nested, f"{where}.{key}")
        elif isinstance(nested, dict) and isinstance(value, list):
            for i, item in enumerate(value):
                _check(item, nested, f"{where}.{key}[{i}]")
        elif isinstance(nested, str):
            raw: Any = value
            items: list[Any] = list(raw.values()) if isinstance(raw, dict) else list(raw)
            if not all(_LEAVES[nested](item) for item in items):
                raise SchemaError(f"{where}.{key} holds a value that is not {nested}")


def validate(doc: Any) -> str:
    """Check a parsed document; return its kind. Raise :class:`SchemaError` otherwise."""
    _check(doc, {"schema_version": (_INT, True, None), "kind": (_STR, True, None)}, "document")
    kind = doc["kind"]
    if kind == KIND_SNAPSHOT:
        _check(doc, _SNAPSHOT, "snapshot")
        if doc["state"] not in ("running", "exited"):
            raise SchemaError(f"snapshot.state {doc['state']!r} is not running/exited")
    elif kind == KIND_PROFILE:
        _check(doc, _PROFILE, "profile")
    elif kind == KIND_OOM_EVENT:
        _check(doc, _EVENT, "oom_event")
        if doc["outcome"] not in OUTCOMES:
            raise SchemaError(f"oom_event.outcome {doc['outcome']!r} is not one of {OUTCOMES}")
    else:
        raise SchemaError(f"unknown kind {kind!r}")
    return str(kind)
