"""The table of metric families read off a device snapshot: name, HELP, value.

One row per family (``docs/metrics.md`` is the prose version); the collector turns
rows into Prometheus families, the text report reuses the derived values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional

from oomsight.analysis import trend
from oomsight.analysis.diagnosis import leak_growth
from oomsight.analysis.inventory import Inventory
from oomsight.wire.schema import DeviceSnapshot, StepTrend

PROC = ["rank", "local_rank"]
DEV = ["rank", "local_rank", "device", "gpu_uuid"]
_SRC = "torch.cuda.memory_stats()"


class At:
    """A device snapshot's value at ``d[section][key]``; None where the section is null or lacks
    the key. The collector reads all of a section's keys in one call."""

    __slots__ = ("key", "section")

    def __init__(self, section: str, key: str) -> None:
        self.section = section
        self.key = key

    def __call__(self, d: DeviceSnapshot) -> Optional[float]:
        found: Any = d.get(self.section)
        return None if found is None else found.get(self.key)


Row = tuple[str, str, Callable[[DeviceSnapshot], Optional[float]]]

# name (without unit suffix handling: full name), help, value from a device snapshot (At: the
# value at one key of one section)
ALLOCATOR_GAUGES: Sequence[Row] = (
    (
        "oomsight_torch_allocated_bytes",
        f"Bytes in live tensors ({_SRC} allocated_bytes.all.current).",
        At("allocator", "allocated_bytes"),
    ),
    (
        "oomsight_torch_reserved_bytes",
        f"Bytes held by the caching allocator ({_SRC} reserved_bytes.all.current).",
        At("allocator", "reserved_bytes"),
    ),
    (
        "oomsight_torch_active_bytes",
        f"Bytes in active blocks, incl. frees awaiting other streams ({_SRC} active_bytes.all.current).",
        At("allocator", "active_bytes"),
    ),
    (
        "oomsight_torch_requested_bytes",
        f"Bytes requested by tensors before rounding ({_SRC} requested_bytes.all.current).",
        At("allocator", "requested_bytes"),
    ),
    (
        "oomsight_torch_inactive_split_bytes",
        f"Free bytes inside split segments that empty_cache() cannot release: fragmentation ({_SRC} inactive_split_bytes.all.current).",
        At("allocator", "inactive_split_bytes"),
    ),
    (
        "oomsight_torch_peak_allocated_bytes",
        f"Lifetime peak of allocated bytes; oomsight never resets it ({_SRC} allocated_bytes.all.peak).",
        At("allocator", "peak_allocated_bytes"),
    ),
    (
        "oomsight_torch_peak_reserved_bytes",
        f"Lifetime peak of reserved bytes; oomsight never resets it ({_SRC} reserved_bytes.all.peak).",
        At("allocator", "peak_reserved_bytes"),
    ),
    (
        "oomsight_torch_window_peak_allocated_bytes",
        "Maximum sampled allocated bytes within the hook's sliding window (OOMSIGHT_WINDOW_SECONDS).",
        At("allocator", "window_peak_allocated_bytes"),
    ),
    (
        "oomsight_torch_window_peak_reserved_bytes",
        "Maximum sampled reserved bytes within the hook's sliding window.",
        At("allocator", "window_peak_reserved_bytes"),
    ),
    (
        "oomsight_torch_window_min_allocated_bytes",
        "Minimum sampled allocated bytes within the sliding window: memory that survives between steps.",
        At("allocator", "window_min_allocated_bytes"),
    ),
)
ALLOCATOR_COUNTERS: Sequence[Row] = (
    (
        "oomsight_torch_alloc_retries",
        f"cudaMalloc failures after which the allocator freed its cache and retried: slow steps, an OOM precursor ({_SRC} num_alloc_retries).",
        At("allocator", "alloc_retries"),
    ),
    (
        "oomsight_torch_ooms",
        f"OOMs raised by this process's allocator, caught ones included ({_SRC} num_ooms); resets when the process restarts.",
        At("allocator", "ooms"),
    ),
    (
        "oomsight_torch_device_allocs",
        f"cudaMalloc/cuMemMap calls ({_SRC} num_device_alloc; 0 before torch 2.4).",
        At("allocator", "device_allocs"),
    ),
    (
        "oomsight_torch_device_frees",
        f"cudaFree/cuMemUnmap calls ({_SRC} num_device_free; 0 before torch 2.4).",
        At("allocator", "device_frees"),
    ),
)
NVML_GAUGES: Sequence[Row] = (
    (
        "oomsight_gpu_memory_total_bytes",
        "Device memory capacity (NVML nvmlDeviceGetMemoryInfo total).",
        At("nvml", "total_bytes"),
    ),
    (
        "oomsight_gpu_memory_used_bytes",
        "Device memory used by all processes and the driver (NVML used).",
        At("nvml", "used_bytes"),
    ),
    ("oomsight_gpu_memory_free_bytes", "Device memory free (NVML free).", At("nvml", "free_bytes")),
    (
        "oomsight_gpu_memory_reserved_bytes",
        "Device memory reserved by the driver and firmware (NVML v2 reserved).",
        At("nvml", "reserved_bytes"),
    ),
    (
        "oomsight_gpu_utilization_ratio",
        "Share of time a kernel ran on the device (NVML utilization.gpu / 100).",
        At("nvml", "utilization_ratio"),
    ),
    (
        "oomsight_gpu_process_used_bytes",
        "This process's device memory per NVML; absent where NVML cannot see the PID (containers).",
        At("nvml", "process_used_bytes"),
    ),
    (
        "oomsight_gpu_process_visible",
        "1 if NVML lists this process's PID on the device, else 0 (then non-torch bytes include other processes).",
        At("nvml", "process_visible"),
    ),
    (
        "oomsight_gpu_non_torch_bytes",
        "Device memory of this process outside PyTorch's allocator (CUDA context, NCCL, cuBLAS): NVML process used minus reserved; where the PID is not visible, device used minus reserved.",
        lambda d: non_torch_bytes(d),
    ),
    (
        "oomsight_gpu_headroom_bytes",
        "Device memory left at this window's peak: total minus memory outside the allocator minus the window peak of reserved bytes.",
        lambda d: headroom_bytes(d),
    ),
)
LIMIT_GAUGES: Sequence[Row] = (
    (
        "oomsight_torch_memory_limit_bytes",
        "Per-process cap of the caching allocator set with torch.cuda.set_per_process_memory_fraction(); absent when unset.",
        lambda d: d.get("limit_bytes"),
    ),
)
STEP_PEAK_GAUGES: Sequence[Row] = (
    (
        "oomsight_step_peak_allocated_bytes",
        "Peak allocated bytes of the last optimizer step read: exact when torch's lifetime peak rose in it, else the sampled maximum (a lower bound); with opt-in OOMSIGHT_STEP_PEAKS read and reset every step.",
        lambda d: _step_peak(d, "allocated_bytes") if d.get("step_peak") else _row(d, trend.PEAK),
    ),
    (
        "oomsight_step_peak_reserved_bytes",
        "Peak reserved bytes of the last optimizer step (opt-in OOMSIGHT_STEP_PEAKS).",
        lambda d: _step_peak(d, "reserved_bytes"),
    ),
)
STEP_MEMORY_GAUGES: Sequence[Row] = (
    (
        "oomsight_step_floor_allocated_bytes",
        "Allocated bytes right after the last optimizer step read: what survives between steps (the leak signal).",
        lambda d: _row(d, trend.FLOOR),
    ),
    (
        "oomsight_step_floor_slope_bytes",
        "Bytes per optimizer step the between-steps floor rose over the judged steps (least squares; 0 when flat).",
        lambda d: _trend(d, "floor_slope_bytes"),
    ),
    (
        "oomsight_oom_forecast_steps",
        "Optimizer steps until the step peak reaches capacity at the current leak or growth; +Inf without a rise.",
        lambda d: _trend(d, "steps_to_oom"),
    ),
    (
        "oomsight_oom_forecast_seconds",
        "Seconds until the step peak reaches capacity at the current leak or growth and step time; +Inf without a rise.",
        lambda d: _trend(d, "seconds_to_oom"),
    ),
)
PREDICTION_GAUGES: Sequence[Row] = (
    (
        "oomsight_predicted_peak_allocated_bytes",
        "Peak allocated bytes the job's prediction (oomsight predict) gave for its training step, carried by the job (OOMSIGHT_PREDICTION or oomsight.record_prediction); compare with oomsight_torch_peak_allocated_bytes.",
        lambda d: _predicted(d, "peak_allocated_bytes"),
    ),
    (
        "oomsight_predicted_peak_reserved_bytes",
        "Peak reserved bytes the job's prediction gave; absent when it gave none (a bare size).",
        lambda d: _predicted(d, "peak_reserved_bytes"),
    ),
)
CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations")
_TRENDS: dict[int, tuple[DeviceSnapshot, StepTrend]] = {}
"""One verdict per device document of an older writer (id -> (document, verdict)): readers
reuse unchanged documents."""


