"""No rank goes missing unnamed (issue 49): every valid snapshot in the spool either serves its rank or is a
sample of ``oomsight_spool_hidden_snapshots`` with its rank and why: a writer's clock in 1970, a process past
the retention, a file past the count of documents (named by the head of its file), and files past the listing
budget (counted under ``rank=""``)."""

import os

from prometheus_client import CollectorRegistry, generate_latest

from oomsight.metrics.collector import SpoolCollector
from oomsight.wire.reader import Budget
from oomsight.wire.spool import SpoolReader

from hostile import NOW, put, snapshot, snapshot_path


def scrape(collector):
    reg = CollectorRegistry()
    reg.register(collector)
    generate_latest(reg)
    return reg


def served_and_hidden(collector):
    reg = scrape(collector)
    served, hidden = set(), {}
    for fam in reg.collect():
        for s in fam.samples:
            if s.name == "oomsight_process_up":
                served.add(s.labels["rank"])
            elif s.name == "oomsight_spool_hidden_snapshots":
                hidden[(s.labels["rank"], s.labels["reason"])] = s.value
    return served, hidden


def written(path, t):
    os.utime(path, (t, t))


def test_a_snapshot_whose_clock_says_1970_is_named_with_its_rank(tmp_path):
    spool = str(tmp_path)
    written(put(spool, snapshot_path(1), snapshot(pid=1, rank=0)), NOW - 1)
    written(put(spool, snapshot_path(2), snapshot(pid=2, rank=1, t=0.0)), NOW - 1)  # written now, its time 0
    served, hidden = served_and_hidden(SpoolCollector(spool, clock=lambda: NOW))
    assert served == {"0"}
    assert hidden == {("1", "clock_behind"): 1.0}


def test_a_process_past_the_retention_is_named_past_retention_and_a_restarted_rank_is_not(tmp_path):
    spool = str(tmp_path)
    written(put(spool, snapshot_path(1), snapshot(pid=1, rank=0, t=NOW - 1000)), NOW - 1000)  # gone long ago
    written(put(spool, snapshot_path(2), snapshot(pid=2, rank=1, t=NOW - 1000)), NOW - 1000)
    written(put(spool, snapshot_path(3), snapshot(pid=3, rank=1)), NOW - 1)  # rank 1 restarted
    served, hidden = served_and_hidden(SpoolCollector(spool, clock=lambda: NOW))
    assert served == {"1"}
    assert hidden == {("0", "past_retention"): 1.0}


def test_every_file_of_a_spool_of_more_ranks_than_listed_is_served_or_counted(tmp_path):
    """The 5,000-rank case of the issue at a smaller budget: listed 200 of 300, read 16 of those; the 184 read
    no further are named by the rank their head names, the 100 not listed are counted under rank=""."""
    spool = str(tmp_path)
    for pid in range(1, 301):
        written(put(spool, snapshot_path(pid), snapshot(pid=pid, rank=pid)), NOW - 300 + pid)
    reader = SpoolReader(spool, budget=Budget(entries_per_folder=200, ranks_per_spool=16))
    collector = SpoolCollector(spool, clock=lambda: NOW, reader=reader)
    for _ in range(2):  # the heads are read once: the second scrape says the same
        served, hidden = served_and_hidden(collector)
        assert len(served) == 16
        assert hidden.pop(("", "too_many_files")) == 100
        assert set(hidden.values()) == {1.0} and len(hidden) == 184
        assert not {rank for rank, _ in hidden} & served
        assert {reason for _, reason in hidden} == {"too_many_files"}
