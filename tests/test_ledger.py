"""A ledger that can only help (issue 36): whatever is done to ``<spool>/sidecar/oom-ledger.json`` between
two runs of the collector, no OOM counter comes back lower but non-zero, none is impossible (fatal plus
recovered over events, over what a spool can hold), a lost ledger restarts the counters at 0 with their
``_created`` moved, and nothing is written through a symbolic link."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from oomsight.metrics.collector import SpoolCollector
from oomsight.metrics.ledger import MAX_COUNT

from hostile import NOW, event, event_path, put, snapshot, snapshot_path

COUNTERS = ("oomsight_oom_events_total", "oomsight_oom_fatal_events_total", "oomsight_oom_recovered_events_total")
EVENTS = [(1, 0, 1, "fatal"), (1, 0, 2, "recovered"), (1, 0, 3, "pending"), (2, 1, 1, "fatal")]
"""(pid, rank, seq, outcome) of the spool's OOM event files."""


def scrape(spool: str, now: float) -> tuple[dict[Any, list[float]], dict[Any, float]]:
    """A fresh collector (a sidecar start) scraped once: counts and ``_created`` per (rank, GPU)."""
    reg = CollectorRegistry()
    ledger = os.path.join(spool, "sidecar", "oom-ledger.json")
    reg.register(SpoolCollector(spool, clock=lambda: now, ledger_path=ledger))
    return counts(reg)


def counts(reg: CollectorRegistry) -> tuple[dict[Any, list[float]], dict[Any, float]]:
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[Any, list[float]] = {}
    created: dict[Any, float] = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            key = tuple(sorted(s.labels.items()))
            if s.name in COUNTERS:
                found.setdefault(key, [0.0, 0.0, 0.0])[COUNTERS.index(s.name)] = s.value
            elif s.name == "oomsight_oom_events_created":
                created[key] = s.value
    return found, created


def ledger_of(spool: str) -> str:
    return os.path.join(spool, "sidecar", "oom-ledger.json")


def rows(spool: str, change: Any) -> None:
    """The ledger's rows changed by ``change(row)`` (a valid file otherwise); nothing where the file is
    no ledger any more (an earlier tampering)."""
    try:
        with open(ledger_of(spool), "rb") as fh:
            state = json.loads(fh.read())
        kept = state["kept"]
    except (ValueError, TypeError, KeyError):
        return
    for row in kept:
        if not isinstance(row, list) or len(row) != 7:
            return
        change(row)
    put(spool, "sidecar/oom-ledger.json", state)


def tamper(spool: str, how: str, data: bytes, elsewhere: str) -> None:
    path = ledger_of(spool)
    if how == "corrupt":
        put(spool, "sidecar/oom-ledger.json", data or b"\xff")
    elif how == "truncated":
        with open(path, "rb") as fh:
            whole = fh.read()
        put(spool, "sidecar/oom-ledger.json", whole[: max(0, len(whole) - 1 - len(data) % len(whole))])
    elif how == "fifo":
        os.remove(path)
        os.mkfifo(path)
    elif how == "directory":
        os.remove(path)
        os.makedirs(os.path.join(path, "inside"))
        put(spool, "sidecar/oom-ledger.json/inside/x", b"x")
    elif how == "huge counts":
        rows(spool, lambda r: r.__setitem__(slice(4, 7), [2**53 - 1, 2**53 - 1, 0]))
    elif how == "fatal over events":
        rows(spool, lambda r: r.__setitem__(slice(4, 7), [1, 50, 0]))
    elif how == "negative or fractional":
        rows(spool, lambda r: r.__setitem__(slice(4, 7), [-1, 0.5, True]))
    elif how == "symlinked folder":
        shutil.move(os.path.join(spool, "sidecar"), elsewhere)
        rows_path = os.path.join(elsewhere, "oom-ledger.json")
        with open(rows_path, "w") as fh:
            json.dump({"decided": {}, "kept": [["0", "0", "0", "GPU-x", 4000, 4000, 0]]}, fh)
        os.symlink(elsewhere, os.path.join(spool, "sidecar"))


TAMPERINGS = [
    "corrupt",
    "truncated",
    "fifo",
    "directory",
    "huge counts",
    "fatal over events",
    "negative or fractional",
    "symlinked folder",
]


def read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def build(spool: str) -> None:
    for pid, rank in ((1, 0), (2, 1)):
        put(spool, snapshot_path(pid), snapshot(pid=pid, rank=rank))
    for pid, rank, seq, outcome in EVENTS:
        put(spool, event_path(pid, seq), event(pid=pid, rank=rank, seq=seq, outcome=outcome))


