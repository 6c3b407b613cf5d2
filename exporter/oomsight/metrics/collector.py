"""The Prometheus collector: every ``oomsight_*`` family built from the spool on each scrape
(``docs/metrics.md`` is the reference, ``oomsight.metrics.family`` the table of families).

Used by the sidecar and by ``oomsight run``; never imported by the in-process hook. As
``prometheus_client.multiprocess`` does with its per-process files, the reader keeps what it
parsed (keyed by each file's identity) and the text is left to prometheus_client's encoders. The
samples of the rows that read a process's snapshot document and whether it is up, nothing else
(``DOCUMENT_SCOPES``), are kept by the same key and ``up`` (:class:`Kept`), and with them the lines
the encoder wrote for them (issue 44, :class:`Text`: a ``Kept`` value is made from those two inputs
alone, so its text cannot be staler than the document; the served text equals the encoder's for
every family built now, byte for byte, ``tests/test_exposition_text.py``); every other row (ages,
OOM counters, profiles, the reader's own) is built and written at every scrape.
Series of a process vanish by themselves once it is past retention; OOM counters are rebuilt
from the event files and never go backwards (``oomsight.metrics.ledger``), and leave with
their files, after the retention.
"""

from __future__ import annotations

import functools
import itertools
import math
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
    HIDDEN,
    LEDGER,
    OOM,
    PROCESS,
    PROFILE,
    READER,
    SNAPSHOT,
    SOURCE,
    Family,
)
from oomsight.metrics.ledger import Ledger
from oomsight.metrics.verdict import follow_trends
from oomsight.wire.reader import TOO_MANY_FILES, TOO_MANY_SERIES, Budget, Claim, FileKey, SkipLog
from oomsight.wire.schema import Profile, Snapshot
from oomsight.wire.spool import SpoolReader, SpoolState

Encoder = Callable[[Any], bytes]
"""One of prometheus_client's encoders (``generate_latest``, or one ``choose_encoder`` gives)."""
Subjects = dict[str, list[tuple[tuple[str, ...], Any]]]
"""Per scope: (label values, subject) of each of its subjects, in exposition order."""
Losses = dict[str, float]
"""What was done about a lost OOM ledger -> when (``Ledger.losses``): the subject of ``LEDGER``."""
Hidden = dict[Claim, dict[str, int]]
"""(rank, local rank) -> {reason: snapshot files left out of the scrape}: the subjects of ``HIDDEN``."""
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
        *,
        text: bool = True,
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
        self.hidden: Hidden = {}
        """The ranks the last read left out at the budget (``oomsight_spool_hidden_snapshots``)."""
        self.text = Text(self.families) if cache and text else None
        """The text of each process's document samples, kept with them (:class:`Text`); None: the whole text made
        by the encoder at every scrape (``text=False``, the tree before issue 44)."""

    def describe(self) -> list[Metric]:
        return []  # collect() reads files: do not run it at registration

    def inventory(self) -> Inventory:
        state = self.reader.read()
        now = self.clock()
        inv = take_inventory(state, now, self.retention_seconds, self.stale_after_seconds)
        unserved = unserved_snapshots(state, inv, now, self.retention_seconds)
        self.ledger.apply(inv, now)
        self.budget.admit(inv)
        self.hidden = hidden_ranks(state.hidden_snapshots, self.budget.out, state.unlisted_snapshots, unserved)
        follow_trends(self.last_inventory, inv)
        self.last_inventory = inv
        return inv

    def collect(self) -> Iterator[Metric]:
        inv = self.inventory()
        yield from self.families.build(inv, self.hidden, self.ledger.losses)

    def exposition(self, encoder: Encoder, fmt: str = "", others: Optional[Collector] = None) -> bytes:
        """What ``encoder`` gives for a registry holding this collector and then ``others`` (the
        sidecar's ``/metrics`` body), byte for byte: the families read now, each process's document samples
        as the encoder wrote them when its file last changed (:class:`Text`). ``fmt``, the content type, is
        not needed: the encoder itself is the key."""
        if self.text is None:
            return encoder(_Both(self, others))
        inv = self.inventory()
        mine = self.text.exposition(encoder, inv, self.hidden, self.ledger.losses)
        if others is None:
            return mine
        return mine[: -len(EOF)] + encoder(others) if mine.endswith(EOF) else mine + encoder(others)


