"""The facts an OOM diagnosis reads (:class:`OomFacts`), how they come from a recorded event
(:func:`facts_from_event`, so a newer oomsight re-diagnoses an old event), the model states and
the memory outside the allocator they imply, the parameters' layout (wire 1.6: frozen, quantised,
adapter and unsharded bytes, the parallelism), and the legacy leak test for spools without step rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional, TypedDict

from oomsight.analysis import trend
from oomsight.wire.schema import Categories, NvmlSample


class _ModelStatesBase(TypedDict):
    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    optimizer_state_expected_bytes: Optional[int]  # once every optimizer's state exists; None: unknown kind


class ModelStates(_ModelStatesBase, total=False):
    optimizers: Optional[int]  # 0: no optimizer, the live parameters were summed; None: unknown (older hooks)
    param_dtype: Optional[str]  # the dtype holding most parameter bytes
    # wire 1.6: all parameters by local storage; these are subsets of parameters_bytes ...
    frozen_parameters_bytes: int
    quantized_parameters_bytes: int
    adapter_parameters_bytes: int
    gradient_buckets_bytes: int  # ... of gradients_bytes: DDP's bucket copies
    untrained_gradients_bytes: int  # ... of gradients_bytes: of parameters no optimizer trains
    unsharded_parameters_bytes: int  # FSDP all-gathered parameters alive at the OOM, not in parameters_bytes
    frozen_modules: list[str]


def trains(f: OomFacts) -> bool:
    """Whether the process trains: it has stepped (step rows, categories) or holds an optimizer."""
    ms = f.get("model_states")
    stepped = bool(f.get("steps_memory")) or f.get("categories") is not None
    return stepped or (ms is not None and ms.get("optimizers") != 0)


class OomFacts(TypedDict, total=False):
    requested_bytes: int
    device_total_bytes: int  # capacity: the per-process cap where one is set, else the device total
    device_free_bytes: int  # what this process could still get (cap-relative)
    physical_free_bytes: int  # free on the device, before any per-process cap
    allocated_bytes: int
    reserved_bytes: int
    inactive_split_bytes: int
    nvml: Optional[NvmlSample]
    categories: Optional[Categories]
    trend: Sequence[Sequence[float]]  # legacy window trend: [[time, window_min_allocated, steps], ...]
    expandable_segments: bool
    steps_memory: Sequence[Sequence[float]]  # step rows (analysis.trend)
    forwards_memory: Sequence[Sequence[float]]  # since the last step: [forward, time, allocated, peak, start] (1.7)
    forwards_since_backward: Optional[int]  # forwards recording a graph since a backward consumed one (1.8)
    most_forwards_per_backward: Optional[int]  # the most one backward consumed; None: none did (1.8)
    least_forwards_per_backward: Optional[int]  # the fewest one backward consumed; None: none did (1.11)
    backwards_memory: Sequence[Sequence[float]]  # since the last step: [backward, time, allocated] (1.10)
    input_elements: int  # the most one forward took in since the last step row; -1 unknown (1.10)
    largest_free_block_bytes: Optional[int]
    phase: Optional[str]  # forward, backward, optimizer, unknown
    job: Optional[Mapping[str, Any]]
    model_states: Optional[ModelStates]
    world_size: int
    stack: Sequence[str]  # "file:line in function" of the failing thread, innermost last
    grad_enabled: Optional[bool]  # autograd recording in the failing thread (False: no_grad, inference_mode)
    time: float  # Unix time of the OOM
    sampled_allocated: Sequence[Sequence[float]]  # the sampler's last [time, allocated_bytes], oldest first
    last_step_time: Optional[float]  # Unix time the last optimizer step completed
    module_training: Optional[bool]  # the failing forward's outermost module in training mode (False: eval)
    module_frozen: Optional[bool]  # that module has no trainable parameter (a frozen teacher, reference model)
    private_pool_bytes: Optional[int]  # reserved in private pools (CUDA graphs, MemPool)
    private_pool_free_bytes: Optional[int]  # of those, not allocated
    captured_by: str  # "observer", or "exception" (no OOM observer: cudaMallocAsync, pluggable)
    allocator_backend: str  # "native", "cudaMallocAsync", "pluggable" ("" where older events do not say)
    census: Optional[Mapping[str, Any]]  # what holds the bytes, read from the job's objects (1.11); None: not taken


def states(f: OomFacts) -> Optional[int]:
    """Parameters + gradients + optimizer state (the expected state where known), else None."""
    ms = f.get("model_states")
    if ms:
        state = max(ms["optimizer_state_bytes"], ms.get("optimizer_state_expected_bytes") or 0)
        return int(ms["parameters_bytes"] + ms["gradients_bytes"] + state)
    cat = f.get("categories")
    if cat:
        expected: Any = cat.get("optimizer_state_expected_bytes")
        return int(cat["parameters_bytes"] + cat["gradients_bytes"] + max(cat["optimizer_state_bytes"], expected or 0))
    return None


def states_held(f: OomFacts) -> Optional[int]:
    """Parameters + gradients + the optimizer state allocated at the OOM (not the expected), else None."""
    ms: Any = f.get("model_states") or f.get("categories")
    if not ms:
        return None
    return int(ms["parameters_bytes"] + ms["gradients_bytes"] + ms["optimizer_state_bytes"])


def outside(f: OomFacts, reserved: int) -> tuple[Optional[int], Optional[int]]:
    """(memory outside this allocator, memory of other processes) from NVML, if known."""
    nv = f.get("nvml")
    if nv is None:
        return None, None
    outside = max(nv["used_bytes"] - reserved, 0)
    own = nv.get("process_used_bytes")
    if nv.get("process_visible") and own is not None:
        return max(own - reserved, 0), max(nv["used_bytes"] - own, 0)
    return outside, None


def leak_growth(rows: Sequence[Sequence[float]], total: int) -> Optional[int]:
    """Legacy (spools without step rows): the growth of the sampled between-steps troughs, rows
    ``[time, window_min_allocated_bytes, steps]``, by the one leak detector (``trend.leak_in``)."""
    return trend.legacy_leak(rows, total)


def layout(f: OomFacts, key: str) -> int:
    """A layout byte count (wire 1.6: frozen, quantized, adapter, unsharded parameters, DDP buckets)
    from the model states, else the categories; 0 where older events do not say."""
    for source in (f.get("model_states"), f.get("categories")):
        found = source.get(key) if source else None
        if isinstance(found, int):
            return found
    return 0


def frozen_modules(f: OomFacts) -> list[str]:
    for source in (f.get("model_states"), f.get("categories")):
        names = source.get("frozen_modules") if source else None
        if isinstance(names, list):
            return [str(n) for n in names]
    return []


def parallelism(f: OomFacts) -> Mapping[str, Any]:
    """The job's parallelism (wire 1.6), {} where unknown."""
    job = f.get("job") or {}
    found = job.get("parallelism")
    return found if isinstance(found, Mapping) else {}


