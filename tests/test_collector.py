"""The Prometheus collector over spools written by the real hook (over fakes)."""

import os
import re
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from oomsight.metrics.collector import SpoolCollector

from fakes import GIB, ROOT
from kubetools import sidecar_and_webhook_collectors
from spoolmaker import hooked_process


def registry_for(spool, **kw):
    reg = CollectorRegistry()
    collector = SpoolCollector(spool, **kw)
    reg.register(collector)
    return reg, collector


def labels(rank=0, device="0"):
    return {
        "rank": str(rank),
        "local_rank": str(rank),
        "device": device,
        "gpu_uuid": "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd",
    }


def test_allocator_values_reach_the_exposition(spool, monkeypatch):
    hooked_process(spool, allocated=3 * GIB, reserved=4 * GIB, monkeypatch=monkeypatch)
    reg, _ = registry_for(spool)
    assert reg.get_sample_value("oomsight_torch_allocated_bytes", labels()) == 3 * GIB
    assert reg.get_sample_value("oomsight_torch_reserved_bytes", labels()) == 4 * GIB
    assert reg.get_sample_value("oomsight_torch_peak_allocated_bytes", labels()) == 4 * GIB
    assert reg.get_sample_value("oomsight_gpu_memory_total_bytes", labels()) == 140 * GIB
    assert reg.get_sample_value("oomsight_gpu_non_torch_bytes", labels()) == GIB  # process used 5 - reserved 4
    assert reg.get_sample_value("oomsight_gpu_headroom_bytes", labels()) == 140 * GIB - GIB - 4 * GIB
    assert (
        reg.get_sample_value("oomsight_memory_by_category_bytes", {**labels(), "category": "optimizer_state"})
        == GIB // 2
    )
    assert reg.get_sample_value("oomsight_memory_by_category_bytes", {**labels(), "category": "activations"}) == (
        4 * GIB - GIB - GIB - GIB // 2  # step peak (opt-in) minus parameters, gradients, state
    )
    assert reg.get_sample_value("oomsight_steps_total", {"rank": "0", "local_rank": "0"}) == 2
    assert reg.get_sample_value("oomsight_source_up", {"rank": "", "local_rank": "", "source": "spool"}) == 1


def test_oom_counter_is_present_at_zero_from_the_start(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch)
    reg, _ = registry_for(spool)
    assert reg.get_sample_value("oomsight_oom_events_total", labels()) == 0
    assert reg.get_sample_value("oomsight_last_oom_timestamp_seconds", labels()) is None


def test_an_oom_is_counted_with_its_cause_and_outcome(spool, monkeypatch):
    hook, cuda = hooked_process(spool, monkeypatch=monkeypatch)
    cuda.observer(0, 100 * GIB, 140 * GIB, 2 * GIB)
    reg, _ = registry_for(spool)
    assert reg.get_sample_value("oomsight_oom_events_total", labels()) == 1
    assert reg.get_sample_value("oomsight_oom_fatal_events_total", labels()) == 0  # still pending
    assert reg.get_sample_value("oomsight_last_oom_requested_bytes", labels()) == 100 * GIB
    assert reg.get_sample_value("oomsight_last_oom_cause_info", {**labels(), "cause": "oversized_request"}) == 1
    hook.uncaught = RuntimeError("CUDA out of memory")
    hook.at_exit()
    assert reg.get_sample_value("oomsight_oom_fatal_events_total", labels()) == 1
    assert reg.get_sample_value("oomsight_process_up", {"rank": "0", "local_rank": "0"}) == 0


def test_the_last_oom_reports_the_free_bytes_the_allocator_saw(spool, monkeypatch):
    _hook, cuda = hooked_process(spool, monkeypatch=monkeypatch)
    cuda.observer(0, 100 * GIB, 140 * GIB, 2 * GIB)
    reg, _ = registry_for(spool)
    assert reg.get_sample_value("oomsight_last_oom_device_free_bytes", labels()) == 2 * GIB