CLOCK_BEHIND, PAST_RETENTION = "clock_behind", "past_retention"
"""Why a valid snapshot read from the spool serves no rank (issue 49): its ``time`` lies more than the retention
before the time its file was written (a writer whose clock says 1970, or no time at all), or its process ended or
went silent longer than the retention ago (its series left; its file stays in the spool)."""


def unserved_snapshots(state: SpoolState, inv: Inventory, now: float, retention: float) -> list[tuple[Claim, str]]:
    """The rank and the reason of every snapshot read whose rank no process of ``inv`` serves (a rank served by
    another process of it, a restart, is served)."""
    served = {v.rank_labels for v in inv.processes}
    keys: Sequence[Optional[FileKey]] = state.snapshot_keys
    if len(keys) != len(state.snapshots):
        keys = [None] * len(state.snapshots)
    found = []
    for s, key in zip(state.snapshots, keys):
        rank = rank_labels(s)
        if rank not in served:
            written = key[1][3] / 1e9 if key is not None else -math.inf  # its file's mtime
            found.append((rank, CLOCK_BEHIND if now - written <= retention else PAST_RETENTION))
    return found


def hidden_ranks(
    files: Sequence[Claim], series: Iterable[Claim], unlisted: int = 0, unserved: Sequence[tuple[Claim, str]] = ()
) -> Hidden:
    """The subjects of ``HIDDEN``: the snapshot files the reader left out (by the rank each names, ``unlisted``
    more that name none), the processes the series budget left out, and the snapshots read that serve no rank."""
    found: Hidden = {}
    named = [(TOO_MANY_FILES, rank) for rank in files] + [(TOO_MANY_SERIES, rank) for rank in series]
    for reason, rank in [*named, *((reason, rank) for rank, reason in unserved)]:
        reasons = found.setdefault(rank, {})
        reasons[reason] = reasons.get(reason, 0) + 1
    if unlisted:
        reasons = found.setdefault(("", ""), {})
        reasons[TOO_MANY_FILES] = reasons.get(TOO_MANY_FILES, 0) + unlisted
    return dict(sorted(found.items()))


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
        self.out: set[Claim] = set()
        """The ranks left out of the last scrape."""
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
        for rank, local_rank in sorted(out - self.out):
            self.refused_total += 1
            limits = f"over {self.budget.series_per_scrape} series or {self.budget.metrics_bytes} bytes"
            self.log.add(TOO_MANY_SERIES, f"rank {rank} local rank {local_rank}", limits)
        self.out = out
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


_SCOPES = (READER, SOURCE, PROCESS, SNAPSHOT, DEVICE, OOM, PROFILE, HIDDEN, LEDGER)


class _Both:
    """This collector's families, then those of ``others``: what a registry of both collects."""

    def __init__(self, first: Collector, others: Optional[Collector]) -> None:
        self.first, self.others = first, others

    def collect(self) -> Iterator[Metric]:
        yield from self.first.collect()
        if self.others is not None:
            yield from self.others.collect()


def families(
    inv: Inventory, table: Sequence[Family] = FAMILIES, hidden: Optional[Hidden] = None, ledger: Optional[Losses] = None
) -> list[Metric]:
    """Every family of ``table`` with its samples read from ``inv`` (and ``hidden``, ``ledger``), all built now."""
    subjects = scopes(inv, hidden=hidden, ledger=ledger)
    return [family(row, subjects[row.scope]) for row in table]


