"""The demo's training job (needs a CUDA GPU).

``python -m oomsight.tools.demo_train`` starts two ranks on the first GPU, as a launcher
would (``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` set, no process group needed). Both
train an MLP; rank 1 then starts the classic leak — evaluation outputs kept with
their autograd graph, outside ``torch.no_grad()`` — and dies of a CUDA OOM, while
rank 0 trains on and exits normally. The OOM is deliberate: a per-process memory cap
(``DEMO_MEMORY_FRACTION``, default 0.05 of the device) makes it come within seconds
on any GPU size.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from oomsight.config import BY_KEYWORD

ENV_WINDOW = BY_KEYWORD["window_seconds"].variable


def launch(ranks: int = 2) -> int:
    env = {
        **os.environ,
        "WORLD_SIZE": str(ranks),
        ENV_WINDOW: os.environ.get(ENV_WINDOW, "12"),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "oomsight.tools.demo_train", "--worker"],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
        )
        for r in range(ranks)
    ]
    return max(p.wait() for p in procs)


def worker() -> None:
    import torch
    from torch import nn

    rank = int(os.environ.get("RANK", "0"))
    leaks = rank == int(os.environ.get("DEMO_LEAKING_RANK", "1")) or os.environ.get("WORLD_SIZE") == "1"
    fraction = float(os.environ.get("DEMO_MEMORY_FRACTION", "0.05"))
    train_seconds = float(os.environ.get("DEMO_TRAIN_SECONDS", "10"))
    torch.cuda.set_per_process_memory_fraction(fraction)
    torch.manual_seed(rank)
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(2048, 2048), nn.GELU()]
    model = nn.Sequential(*layers).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(256, 2048, device="cuda")
    val = torch.randn(64, 2048, device="cuda")

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    print(f"demo rank {rank}: training for {train_seconds:.0f} s under a {fraction:.0%} memory cap", flush=True)
    end = time.time() + train_seconds
    while time.time() < end:
        step()
        time.sleep(0.005)
    if not leaks:
        end = time.time() + 2 * train_seconds
        while time.time() < end:
            step()
            time.sleep(0.005)
        print(f"demo rank {rank}: done", flush=True)
        return
    print(f"demo rank {rank}: now keeping evaluation outputs with their graph (no torch.no_grad())", flush=True)
    kept = []
    while True:  # ends with torch.cuda.OutOfMemoryError, on purpose
        step()
        kept.append(model(val))  # the classic leak: the graph keeps every activation alive
        time.sleep(0.02)


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker()
    else:
        sys.exit(launch())