def device_trend(d: DeviceSnapshot) -> Optional[StepTrend]:
    """The verdict on a device's step rows: the hook's own (wire 1.5), or, for an older writer,
    judged here from the rows it carries; None when it has no step rows."""
    if d.get("step_trend") is not None or not d.get("steps_memory"):
        return trend.device_verdict(d)
    cached = _TRENDS.get(id(d))
    if cached is not None and cached[0] is d:
        return cached[1]
    found = trend.device_verdict(d)  # an older writer's rows: judged once per document
    if found is not None:
        _keep_trend(d, found)
    return found


def carry_trend(new: DeviceSnapshot, old: DeviceSnapshot) -> None:
    """Give ``new`` the trend already judged for ``old`` (the same device's previous document)
    when its step rows and capacity are the same: a process that publishes again without a new
    step row (steps longer than the publish interval, a paused job) is not judged again."""
    cached, known = _TRENDS.get(id(old)), _TRENDS.get(id(new))
    if cached is None or cached[0] is not old or (known is not None and known[0] is new):
        return
    if new.get("steps_memory") == old.get("steps_memory") and _capacity(new) == _capacity(old):
        _keep_trend(new, cached[1])


def follow_trends(before: Optional[Inventory], now: Inventory) -> None:
    """A long-lived reader's step: each rank's device documents parsed again keep the trend of
    their step rows when the rows did not move (:func:`carry_trend`), and the trends of every
    document but ``now``'s are forgotten (they would keep replaced documents alive). With no
    trend judged here (every writer judges its own rows) there is nothing to carry or forget."""
    if not _TRENDS:
        return
    last = {v.rank_labels: v.snapshot for v in before.processes} if before is not None else {}
    for v in now.processes:
        old = last.get(v.rank_labels)
        if old is not None and old is not v.snapshot:
            olds = {d["index"]: d for d in old["devices"]}
            for d in v.snapshot["devices"]:
                if d["index"] in olds:
                    carry_trend(d, olds[d["index"]])
    kept = {}
    for v in now.processes:
        for d in v.snapshot["devices"]:
            found = _TRENDS.get(id(d))
            if found is not None and found[0] is d:
                kept[id(d)] = found
    _TRENDS.clear()
    _TRENDS.update(kept)