class Families:
    """Every family of ``table`` with its samples read from an inventory, as :func:`families` gives them:
    a row's samples are those of its subjects read now, then, for a row of ``DOCUMENT_SCOPES``, those of
    each process, built once per snapshot file and state (:class:`Kept`)."""

    def __init__(self, table: Sequence[Family] = FAMILIES, cache: bool = True) -> None:
        self.table = table
        self.rows = [row for row in table if row.scope in DOCUMENT_SCOPES]
        self.kept = Kept(self._samples, cache)

    def build(self, inv: Inventory, hidden: Optional[Hidden] = None, ledger: Optional[Losses] = None) -> list[Metric]:
        if not self.kept.enabled:  # every family built now, as before issue 36
            return families(inv, self.table, hidden, ledger)
        return self.joined(*self.parts(inv, hidden, ledger))

    def joined(self, live: list[Metric], blocks: list[Block]) -> list[Metric]:
        """``live`` (:meth:`parts`) with each document row's samples of each process after its own."""
        per_row = iter(zip(*(b.samples for b in blocks)) if blocks else [() for _ in self.rows])
        for row, fam in zip(self.table, live):
            if row.scope in DOCUMENT_SCOPES:
                fam.samples.extend(itertools.chain.from_iterable(next(per_row)))
        return live

    def parts(
        self, inv: Inventory, hidden: Optional[Hidden] = None, ledger: Optional[Losses] = None
    ) -> tuple[list[Metric], list[Block]]:
        """Every family with the samples read now alone (a row of ``DOCUMENT_SCOPES``: those not of a process),
        and the kept :class:`Block` of each process, in exposition order."""
        blocks = [self.kept.get(v) for v in inv.processes]
        self.kept.turn()
        subjects = scopes(inv, documents=False, hidden=hidden, ledger=ledger)
        return [family(row, subjects[row.scope]) for row in self.table], blocks

    def _samples(self, s: Snapshot, up: bool) -> Block:
        """The samples of every row of :attr:`rows` in one process, in the order of the rows."""
        subjects = document_scopes(s, up)
        return Block([family(row, subjects[row.scope]).samples for row in self.rows])


class Block:
    """The samples of the rows of ``DOCUMENT_SCOPES`` in one process (one list a row), and their text as each
    encoder writes them (:class:`Text`): both made from the process's snapshot document and whether it is up
    alone, and kept by those (:class:`Kept`)."""

    def __init__(self, samples: list[list[Sample]]) -> None:
        self.samples = samples
        self.texts: dict[Any, Optional[list[bytes]]] = {}
        """Encoder key (:func:`encoder_key`) -> the sample lines of each row; None where they cannot be cut out."""


EOF = b"# EOF\n"
"""The end of an OpenMetrics text."""


def encoder_key(encoder: Encoder) -> Any:
    """What decides ``encoder``'s text: the function and its arguments (``choose_encoder`` makes a new partial
    at each request, with the escaping and version of its Accept header); None where that is not hashable."""
    key: Any = encoder
    if isinstance(encoder, functools.partial):
        key = (encoder.func, encoder.args, tuple(sorted(encoder.keywords.items())))
    try:
        hash(key)
    except TypeError:
        return None
    return key


class _Listed:
    """Families already built, as a registry gives them."""

    def __init__(self, found: Sequence[Metric]) -> None:
        self.found = found

    def collect(self) -> Sequence[Metric]:
        return self.found


