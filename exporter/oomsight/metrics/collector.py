"""The Prometheus collector: builds every ``oomsight_*`` family from the spool on
each scrape (``docs/metrics.md`` is the reference).

Used by the sidecar and by ``oomsight run``; never imported by the in-process hook.
Series of a process vanish by themselves once it is past retention; OOM counters
are rebuilt from the event files, so they survive a sidecar restart and never go
backwards while the spool lives.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Iterator, Sequence
from typing import Any, Callable, Optional

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from oomsight._version import __version__
from oomsight.analysis.inventory import (
    DEFAULT_RETENTION_SECONDS,
    DEFAULT_STALE_AFTER_SECONDS,
    Inventory,
    Ledger,
    ProcessView,
    take_inventory,
)
from oomsight.metrics.family import (
    ALLOCATOR_COUNTERS,
    ALLOCATOR_GAUGES,
    CATEGORIES,
    DEV,
    LIMIT_GAUGES,
    NVML_GAUGES,
    PROC,
    STEP_MEMORY_GAUGES,
    STEP_PEAK_GAUGES,
    Row,
    leak_suspected,
)
from oomsight.wire.schema import Profile
from oomsight.wire.spool import SKIP_REASONS, SpoolReader


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    """A gauge whose OpenMetrics unit is read off its name's suffix."""
    unit = next((u for u in ("bytes", "seconds", "ratio") if name.endswith("_" + u)), "")
    return GaugeMetricFamily(name, doc, labels=labels, unit=unit)


class SpoolCollector(Collector):
    """``registry.register(SpoolCollector(spool_dir))``; injectable ``clock`` for tests."""

    def __init__(
        self,
        spool_dir: str,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS,
        clock: Callable[[], float] = time.time,
        reader: Optional[SpoolReader] = None,
    ) -> None:
        self.reader = reader or SpoolReader(spool_dir)
        self.retention_seconds = retention_seconds
        self.stale_after_seconds = stale_after_seconds
        self.clock = clock
        self.last_inventory: Optional[Inventory] = None
        self.ledger = Ledger()
        """OOM counters never go backwards while this collector lives (``Ledger``)."""

    def describe(self) -> list[Metric]:
        return []  # collect() reads files: do not run it at registration

    def inventory(self) -> Inventory:
        state = self.reader.read()
        inv = take_inventory(state, self.clock(), self.retention_seconds, self.stale_after_seconds, self.ledger)
        self.last_inventory = inv
        return inv

    def collect(self) -> Iterator[Metric]:
        inv = self.inventory()
        yield from _self_health(inv)
        yield from _process_families(inv.processes)
        yield from _device_families(inv.processes)
        yield from _oom_families(inv)
        yield from _advice_families(inv)


def _self_health(inv: Inventory) -> Iterator[Metric]:
    build = InfoMetricFamily("oomsight_build", "Version of the oomsight reader serving these metrics.")
    build.add_metric([], {"version": __version__, "python_version": platform.python_version()})
    yield build
    up = GaugeMetricFamily(
        "oomsight_source_up",
        "1 if a data source works. The sidecar's own sources have no rank.",
        labels=[*PROC, "source"],
    )
    up.add_metric(["", "", "spool"], float(inv.readable and not inv.error))
    skipped = CounterMetricFamily(
        "oomsight_spool_skipped_files",
        "Spool files that could not be used, by reason; each distinct file counted once.",
        labels=["reason"],
    )
    for reason in SKIP_REASONS:
        skipped.add_metric([reason], inv.skipped_total.get(reason, 0))
    yield skipped
    for v in inv.processes:
        for source, ok in sorted(v.snapshot["sources"].items()):
            up.add_metric([*v.rank_labels, source], float(bool(ok) and v.up))
    yield up


