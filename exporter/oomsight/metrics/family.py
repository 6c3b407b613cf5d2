"""The table of every ``oomsight_*`` family the spool gives: one row each, in exposition order.

A row names its family, its type, its HELP, the scope it is read in (the reader, a process, a
device of a process, an OOM tally, a process's latest profile) and how its value is read from
that scope's subject. ``oomsight.metrics.collector`` turns the rows into prometheus_client
families on every scrape; ``docs/metrics.md`` is the prose version, and a new metric is one row
here (docs/architecture.md, "A new metric").
"""

from __future__ import annotations

import dataclasses
import functools
import platform
from typing import Any, Callable, Optional

from oomsight._version import __version__
from oomsight.analysis import trend
from oomsight.analysis.diagnosis import leak_growth
from oomsight.analysis.inventory import OomTally
from oomsight.metrics.verdict import device_trend
from oomsight.wire.reader import SKIP_REASONS
from oomsight.wire.schema import DeviceSnapshot, Profile, Snapshot

PROC = ["rank", "local_rank"]
DEV = ["rank", "local_rank", "device", "gpu_uuid"]
_SRC = "torch.cuda.memory_stats()"

READER, SOURCE, PROCESS, SNAPSHOT = "reader", "source", "process", "snapshot"
DEVICE, OOM, PROFILE, HIDDEN, LEDGER = "device", "oom", "profile", "hidden", "ledger"
"""Scopes: what a row's value reads. READER: the whole read (an ``Inventory``), no labels. SOURCE: the
data sources as {name: up}, the reader's own (no rank) and then each process's (those of its snapshot,
up while the process is). PROCESS: a ``ProcessView``, the process as this scrape sees it (up, age, exit
reason: from the time now). SNAPSHOT: a process's ``Snapshot`` document alone; DEVICE: a
``DeviceSnapshot`` of that document. OOM: an ``OomTally`` of a (rank, GPU); PROFILE: a process's latest
``Profile``. HIDDEN: the snapshot files of a (rank, local rank) left out of the scrape at the budget, as
{reason: files}. LEDGER: what was done about a lost OOM ledger, as {outcome: when} (``oomsight.metrics.ledger``).
The subjects of :data:`DOCUMENT_SCOPES` in one process are read from its snapshot document
and whether it is up, nothing else: the collector builds their samples once per snapshot file and
state; every other subject is built at every scrape."""
DOCUMENT_SCOPES = (SOURCE, SNAPSHOT, DEVICE)
"""Scopes whose subjects in a process are read from its snapshot document alone (and, for SOURCE,
whether the process is up): the collector keeps their samples by the document's file
(``oomsight.metrics.collector.Kept``)."""
LABELS = {
    READER: [],
    SOURCE: PROC,
    PROCESS: PROC,
    SNAPSHOT: PROC,
    DEVICE: DEV,
    OOM: DEV,
    PROFILE: PROC,
    HIDDEN: PROC,
    LEDGER: [],
}
"""The labels of each scope's subjects."""

STABLE, ALPHA = "STABLE", "ALPHA"
"""Stability, as kube-state-metrics marks its families. STABLE: the name, type, labels and meaning
change only after a release that deprecates them (docs/metrics.md, "Stability"). ALPHA: any of
those may change in any release. A new row is ALPHA until it is marked STABLE; the dashboards and
alerts read only STABLE families, or the row's ``alpha_read`` says why they read this one
(tests/test_metric_stability.py)."""


@dataclasses.dataclass(frozen=True)
class Family:
    """One family: ``value(subject)`` is its number, None for no sample; an info family's label
    values (a dict); with ``label``, (that label's value, number) pairs, one sample each."""

    name: str
    type: str
    """gauge, counter or info"""
    help: str
    scope: str
    value: Callable[[Any], Any]
    label: str = ""
    stability: str = ALPHA
    """STABLE or ALPHA (:data:`STABLE`)."""
    alpha_read: str = ""
    """For an ALPHA family the dashboards or alerts read: which of them, and why they read it before it
    is STABLE."""

    @property
    def exposed(self) -> str:
        """The family's name as served: counters end in ``_total``, info families in ``_info``."""
        return self.name + {"counter": "_total", "info": "_info"}.get(self.type, "")

    @property
    def stability_note(self) -> str:
        """The stability cell of docs/metrics.md: the level, and for an ALPHA family that dashboards or
        alerts read, why."""
        return f"{self.stability}: {self.alpha_read}" if self.alpha_read else self.stability

    @functools.cached_property
    def labels(self) -> list[str]:
        return [*LABELS[self.scope], *([self.label] if self.label else [])]

    @functools.cached_property
    def unit(self) -> str:
        """The OpenMetrics unit, read off the name's suffix (info families have none)."""
        found = (u for u in ("bytes", "seconds", "ratio") if self.name.endswith("_" + u))
        return "" if self.type == "info" else next(found, "")