class Text:
    """The exposition of a scrape (issue 44), byte for byte what the encoder gives for every family built
    now (:meth:`Families.build`), at a fraction of its cost when files did not change: the encoder writes
    the families' samples read now, and each process's samples of ``DOCUMENT_SCOPES`` once per snapshot
    file, state and encoder, kept in its :class:`Block` (what ``Kept`` keeps: nothing in it can depend on
    anything but the document and ``up``). Each part is cut at the families' headers (``# HELP``, as the same
    encoder writes them for an empty family) and the parts are put together in exposition order. A part
    that cannot be cut so (a header missing, a second header in a row's samples: a counter's ``_created``
    in the text format) makes the whole text by the encoder instead."""

    def __init__(self, families: Families) -> None:
        self.families = families
        self.whole = 0
        """Texts made whole by the encoder (a part that could not be cut), for tests."""
        self._headers: dict[Any, tuple[list[bytes], list[bytes]]] = {}

    def exposition(self, encoder: Encoder, inv: Inventory, hidden: Hidden, ledger: Optional[Losses] = None) -> bytes:
        live, blocks = self.families.parts(inv, hidden, ledger)
        key = encoder_key(encoder)
        found = None if key is None else self._compose(encoder, key, live, blocks)
        if found is not None:
            return found
        self.whole += 1
        return encoder(_Listed(self.families.joined(live, blocks)))

    def _compose(self, encoder: Encoder, key: Any, live: list[Metric], blocks: list[Block]) -> Optional[bytes]:
        every, documents = self._header(encoder, key)
        text = encoder(_Listed(live))
        end = EOF if text.endswith(EOF) else b""
        parts = cut(text[: len(text) - len(end)], every)
        self._fill(encoder, key, [b for b in blocks if key not in b.texts], documents)
        bodies = [b.texts[key] for b in blocks]
        if parts is None or any(b is None for b in bodies):
            return None
        out: list[bytes] = []
        per_row = iter(zip(*bodies) if bodies else [() for _ in documents])
        for row, part, header in zip(self.families.table, parts, every):
            out.append(part)
            if row.scope in DOCUMENT_SCOPES:
                if not _samples_only(part[len(header) :]):
                    return None
                out.extend(next(per_row))
        out.append(end)
        return b"".join(out)

    def _fill(self, encoder: Encoder, key: Any, blocks: list[Block], headers: list[bytes]) -> None:
        """Give each of ``blocks`` the sample lines of each of its document rows as ``encoder`` writes them, all
        in one text (one header a row): a sample is one line in both formats, so each row's lines are dealt
        out by the blocks' sample counts. Where they are not (a second header, another count), None."""
        if not blocks:
            return
        built = [_empty(row) for row in self.families.rows]
        for i, fam in enumerate(built):
            fam.samples.extend(itertools.chain.from_iterable(b.samples[i] for b in blocks))
        text = encoder(_Listed(built))
        parts = cut(text[: -len(EOF)] if text.endswith(EOF) else text, headers)
        rows: list[Optional[list[bytes]]] = [None] * len(blocks)
        if parts is not None:
            rows = [[] for _ in blocks]
            for i, (part, header) in enumerate(zip(parts, headers)):
                lines = [line + b"\n" for line in part[len(header) :].split(b"\n")[:-1]]
                counts = [len(b.samples[i]) for b in blocks]
                if not _samples_only(part[len(header) :]) or len(lines) != sum(counts):
                    rows = [None] * len(blocks)
                    break
                at = 0
                for found, n in zip(rows, counts):
                    assert found is not None
                    found.append(b"".join(lines[at : at + n]))
                    at += n
        for block, found in zip(blocks, rows):
            block.texts[key] = found

    def _header(self, encoder: Encoder, key: Any) -> tuple[list[bytes], list[bytes]]:
        """The header of every family and of those of ``DOCUMENT_SCOPES``, as ``encoder`` writes them."""
        found = self._headers.get(key)
        if found is None:
            every = []
            for row in self.families.table:
                text = encoder(_Listed([_empty(row)]))
                every.append(text[: -len(EOF)] if text.endswith(EOF) else text)
            rows = self.families.table
            found = every, [h for row, h in zip(rows, every) if row.scope in DOCUMENT_SCOPES]
            self._headers[key] = found
        return found


def _empty(row: Family) -> Metric:
    return family(row, ())


def _samples_only(text: bytes) -> bool:
    return not text.startswith(b"#") and b"\n#" not in text


def cut(text: bytes, headers: Sequence[bytes]) -> Optional[list[bytes]]:
    """``text`` cut before each of ``headers`` in turn, each at the start of a line: one part a header, the
    first at the start; None where one is not found."""
    if not headers or not text.startswith(headers[0]):
        return None
    starts = [0]
    for header in headers[1:]:
        at = text.find(b"\n" + header, starts[-1] + len(headers[len(starts) - 1]) - 1)
        if at < 0:
            return None
        starts.append(at + 1)
    return [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)])]


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


def scopes(
    inv: Inventory, documents: bool = True, hidden: Optional[Hidden] = None, ledger: Optional[Losses] = None
) -> Subjects:
    """The subjects of every scope of a read; in ``DOCUMENT_SCOPES``, those of its processes only if
    ``documents`` (:func:`document_scopes`); in ``HIDDEN``, those of ``hidden``; in ``LEDGER``, ``ledger`` (what was
    done about a lost OOM ledger) where it holds any."""
    subjects: Subjects = {
        READER: [((), inv)],
        SOURCE: [(("", ""), {"spool": float(inv.readable and not inv.error)})],
        PROCESS: [(v.rank_labels, v) for v in inv.processes],
        SNAPSHOT: [],
        DEVICE: [],
        OOM: sorted(inv.ooms.items()),
        PROFILE: sorted(latest_profiles(inv).items()),
        HIDDEN: list((hidden or {}).items()),
        LEDGER: [((), ledger)] if ledger else [],
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