def facts_from_event(event: Mapping[str, Any]) -> OomFacts:
    """The facts of a recorded OOM event, so a newer diagnosis can be re-run on an old event."""
    free = int(event.get("device_free_bytes", 0))
    facts = OomFacts(
        requested_bytes=int(event.get("requested_bytes", 0)),
        device_total_bytes=int(event.get("device_total_bytes", 0)),
        device_free_bytes=free,
        physical_free_bytes=int(event.get("physical_free_bytes", free)),
        allocated_bytes=int(event.get("allocated_bytes", 0)),
        reserved_bytes=int(event.get("reserved_bytes", 0)),
        inactive_split_bytes=int(event.get("inactive_split_bytes", 0)),
        nvml=event.get("nvml"),
        categories=event.get("categories"),
        trend=event.get("trend") or [],
        expandable_segments=bool(event.get("process", {}).get("expandable_segments")),
        steps_memory=event.get("steps_memory") or [],
        forwards_memory=event.get("forwards_memory") or [],
        backwards_memory=event.get("backwards_memory") or [],
        largest_free_block_bytes=event.get("largest_free_block_bytes"),
        phase=event.get("phase"),
        job=event.get("job"),
        model_states=event.get("model_states"),
        world_size=int(event.get("process", {}).get("world_size") or 1),
        stack=[str(x) for x in event.get("stack") or []],
        grad_enabled=event.get("grad_enabled"),
        time=float(event.get("time") or 0.0),
        sampled_allocated=event.get("sampled_allocated") or [],
        last_step_time=event.get("last_step_time"),
        module_training=event.get("module_training"),
        module_frozen=event.get("module_frozen"),
        census=event.get("census"),
        private_pool_bytes=event.get("private_pool_bytes"),
        private_pool_free_bytes=event.get("private_pool_free_bytes"),
        captured_by=str(event.get("captured_by") or "observer"),
        allocator_backend=str(event.get("process", {}).get("allocator_backend") or ""),
    )
    for key in (
        "forwards_since_backward",
        "most_forwards_per_backward",
        "least_forwards_per_backward",
        "input_elements",
    ):
        if key in event:  # only where it says
            facts[key] = event[key]
    return facts

