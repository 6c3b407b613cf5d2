"""What measuring the layout (``oomsight.hook.layout.measure``) costs the training thread, against
the walk it replaced (the optimizers' parameters, gradients and state only), in the same run.

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/bench_layout_walk.py --out benchmarks/results

The walk runs once every ``categories_interval_seconds`` (30 s by default) in the training thread,
and once at an OOM. Its cost follows the number of tensors, not their size, so the models are
Llama-shaped stacks of small CPU tensors: a 7B-like count (32 blocks, 291 parameters) and a 70B-like
count (80 blocks, 723 parameters), trained with AdamW, with a frozen copy beside (a teacher) in the
second case. The figure that matters is the walk's time over the 30 s interval.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import write

from oomsight.hook.layout import measure

INTERVAL_SECONDS = 30.0


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=False) for _ in range(4))
        self.up, self.gate, self.down = (nn.Linear(width, width, bias=False) for _ in range(3))
        self.norm1, self.norm2 = nn.RMSNorm(width), nn.RMSNorm(width)


def model(blocks: int, width: int = 16) -> nn.Module:
    net = nn.Sequential(nn.Embedding(64, width), *[Block(width) for _ in range(blocks)], nn.Linear(width, 64))
    for p in net.parameters():
        p.grad = torch.zeros_like(p)
    return net


def old_walk(optimizers: list[Any]) -> int:
    """The walk before wire 1.6: the optimizers' parameters, gradients and state, each storage once."""
    seen: set[int] = set()
    total = 0
    for opt in optimizers:
        tensors = [t for g in opt.param_groups for p in g["params"] for t in (p, p.grad) if t is not None]
        tensors += [v for s in opt.state.values() for v in s.values() if hasattr(v, "untyped_storage")]
        for t in tensors:
            s = t.untyped_storage()
            if s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                total += s.nbytes()
    return total


def timed(fn: Callable[[], Any], rounds: int = 30) -> dict[str, float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return {"median_ms": statistics.median(times) * 1e3, "p90_ms": times[int(0.9 * len(times))] * 1e3}


def case(blocks: int, teacher: bool) -> dict[str, Any]:
    student = model(blocks)
    opt = torch.optim.AdamW(student.parameters())
    opt.step()
    roots = [student] + ([model(blocks).requires_grad_(False)] if teacher else [])
    params = sum(1 for r in roots for _ in r.parameters())
    new = timed(lambda: measure(torch, roots, [opt], "cpu"))
    old = timed(lambda: old_walk([opt]))
    return {
        "blocks": blocks,
        "teacher": teacher,
        "parameters": params,
        "measure": new,
        "old_walk": old,
        "share_of_interval": new["median_ms"] / 1e3 / INTERVAL_SECONDS,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    cases = [case(32, False), case(32, True), case(80, False), case(80, True)]
    for c in cases:
        share = 100 * c["share_of_interval"]
        print(
            f"{c['parameters']:5d} parameters (teacher {c['teacher']}): measure {c['measure']['median_ms']:.2f} ms, "
            f"old walk {c['old_walk']['median_ms']:.2f} ms, {share:.4f} % of {INTERVAL_SECONDS} s"
        )
    write(args.out, "layout_walk.json", {"interval_seconds": INTERVAL_SECONDS, "cases": cases})


if __name__ == "__main__":
    main()
