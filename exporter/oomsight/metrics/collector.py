"""The Prometheus collector: builds every ``oomsight_*`` family from the spool on
each scrape (``docs/metrics.md`` is the reference).

Used by the sidecar and by ``oomsight run``; never imported by the in-process hook.
Series of a process vanish by themselves once it is past retention; OOM counters
are rebuilt from the event files, so they survive a sidecar restart and never go
backwards while the spool lives.

A scrape is made of parts (:class:`~oomsight.metrics.exposition.Part`): one per process,
one per OOM tally, one per latest profile, and one fresh part for what changes with every
read (self-health, snapshot ages). ``collect()`` merges them into families;
:meth:`SpoolCollector.exposition` renders each part once and reuses its text while the
part's inputs are unchanged.
"""

from __future__ import annotations

import functools
import platform
import time
from collections.abc import Iterable, Iterator
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
    DeviceKey,
    Inventory,
    Ledger,
    OomTally,
    ProcessView,
    take_inventory,
)
from oomsight.metrics.exposition import Encoder, ExpositionCache, Items, Part, Rows, merge
from oomsight.metrics.family import (
    ALLOCATOR_COUNTERS,
    ALLOCATOR_GAUGES,
    CATEGORIES,
    DEV,
    LIMIT_GAUGES,
    NVML_GAUGES,
    PREDICTION_GAUGES,
    PROC,
    STEP_MEMORY_GAUGES,
    STEP_PEAK_GAUGES,
    follow_trends,
    leak_suspected,
)
from oomsight.wire.schema import Profile
from oomsight.wire.spool import SKIP_REASONS, SpoolReader


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    """A gauge whose OpenMetrics unit is read off its name's suffix."""
    unit = next((u for u in ("bytes", "seconds", "ratio") if name.endswith("_" + u)), "")
    return GaugeMetricFamily(name, doc, labels=labels, unit=unit)


