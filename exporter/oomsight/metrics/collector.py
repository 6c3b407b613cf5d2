"""The Prometheus collector: every ``oomsight_*`` family built from the spool on each scrape
(``docs/metrics.md`` is the reference, ``oomsight.metrics.family`` the table of families).

Used by the sidecar and by ``oomsight run``; never imported by the in-process hook. As
``prometheus_client.multiprocess`` does with its per-process files, the reader keeps what it
parsed (keyed by each file's identity) and the text is left to prometheus_client's encoders:
nothing rendered is kept between scrapes, so a family's value is always the one read now. The
samples of the rows that read a process's snapshot document and whether it is up, nothing else
(``DOCUMENT_SCOPES``), are kept by the same key and ``up`` (:class:`Kept`); every other row (ages,
OOM counters, profiles, the reader's own) is built at every scrape.
Series of a process vanish by themselves once it is past retention; OOM counters are rebuilt
from the event files and never go backwards (``oomsight.metrics.ledger``), and leave with
their files, after the retention.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Callable, Generic, NamedTuple, Optional, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from oomsight.analysis.inventory import (
    DEFAULT_RETENTION_SECONDS,
    DEFAULT_STALE_AFTER_SECONDS,
    DeviceKey,
    Inventory,
    OomTally,
    ProcessView,
    rank_labels,
    take_inventory,
)
from oomsight.metrics.family import (
    CATEGORIES,
    DEVICE,
    DOCUMENT_SCOPES,
    FAMILIES,
    OOM,
    PROCESS,
    PROFILE,
    READER,
    SNAPSHOT,
    SOURCE,
    Family,
    follow_trends,
)
from oomsight.metrics.ledger import Ledger
from oomsight.wire.reader import TOO_MANY_SERIES, Budget, FileKey, SkipLog
from oomsight.wire.schema import Profile, Snapshot
from oomsight.wire.spool import SpoolReader

Encoder = Callable[[Any], bytes]
"""One of prometheus_client's encoders (``generate_latest``, or one ``choose_encoder`` gives)."""
Subjects = dict[str, list[tuple[tuple[str, ...], Any]]]
"""Per scope: (label values, subject) of each of its subjects, in exposition order."""
_TYPES = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}
T = TypeVar("T")


class Kept(Generic[T]):
    """What ``build`` makes of one process's snapshot document and whether the process is up, kept by both:
    the file the document was parsed from (its path and identity, ``ProcessView.key``, as the reader keeps
    the document itself) and ``up``. ``build`` is given those two alone, so nothing it makes can depend on
    another file or on the time but through ``up``. What was not asked for since the last :meth:`turn` is
    forgotten at the next: only the documents of the last scrape are held. ``enabled=False`` builds at
    every call (the behaviour before issue 36, for benchmarks)."""

    def __init__(self, build: Callable[[Snapshot, bool], T], enabled: bool = True) -> None:
        self.build = build
        self.enabled = enabled
        self.built = 0
        """Documents built so far."""
        self._now: dict[tuple[FileKey, bool], T] = {}
        self._last: dict[tuple[FileKey, bool], T] = {}

    def get(self, v: ProcessView) -> T:
        key = (v.key, v.up) if self.enabled and v.key is not None else None
        found = None if key is None else self._now.get(key, self._last.get(key))
        if found is None:
            found = self.build(v.snapshot, v.up)
            self.built += 1
        if key is not None:
            self._now[key] = found
        return found

    def turn(self) -> None:
        """A scrape ended: keep what it asked for, forget the rest."""
        self._last, self._now = self._now, {}


