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

from oomsight.collector import SpoolCollector
from oomsight.spool import SpoolReader

from fakes import ROOT

WORKER = """
import os, sys
sys.path.insert(0, {tests!r})
import torch, torch.distributed as dist
from fakes import GIB, FakeCuda
from oomsight.config import Settings
from oomsight.hook import Hook

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.tensor([float(rank)])
dist.all_reduce(t)
cuda = FakeCuda()
cuda.set(0, allocated=(rank + 1) * GIB, reserved=(rank + 2) * GIB)
hook = Hook(Settings(spool_dir={spool!r}, termination_message_path=""), cuda, None)
hook.sampler.tick()
if rank == 1:
    cuda.observer = None
    hook.start()  # attaches the observer on the fake
    cuda.observer(0, 50 * GIB, 140 * GIB, GIB)
hook.at_exit()
dist.destroy_process_group()
print("rank", rank, "sum", t.item())
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