def _capacity(d: DeviceSnapshot) -> int:
    return int(d.get("limit_bytes") or d.get("total_bytes") or 0) or 1


def _keep_trend(d: DeviceSnapshot, found: StepTrend) -> None:
    if len(_TRENDS) > 4096:
        _TRENDS.clear()
    _TRENDS[id(d)] = (d, found)


def _row(d: DeviceSnapshot, column: int) -> Optional[float]:
    rows = d.get("steps_memory")
    return float(rows[-1][column]) if rows and len(rows[-1]) > column else None


def _trend(d: DeviceSnapshot, key: str) -> Optional[float]:
    t = device_trend(d)
    if t is None or t["points"] < trend.MIN_POINTS:
        return None
    value = t[key]  # type: ignore[literal-required]
    return float("inf") if value is None else float(value)


def leak_suspected(d: DeviceSnapshot) -> bool:
    """The step rows' verdict where the hook wrote them, else the legacy sampled trough trend."""
    t = device_trend(d)
    if t is not None:
        return t["leak"]
    return leak_growth(d.get("trend", []), d.get("limit_bytes") or d.get("total_bytes") or 1) is not None


def _step_peak(d: DeviceSnapshot, key: str) -> Optional[float]:
    peak = d.get("step_peak")
    return None if peak is None else peak[key]  # type: ignore[literal-required]


def _predicted(d: DeviceSnapshot, key: str) -> Optional[float]:
    p = d.get("prediction")
    return None if p is None else p.get(key)  # type: ignore[return-value]


def non_torch_bytes(d: DeviceSnapshot) -> Optional[int]:
    nv = d["nvml"]
    if nv is None:
        return None
    reserved = d["allocator"]["reserved_bytes"]
    own = nv["process_used_bytes"] if nv["process_visible"] else None
    base = own if own is not None else nv["used_bytes"]
    return max(base - reserved, 0)


def headroom_bytes(d: DeviceSnapshot, peak: Optional[int] = None) -> Optional[int]:
    """Memory left at ``peak`` reserved bytes (default: the window peak), within the
    device and within the process cap of ``set_per_process_memory_fraction``."""
    nv = d["nvml"]
    total = nv["total_bytes"] if nv is not None else d.get("total_bytes")
    if not total:
        return None
    a = d["allocator"]
    peak = a["window_peak_reserved_bytes"] if peak is None else peak
    outside = max(nv["used_bytes"] - a["reserved_bytes"], 0) if nv is not None else 0
    left = int(total) - outside - peak
    limit = d.get("limit_bytes")
    if limit:
        left = min(left, int(limit) - peak)
    return max(left, 0)