def test_a_process_that_is_no_longer_up_says_why_it_ended(spool, monkeypatch):
    clock = [1000.0]
    hook, _cuda = hooked_process(spool, monkeypatch=monkeypatch, clock=lambda: clock[0])
    ranks = {"rank": "0", "local_rank": "0"}
    reg, _ = registry_for(spool, clock=lambda: 1000.0 + 1)
    assert reg.get_sample_value("oomsight_process_exit_info", {**ranks, "reason": "vanished"}) is None
    reg, _ = registry_for(spool, clock=lambda: 1000.0 + 31)  # silent past stale_after, no final snapshot
    assert reg.get_sample_value("oomsight_process_exit_info", {**ranks, "reason": "vanished"}) == 1
    hook.uncaught = RuntimeError("CUDA out of memory")
    hook.at_exit()
    reg, _ = registry_for(spool, clock=lambda: 1000.0 + 31)
    assert reg.get_sample_value("oomsight_process_exit_info", {**ranks, "reason": "oom"}) == 1
    assert reg.get_sample_value("oomsight_process_exit_info", {**ranks, "reason": "vanished"}) is None


def test_a_pending_oom_of_a_vanished_process_counts_as_fatal(spool, monkeypatch):
    clock = [1000.0]
    _hook, cuda = hooked_process(spool, monkeypatch=monkeypatch, clock=lambda: clock[0])
    cuda.observer(0, 100 * GIB, 140 * GIB, 2 * GIB)  # then the process is SIGKILLed: no exit handler
    reg, _ = registry_for(spool, clock=lambda: 1000.0 + 31)
    assert reg.get_sample_value("oomsight_process_up", {"rank": "0", "local_rank": "0"}) == 0
    assert reg.get_sample_value("oomsight_oom_fatal_events_total", labels()) == 1


def test_exited_processes_vanish_after_retention_but_oom_counts_stay(spool, monkeypatch):
    clock = [1000.0]
    hook, cuda = hooked_process(spool, monkeypatch=monkeypatch, clock=lambda: clock[0])
    cuda.observer(0, 100 * GIB, 140 * GIB, 2 * GIB)
    hook.uncaught = RuntimeError("CUDA out of memory")
    hook.at_exit()
    reg, _ = registry_for(spool, retention_seconds=300, clock=lambda: 1000.0 + 299)
    assert reg.get_sample_value("oomsight_torch_allocated_bytes", labels()) == 3 * GIB
    reg, _ = registry_for(spool, retention_seconds=300, clock=lambda: 1000.0 + 301)
    assert reg.get_sample_value("oomsight_torch_allocated_bytes", labels()) is None
    assert reg.get_sample_value("oomsight_oom_events_total", labels()) == 1  # never goes backwards


def test_a_restarted_rank_continues_its_oom_count(spool, monkeypatch):
    first, cuda = hooked_process(spool, monkeypatch=monkeypatch)
    cuda.observer(0, 100 * GIB, 140 * GIB, 2 * GIB)
    first.uncaught = RuntimeError("CUDA out of memory")
    first.at_exit()
    _second, cuda2 = hooked_process(spool, monkeypatch=monkeypatch)
    cuda2.observer(0, 100 * GIB, 140 * GIB, 2 * GIB)
    reg, _ = registry_for(spool)
    assert reg.get_sample_value("oomsight_oom_events_total", labels()) == 2
    assert reg.get_sample_value("oomsight_process_up", {"rank": "0", "local_rank": "0"}) == 1


def test_two_ranks_are_two_label_sets(spool, monkeypatch):
    hooked_process(spool, rank=0, monkeypatch=monkeypatch)
    hooked_process(spool, rank=1, allocated=7 * GIB, reserved=8 * GIB, monkeypatch=monkeypatch)
    reg, _ = registry_for(spool)
    assert reg.get_sample_value("oomsight_torch_allocated_bytes", labels(0)) == 3 * GIB
    assert reg.get_sample_value("oomsight_torch_allocated_bytes", labels(1)) == 7 * GIB


