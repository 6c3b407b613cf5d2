"""The text a scrape serves is never stale (issue 44): the collector that keeps each process's document samples
as the encoder wrote them (``oomsight.metrics.collector.Text``) serves, byte for byte, what a collector that
keeps nothing it built (``cache=False``: every sample built, the whole text written by the encoder; its
reader keeps parsed documents by file identity, as every reader does) serves, through a random walk of what a
spool goes through: ranks that publish, rewrites in place with the size and ``mtime`` set back, ranks that
come and go, exit or go silent, hostile files (skips counted), OOM events and their outcomes (the ledger),
a lost ledger (``_created``), profiles, a rank over the memory budget, and every encoder a scraper can ask for."""

from __future__ import annotations

import json
import os
import random
import re
import time
from typing import Any, Callable

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics import exposition as openmetrics
from test_budget import padded, profile

from oomsight.metrics.collector import EOF, SpoolCollector, cut
from oomsight.wire.reader import Budget
from oomsight.wire.spool import SpoolReader

from hostile import NOW, event, event_path, put, snapshot, snapshot_path

ACCEPTS = (
    "",
    "text/plain; version=0.0.4",
    "text/plain; version=1.0.0; escaping=values",
    "application/openmetrics-text",
    "application/openmetrics-text; version=1.0.0; escaping=dots",
    "application/openmetrics-text; version=1.0.0; escaping=allow-utf-8",
)
"""What Prometheus 2 and 3 and other scrapers send: each gives prometheus_client another encoder."""
SEEN = (
    rb"\noomsight_spool_hidden_snapshots\{",
    rb"\noomsight_oom_events_created\{",
    rb"\noomsight_process_exit_info\{",
)
"""What the walk must have served at least once: a rank left out, a counter reset by a lost ledger, an exit."""
SMALL = Budget(snapshot_memory_bytes=3 << 20)
"""The walk's 6 ranks fit (the tape's snapshot costs 206 KB); a padded one (about 4 MiB) is left out."""


class Pair:
    """Two collectors of one spool and one clock: ``kept`` as the sidecar runs it, ``fresh`` keeping nothing."""

    def __init__(self, spool: str, tmp: Any) -> None:
        self.now = NOW
        self.seen: set[bytes] = set()
        """Which of :data:`SEEN` the texts served held."""
        clock = lambda: self.now  # noqa: E731
        self.kept = SpoolCollector(
            spool, clock=clock, reader=SpoolReader(spool, budget=SMALL), ledger_path=str(tmp / "a" / "ledger.json")
        )
        fresh_reader = SpoolReader(spool, budget=SMALL)  # parsed again only when a file's identity moves
        self.fresh = SpoolCollector(
            spool, clock=clock, reader=fresh_reader, ledger_path=str(tmp / "b" / "ledger.json"), cache=False
        )

    def same(self, accept: str, others: Any = None) -> bytes:
        encoder, _ = choose_encoder(accept)
        kept, fresh = self.kept.exposition(encoder, "", others), self.fresh.exposition(encoder, "", others)
        assert kept == fresh, first_difference(kept, fresh)
        self.seen.update(part for part in SEEN if re.search(part, kept))
        return kept


def first_difference(a: bytes, b: bytes) -> str:
    for x, y in zip(a.splitlines(), b.splitlines()):
        if x != y:
            return f"{x[:200]!r} != {y[:200]!r}"
    return f"lengths {len(a)} != {len(b)}"


