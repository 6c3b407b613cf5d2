import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomsight.wire import spool as spool_mod
from oomsight.wire.schema import SCHEMA_VERSION
from oomsight.wire.spool import SpoolReader, SpoolWriter


def snapshot_doc(pid=1, rank=0, t=1000.0, **extra):
    doc = {
        "schema_version": SCHEMA_VERSION,
        "kind": "snapshot",
        "process": {"id": f"{pid}-ab", "pid": pid, "rank": rank, "local_rank": rank, "started_at": t - 10},
        "time": t,
        "seq": 1,
        "state": "running",
        "devices": [],
        "steps": {"count": 0, "duration_seconds_total": 0.0},
        "sources": {},
        "errors": {},
    }
    doc.update(extra)
    return doc


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data if isinstance(data, bytes) else json.dumps(data).encode())


def test_writer_replaces_the_snapshot_atomically_and_leaves_no_temp_file(spool):
    w = SpoolWriter(spool, "1-ab")
    w.prepare()
    w.write_snapshot(snapshot_doc(t=1.0))
    w.write_snapshot(snapshot_doc(t=2.0))
    files = os.listdir(os.path.join(spool, "snapshots"))
    assert files == ["1-ab.json"]
    state = SpoolReader(spool).read()
    assert [s["time"] for s in state.snapshots] == [2.0]


@pytest.mark.parametrize(
    "content, reason",
    [
        (b'{"schema_version": 1, "kind": "snap', "corrupt"),
        (b"\xff\xfe\x00garbage", "corrupt"),
        ({"hello": "world"}, "foreign"),
        (["a", "list"], "foreign"),
        ({"schema_version": 99, "kind": "snapshot"}, "future_version"),
        ({"schema_version": 1, "kind": "snapshot", "time": "yesterday"}, "invalid"),
        ({"schema_version": 1, "kind": "teapot"}, "invalid"),
    ],
)
def test_a_bad_file_is_a_counted_skip_and_stays_in_place(spool, content, reason, caplog):
    write(os.path.join(spool, "snapshots", "good.json"), snapshot_doc())
    bad = os.path.join(spool, "snapshots", "bad.json")
    write(bad, content)
    reader = SpoolReader(spool)
    state = reader.read()
    assert len(state.snapshots) == 1
    assert state.skipped_total[reason] == 1
    assert os.path.exists(bad)
    assert sum(f"skipped spool files: 1 {reason}" in r.message for r in caplog.records) == 1
    # reading again does not count (or log) the same unchanged file again
    assert reader.read().skipped_total[reason] == 1
    assert sum("skipped spool files" in r.message for r in caplog.records) == 1


def test_oversized_files_are_not_read(spool, monkeypatch):
    write(os.path.join(spool, "events", "big.json"), b" " * 2048)
    state = SpoolReader(spool, max_file_bytes=1024).read()
    assert state.skipped_total["oversized"] == 1


def test_a_snapshot_in_the_events_folder_is_foreign(spool):
    write(os.path.join(spool, "events", "x.oom-00001.json"), snapshot_doc())
    assert SpoolReader(spool).read().skipped_total["foreign"] == 1


def test_temp_files_of_writers_in_flight_are_ignored(spool):
    write(os.path.join(spool, "snapshots", ".1-ab.json.tmp-5-6"), b"{partial")
    state = SpoolReader(spool).read()
    assert state.snapshots == [] and sum(state.skipped_total.values()) == 0


def test_a_corrupt_file_that_is_rewritten_correctly_is_read_again(spool):
    path = os.path.join(spool, "snapshots", "1-ab.json")
    write(path, b"{broken")
    reader = SpoolReader(spool)
    assert reader.read().snapshots == []
    spool_mod.write_atomic(path, json.dumps(snapshot_doc()).encode(), durable=False)
    assert len(reader.read().snapshots) == 1


def test_a_missing_spool_is_reported_not_raised(tmp_path):
    state = SpoolReader(str(tmp_path / "nope")).read()
    assert not state.readable and "not a directory" in state.error


def test_artifacts_are_evicted_oldest_first(spool):
    w = SpoolWriter(spool, "1-ab")
    w.prepare()
    for seq in range(1, 5):
        path = w.artifact_path(seq, "pickle")
        write(path, b"x" * 100)
        os.utime(path, ns=(seq * 10**9, seq * 10**9))
    evicted = w.evict_artifacts(250)
    assert [os.path.basename(p) for p in evicted] == ["1-ab.oom-00001.pickle", "1-ab.oom-00002.pickle"]
    assert sorted(os.listdir(os.path.join(spool, "artifacts"))) == ["1-ab.oom-00003.pickle", "1-ab.oom-00004.pickle"]