class SpoolCollector(Collector):
    """``registry.register(SpoolCollector(spool_dir))``; injectable ``clock`` for tests."""

    def __init__(
        self,
        spool_dir: str,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS,
        clock: Callable[[], float] = time.time,
        reader: Optional[SpoolReader] = None,
        table: Sequence[Family] = FAMILIES,
        ledger_path: Optional[str] = None,
        cache: bool = True,
    ) -> None:
        self.reader = reader or SpoolReader(spool_dir)
        self.retention_seconds = retention_seconds
        self.stale_after_seconds = stale_after_seconds
        self.clock = clock
        self.table = table
        """The families this collector gives (``oomsight.metrics.family.FAMILIES``)."""
        self.last_inventory: Optional[Inventory] = None
        self.budget = BudgetKeeper(self.reader.budget, table, cache)
        self.families = Families(table, cache)
        """The families, with the samples of each snapshot document kept (``cache=False``: built at every scrape)."""
        self.ledger = Ledger(retention_seconds, ledger_path)
        """OOM counters never go backwards, kept in ``ledger_path`` through restarts (``oomsight.metrics.ledger``)."""

    def describe(self) -> list[Metric]:
        return []  # collect() reads files: do not run it at registration

    def inventory(self) -> Inventory:
        state = self.reader.read()
        now = self.clock()
        inv = take_inventory(state, now, self.retention_seconds, self.stale_after_seconds)
        self.ledger.apply(inv, now)
        self.budget.admit(inv)
        follow_trends(self.last_inventory, inv)
        self.last_inventory = inv
        return inv

    def collect(self) -> Iterator[Metric]:
        yield from self.families.build(self.inventory())

    def exposition(self, encoder: Encoder, fmt: str = "", others: Optional[Collector] = None) -> bytes:
        """What ``encoder`` gives for a registry holding this collector and then ``others`` (the
        sidecar's ``/metrics`` body). ``fmt``, the content type, is not needed: nothing is kept."""
        return encoder(_Both(self, others))


NAME_BYTES = 64
"""A sample's bytes besides its label values: name, label names, quotes, value (an estimate, generous)."""