def gauge(
    name: str,
    help: str,
    scope: str,
    value: Callable[[Any], Any],
    label: str = "",
    *,
    stability: str = ALPHA,
    alpha_read: str = "",
) -> Family:
    return Family(name, "gauge", help, scope, value, label, stability, alpha_read)


def counter(*args: Any, **kwargs: Any) -> Family:
    """A counter's row, written as a gauge's (:func:`gauge`)."""
    return dataclasses.replace(gauge(*args, **kwargs), type="counter")


def info(
    name: str, help: str, scope: str, value: Callable[[Any], Any], *, stability: str = ALPHA, alpha_read: str = ""
) -> Family:
    return Family(name, "info", help, scope, value, "", stability, alpha_read)


def at(section: str, key: str) -> Callable[[DeviceSnapshot], Any]:
    """A device snapshot's value at ``d[section][key]``; None where the section is null or lacks the key."""

    def value(d: DeviceSnapshot) -> Any:
        found: Any = d.get(section)
        return None if found is None else found.get(key)

    return value


def _snap(key: str, default: Any = None) -> Callable[[Snapshot], Any]:
    return lambda s: s.get(key, default)


def _step(key: str, default: Any = None) -> Callable[[Snapshot], Any]:
    return lambda s: s["steps"].get(key, default)


def _last(key: str) -> Callable[[OomTally], Any]:
    return lambda t: None if t.last is None else t.last[key]  # type: ignore[literal-required]


def _sorted(key: str) -> Callable[[Snapshot], Any]:
    return lambda s: sorted(s.get(key, {}).items())  # type: ignore[attr-defined]


def _ops(key: str, column: str, scale: float = 1.0) -> Callable[[Profile], Any]:
    return lambda p: [(op["op"], op[column] / scale if scale != 1.0 else op[column]) for op in p[key]]  # type: ignore[literal-required]


def _finding(key: str, column: str) -> Callable[[Snapshot], Any]:
    return lambda s: s[key][column] if s.get(key) else None  # type: ignore[literal-required]


CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations")


def _row(d: DeviceSnapshot, column: int) -> Optional[float]:
    rows = d.get("steps_memory")
    return float(rows[-1][column]) if rows and len(rows[-1]) > column else None


def _trend(d: DeviceSnapshot, key: str) -> Optional[float]:
    t = device_trend(d)
    if t is None or t["points"] < trend.MIN_POINTS:
        return None
    value = t[key]  # type: ignore[literal-required]
    return float("inf") if value is None else float(value)


def _forecast_judged(d: DeviceSnapshot) -> bool:
    """The verdict carries the forecast's kind or reason (wire 1.9): a writer older than that has
    no earliest time, which is no sample rather than +Inf."""
    t = device_trend(d)
    return t is not None and bool(t.get("forecast_kind") or t.get("no_forecast_reason"))


def leak_suspected(d: DeviceSnapshot) -> bool:
    """The step rows' verdict where the hook wrote them, else the legacy sampled trough trend; with
    no optimizer step, also the hook's verdict on its forward rows (wire 1.7)."""
    if d.get("forward_pile_bytes"):
        return True
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


def _process_info(s: Snapshot) -> dict[str, str]:
    p = s["process"]
    return {
        "world_size": str(p.get("world_size", 1)),
        "torch_version": str(p.get("torch_version", "")),
        "cuda_version": str(p.get("cuda_version", "")),
        "allocator_backend": str(p.get("allocator_backend", "")),
        "expandable_segments": str(bool(p.get("expandable_segments", False))).lower(),
        "oomsight_version": str(p.get("oomsight_version", "")),
    }