def test_the_artifacts_bound_is_the_setting_lowered_to_half_the_spools_filesystem(spool, tmp_path, monkeypatch):
    assert spool_mod.artifacts_cap_bytes(256 * 2**20) == 128 * 2**20 and spool_mod.artifacts_cap_bytes(1) == 1
    os.makedirs(spool)
    capacity = spool_mod.spool_capacity_bytes(spool)
    st = os.statvfs(spool)
    assert capacity == st.f_blocks * st.f_frsize > 0
    assert spool_mod.artifacts_budget_bytes(spool, 1000) == 1000  # a setting below half the filesystem
    assert spool_mod.artifacts_budget_bytes(spool, 2**62) == capacity // 2
    missing = str(tmp_path / "nowhere")
    assert spool_mod.spool_capacity_bytes(missing) is None and spool_mod.artifacts_budget_bytes(missing, 7) == 7
    monkeypatch.delattr(os, "statvfs")  # Windows has none: the setting stays
    assert spool_mod.artifacts_budget_bytes(spool, 2**62) == 2**62


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4096))
def test_the_reader_never_crashes_on_arbitrary_bytes(tmp_path_factory, data):
    root = str(tmp_path_factory.mktemp("fuzz"))
    write(os.path.join(root, "snapshots", "x.json"), data)
    write(os.path.join(root, "events", "y.oom-00001.json"), data)
    state = SpoolReader(root).read()
    assert state.readable
    assert len(state.snapshots) + sum(state.skipped_total.values()) >= 1


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_values, st.sampled_from(["snapshot", "oom_event"]))
def test_the_reader_never_crashes_on_arbitrary_json_with_our_header(tmp_path_factory, body, kind):
    root = str(tmp_path_factory.mktemp("fuzzjson"))
    doc = body if isinstance(body, dict) else {"body": body}
    doc = {**doc, "schema_version": 1, "kind": kind}
    folder = "snapshots" if kind == "snapshot" else "events"
    write(os.path.join(root, folder, "z.json"), doc)
    state = SpoolReader(root).read()
    assert state.readable


def test_the_timeline_appends_rotates_and_survives_a_torn_line(spool, monkeypatch):
    w = SpoolWriter(spool, "1-ab")
    monkeypatch.setattr(spool_mod, "TIMELINE_MAX_BYTES", 200)
    for i in range(20):
        w.append_timeline([float(i), i, [[0, i * 10, i * 20, i * 30]]])
    with open(w.timeline_path, "ab") as fh:
        fh.write(b"[99.0, 99, [[0, 1")  # a writer killed mid-line
    rows, skipped = spool_mod.read_timeline(spool, "1-ab")
    assert skipped == 1
    times = [r[0] for r in rows]
    assert times == sorted(times) and times[-1] == 19.0
    assert os.path.exists(os.path.join(spool, "timelines", "1-ab.1.jsonl"))  # rotated once at least
    folder = os.path.join(spool, "timelines")
    assert sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)) < 1000


def test_artifacts_are_settled_within_their_share_after_a_write(tmp_path):
    from oomsight.wire.spool import SpoolWriter

    writer = SpoolWriter(str(tmp_path), "1-aa")
    folder = tmp_path / "artifacts"
    folder.mkdir(exist_ok=True)
    for seq, size in ((1, 300), (2, 300), (3, 300)):
        path = writer.artifact_path(seq, "pickle")
        with open(path, "wb") as fh:
            fh.write(b"x" * size)
        os.utime(path, ns=(seq * 10**9, seq * 10**9))
    newest = writer.artifact_path(4, "pickle")
    with open(newest, "wb") as fh:
        fh.write(b"x" * 500)
    assert writer.settle_artifact(newest, 1000)
    kept = sorted(os.listdir(folder))
    assert kept == [os.path.basename(writer.artifact_path(s, "pickle")) for s in (3, 4)]  # the oldest evicted
    assert sum(os.path.getsize(folder / n) for n in kept) <= 1000
    huge = writer.artifact_path(5, "pickle")
    with open(huge, "wb") as fh:
        fh.write(b"x" * 7000)  # larger than the whole share: never kept, and the others stay
    assert not writer.settle_artifact(huge, 1000)
    assert sorted(os.listdir(folder)) == kept