def test_corrupt_files_are_counted_by_reason(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch)
    with open(os.path.join(spool, "snapshots", "junk.json"), "w") as fh:
        fh.write("{not json")
    reg, _ = registry_for(spool)
    assert reg.get_sample_value("oomsight_spool_skipped_files_total", {"reason": "corrupt"}) == 1
    assert reg.get_sample_value("oomsight_torch_allocated_bytes", labels()) == 3 * GIB


@pytest.mark.e2e
def test_the_exposition_passes_promtool_check_metrics(spool, monkeypatch):
    _hook, cuda = hooked_process(spool, monkeypatch=monkeypatch)
    cuda.observer(0, 100 * GIB, 140 * GIB, 2 * GIB)
    reg, _ = registry_for(spool)
    text = generate_latest(reg)
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_metrics_doc_and_collector_list_the_same_families(spool, monkeypatch):
    hook, cuda = hooked_process(spool, monkeypatch=monkeypatch)
    cuda.observer(0, 100 * GIB, 140 * GIB, 2 * GIB)
    hook.steps.post_step(type("O", (), {"param_groups": [], "state": {}})(), (), {})
    hook.sampler.publish()
    reg, _ = registry_for(spool)
    for collector in sidecar_and_webhook_collectors():  # the sidecar's Kubernetes and the webhook's own families
        reg.register(collector)
    text = generate_latest(reg).decode()
    emitted = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    with open(os.path.join(ROOT, "docs", "metrics.md")) as fh:
        documented = set(re.findall(r"^\| `(oomsight_[a-z_]+)`", fh.read(), re.M))
    assert emitted == documented


def test_a_device_value_the_snapshot_left_null_has_no_sample_and_the_others_theirs(spool):
    from hostile import put, snapshot, snapshot_path

    doc = snapshot(pid=1, rank=0)
    nv = doc["devices"][0]["nvml"]
    nv["process_used_bytes"] = nv["reserved_bytes"] = None  # NVML could not tell
    put(spool, snapshot_path(1), doc)
    reg, _ = registry_for(spool)
    at = {**labels(), "gpu_uuid": doc["devices"][0]["uuid"], "device": str(doc["devices"][0]["index"])}
    for name in ("oomsight_gpu_process_used_bytes", "oomsight_gpu_memory_reserved_bytes"):
        assert reg.get_sample_value(name, at) is None, name
    assert reg.get_sample_value("oomsight_gpu_memory_used_bytes", at) == nv["used_bytes"]
    allocated = doc["devices"][0]["allocator"]["allocated_bytes"]
    assert reg.get_sample_value("oomsight_torch_allocated_bytes", at) == allocated


# Issue 26: counters that never go backwards, series that leave, memory back to its baseline.

OOM_COUNTERS = ("oomsight_oom_events_total", "oomsight_oom_fatal_events_total", "oomsight_oom_recovered_events_total")


def oom_counts(reg):
    """(rank, GPU) label set -> (events, fatal, recovered) as served."""
    found = {}
    for fam in reg.collect():
        for s in fam.samples:
            if s.name in OOM_COUNTERS:
                key = tuple(sorted(s.labels.items()))
                found.setdefault(key, [0, 0, 0])[OOM_COUNTERS.index(s.name)] = s.value
    return {k: tuple(v) for k, v in found.items()}


