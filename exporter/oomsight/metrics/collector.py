"""The Prometheus collector: every ``oomsight_*`` family built from the spool on each scrape
(``docs/metrics.md`` is the reference, ``oomsight.metrics.family`` the table of families).

Used by the sidecar and by ``oomsight run``; never imported by the in-process hook. As
``prometheus_client.multiprocess`` does with its per-process files, the reader keeps what it
parsed (keyed by each file's identity) and the text is left to prometheus_client's encoders:
nothing rendered is kept between scrapes, so a family's value is always the one read now.
Series of a process vanish by themselves once it is past retention; OOM counters are rebuilt
from the event files and never go backwards (``oomsight.metrics.ledger``), and leave with
their files, after the retention.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Callable, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from oomsight.analysis.inventory import (
    DEFAULT_RETENTION_SECONDS,
    DEFAULT_STALE_AFTER_SECONDS,
    Inventory,
    take_inventory,
)
from oomsight.metrics.family import (
    DEVICE,
    FAMILIES,
    OOM,
    PROCESS,
    PROFILE,
    READER,
    SOURCE,
    Family,
    follow_trends,
)
from oomsight.metrics.ledger import Ledger
from oomsight.wire.schema import Profile
from oomsight.wire.spool import SpoolReader

Encoder = Callable[[Any], bytes]
"""One of prometheus_client's encoders (``generate_latest``, or one ``choose_encoder`` gives)."""
Subjects = dict[str, list[tuple[tuple[str, ...], Any]]]
"""Per scope: (label values, subject) of each of its subjects, in exposition order."""
_TYPES = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}


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
    ) -> None:
        self.reader = reader or SpoolReader(spool_dir)
        self.retention_seconds = retention_seconds
        self.stale_after_seconds = stale_after_seconds
        self.clock = clock
        self.table = table
        """The families this collector gives (``oomsight.metrics.family.FAMILIES``)."""
        self.last_inventory: Optional[Inventory] = None
        self.ledger = Ledger(retention_seconds, ledger_path)
        """OOM counters never go backwards, kept in ``ledger_path`` through restarts (``oomsight.metrics.ledger``)."""

    def describe(self) -> list[Metric]:
        return []  # collect() reads files: do not run it at registration

    def inventory(self) -> Inventory:
        state = self.reader.read()
        now = self.clock()
        inv = take_inventory(state, now, self.retention_seconds, self.stale_after_seconds)
        self.ledger.apply(inv, now)
        follow_trends(self.last_inventory, inv)
        self.last_inventory = inv
        return inv

    def collect(self) -> Iterator[Metric]:
        yield from families(self.inventory(), self.table)

    def exposition(self, encoder: Encoder, fmt: str = "", others: Optional[Collector] = None) -> bytes:
        """What ``encoder`` gives for a registry holding this collector and then ``others`` (the
        sidecar's ``/metrics`` body). ``fmt``, the content type, is not needed: nothing is kept."""
        return encoder(_Both(self, others))


class _Both:
    """This collector's families, then those of ``others``: what a registry of both collects."""

    def __init__(self, first: Collector, others: Optional[Collector]) -> None:
        self.first, self.others = first, others

    def collect(self) -> Iterator[Metric]:
        yield from self.first.collect()
        if self.others is not None:
            yield from self.others.collect()


def families(inv: Inventory, table: Sequence[Family] = FAMILIES) -> list[Metric]:
    """Every family of ``table`` with its samples read from ``inv``."""
    subjects = scopes(inv)
    return [family(row, subjects[row.scope]) for row in table]


def family(row: Family, subjects: Iterable[tuple[tuple[str, ...], Any]]) -> Metric:
    """The prometheus_client family of ``row``, one sample per subject that has a value (``row.label``:
    one per pair its value gives)."""
    fam: Any
    if row.type == "info":
        fam = InfoMetricFamily(row.name, row.help, labels=row.labels)
    else:
        fam = _TYPES[row.type](row.name, row.help, labels=row.labels, unit=row.unit)
    for labels, subject in subjects:
        value = row.value(subject)
        if value is None:
            continue
        if not row.label:
            fam.add_metric(labels, value)
            continue
        for label, x in value:
            if x is not None:
                fam.add_metric((*labels, label), x)
    found: Metric = fam
    return found


def scopes(inv: Inventory) -> Subjects:
    """The subjects of every scope of a read."""
    processes: list[tuple[tuple[str, ...], Any]] = [(v.rank_labels, v) for v in inv.processes]
    sources = [
        (v.rank_labels, {k: float(bool(ok) and v.up) for k, ok in sorted(v.snapshot["sources"].items())})
        for v in inv.processes
    ]
    return {
        READER: [((), inv)],
        SOURCE: [(("", ""), {"spool": float(inv.readable and not inv.error)}), *sources],
        PROCESS: processes,
        DEVICE: [((*r, str(d["index"]), d["uuid"]), d) for r, v in processes for d in v.snapshot["devices"]],
        OOM: sorted(inv.ooms.items()),
        PROFILE: sorted(latest_profiles(inv).items()),
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