class BudgetKeeper:
    """The scrape's series and bytes budget (``Budget.series_per_scrape``, ``Budget.metrics_bytes``),
    enforced on the inventory before any family is built: processes in rank order, then OOM tallies,
    each taken while the series and bytes estimated from its label values fit; the others are left out
    of this scrape, each counted once (``too_many_series``) while it stays out, and logged per interval."""

    def __init__(self, budget: Budget, table: Sequence[Family], cache: bool = True) -> None:
        self.budget = budget
        self.per_scope = {scope: sum(1 for f in table if f.scope == scope and not f.label) for scope in _SCOPES}
        self.refused_total = 0
        self._out: set[Any] = set()
        self.log = SkipLog("series left out of a scrape at its budget")
        self.estimates = Kept(lambda s, up: self._snapshot(s), cache)
        """Each snapshot's estimate, kept per file (:meth:`_snapshot`)."""

    def admit(self, inv: Inventory) -> None:
        """Leave out of ``inv`` the ranks (a process with its devices' OOM series) past the budget."""
        used = [0, 0]
        out: set[tuple[str, str]] = set()
        profiles = latest_profiles(inv)
        kept: list[ProcessView] = []
        ooms: dict[DeviceKey, OomTally] = {}
        for v in inv.processes:
            n, b, devices = self.estimates.get(v)
            tallies = [key for key in devices if key in inv.ooms]
            profile = profiles.get(v.rank_labels)
            if profile is not None:
                more, size = self._profile(v.rank_labels, profile)
                n, b = n + more, b + size
            for more, size in (self._tally(key, inv.ooms[key]) for key in tallies):
                n, b = n + more, b + size
            if not self._fits(used, n, b):
                out.add(v.rank_labels)
                continue
            kept.append(v)
            ooms.update((key, inv.ooms[key]) for key in tallies)
        for key, tally in inv.ooms.items():  # OOM series of ranks without a process now
            if key in ooms or key[:2] in out:
                continue
            if self._fits(used, *self._tally(key, tally)):
                ooms[key] = tally
            else:
                out.add(key[:2])
        self.estimates.turn()
        self._count(out)
        inv.processes, inv.ooms = kept, ooms
        total = inv.skipped_total.get(TOO_MANY_SERIES, 0) + self.refused_total
        inv.skipped_total = {**inv.skipped_total, TOO_MANY_SERIES: total}

    def _fits(self, used: list[int], series: int, bytes_: int) -> bool:
        if used[0] + series > self.budget.series_per_scrape or used[1] + bytes_ > self.budget.metrics_bytes:
            return False
        used[0], used[1] = used[0] + series, used[1] + bytes_
        return True

    def _count(self, out: set[tuple[str, str]]) -> None:
        """Each rank left out counted once while it stays out."""
        for rank, local_rank in sorted(out - self._out):
            self.refused_total += 1
            limits = f"over {self.budget.series_per_scrape} series or {self.budget.metrics_bytes} bytes"
            self.log.add(TOO_MANY_SERIES, f"rank {rank} local rank {local_rank}", limits)
        self._out = out
        self.log.flush()

    def _tally(self, key: tuple[str, ...], tally: OomTally) -> tuple[int, int]:
        n = self.per_scope[OOM]
        cause = len(str(tally.last["diagnosis"]["cause"])) if tally.last is not None else 0
        return n, n * (NAME_BYTES + sum(map(len, key))) + cause

    def _snapshot(self, s: Snapshot) -> Estimate:
        """Series and bytes of a process's samples but its profile's, estimated from the label values of its
        snapshot, and the keys of its devices' OOM series."""
        labels = rank_labels(s)
        ranks = sum(map(len, labels))
        maps = [*s["sources"], *s.get("errors", {})]
        series = self.per_scope[PROCESS] + self.per_scope[SNAPSHOT] + len(maps)
        bytes_ = series * (NAME_BYTES + ranks) + sum(map(len, maps)) + len(str(s["process"]))
        for d in s["devices"]:
            n = self.per_scope[DEVICE] + len(CATEGORIES)
            series += n
            bytes_ += n * (NAME_BYTES + ranks + len(str(d["index"])) + len(d["uuid"])) + len(str(d.get("name", "")))
        devices = [(*labels, str(d["index"]), d["uuid"]) for d in s["devices"]]
        return Estimate(series, bytes_, devices)

    def _profile(self, labels: tuple[str, str], profile: Profile) -> tuple[int, int]:
        """Series and bytes of the samples of a process's latest profile."""
        ops = [op["op"] for op in (*profile["top_by_memory"], *profile["top_by_time"])]
        series = self.per_scope[PROFILE] + len(ops)
        return series, series * (NAME_BYTES + sum(map(len, labels))) + sum(map(len, ops))


class Estimate(NamedTuple):
    """What a snapshot's samples cost the budget (:meth:`BudgetKeeper._snapshot`)."""

    series: int
    bytes: int
    devices: list[DeviceKey]
    """The keys of its devices' OOM series."""


_SCOPES = (READER, SOURCE, PROCESS, SNAPSHOT, DEVICE, OOM, PROFILE)


class _Both:
    """This collector's families, then those of ``others``: what a registry of both collects."""

    def __init__(self, first: Collector, others: Optional[Collector]) -> None:
        self.first, self.others = first, others

    def collect(self) -> Iterator[Metric]:
        yield from self.first.collect()
        if self.others is not None:
            yield from self.others.collect()


def families(inv: Inventory, table: Sequence[Family] = FAMILIES) -> list[Metric]:
    """Every family of ``table`` with its samples read from ``inv``, every one built now."""
    subjects = scopes(inv)
    return [family(row, subjects[row.scope]) for row in table]


