"""The Prometheus collector over spools written by the real hook (over fakes)."""

import os
import re
import subprocess

import pytest
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
