"""Every spool file is untrusted: hostile files are counted skips, never a failed scrape, a
hung reader, a dead Event loop or a crashed report (issue 13)."""

import errno
import json
import os
import threading
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from test_events import POD

from oomsight.analysis.inventory import take_inventory
from oomsight.metrics.collector import SpoolCollector
from oomsight.wire import decoding
from oomsight.wire.fieldtypes import LABEL_MAX_CHARS
from oomsight.wire.reader import Budget
from oomsight.wire.spool import SpoolReader
from oomsight_sidecar.events import EventPoster

from hostile import NOW, event, event_path, put, snapshot, snapshot_path
from kubetools import FakeKube

SPOOL_UP = {"rank": "", "local_rank": "", "source": "spool"}
DEV = {"rank": "0", "local_rank": "0", "device": "0", "gpu_uuid": snapshot()["devices"][0]["uuid"]}


def scrape(collector):
    reg = CollectorRegistry()
    reg.register(collector)
    return reg, generate_latest(reg).decode()


def deep(n):
    return ("[" * n + "]" * n).encode()


HOSTILE = {
    "nested_1000_deep": b'{"schema_version": 1, "kind": "snapshot", "x": ' + deep(1000) + b"}",
    "int_above_1e308": json.dumps(snapshot(pid=9)).replace('"pid": 9', '"pid": 9' + "0" * 310).encode(),
    "float_overflowing_to_inf": json.dumps(snapshot(pid=9)).replace('"pid": 9', '"pid": 1e400').encode(),
    "nan_time": json.dumps(snapshot(pid=9, t=float("nan"))).encode(),
    "infinite_time": json.dumps(snapshot(pid=9, t=float("inf"))).encode(),
    "lone_surrogate_in_a_label": json.dumps(snapshot(pid=9)).replace("NVIDIA H200", "\\udc80").encode(),
    "lone_surrogate_as_raw_bytes": json.dumps(snapshot(pid=9)).encode().replace(b"NVIDIA", b"\xed\xb2\x80"),
    "huge_time": json.dumps(snapshot(pid=9, t=1e300)).encode(),
    "newer_key_nested_40_deep": json.dumps(snapshot(pid=9, x=json.loads(deep(40)))).encode(),
    "newer_device_key_nested_40_deep": json.dumps(snapshot(pid=9))
    .replace('"index": 0', '"index": 0, "x": ' + deep(40).decode())
    .encode(),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_snapshot_is_a_counted_skip_and_the_scrape_still_answers(spool, name):
    put(spool, snapshot_path(1), snapshot(pid=1))
    put(spool, snapshot_path(9), HOSTILE[name])
    collector = SpoolCollector(spool, clock=lambda: NOW)
    reg, text = scrape(collector)
    assert reg.get_sample_value("oomsight_torch_allocated_bytes", DEV) is not None  # the good rank
    assert reg.get_sample_value("oomsight_process_up", {"rank": "0", "local_rank": "0"}) == 1
    skipped = sum(
        reg.get_sample_value("oomsight_spool_skipped_files_total", {"reason": r}) for r in ("corrupt", "invalid")
    )
    assert skipped == 1
    assert 'gpu_uuid="' in text and len(collector.inventory().processes) == 1


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_event_never_stops_the_event_poster(spool, name):
    put(spool, event_path(1, 1), event(pid=1, seq=1))
    put(spool, event_path(9, 1), HOSTILE[name].replace(b'"snapshot"', b'"oom_event"'))
    kube = FakeKube()
    poster = EventPoster(spool, POD, lambda: kube)
    assert poster.tick() == 1 and len(kube.events) == 1


def test_json_nested_1000_deep_is_corrupt_before_it_reaches_the_parser():
    with pytest.raises(decoding.Unusable) as exc:
        decoding.decode(deep(1000))
    assert exc.value.reason == "corrupt"
    assert isinstance(decoding.decode(deep(decoding.MAX_DEPTH)), list)  # as deep as allowed reads
    assert decoding.nesting_within(b'{"a": "[[[[\\"[[[\\\\", "b": [1, {"c": []}]}', 4)
    assert not decoding.nesting_within(b'{"a": [1, {"c": []}]}', 3)
    assert not decoding.nesting_within(b"[" * 5000 + b"]" * 5000, 32)  # the regex passes, on long input
    assert not decoding.nesting_within(b"[[]", 32) and not decoding.nesting_within(b"][", 32)


def test_a_file_parsed_again_shares_what_did_not_change_and_checks_what_did(spool):
    """The reader validates only what changed since a file's last version (the rest is the last
    version's, already checked): a bad value is still caught where it changed, and a newer
    writer's key nested within bounds is kept."""
    reader = SpoolReader(spool)
    put(spool, snapshot_path(1), snapshot(pid=1, x=json.loads(deep(20))))
    first = reader.read().snapshots[0]
    moved = snapshot(pid=1, x=json.loads(deep(20)))
    moved["time"] -= 1
    moved["devices"][0]["allocator"]["allocated_bytes"] += 1
    put(spool, snapshot_path(1), moved)
    second = reader.read().snapshots[0]
    assert second["process"] is first["process"] and second["x"] is first["x"]  # unchanged: shared
    assert second["devices"][0]["nvml"] is first["devices"][0]["nvml"]
    assert second["devices"][0]["allocator"] is not first["devices"][0]["allocator"]
    bad = json.loads(json.dumps(moved))
    bad["devices"][0]["allocator"]["reserved_bytes"] = -1.5  # an int field
    put(spool, snapshot_path(1), bad)
    assert reader.read().snapshots == [] and reader._skipped["invalid"] == 1
    put(spool, snapshot_path(1), moved)
    assert (
        reader.read().snapshots[0]["devices"][0]["allocator"]["allocated_bytes"]
        == first["devices"][0]["allocator"]["allocated_bytes"] + 1
    )


def test_a_device_without_its_optional_nvml_key_scrapes(spool):
    doc = snapshot()
    del doc["devices"][0]["nvml"], doc["sources"], doc["steps"]["last_duration_seconds"]
    put(spool, snapshot_path(1), doc)
    reg, _ = scrape(SpoolCollector(spool, clock=lambda: NOW))
    assert reg.get_sample_value("oomsight_torch_allocated_bytes", DEV) is not None
    assert reg.get_sample_value("oomsight_gpu_memory_used_bytes", DEV) is None


def test_a_fifo_swapped_in_after_the_stat_does_not_hang_the_reader(spool, monkeypatch):
    path = put(spool, snapshot_path(1), snapshot())
    regular = os.lstat(path)
    os.unlink(path)
    os.mkfifo(path)
    for name in ("lstat", "stat"):  # every stat says "a regular file": the swap comes after it
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda p, *a, _real=real, **k: regular if p == path else _real(p, *a, **k))
    result = {}
    reader = threading.Thread(target=lambda: result.update(state=SpoolReader(spool).read()), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "the reader blocked opening a FIFO"
    assert result["state"].snapshots == [] and result["state"].skipped_total["foreign"] == 1


def test_a_symlink_is_foreign_and_not_followed(spool, tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps(snapshot()))
    os.makedirs(os.path.join(spool, "snapshots"))
    os.symlink(target, os.path.join(spool, snapshot_path(1)))
    state = SpoolReader(spool).read()
    assert state.snapshots == [] and state.skipped_total["foreign"] == 1


def test_a_repeated_device_entry_gives_one_series(spool):
    doc = snapshot()
    doc["devices"] = doc["devices"] * 2
    put(spool, snapshot_path(1), doc)
    _, text = scrape(SpoolCollector(spool, clock=lambda: NOW))
    assert sum(line.startswith("oomsight_torch_allocated_bytes{") for line in text.splitlines()) == 1


def test_a_dead_process_with_a_future_dated_snapshot_does_not_shadow_the_restarted_rank(spool):
    put(spool, snapshot_path(1), snapshot(pid=1, t=NOW + 86400))
    put(spool, snapshot_path(2), snapshot(pid=2, t=NOW - 1))
    inv = take_inventory(SpoolReader(spool).read(), NOW)
    assert [v.snapshot["process"]["pid"] for v in inv.processes] == [2] and inv.processes[0].up


def test_temp_files_of_killed_writers_are_swept_only_when_old_and_only_when_asked(spool):
    old = put(spool, "snapshots/.1-aa.json.tmp-7-8", b"{half")
    old_pickle = put(spool, "artifacts/.1-aa.oom-00001.pickle.tmp-7-8", b"\x80")
    young = put(spool, "snapshots/.2-aa.json.tmp-7-8", b"{half")
    other = put(spool, "snapshots/.hidden", b"x")
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    os.utime(old_pickle, (an_hour_ago, an_hour_ago))
    os.utime(other, (an_hour_ago, an_hour_ago))
    SpoolReader(spool).read()
    assert os.path.exists(old)
    SpoolReader(spool, sweep_temp_after_seconds=600).read()
    assert not os.path.exists(old) and not os.path.exists(old_pickle)
    assert os.path.exists(young) and os.path.exists(other)


def test_series_stay_when_file_descriptors_run_out(spool, monkeypatch):
    put(spool, snapshot_path(1), snapshot())
    collector = SpoolCollector(spool, clock=lambda: NOW)
    reg, _ = scrape(collector)
    assert reg.get_sample_value("oomsight_torch_allocated_bytes", DEV) is not None
    put(spool, snapshot_path(1), snapshot(seq=2))  # changed: it must be opened again

    def no_fds(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "listdir", no_fds)
    monkeypatch.setattr(os, "open", no_fds)
    reg, _ = scrape(collector)
    assert reg.get_sample_value("oomsight_torch_allocated_bytes", DEV) is not None
    assert reg.get_sample_value("oomsight_source_up", SPOOL_UP) == 0
    monkeypatch.undo()
    assert scrape(collector)[0].get_sample_value("oomsight_source_up", SPOOL_UP) == 1


def test_the_oom_counter_does_not_drop_while_the_events_folder_is_unreadable(spool, monkeypatch):
    put(spool, snapshot_path(1), snapshot())
    for seq in (1, 2, 3):
        put(spool, event_path(1, seq), event(seq=seq, outcome="recovered"))
    collector = SpoolCollector(spool, clock=lambda: NOW)
    assert scrape(collector)[0].get_sample_value("oomsight_oom_events_total", DEV) == 3
    real, events = os.scandir, os.open(os.path.join(spool, "events"), os.O_RDONLY)
    os.close(events)

    def scandir(path="."):
        if isinstance(path, int) and os.path.realpath(f"/proc/self/fd/{path}").endswith("events"):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert scrape(collector)[0].get_sample_value("oomsight_oom_events_total", DEV) == 3
    assert SpoolCollector(spool, clock=lambda: NOW).inventory().error == "cannot list events"


def test_a_fatal_oom_stays_fatal_when_its_silent_process_publishes_again(spool):
    clock = [NOW]
    put(spool, snapshot_path(1), snapshot(t=NOW))
    put(spool, event_path(1, 1), event(t=NOW))
    collector = SpoolCollector(spool, clock=lambda: clock[0])
    assert scrape(collector)[0].get_sample_value("oomsight_oom_fatal_events_total", DEV) == 0
    clock[0] = NOW + 60  # silent past stale-after: the pending OOM ended it
    assert scrape(collector)[0].get_sample_value("oomsight_oom_fatal_events_total", DEV) == 1
    put(spool, snapshot_path(1), snapshot(t=NOW + 61))  # and then it publishes again
    assert scrape(collector)[0].get_sample_value("oomsight_oom_fatal_events_total", DEV) == 1


def test_a_deeply_nested_posted_events_file_does_not_stop_the_poster(spool):
    put(spool, "sidecar/events-posted.json", b'{"done": ' + deep(5000) + b"}")
    put(spool, event_path(1, 1), event())
    kube = FakeKube()
    poster = EventPoster(spool, POD, lambda: kube)
    assert poster.counts()[1]["events_state"] == 1
    assert poster.tick() == 1


def test_an_event_that_breaks_the_poster_is_counted_failed_and_the_loop_goes_on(spool, monkeypatch):
    put(spool, event_path(1, 1), event(seq=1, t=NOW))
    put(spool, event_path(1, 2), event(seq=2, t=NOW + 1))
    kube = FakeKube()
    poster = EventPoster(spool, POD, lambda: kube)
    import oomsight_sidecar.events as events_mod

    real = events_mod.micro_time
    monkeypatch.setattr(events_mod, "micro_time", lambda t: real(t) if t > NOW else 1 / 0)
    assert poster.tick() == 1
    results, errors = poster.counts()
    assert results["failed"] == 1 and results["posted"] == 1 and errors["events_document"] == 1
    assert poster.tick() == 0  # the broken one is not retried for ever


def test_a_fifo_among_the_requests_or_timelines_blocks_neither_the_hook_nor_the_report(spool):
    from oomsight.wire.requests import pending_requests
    from oomsight.wire.spool import read_timeline

    for rel in ("requests/profile-x.json", "timelines/1-aa.jsonl"):
        os.makedirs(os.path.dirname(os.path.join(spool, rel)), exist_ok=True)
        os.mkfifo(os.path.join(spool, rel))
    done = {}
    worker = threading.Thread(
        target=lambda: done.update(req=pending_requests(spool, 0.0, set()), rows=read_timeline(spool, "1-aa")),
        daemon=True,
    )
    worker.start()
    worker.join(10)
    assert not worker.is_alive() and done == {"req": [], "rows": ([], 0)}


def test_a_fifo_in_the_spool_does_not_hang_the_tape_recorder_of_oomsight_run(spool, tmp_path):
    from oomsight.tools import tape

    put(spool, snapshot_path(2), snapshot(pid=2))
    fifo = os.path.join(spool, snapshot_path(1))
    os.mkfifo(fifo)
    os.symlink(os.path.join(spool, snapshot_path(2)), os.path.join(spool, snapshot_path(3)))
    stop = threading.Event()
    stop.set()  # one pass over the spool, then the recorder returns
    path = str(tmp_path / "run.tape")
    done = {}
    recorder = threading.Thread(target=lambda: done.update(n=tape.record(spool, path, stop)), daemon=True)
    recorder.start()
    recorder.join(10)
    if recorder.is_alive():  # blocked opening the FIFO: open its other end to let it go
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        recorder.join(10)
        pytest.fail("the tape recorder blocked opening a FIFO")
    _, records = tape.read(path)
    assert done["n"] == 1 and [r["path"] for r in records] == [snapshot_path(2)]


# Issue 26: a valid spool cannot make the reader do unbounded work (oomsight.wire.reader.Budget).


def skipped(reg, reason):
    return reg.get_sample_value("oomsight_spool_skipped_files_total", {"reason": reason})


def many_devices(pid, rank, n):
    doc = snapshot(pid=pid, rank=rank)
    one = {**doc["devices"][0], "steps_memory": [], "trend": [], "step_trend": None}
    doc["devices"] = [{**one, "index": i, "uuid": f"GPU-{i:08d}"} for i in range(n)]
    return doc


def test_a_valid_snapshot_listing_more_devices_than_a_document_may_is_refused_whole(spool):
    put(spool, snapshot_path(1), snapshot(pid=1, rank=0))
    put(spool, snapshot_path(2), many_devices(2, 1, 200))  # within 1 MiB (the listed 2,893)
    reg, text = scrape(SpoolCollector(spool, clock=lambda: NOW))
    assert skipped(reg, "too_many_devices") == 1
    assert reg.get_sample_value("oomsight_process_up", {"rank": "0", "local_rank": "0"}) == 1
    assert reg.get_sample_value("oomsight_process_up", {"rank": "1", "local_rank": "1"}) is None
    assert len(text) < 100_000
    put(spool, snapshot_path(2), many_devices(2, 1, 16))  # within the budget
    reg, _ = scrape(SpoolCollector(spool, clock=lambda: NOW))
    assert reg.get_sample_value("oomsight_process_up", {"rank": "1", "local_rank": "1"}) == 1


def test_ranks_past_the_budget_are_refused_the_newest_read_and_each_counted_once(spool):
    for pid in range(1, 13):
        path = put(spool, snapshot_path(pid), snapshot(pid=pid, rank=pid))
        os.utime(path, (NOW + pid, NOW + pid))
    reader = SpoolReader(spool, budget=Budget(ranks_per_spool=8))
    collector = SpoolCollector(spool, clock=lambda: NOW, reader=reader)
    for _ in range(3):
        reg, _ = scrape(collector)
        assert skipped(reg, "too_many_files") == 4  # each refused file once, however many scrapes
    ranks = sorted(int(v.rank_labels[0]) for v in collector.last_inventory.processes)
    assert ranks == list(range(5, 13))  # the newest eight
    assert reader.parsed == 8
    for rank in range(1, 5):  # never parsed: each named by the head of its file (issue 49)
        hidden = {"rank": str(rank), "local_rank": str(rank), "reason": "too_many_files"}
        assert reg.get_sample_value("oomsight_spool_hidden_snapshots", hidden) == 1


def test_a_folder_of_many_files_is_listed_only_to_its_budget_and_logged_once_per_interval(spool, caplog):
    put(spool, snapshot_path(1), snapshot(pid=1, rank=0))
    events = os.path.join(spool, "events")
    os.makedirs(events, exist_ok=True)
    for i in range(3000):  # empty files: each one corrupt
        open(os.path.join(events, f"{i:05d}.json"), "wb").close()
    open(os.path.join(events, "bad\nname.json"), "wb").close()
    reader = SpoolReader(spool, budget=Budget(entries_per_folder=500, events_per_spool=100))
    collector = SpoolCollector(spool, clock=lambda: NOW, reader=reader)
    started = time.process_time()  # CPU time: a shared machine's load does not make the listing slow
    reg, _ = scrape(collector)
    assert time.process_time() - started < 5
    assert skipped(reg, "too_many_files") == 1 + 400  # the listing cut; the documents past 100 of the 500
    assert skipped(reg, "corrupt") == 100
    for _ in range(3):
        scrape(collector)
    lines = [r.getMessage() for r in caplog.records if "skipped spool files" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines  # one line per interval, never split
    assert reader.parsed == 100 + 1  # and the snapshot


def test_a_file_name_holding_a_newline_cannot_split_a_log_line(spool, caplog):
    put(spool, "snapshots/evil\nWARNING forged line.json", b"{torn")
    reg, _ = scrape(SpoolCollector(spool, clock=lambda: NOW))
    assert skipped(reg, "corrupt") == 1
    found = [r.getMessage() for r in caplog.records if "skipped spool files" in r.getMessage()]
    assert len(found) == 1 and "\n" not in found[0] and "evil\\nWARNING" in found[0]


def test_series_past_the_scrape_budget_are_left_out_before_any_text_is_made(spool):
    for pid in range(1, 9):
        put(spool, snapshot_path(pid), snapshot(pid=pid, rank=pid))
    reader = SpoolReader(spool, budget=Budget(series_per_scrape=300))
    collector = SpoolCollector(spool, clock=lambda: NOW, reader=reader)
    reg, text = scrape(collector)
    kept = len(collector.last_inventory.processes)
    assert 0 < kept < 8 and skipped(reg, "too_many_series") == 8 - kept
    samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    assert samples <= 300 + 20  # the budget, and the reader's own series
    scrape(collector)
    assert skipped(reg, "too_many_series") == 8 - kept  # counted once while left out
    for pid in range(kept + 1, 9):  # the lowest ranks first: each rank left out says so
        hidden = {"rank": str(pid), "local_rank": str(pid), "reason": "too_many_series"}
        assert reg.get_sample_value("oomsight_spool_hidden_snapshots", hidden) == 1


def test_huge_label_values_cannot_blow_up_the_exposition(spool):
    """A label value over the bound refuses its document (issue 44); long ones within it reach the bytes budget."""
    put(spool, snapshot_path(1), snapshot(pid=1, rank=0))
    doc = many_devices(2, 1, 16)
    for d in doc["devices"]:
        d["uuid"] = "GPU-" + "f" * 60_000  # in every one of a device's ~50 series
    put(spool, snapshot_path(2), doc)
    reg, text = scrape(SpoolCollector(spool, clock=lambda: NOW))
    assert skipped(reg, "invalid") == 1 and skipped(reg, "too_many_series") == 0
    assert len(text) < 100_000 and reg.get_sample_value("oomsight_process_up", {"rank": "0", "local_rank": "0"}) == 1
    for d in doc["devices"]:
        d["uuid"] = "GPU-" + "f" * (LABEL_MAX_CHARS - 4)  # valid
    put(spool, snapshot_path(2), doc)
    reader = SpoolReader(spool, budget=Budget(metrics_bytes=200_000))
    reg, text = scrape(SpoolCollector(spool, clock=lambda: NOW, reader=reader))
    assert skipped(reg, "too_many_series") == 1
    assert len(text) < 100_000 and reg.get_sample_value("oomsight_process_up", {"rank": "0", "local_rank": "0"}) == 1


def test_an_events_folder_that_is_a_symlink_is_not_followed(spool, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    put(str(elsewhere), "x.oom-00001.json", event(pid=1))
    put(spool, snapshot_path(1), snapshot(pid=1))
    os.makedirs(spool, exist_ok=True)
    os.symlink(elsewhere, os.path.join(spool, "events"))
    reg, _ = scrape(SpoolCollector(spool, clock=lambda: NOW))
    assert reg.get_sample_value("oomsight_oom_events_total", DEV) == 0
    assert skipped(reg, "foreign") == 1


def test_dot_files_and_junk_names_cannot_hide_a_live_rank_from_the_listing(spool):
    """Issue 36, on ext4 then: 5,000 dot files or junk names in snapshots/ hid 1 of 4 live ranks."""
    folder = os.path.join(spool, "snapshots")
    for pid in range(1, 5):
        put(spool, snapshot_path(pid), snapshot(pid=pid, rank=pid - 1))
    for i in range(5000):
        open(os.path.join(folder, f".{i}.json.tmp-1-2"), "wb").close()
        open(os.path.join(folder, f"junk-{i}.txt"), "wb").close()
    state = SpoolReader(spool).read()
    assert sorted(s["process"]["rank"] for s in state.snapshots) == [0, 1, 2, 3]
    assert state.skipped_total["too_many_files"] == 0  # junk is not listed, so nothing is cut


def test_names_the_hook_makes_are_listed_before_newer_junk_json(spool):
    """Issue 36: junk newer than ranks that stopped publishing hid all 64. The hook's own names come
    first, then the newest; what is left out is counted once."""

    folder = os.path.join(spool, "snapshots")
    for pid in range(1, 65):
        path = put(spool, snapshot_path(pid), snapshot(pid=pid, rank=pid))
        os.utime(path, (time.time() - 600, time.time() - 600))  # stopped publishing ten minutes ago
    for i in range(5000):
        open(os.path.join(folder, f"junk{i}.json"), "wb").close()  # newer, and .json
    reader = SpoolReader(spool)
    state = reader.read()
    assert len(state.snapshots) == 64 and reader.parsed == 64
    # the folder cut once past its 4,096 names; the junk listed is past the 64 documents, each counted
    assert state.skipped_total["too_many_files"] == 1 + 4096 - 64
    small = SpoolReader(spool, budget=Budget(entries_per_folder=100, entries_scanned_per_folder=200))
    assert len(small.read().snapshots) <= 64  # a scan that stops early still reads what it listed