def _process_families(processes: Sequence[ProcessView]) -> Iterator[Metric]:
    pup = GaugeMetricFamily(
        "oomsight_process_up",
        "1 while the process runs and publishes; 0 once it exited or went silent (kept for the retention period).",
        labels=PROC,
    )
    age = GaugeMetricFamily(
        "oomsight_snapshot_age_seconds",
        "Seconds since the process last wrote its snapshot.",
        labels=PROC,
        unit="seconds",
    )
    info = InfoMetricFamily(
        "oomsight_process", "The process behind a rank: versions and allocator settings.", labels=PROC
    )
    steps = CounterMetricFamily("oomsight_steps", "Optimizer steps seen by the global step hook.", labels=PROC)
    dur = CounterMetricFamily(
        "oomsight_step_duration_seconds",
        "Sum of the times between consecutive optimizer steps.",
        labels=PROC,
        unit="seconds",
    )
    last = GaugeMetricFamily(
        "oomsight_step_last_duration_seconds", "Time between the last two optimizer steps.", labels=PROC, unit="seconds"
    )
    errs = CounterMetricFamily(
        "oomsight_hook_errors",
        "Errors the in-process hook caught and swallowed, by component.",
        labels=[*PROC, "component"],
    )
    exits = InfoMetricFamily(
        "oomsight_process_exit",
        "Why a process that is no longer up ended: normal, exception, oom, stopped, or vanished (silent without a final snapshot: killed, or its hook stopped).",
        labels=PROC,
    )
    dropped = CounterMetricFamily(
        "oomsight_oom_events_unwritten",
        "OOMs counted but not written because OOMSIGHT_MAX_OOM_EVENTS was reached.",
        labels=PROC,
    )
    for v in processes:
        s, labels = v.snapshot, list(v.rank_labels)
        p = s["process"]
        pup.add_metric(labels, float(v.up))
        if not v.up:
            exits.add_metric(labels, {"reason": v.exit_reason or "vanished"})
        age.add_metric(labels, v.age_seconds)
        info.add_metric(
            labels,
            {
                "world_size": str(p.get("world_size", 1)),
                "torch_version": str(p.get("torch_version", "")),
                "cuda_version": str(p.get("cuda_version", "")),
                "allocator_backend": str(p.get("allocator_backend", "")),
                "expandable_segments": str(bool(p.get("expandable_segments", False))).lower(),
                "oomsight_version": str(p.get("oomsight_version", "")),
            },
        )
        steps.add_metric(labels, s["steps"].get("count", 0))
        dur.add_metric(labels, s["steps"].get("duration_seconds_total", 0.0))
        last_duration = s["steps"].get("last_duration_seconds")
        if last_duration is not None:
            last.add_metric(labels, last_duration)
        for component, n in sorted(s.get("errors", {}).items()):
            errs.add_metric([*labels, component], n)
        dropped.add_metric(labels, s.get("oom_events_unwritten", 0))
    yield from (pup, age, info, exits, steps, dur, last, errs, dropped)


def _device_families(processes: Sequence[ProcessView]) -> Iterator[Metric]:
    rows: list[tuple[Row, GaugeMetricFamily | CounterMetricFamily]] = [
        (r, _gauge(r[0], r[1], DEV)) for r in (*ALLOCATOR_GAUGES, *LIMIT_GAUGES, *NVML_GAUGES, *STEP_PEAK_GAUGES, *STEP_MEMORY_GAUGES)
    ]
    counters: list[tuple[Row, GaugeMetricFamily | CounterMetricFamily]] = [
        (r, CounterMetricFamily(r[0], r[1], labels=DEV)) for r in ALLOCATOR_COUNTERS
    ]
    gpu = InfoMetricFamily("oomsight_gpu", "The GPU behind a (rank, device): model name.", labels=DEV)
    cat = _gauge(
        "oomsight_memory_by_category_bytes",
        "Device memory by category: parameters, gradients and optimizer state summed from the optimizers' tensors; "
        "activations = peak allocated minus those (a lower bound unless OOMSIGHT_STEP_PEAKS is on).",
        [*DEV, "category"],
    )
    for v in processes:
        for d in v.snapshot["devices"]:
            labels = [*v.rank_labels, str(d["index"]), d["uuid"]]
            for (_, _, value), fam in (*rows, *counters):
                x = value(d)
                if x is not None:
                    fam.add_metric(labels, float(x))
            gpu.add_metric(labels, {"name": d.get("name", "")})
            c: Any = d.get("categories")
            if c:
                for name in CATEGORIES:
                    if c.get(f"{name}_bytes") is not None:
                        cat.add_metric([*labels, name], c[f"{name}_bytes"])
    yield from (fam for _, fam in rows)
    yield from (fam for _, fam in counters)
    yield gpu
    yield cat


