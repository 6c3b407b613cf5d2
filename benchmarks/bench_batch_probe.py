"""The batch-size probe against the classic loops, on the same model, same process.

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/bench_batch_probe.py --out benchmarks/results

Model: 8x(Linear 2048 + GELU), AdamW, under a 4 GiB per-process cap (a small GPU). Compared:
- oomsight.probe_batch_size (3 measured batches + one check, margin 3 %),
- halve-on-OOM from 131072 (the classic retry loop; accelerate's old default),
- shrink by 0.9 on OOM from 131072 (accelerate >= 1.x default factor),
- exhaustive bisection with real OOMs: the true largest batch.
Each reports its answer, wall time and how many OOMs it provoked.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import write


def training_step() -> Callable[[int], None]:
    """Under a 4 GiB cap, one AdamW step of 8 Linear(2048) + GELU layers at a given batch size."""
    import torch
    from torch import nn

    torch.cuda.set_per_process_memory_fraction(4 * 2**30 / torch.cuda.get_device_properties(0).total_memory)
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(2048, 2048), nn.GELU()]
    model = nn.Sequential(*layers).cuda()
    opt = torch.optim.AdamW(model.parameters())

    def step(batch: int) -> None:
        opt.zero_grad(set_to_none=True)
        model(torch.randn(batch, 2048, device="cuda")).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = p.parse_args()
    import torch

    from oomsight.tools.probe import Memory, _try, probe_batch_size

    step = training_step()
    mem = Memory(torch, 0)
    ooms = [0]

    def fits(b: int) -> bool:
        ok = _try(mem, lambda: step(b)) is not None
        ooms[0] += not ok
        return ok

    def shrink(factor: float) -> int:
        b = 1 << 17
        while not fits(b):
            b = max(1, int(b * factor))
        return b

    def bisect() -> int:
        good, bad = 1, 1 << 17
        while bad - good > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if fits(mid) else (good, mid)
        return good

    advice: dict[str, object] = {}

    def probe() -> int:
        advice.update(probe_batch_size(step, start=256, margin=0.03, memory=mem))
        return int(advice["max_batch_size"])  # type: ignore[call-overload]

    results = {}
    for name, fn in (
        ("probe", probe),
        ("halve_on_oom", lambda: shrink(0.5)),
        ("shrink_0.9_on_oom", lambda: shrink(0.9)),
        ("exhaustive_bisection", bisect),
    ):
        ooms[0] = 0
        t0 = time.time()
        answer = fn()
        results[name] = {"batch": answer, "seconds": time.time() - t0, "ooms_provoked": ooms[0]}
        print(name, results[name], flush=True)
    true_max = results["exhaustive_bisection"]["batch"]
    for r in results.values():
        r["share_of_true_max"] = r["batch"] / true_max
    write(args.out, "batch_probe.json", {"cap_bytes": 4 * 2**30, "results": results, "probe_advice": advice})


if __name__ == "__main__":
    main()