def in_place(path: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite ``path`` in place, its size kept, its ``mtime`` set back: only ``ctime`` moves."""
    st = os.stat(path)
    with open(path, "rb") as fh:
        doc = json.loads(fh.read())
    change(doc)
    data = json.dumps(doc).encode()
    assert len(data) <= st.st_size
    data = data[:-1] + b" " * (st.st_size - len(data)) + b"}"  # JSON still
    time.sleep(0.011)  # past a coarse clock's tick since the last read (docs/scale.md, "Limit")
    with open(path, "r+b") as fh:
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns


def walk(spool: str, pair: Pair, rng: random.Random, steps: int) -> dict[str, int]:
    """``steps`` random changes to the spool (each kind among the first), each followed by a scrape in a random
    format; what was done."""
    ranks: dict[int, dict[str, Any]] = {}
    done: dict[str, int] = {}
    seq = {"n": 0}

    def publish(rank: int) -> None:
        doc = ranks.setdefault(rank, snapshot(pid=rank + 1, rank=rank, t=pair.now))
        seq["n"] += 1
        doc.update(time=pair.now, seq=seq["n"])
        doc["devices"][0]["allocator"]["allocated_bytes"] = rng.randrange(1 << 30, 1 << 34)
        doc["steps"]["count"] += rng.randrange(1, 5)
        put(spool, snapshot_path(rank + 1), doc)

    def rewrite_in_place(rank: int) -> None:
        path = os.path.join(spool, snapshot_path(rank + 1))
        digit = str(rng.randrange(1, 10))

        def change(doc: dict[str, Any]) -> None:
            allocator = doc["devices"][0]["allocator"]
            allocator["ooms"] = int(digit * len(str(allocator["ooms"])))  # as many digits: the size kept

        in_place(path, change)

    def remove(rank: int) -> None:
        os.remove(os.path.join(spool, snapshot_path(rank + 1)))
        ranks.pop(rank)

    def exit_(rank: int) -> None:
        ranks[rank].update(state="exited", exit_reason=rng.choice(["normal", "oom", "exception"]))
        put(spool, snapshot_path(rank + 1), ranks[rank])

    def oom(rank: int) -> None:
        n = rng.randrange(1, 4)
        put(spool, event_path(rank + 1, n), event(pid=rank + 1, rank=rank, seq=n, t=pair.now, outcome="pending"))

    def outcome(rank: int) -> None:
        for name in sorted(os.listdir(os.path.join(spool, "events")))[:1]:
            with open(os.path.join(spool, "events", name)) as fh:
                doc = json.load(fh)
            doc.update(outcome=rng.choice(["fatal", "recovered"]), outcome_time=pair.now)
            put(spool, f"events/{name}", doc)

    def hostile(rank: int) -> None:
        put(spool, f"snapshots/{rng.randrange(10**6)}-ff.json", rng.choice([b"{", b"[]", b'{"schema_version": 9}']))

    def lose_ledger(rank: int) -> None:
        for side in ("a", "b"):
            path = os.path.join(os.path.dirname(spool), side, "ledger.json")
            for name in ("ledger.json", "ledger.json.copy"):  # the copy too: a reset (issue 49 reads a copy back)
                if os.path.exists(os.path.join(os.path.dirname(path), name)):
                    put(os.path.dirname(path), name, b"not json")
        pair.kept.ledger.__init__(pair.kept.ledger.retention_seconds, pair.kept.ledger.path)
        pair.fresh.ledger.__init__(pair.fresh.ledger.retention_seconds, pair.fresh.ledger.path)

    def a_profile(rank: int) -> None:
        doc = profile(rank + 1, rank, seq["n"])
        doc["process"] = dict(ranks[rank]["process"])
        put(spool, f"profiles/{rank + 1}-aa.profile-r{seq['n']}.json", doc)

    def oversized(rank: int) -> None:
        put(spool, snapshot_path(rank + 1), padded(snapshot(pid=rank + 1, rank=rank, t=pair.now)))

    def time_passes(rank: int) -> None:
        pair.now += rng.choice([1.0, 20.0, 90.0, 400.0])  # silent, stale, past the retention

    changes = [publish, publish, publish, rewrite_in_place, remove, exit_, exit_, oom, outcome, hostile]
    changes += [lose_ledger, a_profile, oversized, time_passes]
    every = rng.sample(changes, len(changes))  # each kind once, in a random order, then any
    for step in range(steps):
        change = every[step] if step < len(every) else rng.choice(changes)
        rank = rng.randrange(6)
        if change not in (publish, oom, hostile, time_passes, lose_ledger, outcome) and rank not in ranks:
            change = publish
        change(rank)
        done[change.__name__] = done.get(change.__name__, 0) + 1
        pair.same(rng.choice(ACCEPTS))
    return done


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_kept_text_is_byte_for_byte_what_nothing_kept_serves_through_a_random_walk(
    tmp_path: Any, seed: int
) -> None:
    spool = str(tmp_path / "spool")
    for folder in ("snapshots", "events"):
        os.makedirs(os.path.join(spool, folder))
    pair = Pair(spool, tmp_path)
    done = walk(spool, pair, random.Random(seed), 60)
    assert len(done) >= 9, done
    assert pair.seen == set(SEEN), pair.seen
    assert pair.kept.text is not None and pair.kept.text.whole == 0  # every text was put together from parts
    assert pair.kept.families.kept.built < pair.fresh.families.kept.built or pair.fresh.families.kept.built == 0


def test_a_rewrite_in_place_with_size_and_mtime_set_back_is_seen(tmp_path: Any) -> None:
    spool = str(tmp_path / "spool")
    pair = Pair(spool, tmp_path)
    doc = snapshot(pid=1, rank=0, t=NOW)
    doc["devices"][0]["allocator"]["ooms"] = 111
    put(spool, snapshot_path(1), doc)
    before = pair.same("")
    in_place(os.path.join(spool, snapshot_path(1)), lambda d: d["devices"][0]["allocator"].update(ooms=777))
    after = pair.same("")
    assert b"oomsight_torch_ooms_total{" in after and b"} 777.0" in after and after != before


def test_an_unchanged_spool_reuses_every_process_s_text(tmp_path: Any) -> None:
    spool = str(tmp_path / "spool")
    pair = Pair(spool, tmp_path)
    for rank in range(4):
        put(spool, snapshot_path(rank + 1), snapshot(pid=rank + 1, rank=rank, t=NOW))
    pair.same("")
    built = pair.kept.families.kept.built
    for accept in ACCEPTS:
        pair.same(accept)
        pair.same(accept)
    assert pair.kept.families.kept.built == built  # samples built once per file, each encoder's text once


def test_the_sidecar_s_own_families_follow_the_spool_s_in_every_format(tmp_path: Any) -> None:
    from prometheus_client import Counter

    spool = str(tmp_path / "spool")
    pair = Pair(spool, tmp_path)
    put(spool, snapshot_path(1), snapshot(pid=1, rank=0, t=NOW))
    others = CollectorRegistry()
    Counter("oomsight_sidecar_things", "Things.", registry=others).inc()
    for accept in ACCEPTS:
        text = pair.same(accept, others)
        assert text.count(EOF) == (1 if "openmetrics" in accept else 0)
        assert re.search(rb"\noomsight_+sidecar_+things_+total 1\.0\n", text)


def test_a_text_that_cannot_be_cut_at_its_headers_is_made_whole() -> None:
    headers = [b"# HELP a x\n# TYPE a gauge\n", b"# HELP b y\n# TYPE b gauge\n"]
    text = b"".join([headers[0], b"a 1.0\n", headers[1], b"b 2.0\n"])
    assert cut(text, headers) == [headers[0] + b"a 1.0\n", headers[1] + b"b 2.0\n"]
    assert cut(text, headers[::-1]) is None and cut(b"a 1.0\n" + text, headers) is None
    registry = CollectorRegistry()
    assert openmetrics.generate_latest(registry) == EOF and generate_latest(registry) == b""