class Families:
    """Every family of ``table`` with its samples read from an inventory, as :func:`families` gives them:
    a row's samples are those of its subjects read now, then, for a row of ``DOCUMENT_SCOPES``, those of
    each process, built once per snapshot file and state (:class:`Kept`)."""

    def __init__(self, table: Sequence[Family] = FAMILIES, cache: bool = True) -> None:
        self.table = table
        self.rows = [row for row in table if row.scope in DOCUMENT_SCOPES]
        self.kept = Kept(self._samples, cache)

    def build(self, inv: Inventory) -> list[Metric]:
        if not self.kept.enabled:  # every family built now, as before issue 36
            return families(inv, self.table)
        kept = [self.kept.get(v) for v in inv.processes]
        self.kept.turn()
        per_row = iter(zip(*kept) if kept else [() for _ in self.rows])  # each row's samples of each process
        subjects = scopes(inv, documents=False)
        found = []
        for row in self.table:
            fam = family(row, subjects[row.scope])
            if row.scope in DOCUMENT_SCOPES:
                fam.samples.extend(itertools.chain.from_iterable(next(per_row)))
            found.append(fam)
        return found

    def _samples(self, s: Snapshot, up: bool) -> list[list[Sample]]:
        """The samples of every row of :attr:`rows` in one process, in the order of the rows."""
        subjects = document_scopes(s, up)
        found: list[list[Sample]] = [family(row, subjects[row.scope]).samples for row in self.rows]
        return found


def family(row: Family, subjects: Iterable[tuple[tuple[str, ...], Any]]) -> Metric:
    """The prometheus_client family of ``row``, one sample per subject that has a value (``row.label``:
    one per pair its value gives)."""
    fam: Any
    if row.type == "info":
        fam = InfoMetricFamily(row.name, row.help, labels=row.labels)
    else:
        fam = _TYPES[row.type](row.name, row.help, labels=row.labels, unit=row.unit)
    add, read, counter = fam.add_metric, row.value, row.type == "counter"
    for labels, subject in subjects:
        value = read(subject)
        if value is None:
            continue
        created = getattr(subject, "created", None) if counter else None
        if created is not None:  # an OOM counter restarted by a lost ledger (``oomsight.metrics.ledger``)
            add(labels, value, created=created)
        elif not row.label:
            add(labels, value)
        else:
            for label, x in value:
                if x is not None:
                    add((*labels, label), x)
    found: Metric = fam
    return found


def scopes(inv: Inventory, documents: bool = True) -> Subjects:
    """The subjects of every scope of a read; in ``DOCUMENT_SCOPES``, those of its processes only if
    ``documents`` (:func:`document_scopes`)."""
    subjects: Subjects = {
        READER: [((), inv)],
        SOURCE: [(("", ""), {"spool": float(inv.readable and not inv.error)})],
        PROCESS: [(v.rank_labels, v) for v in inv.processes],
        SNAPSHOT: [],
        DEVICE: [],
        OOM: sorted(inv.ooms.items()),
        PROFILE: sorted(latest_profiles(inv).items()),
    }
    for v in inv.processes if documents else ():
        for scope, found in document_scopes(v.snapshot, v.up).items():
            subjects[scope].extend(found)
    return subjects


def document_scopes(s: Snapshot, up: bool) -> Subjects:
    """The subjects of ``DOCUMENT_SCOPES`` in one process, read from its snapshot document and whether it
    is up: its sources, the document, each of its devices."""
    labels = rank_labels(s)
    return {
        SOURCE: [(labels, {k: float(bool(ok) and up) for k, ok in sorted(s["sources"].items())})],
        SNAPSHOT: [(labels, s)],
        DEVICE: [((*labels, str(d["index"]), d["uuid"]), d) for d in s["devices"]],
    }


def latest_profiles(inv: Inventory) -> dict[tuple[str, str], Profile]:
    """The newest profile of every (rank, local rank) that has a process in ``inv``."""
    latest: dict[tuple[str, str], Profile] = {}
    ranks = {v.rank_labels for v in inv.processes}
    for p in inv.profiles:
        key = (str(p["process"]["rank"]), str(p["process"]["local_rank"]))
        if key in ranks and (key not in latest or p["ended_at"] > latest[key]["ended_at"]):
            latest[key] = p
    return latest