HEADROOM_HELP = (
    "Bytes the allocator could still reserve at this window's peak: the device total minus memory outside the "
    "allocator, or the per-process cap of set_per_process_memory_fraction() where that is smaller, minus the "
    "window peak of reserved bytes; 0 when none is left."
)
CATEGORY_HELP = (
    "Device memory by category: parameters (every parameter of the models, trainable and frozen), gradients "
    "and optimizer state, each tensor by its local storage on this device (a shard for a sharded one); "
    "activations = peak allocated minus those (a lower bound unless OOMSIGHT_STEP_PEAKS is on)."
)
LEAK_HELP = (
    "1 while the between-steps floor of allocated memory rises step after step and the step's own memory does "
    "not, or, with no optimizer step, the memory left after each forward that records a graph rises forward "
    "after forward (docs/diagnosis.md)."
)
PREDICTION_READ = (
    "the pod dashboard's prediction row and the alert OomsightPeakAbovePrediction, where a job's prediction meets "
    "its measured peak (docs/prediction.md); new with the fleet comparison, and they change with the family"
)
SLOPE_HELP = (
    "Slope of the between-steps floor of allocated memory in bytes per optimizer step, not bytes (least squares "
    "over the judged step rows; negative while it falls, 0 when not known); absent before enough steps."
)


