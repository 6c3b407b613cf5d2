"""CPU tests on numbers recorded on the H200 (tests/fixtures/h200/, recorded by
tests/fixtures/record_h200.py; the tape by ``oomsight run --tape`` of the demo job)."""

import json
import os
import types

import pytest

from oomsight.analysis.inventory import take_inventory
from oomsight.hook.cuda import nested_from_flat, reading_from_nested
from oomsight.hook.nvml import Nvml
from oomsight.metrics.collector import SpoolCollector
from oomsight.tools import tape
from oomsight.tools.demo import TAPE
from oomsight.wire.spool import SpoolReader

from fakes import FIXTURES, FakeNvmlModule

H200 = os.path.join(FIXTURES, "h200")


def load(name):
    with open(os.path.join(H200, name)) as fh:
        return json.load(fh)


def test_the_raw_binding_and_memory_stats_agree_on_the_h200():
    nested = load("memory_stats_nested.json")
    flat = load("memory_stats_flat.json")
    from_raw = reading_from_nested(nested)
    from_flat = reading_from_nested(nested_from_flat(flat))
    assert from_raw == from_flat
    assert from_raw.allocated_bytes == flat["allocated_bytes.all.current"]
    assert from_raw.reserved_bytes >= from_raw.allocated_bytes > 0
    assert from_raw.device_allocs == flat["num_device_alloc"]  # present in torch >= 2.4


def test_the_observer_passes_device_request_total_and_free():
    # DESIGN.md guessed (device, alloc, device_allocated, device_free); the H200 says otherwise
    rec = load("observer_args.json")
    ((device, requested, third, free),) = rec["observer_calls"]
    assert device == 0 and requested == rec["request"]
    assert third == rec["before"]["mem_get_info"][1]  # the device total, not allocated bytes
    assert free <= third and rec["num_ooms"] == 1


def test_nvml_readings_of_the_h200_give_a_sample():
    rec = load("nvml.json")
    own = rec["own_pid"]
    module = FakeNvmlModule(
        total=rec["memory_v2"]["total"],
        used=rec["memory_v2"]["used"],
        procs=[(p["pid"], p["usedGpuMemory"]) for p in rec["processes"]],
    )
    module.nvmlDeviceGetMemoryInfo = lambda h, version=None: types.SimpleNamespace(**rec["memory_v2"])
    sample = Nvml(module).sample("handle", own)
    assert sample["process_visible"] and sample["process_used_bytes"] == rec["processes"][0]["usedGpuMemory"]
    # NVML's own entry minus torch's reserved bytes: the CUDA context and libraries, a few hundred MiB
    assert 100 << 20 < sample["process_used_bytes"] - rec["torch_reserved"] < 2 << 30


def test_the_h200_tape_replays_into_a_spool_the_collector_reads(tmp_path):
    spool = str(tmp_path / "spool")
    count = tape.replay(TAPE, spool, speed=1e6, sleep=lambda s: None)
    assert count > 50
    state = SpoolReader(spool).read()
    assert sum(state.skipped_total.values()) == 0
    inv = take_inventory(state, now=max(s["time"] for s in state.snapshots))
    assert [v.snapshot["process"]["rank"] for v in inv.processes] == [0, 1]
    (event,) = [e.event for e in inv.events]
    assert event["process"]["rank"] == 1 and event["outcome"] == "fatal"
    assert event["diagnosis"]["cause"] == "leak"
    assert SpoolCollector(spool).collect()  # every family builds from real data


def test_a_tape_that_is_not_a_tape_is_a_clear_error(tmp_path):
    bad = tmp_path / "x.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(tape.TapeError, match="not a readable tape"):
        tape.read(str(bad))


def test_a_tape_cannot_write_outside_the_spool(tmp_path):
    import gzip

    evil = tmp_path / "evil.tape.jsonl.gz"
    with gzip.open(evil, "wt") as fh:
        fh.write(json.dumps({"tape": tape.TAPE_MAGIC, "version": 1, "start": 0}) + "\n")
        fh.write(json.dumps({"t": 0, "path": "../../etc/x.json", "doc": {}}) + "\n")
    with pytest.raises(tape.TapeError, match="outside the spool"):
        tape.replay(str(evil), str(tmp_path / "spool"), sleep=lambda s: None)