def _oom_families(inv: Inventory) -> Iterator[Metric]:
    total = CounterMetricFamily(
        "oomsight_oom_events",
        "CUDA OOMs recorded by the hook's observer (caught ones included); 0 from the start.",
        labels=DEV,
    )
    fatal = CounterMetricFamily(
        "oomsight_oom_fatal_events",
        "OOMs that ended their process (uncaught, or the process died before a later step).",
        labels=DEV,
    )
    recovered = CounterMetricFamily(
        "oomsight_oom_recovered_events",
        "OOMs the process survived (a later step completed, or it exited normally).",
        labels=DEV,
    )
    ts = _gauge("oomsight_last_oom_timestamp_seconds", "Unix time of the last OOM.", DEV)
    req = _gauge("oomsight_last_oom_requested_bytes", "Bytes the failing allocation of the last OOM asked for.", DEV)
    free = _gauge(
        "oomsight_last_oom_device_free_bytes", "Device bytes free as the allocator saw them at the last OOM.", DEV
    )
    cause = InfoMetricFamily(
        "oomsight_last_oom_cause", "Diagnosed cause of the last OOM (see docs/diagnosis.md).", labels=DEV
    )
    for key, tally in sorted(inv.ooms.items()):
        labels = list(key)
        total.add_metric(labels, tally.events)
        fatal.add_metric(labels, tally.fatal)
        recovered.add_metric(labels, tally.recovered)
        if tally.last is not None:
            ts.add_metric(labels, tally.last["time"])
            req.add_metric(labels, tally.last["requested_bytes"])
            free.add_metric(labels, tally.last["device_free_bytes"])
            cause.add_metric(labels, {"cause": tally.last["diagnosis"]["cause"]})
    yield from (total, fatal, recovered, ts, req, free, cause)


def _advice_families(inv: Inventory) -> Iterator[Metric]:
    """Profiles, leak findings and batch advice: what oomsight measured on request."""
    leak = GaugeMetricFamily(
        "oomsight_leak_suspected",
        "1 while the between-steps floor of allocated memory rises step after step and the step's own memory does not (docs/diagnosis.md).",
        labels=DEV,
    )
    tensors = GaugeMetricFamily(
        "oomsight_leak_graph_tensors",
        "CUDA tensors found alive past an optimizer step still holding their autograd graph (last scan).",
        labels=PROC,
    )
    graph_bytes = _gauge("oomsight_leak_graph_bytes", "Bytes of those tensors (last scan).", PROC)
    batch = GaugeMetricFamily(
        "oomsight_advice_max_batch_size",
        "Largest batch size that keeps the margin, from oomsight.probe_batch_size().",
        labels=PROC,
    )
    profiling = GaugeMetricFamily(
        "oomsight_profiling", "1 while a profiling window is pending or running in the process.", labels=PROC
    )
    for v in inv.processes:
        s, labels = v.snapshot, list(v.rank_labels)
        for d in s["devices"]:
            leak.add_metric([*labels, str(d["index"]), d["uuid"]], float(leak_suspected(d)))
        if s.get("leak"):
            tensors.add_metric(labels, s["leak"]["graph_tensors"])  # type: ignore[index]
            graph_bytes.add_metric(labels, s["leak"]["graph_bytes"])  # type: ignore[index]
        if s.get("batch_advice"):
            batch.add_metric(labels, s["batch_advice"]["max_batch_size"])  # type: ignore[index]
        profiling.add_metric(labels, float(bool(s.get("profiling"))))
    yield from (leak, tensors, graph_bytes, batch, profiling)
    yield from _profile_families(inv)


def _profile_families(inv: Inventory) -> Iterator[Metric]:
    mem = GaugeMetricFamily(
        "oomsight_profile_op_self_cuda_memory_bytes",
        'Self CUDA memory of the top operators in the last profiling window (top 10 by memory, the rest as op="other").',
        labels=[*PROC, "op"],
        unit="bytes",
    )
    time_ = GaugeMetricFamily(
        "oomsight_profile_op_self_cuda_time_seconds",
        'Self CUDA time of the top operators in the last profiling window (top 10 by time, the rest as op="other").',
        labels=[*PROC, "op"],
        unit="seconds",
    )
    last = _gauge(
        "oomsight_profile_last_timestamp_seconds", "When the last profiling window of the process ended.", PROC
    )
    latest: dict[tuple[str, str], Profile] = {}
    ranks = {v.rank_labels for v in inv.processes}
    for p in inv.profiles:
        key = (str(p["process"]["rank"]), str(p["process"]["local_rank"]))
        if key in ranks and (key not in latest or p["ended_at"] > latest[key]["ended_at"]):
            latest[key] = p
    for key, p in sorted(latest.items()):
        for op in p["top_by_memory"]:
            mem.add_metric([*key, op["op"]], op["self_cuda_memory_bytes"])
        for op in p["top_by_time"]:
            time_.add_metric([*key, op["op"]], op["self_cuda_time_us"] / 1e6)
        last.add_metric(list(key), p["ended_at"])
    yield from (mem, time_, last)