FAMILIES: tuple[Family, ...] = (
    info(
        "oomsight_build",
        "Version of the oomsight reader serving these metrics.",
        READER,
        lambda inv: {"version": __version__, "python_version": platform.python_version()},
        stability=STABLE,
    ),
    counter(
        "oomsight_spool_skipped_files",
        "Spool files that could not be used, by reason; each distinct file counted once.",
        READER,
        lambda inv: [(reason, inv.skipped_total.get(reason, 0)) for reason in SKIP_REASONS],
        "reason",
        stability=STABLE,
    ),
    gauge(
        "oomsight_spool_hidden_snapshots",
        "Snapshot files that serve no rank in this scrape, by the rank each names and why: too_many_files (past "
        'the files listed, the ranks or the memory a spool may hold; rank "" where the file names none or was not '
        "listed), too_many_series (past a scrape's series or bytes), clock_behind (its time lies more than the "
        "retention before its file was written: a writer's clock in the past), past_retention (its process ended "
        "or went silent longer than the retention ago). Absent while every snapshot serves its rank.",
        HIDDEN,
        lambda reasons: sorted(reasons.items()),
        "reason",
    ),
    gauge(
        "oomsight_oom_ledger_lost_timestamp_seconds",
        "When the reader last found its OOM ledger lost, by what it did: restored (read back from its copy: no OOM "
        "counter fell), reset (neither could be used: every OOM counter restarted at 0 with its _created moved; kept "
        "through restarts), put_back (removed or replaced while the reader ran: written again from the counts "
        'served). Absent while the ledger was never lost (docs/metrics.md, "OOM counters").',
        LEDGER,
        lambda losses: sorted(losses.items()),
        "outcome",
    ),
    gauge(
        "oomsight_source_up",
        "1 if a data source works. The sidecar's own sources have no rank.",
        SOURCE,
        lambda sources: sources.items(),
        "source",
        stability=STABLE,
    ),
    gauge(
        "oomsight_process_up",
        "1 while the process runs and publishes; 0 once it exited or went silent (kept for the retention period).",
        PROCESS,
        lambda v: float(v.up),
        stability=STABLE,
    ),
    gauge(
        "oomsight_snapshot_age_seconds",
        "Seconds since the process last wrote its snapshot.",
        PROCESS,
        lambda v: v.age_seconds,
        stability=STABLE,
    ),
    info(
        "oomsight_process",
        "The process behind a rank: versions and allocator settings.",
        SNAPSHOT,
        _process_info,
        stability=STABLE,
    ),
    info(
        "oomsight_process_exit",
        "Why a process that is no longer up ended: normal, exception, oom, stopped, or vanished (silent without a final snapshot: killed, or its hook stopped).",
        PROCESS,
        lambda v: None if v.up else {"reason": v.exit_reason or "vanished"},
        stability=STABLE,
    ),
    counter(
        "oomsight_steps", "Optimizer steps seen by the global step hook.", SNAPSHOT, _step("count", 0), stability=STABLE
    ),
    counter(
        "oomsight_step_duration_seconds",
        "Sum of the times between consecutive optimizer steps.",
        SNAPSHOT,
        _step("duration_seconds_total", 0.0),
        stability=STABLE,
    ),
    gauge(
        "oomsight_step_last_duration_seconds",
        "Time between the last two optimizer steps.",
        SNAPSHOT,
        _step("last_duration_seconds"),
        stability=STABLE,
    ),
    counter(
        "oomsight_hook_errors",
        "Errors the in-process hook caught and swallowed, by component.",
        SNAPSHOT,
        _sorted("errors"),
        "component",
        stability=STABLE,
    ),
    counter(
        "oomsight_oom_events_unwritten",
        "OOMs counted but not written because OOMSIGHT_MAX_OOM_EVENTS was reached.",
        SNAPSHOT,
        _snap("oom_events_unwritten", 0),
        stability=STABLE,
    ),
    gauge(
        "oomsight_torch_allocated_bytes",
        f"Bytes in live tensors ({_SRC} allocated_bytes.all.current).",
        DEVICE,
        at("allocator", "allocated_bytes"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_torch_reserved_bytes",
        f"Bytes held by the caching allocator ({_SRC} reserved_bytes.all.current).",
        DEVICE,
        at("allocator", "reserved_bytes"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_torch_active_bytes",
        f"Bytes in active blocks, incl. frees awaiting other streams ({_SRC} active_bytes.all.current).",
        DEVICE,
        at("allocator", "active_bytes"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_torch_requested_bytes",
        f"Bytes requested by tensors before rounding ({_SRC} requested_bytes.all.current).",
        DEVICE,
        at("allocator", "requested_bytes"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_torch_inactive_split_bytes",
        f"Free bytes inside split segments that empty_cache() cannot release: fragmentation ({_SRC} inactive_split_bytes.all.current).",
        DEVICE,
        at("allocator", "inactive_split_bytes"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_torch_peak_allocated_bytes",
        f"Lifetime peak of allocated bytes; oomsight never resets it ({_SRC} allocated_bytes.all.peak).",
        DEVICE,
        at("allocator", "peak_allocated_bytes"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_torch_peak_reserved_bytes",
        f"Lifetime peak of reserved bytes; oomsight never resets it ({_SRC} reserved_bytes.all.peak).",
        DEVICE,
        at("allocator", "peak_reserved_bytes"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_torch_window_peak_allocated_bytes",
        "Maximum sampled allocated bytes within the hook's sliding window (OOMSIGHT_WINDOW_SECONDS).",
        DEVICE,
        at("allocator", "window_peak_allocated_bytes"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_torch_window_peak_reserved_bytes",
        "Maximum sampled reserved bytes within the hook's sliding window.",
        DEVICE,
        at("allocator", "window_peak_reserved_bytes"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_torch_window_min_allocated_bytes",
        "Minimum sampled allocated bytes within the sliding window: memory that survives between steps.",
        DEVICE,
        at("allocator", "window_min_allocated_bytes"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_torch_memory_limit_bytes",
        "Per-process cap of the caching allocator set with torch.cuda.set_per_process_memory_fraction(); absent when unset.",
        DEVICE,
        lambda d: d.get("limit_bytes"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_gpu_memory_total_bytes",
        "Device memory capacity (NVML nvmlDeviceGetMemoryInfo total).",
        DEVICE,
        at("nvml", "total_bytes"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_gpu_memory_used_bytes",
        "Device memory used by all processes and the driver (NVML used).",
        DEVICE,
        at("nvml", "used_bytes"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_gpu_memory_free_bytes",
        "Device memory free (NVML free).",
        DEVICE,
        at("nvml", "free_bytes"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_gpu_memory_reserved_bytes",
        "Device memory reserved by the driver and firmware (NVML v2 reserved).",
        DEVICE,
        at("nvml", "reserved_bytes"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_gpu_utilization_ratio",
        "Share of time a kernel ran on the device (NVML utilization.gpu / 100).",
        DEVICE,
        at("nvml", "utilization_ratio"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_gpu_process_used_bytes",
        "This process's device memory per NVML; absent where NVML cannot see the PID (containers).",
        DEVICE,
        at("nvml", "process_used_bytes"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_gpu_process_visible",
        "1 if NVML lists this process's PID on the device, else 0 (then non-torch bytes include other processes).",
        DEVICE,
        at("nvml", "process_visible"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_gpu_non_torch_bytes",
        "Device memory of this process outside PyTorch's allocator (CUDA context, NCCL, cuBLAS): NVML process used minus reserved; where the PID is not visible, device used minus reserved.",
        DEVICE,
        lambda d: non_torch_bytes(d),
        stability=STABLE,
    ),
    gauge(
        "oomsight_gpu_headroom_bytes",
        HEADROOM_HELP,
        DEVICE,
        lambda d: headroom_bytes(d),
        stability=STABLE,
    ),
    gauge(
        "oomsight_step_peak_allocated_bytes",
        "Peak allocated bytes of the last optimizer step read: exact when torch's lifetime peak rose in it, else the sampled maximum (a lower bound); with opt-in OOMSIGHT_STEP_PEAKS read and reset every step.",
        DEVICE,
        lambda d: _step_peak(d, "allocated_bytes") if d.get("step_peak") else _row(d, trend.PEAK),
        stability=STABLE,
    ),
    gauge(
        "oomsight_step_peak_reserved_bytes",
        "Peak reserved bytes of the last optimizer step (opt-in OOMSIGHT_STEP_PEAKS).",
        DEVICE,
        lambda d: _step_peak(d, "reserved_bytes"),
        stability=ALPHA,
    ),
    gauge(
        "oomsight_step_floor_allocated_bytes",
        "Allocated bytes right after the last optimizer step read: what survives between steps (the leak signal).",
        DEVICE,
        lambda d: _row(d, trend.FLOOR),
        stability=STABLE,
    ),
    gauge(
        "oomsight_step_floor_slope_bytes",
        SLOPE_HELP,
        DEVICE,
        lambda d: _trend(d, "floor_slope_bytes"),
        stability=ALPHA,
    ),
    gauge(
        "oomsight_oom_forecast_steps",
        "Optimizer steps until the step peak reaches capacity at the current leak or growth; +Inf without a rise or where too noisy to time.",
        DEVICE,
        lambda d: _trend(d, "steps_to_oom"),
        stability=ALPHA,
    ),
    gauge(
        "oomsight_oom_forecast_seconds",
        "Seconds until the step peak reaches capacity at the current leak or growth and step time (central); +Inf "
        "without a rise, and where when the OOM comes is chance beyond the bar (too_noisy: the earliest time stands).",
        DEVICE,
        lambda d: _trend(d, "seconds_to_oom"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_oom_forecast_earliest_seconds",
        "The earliest plausible seconds until the step peak reaches capacity, from the step rows' own noise (at most oomsight_oom_forecast_seconds, and given where that is withheld as too noisy to time); +Inf without a forecast (no rise, too few rows, a slope lost in noise: the snapshot's step_trend says why); absent for hooks older than wire 1.9.",
        DEVICE,
        lambda d: _trend(d, "earliest_seconds_to_oom") if _forecast_judged(d) else None,
        stability=ALPHA,
        alpha_read="alert OomsightCudaOomPredicted, which must fire before the OOM its central forecast could miss; new in wire 1.9 and its method may still change, and the alert changes with it",
    ),
    gauge(
        "oomsight_predicted_peak_allocated_bytes",
        "Peak allocated bytes the job's prediction (oomsight predict) gave for its training step, carried by the job (OOMSIGHT_PREDICTION or oomsight.record_prediction); compare with oomsight_torch_peak_allocated_bytes.",
        DEVICE,
        lambda d: _predicted(d, "peak_allocated_bytes"),
        stability=ALPHA,
        alpha_read=PREDICTION_READ,
    ),
    gauge(
        "oomsight_predicted_peak_reserved_bytes",
        "Peak reserved bytes the job's prediction gave; absent when it gave none (a bare size).",
        DEVICE,
        lambda d: _predicted(d, "peak_reserved_bytes"),
        stability=ALPHA,
        alpha_read=PREDICTION_READ,
    ),
    counter(
        "oomsight_torch_alloc_retries",
        f"cudaMalloc failures after which the allocator freed its cache and retried: slow steps, an OOM precursor ({_SRC} num_alloc_retries).",
        DEVICE,
        at("allocator", "alloc_retries"),
        stability=STABLE,
    ),
    counter(
        "oomsight_torch_ooms",
        f"OOMs raised by this process's allocator, caught ones included ({_SRC} num_ooms); resets when the process restarts.",
        DEVICE,
        at("allocator", "ooms"),
        stability=STABLE,
    ),
    counter(
        "oomsight_torch_device_allocs",
        f"cudaMalloc/cuMemMap calls ({_SRC} num_device_alloc; 0 before torch 2.4).",
        DEVICE,
        at("allocator", "device_allocs"),
        stability=STABLE,
    ),
    counter(
        "oomsight_torch_device_frees",
        f"cudaFree/cuMemUnmap calls ({_SRC} num_device_free; 0 before torch 2.4).",
        DEVICE,
        at("allocator", "device_frees"),
        stability=STABLE,
    ),
    info(
        "oomsight_gpu",
        "The GPU behind a (rank, device): model name.",
        DEVICE,
        lambda d: {"name": d.get("name", "")},
        stability=STABLE,
    ),
    gauge(
        "oomsight_memory_by_category_bytes",
        CATEGORY_HELP,
        DEVICE,
        lambda d: (
            [(name, d["categories"].get(f"{name}_bytes")) for name in CATEGORIES] if d.get("categories") else None
        ),
        "category",
        stability=STABLE,
    ),
    counter(
        "oomsight_oom_events",
        "CUDA OOMs recorded by the hook's observer (caught ones included); 0 from the start.",
        OOM,
        lambda t: t.events,
        stability=STABLE,
    ),
    counter(
        "oomsight_oom_fatal_events",
        "OOMs that ended their process (uncaught, or the process died before a later step).",
        OOM,
        lambda t: t.fatal,
        stability=STABLE,
    ),
    counter(
        "oomsight_oom_recovered_events",
        "OOMs the process survived (a later step completed, or it exited normally).",
        OOM,
        lambda t: t.recovered,
        stability=STABLE,
    ),
    gauge("oomsight_last_oom_timestamp_seconds", "Unix time of the last OOM.", OOM, _last("time"), stability=STABLE),
    gauge(
        "oomsight_last_oom_requested_bytes",
        "Bytes the failing allocation of the last OOM asked for.",
        OOM,
        _last("requested_bytes"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_last_oom_device_free_bytes",
        "Device bytes free as the allocator saw them at the last OOM.",
        OOM,
        _last("device_free_bytes"),
        stability=STABLE,
    ),
    info(
        "oomsight_last_oom_cause",
        "Diagnosed cause of the last OOM (see docs/diagnosis.md).",
        OOM,
        lambda t: None if t.last is None else {"cause": t.last["diagnosis"]["cause"]},
        stability=STABLE,
    ),
    gauge(
        "oomsight_leak_suspected",
        LEAK_HELP,
        DEVICE,
        lambda d: float(leak_suspected(d)),
        stability=STABLE,
    ),
    gauge(
        "oomsight_leak_graph_tensors",
        "CUDA tensors found alive past an optimizer step still holding their autograd graph (last scan).",
        SNAPSHOT,
        _finding("leak", "graph_tensors"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_leak_graph_bytes",
        "Bytes of those tensors (last scan).",
        SNAPSHOT,
        _finding("leak", "graph_bytes"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_advice_max_batch_size",
        "Largest batch size that keeps the margin, from oomsight.probe_batch_size().",
        SNAPSHOT,
        _finding("batch_advice", "max_batch_size"),
        stability=STABLE,
    ),
    gauge(
        "oomsight_profiling",
        "1 while a profiling window is pending or running in the process.",
        SNAPSHOT,
        lambda s: float(bool(s.get("profiling"))),
        stability=ALPHA,
    ),
    gauge(
        "oomsight_profile_op_self_cuda_memory_bytes",
        'Self CUDA memory of the top operators in the last profiling window (top 10 by memory, the rest as op="other").',
        PROFILE,
        _ops("top_by_memory", "self_cuda_memory_bytes"),
        "op",
        stability=STABLE,
    ),
    gauge(
        "oomsight_profile_op_self_cuda_time_seconds",
        'Self CUDA time of the top operators in the last profiling window (top 10 by time, the rest as op="other").',
        PROFILE,
        _ops("top_by_time", "self_cuda_time_us", 1e6),
        "op",
        stability=STABLE,
    ),
    gauge(
        "oomsight_profile_last_timestamp_seconds",
        "When the last profiling window of the process ended.",
        PROFILE,
        lambda p: p["ended_at"],
        stability=ALPHA,
    ),
)
"""Every family of the spool, in exposition order."""