_DEVICE_GAUGES = (
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
        "oomsight_snapshot_age_seconds", "Seconds since the process last wrote its snapshot.", labels=PROC, unit="seconds"
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
    *(_gauge(name, doc, DEV) for name, doc, _ in _DEVICE_GAUGES),
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


_SAMPLE = {f.name: f.name + {"counter": "_total", "info": "_info"}.get(f.type, "") for f in LAYOUT}
"""Each family's sample name, as its ``add_metric`` names it."""


class _Rows(Rows):
    """A part's samples, added as ``add_metric`` would add them to the families of ``LAYOUT``."""

    def add(self, name: str, items: Items, value: Any) -> None:
        self.append((name, _SAMPLE[name], items, value))

    def info(self, name: str, items: Items, about: dict[str, str]) -> None:
        self.append((name, _SAMPLE[name], (*items, *about.items()), 1))


def _items(names: list[str], values: Iterable[str]) -> Items:
    return tuple(zip(names, values))


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
        self.cache = ExpositionCache()
        """Rendered text of every part, kept while the part's inputs are unchanged (``exposition``)."""

    def describe(self) -> list[Metric]:
        return []  # collect() reads files: do not run it at registration

    def inventory(self) -> Inventory:
        state = self.reader.read()
        inv = take_inventory(state, self.clock(), self.retention_seconds, self.stale_after_seconds, self.ledger)
        follow_trends(self.last_inventory, inv)
        self.last_inventory = inv
        return inv

    def collect(self) -> Iterator[Metric]:
        yield from families(self.inventory())

    def exposition(self, encoder: Encoder, fmt: str, others: Optional[Collector] = None) -> bytes:
        """What ``encoder`` (one of prometheus_client's, e.g. from ``choose_encoder``) gives for a
        registry holding this collector and then ``others``, with each process's text reused
        from the last scrape when its snapshot is the one read then. ``fmt`` names the format
        (the content type): text cached for one format is never served for another."""
        return self.cache.render(LAYOUT, parts(self.inventory()), encoder, fmt, others)


def families(inv: Inventory) -> list[Metric]:
    """Every family of ``inv``, built from scratch (what :meth:`SpoolCollector.collect` yields)."""
    return merge(LAYOUT, parts(inv))


def parts(inv: Inventory) -> Iterator[Part]:
    """The parts of a scrape in exposition order; each family's samples are its parts' samples in turn."""
    yield Part(None, (), functools.partial(_fresh, inv))
    for v in inv.processes:
        yield Part(("process", *v.rank_labels), (v.snapshot, v.up, v.exit_reason), functools.partial(_process, v))
    for key, tally in sorted(inv.ooms.items()):
        inputs = (tally.events, tally.fatal, tally.recovered, tally.last)
        yield Part(("oom", *key), inputs, functools.partial(_oom, key, tally))
    for rank, profile in sorted(latest_profiles(inv).items()):
        yield Part(("profile", *rank), (profile,), functools.partial(_profile, rank, profile))


def _fresh(inv: Inventory) -> Rows:
    """What changes with every read: the reader's own health and the snapshots' ages."""
    f = _Rows()
    f.info("oomsight_build", (), {"version": __version__, "python_version": platform.python_version()})
    for reason in SKIP_REASONS:
        f.add("oomsight_spool_skipped_files", (("reason", reason),), inv.skipped_total.get(reason, 0))
    f.add("oomsight_source_up", _items(_SOURCE, ("", "", "spool")), float(inv.readable and not inv.error))
    for v in inv.processes:
        f.add("oomsight_snapshot_age_seconds", _items(PROC, v.rank_labels), v.age_seconds)
    return f


_SOURCE = [*PROC, "source"]


def _process(v: ProcessView) -> Rows:
    """Everything of one process but its age: a function of its snapshot, ``up`` and exit reason."""
    f = _Rows()
    labels = _items(PROC, v.rank_labels)
    for source, ok in sorted(v.snapshot["sources"].items()):
        f.add("oomsight_source_up", (*labels, ("source", source)), float(bool(ok) and v.up))
    f.add("oomsight_process_up", labels, float(v.up))
    if not v.up:
        f.info("oomsight_process_exit", labels, {"reason": v.exit_reason or "vanished"})
    _process_info(f, v, labels)
    _devices(f, v, labels)
    _advice(f, v, labels)
    return f


def _process_info(f: _Rows, v: ProcessView, labels: Items) -> None:
    s = v.snapshot
    p = s["process"]
    f.info(
        "oomsight_process",
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
    f.add("oomsight_steps", labels, s["steps"].get("count", 0))
    f.add("oomsight_step_duration_seconds", labels, s["steps"].get("duration_seconds_total", 0.0))
    last_duration = s["steps"].get("last_duration_seconds")
    if last_duration is not None:
        f.add("oomsight_step_last_duration_seconds", labels, last_duration)
    for component, n in sorted(s.get("errors", {}).items()):
        f.add("oomsight_hook_errors", (*labels, ("component", component)), n)
    f.add("oomsight_oom_events_unwritten", labels, s.get("oom_events_unwritten", 0))


def _device_items(ranks: Items, d: Any) -> Items:
    return (*ranks, ("device", str(d["index"])), ("gpu_uuid", d["uuid"]))


def _devices(f: _Rows, v: ProcessView, ranks: Items) -> None:
    for d in v.snapshot["devices"]:
        labels = _device_items(ranks, d)
        for name, _, value in _DEVICE_ROWS:
            x = value(d)
            if x is not None:
                f.add(name, labels, float(x))
        f.info("oomsight_gpu", labels, {"name": d.get("name", "")})
        c: Any = d.get("categories")
        if c:
            for name in CATEGORIES:
                if c.get(f"{name}_bytes") is not None:
                    f.add("oomsight_memory_by_category_bytes", (*labels, ("category", name)), c[f"{name}_bytes"])


_DEVICE_ROWS = (*_DEVICE_GAUGES, *ALLOCATOR_COUNTERS)


def _advice(f: _Rows, v: ProcessView, labels: Items) -> None:
    """Leak findings and batch advice: what oomsight measured on request."""
    s = v.snapshot
    for d in s["devices"]:
        f.add("oomsight_leak_suspected", _device_items(labels, d), float(leak_suspected(d)))
    if s.get("leak"):
        f.add("oomsight_leak_graph_tensors", labels, s["leak"]["graph_tensors"])  # type: ignore[index]
        f.add("oomsight_leak_graph_bytes", labels, s["leak"]["graph_bytes"])  # type: ignore[index]
    if s.get("batch_advice"):
        f.add("oomsight_advice_max_batch_size", labels, s["batch_advice"]["max_batch_size"])  # type: ignore[index]
    f.add("oomsight_profiling", labels, float(bool(s.get("profiling"))))


def _oom(key: DeviceKey, tally: OomTally) -> Rows:
    f = _Rows()
    labels = _items(DEV, key)
    f.add("oomsight_oom_events", labels, tally.events)
    f.add("oomsight_oom_fatal_events", labels, tally.fatal)
    f.add("oomsight_oom_recovered_events", labels, tally.recovered)
    if tally.last is not None:
        f.add("oomsight_last_oom_timestamp_seconds", labels, tally.last["time"])
        f.add("oomsight_last_oom_requested_bytes", labels, tally.last["requested_bytes"])
        f.add("oomsight_last_oom_device_free_bytes", labels, tally.last["device_free_bytes"])
        f.info("oomsight_last_oom_cause", labels, {"cause": tally.last["diagnosis"]["cause"]})
    return f


def latest_profiles(inv: Inventory) -> dict[tuple[str, str], Profile]:
    """The newest profile of every (rank, local rank) that has a process in ``inv``."""
    latest: dict[tuple[str, str], Profile] = {}
    ranks = {v.rank_labels for v in inv.processes}
    for p in inv.profiles:
        key = (str(p["process"]["rank"]), str(p["process"]["local_rank"]))
        if key in ranks and (key not in latest or p["ended_at"] > latest[key]["ended_at"]):
            latest[key] = p
    return latest


def _profile(rank: tuple[str, str], p: Profile) -> Rows:
    f = _Rows()
    labels = _items(PROC, rank)
    for op in p["top_by_memory"]:
        f.add("oomsight_profile_op_self_cuda_memory_bytes", (*labels, ("op", op["op"])), op["self_cuda_memory_bytes"])
    for op in p["top_by_time"]:
        f.add("oomsight_profile_op_self_cuda_time_seconds", (*labels, ("op", op["op"])), op["self_cuda_time_us"] / 1e6)
    f.add("oomsight_profile_last_timestamp_seconds", labels, p["ended_at"])
    return f
