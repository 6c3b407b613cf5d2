"""Every ``oomsight_*`` family the spool gives, without samples, in exposition order
(``docs/metrics.md`` is the reference; ``oomsight.metrics.collector`` fills them)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from oomsight.metrics.family import (
    ALLOCATOR_COUNTERS,
    ALLOCATOR_GAUGES,
    DEV,
    LIMIT_GAUGES,
    NVML_GAUGES,
    PREDICTION_GAUGES,
    PROC,
    STEP_MEMORY_GAUGES,
    STEP_PEAK_GAUGES,
)


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    """A gauge whose OpenMetrics unit is read off its name's suffix."""
    unit = next((u for u in ("bytes", "seconds", "ratio") if name.endswith("_" + u)), "")
    return GaugeMetricFamily(name, doc, labels=labels, unit=unit)


DEVICE_GAUGES = (
    *ALLOCATOR_GAUGES,
    *LIMIT_GAUGES,
    *NVML_GAUGES,
    *STEP_PEAK_GAUGES,
    *STEP_MEMORY_GAUGES,
    *PREDICTION_GAUGES,
)

LAYOUT: tuple[Metric, ...] = (
    InfoMetricFamily("oomsight_build", "Version of the oomsight reader serving these metrics."),
    CounterMetricFamily(
        "oomsight_spool_skipped_files",
        "Spool files that could not be used, by reason; each distinct file counted once.",
        labels=["reason"],
    ),
    GaugeMetricFamily(
        "oomsight_source_up",
        "1 if a data source works. The sidecar's own sources have no rank.",
        labels=[*PROC, "source"],
    ),
    GaugeMetricFamily(
        "oomsight_process_up",
        "1 while the process runs and publishes; 0 once it exited or went silent (kept for the retention period).",
        labels=PROC,
    ),
    GaugeMetricFamily(
        "oomsight_snapshot_age_seconds",
        "Seconds since the process last wrote its snapshot.",
        labels=PROC,
        unit="seconds",
    ),
    InfoMetricFamily("oomsight_process", "The process behind a rank: versions and allocator settings.", labels=PROC),
    InfoMetricFamily(
        "oomsight_process_exit",
        "Why a process that is no longer up ended: normal, exception, oom, stopped, or vanished (silent without a final snapshot: killed, or its hook stopped).",
        labels=PROC,
    ),
    CounterMetricFamily("oomsight_steps", "Optimizer steps seen by the global step hook.", labels=PROC),
    CounterMetricFamily(
        "oomsight_step_duration_seconds",
        "Sum of the times between consecutive optimizer steps.",
        labels=PROC,
        unit="seconds",
    ),
    GaugeMetricFamily(
        "oomsight_step_last_duration_seconds", "Time between the last two optimizer steps.", labels=PROC, unit="seconds"
    ),
    CounterMetricFamily(
        "oomsight_hook_errors",
        "Errors the in-process hook caught and swallowed, by component.",
        labels=[*PROC, "component"],
    ),
    CounterMetricFamily(
        "oomsight_oom_events_unwritten",
        "OOMs counted but not written because OOMSIGHT_MAX_OOM_EVENTS was reached.",
        labels=PROC,
    ),
    *(_gauge(name, doc, DEV) for name, doc, _ in DEVICE_GAUGES),
    *(CounterMetricFamily(name, doc, labels=DEV) for name, doc, _ in ALLOCATOR_COUNTERS),
    InfoMetricFamily("oomsight_gpu", "The GPU behind a (rank, device): model name.", labels=DEV),
    _gauge(
        "oomsight_memory_by_category_bytes",
        "Device memory by category: parameters, gradients and optimizer state summed from the optimizers' tensors; "
        "activations = peak allocated minus those (a lower bound unless OOMSIGHT_STEP_PEAKS is on).",
        [*DEV, "category"],
    ),
    CounterMetricFamily(
        "oomsight_oom_events",
        "CUDA OOMs recorded by the hook's observer (caught ones included); 0 from the start.",
        labels=DEV,
    ),
    CounterMetricFamily(
        "oomsight_oom_fatal_events",
        "OOMs that ended their process (uncaught, or the process died before a later step).",
        labels=DEV,
    ),
    CounterMetricFamily(
        "oomsight_oom_recovered_events",
        "OOMs the process survived (a later step completed, or it exited normally).",
        labels=DEV,
    ),
    _gauge("oomsight_last_oom_timestamp_seconds", "Unix time of the last OOM.", DEV),
    _gauge("oomsight_last_oom_requested_bytes", "Bytes the failing allocation of the last OOM asked for.", DEV),
    _gauge("oomsight_last_oom_device_free_bytes", "Device bytes free as the allocator saw them at the last OOM.", DEV),
    InfoMetricFamily("oomsight_last_oom_cause", "Diagnosed cause of the last OOM (see docs/diagnosis.md).", labels=DEV),
    GaugeMetricFamily(
        "oomsight_leak_suspected",
        "1 while the between-steps floor of allocated memory rises step after step and the step's own memory does not (docs/diagnosis.md).",
        labels=DEV,
    ),
    GaugeMetricFamily(
        "oomsight_leak_graph_tensors",
        "CUDA tensors found alive past an optimizer step still holding their autograd graph (last scan).",
        labels=PROC,
    ),
    _gauge("oomsight_leak_graph_bytes", "Bytes of those tensors (last scan).", PROC),
    GaugeMetricFamily(
        "oomsight_advice_max_batch_size",
        "Largest batch size that keeps the margin, from oomsight.probe_batch_size().",
        labels=PROC,
    ),
    GaugeMetricFamily(
        "oomsight_profiling", "1 while a profiling window is pending or running in the process.", labels=PROC
    ),
    GaugeMetricFamily(
        "oomsight_profile_op_self_cuda_memory_bytes",
        'Self CUDA memory of the top operators in the last profiling window (top 10 by memory, the rest as op="other").',
        labels=[*PROC, "op"],
        unit="bytes",
    ),
    GaugeMetricFamily(
        "oomsight_profile_op_self_cuda_time_seconds",
        'Self CUDA time of the top operators in the last profiling window (top 10 by time, the rest as op="other").',
        labels=[*PROC, "op"],
        unit="seconds",
    ),
    _gauge("oomsight_profile_last_timestamp_seconds", "When the last profiling window of the process ended.", PROC),
)
"""Every family of the spool, without samples, in exposition order."""