def test_an_oom_judged_fatal_while_its_rank_was_silent_stays_fatal_when_the_rank_comes_back(spool):
    from hostile import NOW, event, event_path, put, snapshot, snapshot_path

    clock = [NOW]
    ledger = os.path.join(spool, "sidecar", "oom-ledger.json")
    put(spool, snapshot_path(1), snapshot(pid=1))
    put(spool, event_path(1, 1), event(pid=1))
    reg, _ = registry_for(spool, clock=lambda: clock[0], ledger_path=ledger)
    assert list(oom_counts(reg).values()) == [(1, 0, 0)]  # pending
    clock[0] = NOW + 40  # silent past stale: fatal
    assert list(oom_counts(reg).values()) == [(1, 1, 0)]
    put(spool, snapshot_path(1), snapshot(pid=1, t=NOW + 41))  # back, and it says it recovered
    put(spool, event_path(1, 1), event(pid=1, outcome="recovered"))
    clock[0] = NOW + 41
    assert list(oom_counts(reg).values()) == [(1, 1, 0)]  # never fatal 1, recovered 1 (pending -1)
    restarted, _ = registry_for(spool, clock=lambda: clock[0], ledger_path=ledger)  # a sidecar restart
    assert list(oom_counts(restarted).values()) == [(1, 1, 0)]  # not fatal 1 -> 0


def test_a_rank_s_oom_series_leave_after_the_retention_once_its_files_are_gone(spool):
    from hostile import NOW, event, event_path, put, snapshot, snapshot_path

    clock = [NOW]
    for pid in (1, 2):
        put(spool, snapshot_path(pid), snapshot(pid=pid, rank=pid - 1))
    put(spool, event_path(1, 1), event(pid=1, rank=0))
    reg, collector = registry_for(spool, clock=lambda: clock[0], retention_seconds=300)
    assert len(oom_counts(reg)) == 2
    os.remove(os.path.join(spool, snapshot_path(2)))  # rank 1's files gone; rank 0's event stays
    clock[0] = NOW + 200
    assert len(oom_counts(reg)) == 2  # within retention: kept, at its last counts
    clock[0] = NOW + 501
    assert [dict(k)["rank"] for k in oom_counts(reg)] == ["0"]
    os.remove(os.path.join(spool, event_path(1, 1)))
    os.remove(os.path.join(spool, snapshot_path(1)))
    clock[0] = NOW + 900
    assert oom_counts(reg) == {} and collector.ledger.kept == {} and collector.ledger.decided == {}


def test_memory_returns_to_its_baseline_once_the_spool_is_clean(spool):
    import gc
    import tracemalloc

    from oomsight.wire.reader import Budget, SpoolReader

    from hostile import NOW, event, event_path, put, snapshot, snapshot_path

    clock = [NOW]
    put(spool, snapshot_path(1), snapshot(pid=1))
    roomy = Budget(ranks_per_spool=256, snapshot_memory_bytes=64 << 20, event_memory_bytes=64 << 20)
    reg, _ = registry_for(spool, clock=lambda: clock[0], retention_seconds=60, reader=SpoolReader(spool, budget=roomy))
    generate_latest(reg)
    tracemalloc.start()
    try:
        gc.collect()
        baseline = tracemalloc.get_traced_memory()[0]
        for pid in range(2, 202):  # 200 ranks with an OOM each come and go
            put(spool, snapshot_path(pid), snapshot(pid=pid, rank=pid))
            put(spool, event_path(pid, 1), event(pid=pid, rank=pid, outcome="fatal"))
        assert len(oom_counts(reg)) == 201
        for pid in range(2, 202):
            os.remove(os.path.join(spool, snapshot_path(pid)))
            os.remove(os.path.join(spool, event_path(pid, 1)))
        put(spool, snapshot_path(1), snapshot(pid=1, t=NOW + 100))
        clock[0] = NOW + 100
        generate_latest(reg)
        assert len(oom_counts(reg)) == 1
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - baseline
    finally:
        tracemalloc.stop()
    assert grown < 256 * 1024, grown  # 200 ranks' documents were several MB