def possible(found: dict[Any, list[float]]) -> None:
    for key, (events, fatal, recovered) in found.items():
        assert fatal + recovered <= events <= MAX_COUNT, (key, events, fatal, recovered)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    hows=st.lists(st.sampled_from(TAMPERINGS), min_size=1, max_size=2),
    data=st.binary(max_size=64),
    gone=st.sampled_from([None, *range(len(EVENTS))]),
)
def test_no_ledger_tampering_lowers_a_counter_to_a_non_zero_value_or_makes_an_impossible_one(
    tmp_path_factory: Any, hows: list[str], data: bytes, gone: Any
) -> None:
    root = str(tmp_path_factory.mktemp("ledger"))
    spool, elsewhere = os.path.join(root, "spool"), os.path.join(root, "elsewhere")
    build(spool)
    before, _ = scrape(spool, NOW)
    assert before and all(v[0] > 0 for v in before.values())
    for how in hows:
        if os.path.islink(os.path.join(spool, "sidecar")) or not os.path.isfile(ledger_of(spool)):
            break  # the first tampering left nothing of this kind to tamper with
        tamper(spool, how, data, elsewhere)
    target = read(os.path.join(elsewhere, "oom-ledger.json")) if os.path.isdir(elsewhere) else None
    if gone is not None:  # an event file has gone too
        pid, _, seq, _ = EVENTS[gone]
        os.remove(os.path.join(spool, event_path(pid, seq)))
    after, created = scrape(spool, NOW + 5)  # a sidecar restart
    again, _ = scrape(spool, NOW + 6)  # and another, on what the first left
    for found in (after, again):
        possible(found)
        for key, was in before.items():
            now = found.get(key, [0.0, 0.0, 0.0])
            for b, a in zip(was, now):
                assert a >= b or a == 0, (hows, gone, key, was, now)
    for key, now in after.items():
        if any(0 == a < b for a, b in zip(now, before.get(key, now))):
            assert created.get(key) == NOW + 5, (hows, key)  # a reset, said as one
    if target is not None:  # nothing was written through the link
        assert read(os.path.join(elsewhere, "oom-ledger.json")) == target


def test_a_lost_ledger_is_replaced_at_once_by_a_regular_file(tmp_path: Any) -> None:
    spool = str(tmp_path)
    build(spool)
    scrape(spool, NOW)
    for how in ("fifo", "directory", "corrupt"):
        tamper(spool, how, b"{", str(tmp_path / "elsewhere"))
        put(spool, "sidecar/oom-ledger.json.copy", b"{")  # its copy lost too: a reset
        reg = CollectorRegistry()
        reg.register(SpoolCollector(spool, clock=lambda: NOW, ledger_path=ledger_of(spool)))  # no scrape yet
        assert os.path.isfile(ledger_of(spool)) and not os.path.islink(ledger_of(spool)), how
        with open(ledger_of(spool)) as fh:
            json.load(fh)
        found, _ = counts(reg)
        assert all(v == [0.0, 0.0, 0.0] for v in found.values())  # the files present are not counted again
    put(spool, event_path(1, 9), event(pid=1, rank=0, seq=9, outcome="fatal"))
    found, _ = scrape(spool, NOW + 1)
    assert sum(v[0] for v in found.values()) == 1  # a new OOM after the reset counts, through restarts


def three_fatal_ooms(spool: str) -> CollectorRegistry:
    """A rank with 3 fatal OOMs, and a running collector's registry that served them once."""
    put(spool, snapshot_path(1), snapshot(pid=1, rank=0, t=NOW))
    for seq in (1, 2, 3):
        put(spool, event_path(1, seq), event(pid=1, rank=0, seq=seq, t=NOW, outcome="fatal"))
    reg = CollectorRegistry()
    reg.register(SpoolCollector(spool, clock=lambda: NOW, ledger_path=ledger_of(spool)))
    assert events_total(reg) == 3
    return reg


def events_total(reg: CollectorRegistry) -> float:
    found = reg.get_sample_value(
        "oomsight_oom_events_total",
        {"rank": "0", "local_rank": "0", "device": "0", "gpu_uuid": snapshot()["devices"][0]["uuid"]},
    )
    assert found is not None
    return found


