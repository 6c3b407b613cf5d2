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
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any, Callable, Optional

from prometheus_client.core import (
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
from oomsight.metrics.exposition import Encoder, ExpositionCache, Part, merge
from oomsight.metrics.family import (
    ALLOCATOR_COUNTERS,
    CATEGORIES,
    DEV,
    PROC,
    At,
    Row,
    follow_trends,
    leak_suspected,
)
from oomsight.metrics.layout import DEVICE_GAUGES, LAYOUT
from oomsight.metrics.rows import Items, Memo, Rows
from oomsight.wire.schema import Profile
from oomsight.wire.spool import SKIP_REASONS, SpoolReader

_SAMPLE = {f.name: f.name + {"counter": "_total", "info": "_info"}.get(f.type, "") for f in LAYOUT}
"""Each family's sample name, as its ``add_metric`` names it."""


class _Rows(Rows):
    """A part's samples, added as ``add_metric`` would add them to the families of ``LAYOUT``."""

    __slots__ = ()

    def add(self, name: str, items: Items, value: Any) -> None:
        self.families.append(name)
        self.items.append(items)
        self.values.append(value)

    def info(self, name: str, items: Items, about: dict[str, str]) -> None:
        self.add(name, (*items, *about.items()), 1)

    def name_of(self, family: str) -> str:
        return _SAMPLE[family]


def _items(names: list[str], values: Iterable[str]) -> Items:
    return _interned(tuple(zip(names, values)))


_LABEL_SETS_KEPT = 65536
_interned: Callable[[Items], Items] = Memo[Items, Items](lambda items: items, _LABEL_SETS_KEPT).__getitem__
"""The one tuple kept for these label items: a part's label sets, compared with the last
scrape's on every scrape (``oomsight.metrics.lines``), are then the same objects."""


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
        s = v.snapshot  # the reader gives a file's unchanged parts as the same objects as before
        about = tuple([s.get(key) for key in _ABOUT])
        yield Part(("process", *v.rank_labels), (*about, v.up, v.exit_reason), functools.partial(_process, v))
        yield Part(("state", *v.rank_labels), (s["steps"], s["devices"]), functools.partial(_state, v))
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


_ABOUT = ("process", "sources", "errors", "oom_events_unwritten", "leak", "batch_advice", "profiling")
"""What a process's own part (``_process``) reads of its snapshot, besides ``up`` and the exit reason."""


def _process(v: ProcessView) -> Rows:
    """A process's own series: a function of its ``_ABOUT`` keys, ``up`` and exit reason. Its
    steps and devices, which move with every publish, are a part of their own (``_state``)."""
    f = _Rows()
    labels = _items(PROC, v.rank_labels)
    for source, ok in sorted(v.snapshot["sources"].items()):
        f.add("oomsight_source_up", (*labels, ("source", source)), float(bool(ok) and v.up))
    f.add("oomsight_process_up", labels, float(v.up))
    if not v.up:
        f.info("oomsight_process_exit", labels, {"reason": v.exit_reason or "vanished"})
    _process_info(f, v, labels)
    _advice(f, v, labels)
    return f


def _state(v: ProcessView) -> Rows:
    """What moves with every publish: a process's steps and devices."""
    f = _Rows()
    _steps(f, v)
    _devices(f, v)
    return f


def _steps(f: _Rows, v: ProcessView) -> None:
    labels = _items(PROC, v.rank_labels)
    steps = v.snapshot["steps"]
    f.add("oomsight_steps", labels, steps.get("count", 0))
    f.add("oomsight_step_duration_seconds", labels, steps.get("duration_seconds_total", 0.0))
    last_duration = steps.get("last_duration_seconds")
    if last_duration is not None:
        f.add("oomsight_step_last_duration_seconds", labels, last_duration)


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
    for component, n in sorted(s.get("errors", {}).items()):
        f.add("oomsight_hook_errors", (*labels, ("component", component)), n)
    f.add("oomsight_oom_events_unwritten", labels, s.get("oom_events_unwritten", 0))


def _devices(f: _Rows, v: ProcessView) -> None:
    ranks = _items(PROC, v.rank_labels)
    families, values = f.families, f.values  # a device's gauges share its labels: added in one loop
    for d in v.snapshot["devices"]:
        labels = _interned((*ranks, ("device", str(d["index"])), ("gpu_uuid", d["uuid"])))
        families.append("oomsight_leak_suspected")
        values.append(float(leak_suspected(d)))
        for section, names, keys, read in _SECTIONS:  # the rows read at d[section][key], a section at once
            found: Any = d.get(section)
            if found is not None:
                try:
                    xs = read(found)
                except KeyError:  # a section without some optional keys (a document read without its defaults)
                    xs = tuple(map(found.get, keys))
                if None in xs:  # absent values have no sample
                    names = tuple(n for n, x in zip(names, xs) if x is not None)
                    xs = tuple(x for x in xs if x is not None)
                families.extend(names)
                values.extend(map(float, xs))
        for name, value in _DERIVED:
            x = value(d)
            if x is not None:
                families.append(name)
                values.append(float(x))
        f.items.extend(repeat(labels, len(families) - len(f.items)))
        f.info("oomsight_gpu", labels, {"name": d.get("name", "")})
        c: Any = d.get("categories")
        if c:
            for key, items in zip(_CATEGORY_KEYS, _by_category(labels)):
                if c.get(key) is not None:
                    f.add("oomsight_memory_by_category_bytes", items, c[key])


_DEVICE_ROWS = (*DEVICE_GAUGES, *ALLOCATOR_COUNTERS)


Section = tuple[str, tuple[str, ...], tuple[str, ...], "itemgetter[Any]"]


def _split(rows: Sequence[Row]) -> tuple[tuple[Section, ...], tuple[tuple[str, Any], ...]]:
    """The rows read at ``d[section][key]`` (``At``) per section: the section, the rows' family
    names and keys, and a getter of those keys' values as a tuple in one call; and the other rows
    (name, value function), a call each."""
    keyed: dict[str, list[tuple[str, str]]] = {}
    for name, _, value in rows:
        if isinstance(value, At):
            keyed.setdefault(value.section, []).append((name, value.key))
    sections = []
    for section, pairs in keyed.items():
        names, keys = zip(*pairs)
        if len(keys) < 2:  # a row of its own: itemgetter of one key gives the value, not a tuple
            raise ValueError(f"one row reads {section}: give it a function of its own")
        sections.append((section, names, keys, itemgetter(*keys)))
    return tuple(sections), tuple((n, v) for n, _, v in rows if not isinstance(v, At))


_SECTIONS, _DERIVED = _split(_DEVICE_ROWS)
_CATEGORY_KEYS = tuple(f"{name}_bytes" for name in CATEGORIES)
_by_category: Callable[[Items], tuple[Items, ...]] = Memo[Items, tuple[Items, ...]](
    lambda labels: tuple(_interned((*labels, ("category", name))) for name in CATEGORIES), _LABEL_SETS_KEPT
).__getitem__
"""A device's label set with each category added, made once per device."""


def _advice(f: _Rows, v: ProcessView, labels: Items) -> None:
    """Leak findings and batch advice: what oomsight measured on request."""
    s = v.snapshot
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