def _spool_step(spool, op, state):
    """One step of the property test below: publish, oom, recover, fatal, stale, tick or restart."""
    from hostile import event, event_path, put, snapshot, snapshot_path

    kind, rank = op
    pid = rank + 1
    if kind == "publish":
        put(spool, snapshot_path(pid), snapshot(pid=pid, rank=rank, t=state["now"]))
    elif kind in ("oom", "recover", "fatal"):
        seqs = state["seqs"].setdefault(rank, [])
        if kind == "oom" or not seqs:
            seqs.append(len(seqs) + 1)
        outcome = {"oom": "pending", "recover": "recovered", "fatal": "fatal"}[kind]
        put(spool, event_path(pid, seqs[-1]), event(pid=pid, rank=rank, seq=seqs[-1], t=state["now"], outcome=outcome))
    elif kind == "stale":
        state["now"] += 40
    elif kind == "tick":
        state["now"] += 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["publish", "oom", "recover", "fatal", "stale", "tick", "restart"]), st.integers(0, 1)
        ),
        max_size=25,
    )
)
def test_oom_counters_never_go_backwards_through_any_publish_stale_recover_restart_sequence(tmp_path_factory, ops):
    from hostile import NOW

    spool = str(tmp_path_factory.mktemp("spool"))
    state = {"now": NOW, "seqs": {}}
    ledger = os.path.join(spool, "sidecar", "oom-ledger.json")
    reg, _ = registry_for(spool, clock=lambda: state["now"], ledger_path=ledger)
    last: dict = {}
    for op in ops:
        if op[0] == "restart":
            reg, _ = registry_for(spool, clock=lambda: state["now"], ledger_path=ledger)
        else:
            _spool_step(spool, op, state)
        now = oom_counts(reg)
        for key, (events, fatal, recovered) in now.items():
            assert events >= fatal + recovered, (op, key, now[key])  # pending never negative
            before = last.get(key, (0, 0, 0))
            assert all(a >= b for a, b in zip(now[key], before)), (op, key, before, now[key])
        assert set(last) <= set(now)  # no file is removed here: no series leaves
        last = now


def test_the_ledger_file_is_written_only_when_counts_change_and_a_damaged_one_restarts_the_counts_at_0(
    spool, caplog
):
    from hostile import NOW, event, event_path, put, snapshot, snapshot_path

    clock = [NOW]
    ledger = os.path.join(spool, "sidecar", "oom-ledger.json")
    put(spool, snapshot_path(1), snapshot(pid=1))
    reg, _ = registry_for(spool, clock=lambda: clock[0], ledger_path=ledger)
    oom_counts(reg)
    written = os.stat(ledger).st_mtime_ns, os.stat(ledger).st_ino
    for step in range(1, 4):
        clock[0] = NOW + step
        oom_counts(reg)
    assert (os.stat(ledger).st_mtime_ns, os.stat(ledger).st_ino) == written  # nothing changed: not rewritten
    put(spool, event_path(1, 1), event(pid=1, outcome="fatal"))
    assert list(oom_counts(reg).values()) == [(1, 1, 0)]
    assert os.stat(ledger).st_ino != written[1]
    for damaged in (b"{torn", b'{"decided": {}, "kept": [["0", "0", "0", "x", -1, 0, 0]]}', b"[" * 5000):
        put(spool, "sidecar/oom-ledger.json", damaged)
        put(spool, "sidecar/oom-ledger.json.copy", damaged)  # its copy too (issue 49 reads a usable copy back)
        reg, _ = registry_for(spool, clock=lambda: clock[0], ledger_path=ledger)
        assert os.path.getsize(ledger) > 10  # replaced at once, before any scrape
        # issue 36: an honest reset (0, its _created moved), never the recount of what is left
        counts = oom_counts(reg)
        assert list(counts.values()) == [(0, 0, 0)]
        assert reg.get_sample_value("oomsight_oom_events_created", dict(next(iter(counts)))) == clock[0]
    put(spool, event_path(1, 2), event(pid=1, seq=2, outcome="fatal"))
    assert list(oom_counts(reg).values()) == [(1, 1, 0)]  # a new OOM after the reset counts
    assert sum("cannot be used" in r.getMessage() for r in caplog.records) == 3
