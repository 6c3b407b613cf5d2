"""Rank bodies for the distributed jobs of the job space (``tests/jobspace.py``): one group of 2 gloo
ranks runs several jobs in turn, each rank writing its outcomes to ``rank<r>.json``."""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))

import jobspace

GROUP_TIMEOUT_SECONDS = 60
"""A rank that fails while the other waits in a collective: gloo gives up after this long."""


def spawn(jobs: list[str], out: str, timeout_seconds: float = 900.0) -> list[list[dict[str, Any]]]:
    """Run ``jobs`` (their ids) on 2 spawned ranks; each rank's outcomes, in order."""
    context = torch.multiprocessing.spawn(run, args=(jobspace.WORLD, out, jobs), nprocs=jobspace.WORLD, join=False)
    deadline = time.monotonic() + timeout_seconds
    try:
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                break
    except Exception as exc:  # a rank died: the outcomes written so far stand, the rest are missing
        print(f"jobspace: a rank group died: {exc}", file=sys.stderr)
    for p in context.processes:
        if p.is_alive():
            p.kill()
    found = []
    for rank in range(jobspace.WORLD):
        path = os.path.join(out, f"rank{rank}.json")
        if not os.path.exists(path):
            found.append([])
            continue
        with open(path) as fh:
            found.append(json.load(fh))
    return found


def run(rank: int, world: int, out: str, jobs: list[str]) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{out}/store",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_SECONDS),
    )
    outcomes = []
    path = os.path.join(out, f"rank{rank}.json")
    for text in jobs:
        outcome = jobspace.run(jobspace.Job.parse(text), rank, dist.group.WORLD, out)
        outcomes.append(outcome.as_dict())
        with open(path + ".tmp", "w") as fh:
            json.dump(outcomes, fh)
        os.replace(path + ".tmp", path)
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # gloo's threads at interpreter teardown now and then abort the process (tests/layoutworker.py)
