"""The demo's training job (needs a CUDA GPU): trains an MLP, then leaks the outputs of
an un-``no_grad`` evaluation with their autograd graph until CUDA runs out of memory.

The OOM is deliberate. A per-process memory cap (``DEMO_MEMORY_FRACTION``, default
0.05 of the device) makes it come within seconds on any GPU size.
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn


def main() -> None:
    fraction = float(os.environ.get("DEMO_MEMORY_FRACTION", "0.05"))
    train_seconds = float(os.environ.get("DEMO_TRAIN_SECONDS", "8"))
    torch.cuda.set_per_process_memory_fraction(fraction)
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(2048, 2048), nn.GELU()]
    model = nn.Sequential(*layers).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(256, 2048, device="cuda")
    val = torch.randn(64, 2048, device="cuda")

    def step() -> None:
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    print(f"demo: training for {train_seconds:.0f} s under a {fraction:.0%} memory cap", flush=True)
    end = time.time() + train_seconds
    while time.time() < end:
        step()
    torch.cuda.synchronize()
    print("demo: now leaking evaluation outputs with their graph (no torch.no_grad())", flush=True)
    kept = []
    while True:  # ends with torch.cuda.OutOfMemoryError, on purpose
        step()
        kept.append(model(val))  # the classic leak: the graph keeps every activation alive
        time.sleep(0.01)


if __name__ == "__main__":
    main()
