"""Rank attribution under a real ``torchrun`` with the gloo backend (CPU machine).

Each rank runs the real hook with the launcher's environment; CUDA itself is the
fake (no GPU here), so what is proven is that ranks, local ranks and world size reach
the spool and the metrics as torchrun sets them.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from oomsight.metrics.collector import SpoolCollector
from oomsight.wire.spool import SpoolReader

from fakes import ROOT

WORKER = """
import os, sys
sys.path.insert(0, {tests!r})
import torch, torch.distributed as dist
from fakes import GIB, FakeCuda
from oomsight.config import Settings
from oomsight.hook.runtime import Hook

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.tensor([float(rank)])
dist.all_reduce(t)
cuda = FakeCuda()
cuda.set(0, allocated=(rank + 1) * GIB, reserved=(rank + 2) * GIB)
hook = Hook(Settings().replace(spool_dir={spool!r}, termination_message_path=""), cuda, None)
hook.sampler.tick()
if rank == 1:
    cuda.observer = None
    hook.start()  # attaches the observer on the fake
    cuda.observer(0, 50 * GIB, 140 * GIB, GIB)
hook.at_exit()
dist.destroy_process_group()
print("rank %d sum %s" % (rank, t.item()))  # one write: ranks share the pipe
"""


@pytest.mark.e2e
def test_torchrun_ranks_are_attributed_in_the_spool(tmp_path):
    spool = str(tmp_path / "spool")
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER.format(tests=os.path.join(ROOT, "tests"), spool=spool)))
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=3", str(script)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("sum 3.0") == 3  # gloo really ran: 0 + 1 + 2
    state = SpoolReader(spool).read()
    ranks = sorted(
        (s["process"]["rank"], s["process"]["local_rank"], s["process"]["world_size"]) for s in state.snapshots
    )
    assert ranks == [(0, 0, 3), (1, 1, 3), (2, 2, 3)]
    (event,) = state.events
    assert event["process"]["rank"] == 1  # the OOM is attributed to the rank that had it, only
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    reg.register(SpoolCollector(spool))
    for rank in range(3):
        labels = {
            "rank": str(rank),
            "local_rank": str(rank),
            "device": "0",
            "gpu_uuid": "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd",
        }
        assert reg.get_sample_value("oomsight_oom_events_total", labels) == (1 if rank == 1 else 0)
        assert reg.get_sample_value("oomsight_torch_allocated_bytes", labels) == (rank + 1) << 30


PROFILED_WORKER = """
import os, sys, time
sys.path.insert(0, {tests!r})
import torch, torch.distributed as dist
from fakes import GIB, FakeCuda
from oomsight.config import Settings
from oomsight.hook.runtime import Hook
from oomsight.wire.spool import SpoolReader

dist.init_process_group("gloo")
rank = dist.get_rank()
cuda = FakeCuda()
cuda.set(0, allocated=GIB, reserved=GIB)
hook = Hook(Settings().replace(spool_dir={spool!r}, termination_message_path=""), cuda, None, torch)
hook.start()
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 64)
end, step = time.time() + 90, 0
while time.time() < end:
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
    step += 1
    time.sleep(0.01 * (1 + 3 * rank))  # rank 1 is four times slower: windows align by step, not time
    if step % 10 == 0 and len(SpoolReader({spool!r}).read().profiles) >= 2:
        break
hook.stop()
dist.destroy_process_group()
print("rank %d steps %d" % (rank, step))
"""


@pytest.mark.e2e
@pytest.mark.parametrize("memory_only", [False, True])
def test_a_profile_request_profiles_every_rank_over_the_same_steps(tmp_path, memory_only):
    from procs import wait_for

    spool = str(tmp_path / "spool")
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(PROFILED_WORKER.format(tests=os.path.join(ROOT, "tests"), spool=spool)))
    job = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # ask once both ranks are well under way, rank 0 far ahead of rank 1
        wait_for(lambda: sorted(s["steps"]["count"] for s in SpoolReader(spool).read().snapshots)[:1] >= [40], 60)
        cmd = [sys.executable, "-m", "oomsight", "profile", "--spool", spool, "--steps", "3", "--wait", "60"]
        asked = subprocess.run(cmd + (["--memory-only"] if memory_only else []), capture_output=True, text=True)
    finally:
        out = job.communicate(timeout=120)[0]
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert job.returncode == 0, out
    profiles = sorted(SpoolReader(spool).read().profiles, key=lambda p: p["process"]["rank"])
    assert [p["process"]["rank"] for p in profiles] == [0, 1]
    assert len({p["request_id"] for p in profiles}) == 1
    assert {(p["start_step"], p["steps"]) for p in profiles} == {(profiles[0]["start_step"], 3)}
    assert profiles[0]["start_step"] > 100  # planned ahead of the fastest rank, not "now"
    assert abs(profiles[0]["started_at"] - profiles[1]["started_at"]) > 0.05  # same step, different times
    assert all(p.get("cuda_time", True) is not memory_only for p in profiles)
    assert all(p["top_by_memory"] and p["table_artifact"] and p["trace_artifact"] for p in profiles)