def test_a_ledger_deleted_while_its_event_files_remain_is_put_back_and_no_count_falls(tmp_path: Any) -> None:
    """Issue 44: 3 OOMs, the ledger deleted, one event file gone, the sidecar restarted: 3, never 2."""
    spool = str(tmp_path)
    reg = three_fatal_ooms(spool)
    os.remove(ledger_of(spool))
    assert events_total(reg) == 3 and os.path.exists(ledger_of(spool))  # put back at the scrape
    os.remove(os.path.join(spool, event_path(1, 1)))
    assert events_total(reg) == 3
    os.remove(ledger_of(spool))
    assert events_total(reg) == 3  # 2 files left: the count is the high-water mark, written again
    assert scrape(spool, NOW)[0] == {key: [3.0, 3.0, 0.0] for key in scrape(spool, NOW)[0]}  # a restart: 3


def test_a_ledger_replaced_by_a_lower_one_while_running_is_overwritten_by_the_counts_served(tmp_path: Any) -> None:
    spool = str(tmp_path)
    reg = three_fatal_ooms(spool)
    rows(spool, lambda row: row.__setitem__(slice(4, 7), [1, 1, 0]))
    with open(ledger_of(spool)) as fh:
        assert [row[4:] for row in json.load(fh)["kept"]] == [[1, 1, 0]]
    assert events_total(reg) == 3
    with open(ledger_of(spool)) as fh:
        assert [row[4:] for row in json.load(fh)["kept"]] == [[3, 3, 0]]


def test_a_restart_without_a_ledger_or_its_copy_counts_the_event_files_present(tmp_path: Any) -> None:
    spool = str(tmp_path)
    three_fatal_ooms(spool)
    for _ in range(2):
        os.remove(ledger_of(spool))
        os.remove(ledger_of(spool) + ".copy")
        found, created = scrape(spool, NOW)
        assert list(found.values()) == [[3.0, 3.0, 0.0]] and created == {}  # a first start: no reset


def served(spool: str, now: float) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(SpoolCollector(spool, clock=lambda: now, ledger_path=ledger_of(spool)))
    generate_latest(reg)
    return reg


def lost_at(reg: CollectorRegistry, outcome: str) -> Any:
    return reg.get_sample_value("oomsight_oom_ledger_lost_timestamp_seconds", {"outcome": outcome})


def test_a_ledger_deleted_between_two_runs_with_an_event_file_gone_is_read_from_its_copy_logged_and_exported(
    tmp_path: Any, caplog: Any
) -> None:
    """Issue 49: 3 OOMs (the issue's 2 of them fatal), the sidecar stopped, its ledger deleted and one event file
    gone, the sidecar started: 3 and 2 again, never 2 and 1; a warning, and the restore exported."""
    spool = str(tmp_path)
    put(spool, snapshot_path(1), snapshot(pid=1, rank=0, t=NOW))
    for seq, outcome in ((1, "fatal"), (2, "fatal"), (3, "recovered")):
        put(spool, event_path(1, seq), event(pid=1, rank=0, seq=seq, t=NOW, outcome=outcome))
    assert list(scrape(spool, NOW)[0].values()) == [[3.0, 2.0, 1.0]]
    os.remove(ledger_of(spool))
    os.remove(os.path.join(spool, event_path(1, 1)))
    reg = served(spool, NOW + 10)
    assert list(counts(reg)[0].values()) == [[3.0, 2.0, 1.0]] and counts(reg)[1] == {}
    assert lost_at(reg, "restored") == NOW + 10 and lost_at(reg, "reset") is None
    assert "read back from its copy" in caplog.text
    assert os.path.isfile(ledger_of(spool))  # written again
    assert lost_at(served(spool, NOW + 20), "restored") is None  # a later clean start says nothing


def test_a_reset_is_exported_through_restarts_and_a_ledger_taken_away_while_running_is_said(
    tmp_path: Any, caplog: Any
) -> None:
    spool = str(tmp_path)
    reg = three_fatal_ooms(spool)
    assert lost_at(reg, "put_back") is None
    os.remove(ledger_of(spool) + ".copy")
    events_total(reg)
    assert lost_at(reg, "put_back") == NOW and "removed or replaced while the reader ran" in caplog.text
    for path in (ledger_of(spool), ledger_of(spool) + ".copy"):
        put(spool, os.path.relpath(path, spool), b"[")
    reg = served(spool, NOW + 5)
    assert events_total(reg) == 0 and lost_at(reg, "reset") == NOW + 5
    assert lost_at(served(spool, NOW + 50), "reset") == NOW + 5  # the reset's time kept in the ledger
