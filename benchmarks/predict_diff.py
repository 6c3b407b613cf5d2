"""Where a prediction and the GPU disagree: the tensors alive at each one's peak, by size.

Runs one configuration of ``bench_predict.py`` on the GPU with the allocator's history
(Python stacks), finds the measured peak, and lists the blocks alive there; traces the
same steps on the CPU and lists the allocations alive at the predicted peak. Sizes are
rounded as the allocator rounds them (512 B), so a size the GPU holds more often than
the trace names the missing (or extra) tensors; the GPU side carries the stack frames.
The trace includes the cuBLAS workspaces the prediction adds, so those match.

``--kernels`` also measures, op by op over one warmed-up step on the GPU, what each ATen
call allocates and frees inside itself (the peak of the call above what it leaves), beside
what ``oomsight.predict.kernels`` models for the same call: kernel-private memory
that no trace sees, found by op rather than by model.

    python3 benchmarks/predict_diff.py --config vit_b_16-fp32-adamw --out DIR [--kernels]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_predict
import predict_worker


def _round(size: int) -> int:
    return max(512, (size + 511) // 512 * 512)


def _alive_at_peak(events: list[tuple[int, int]]) -> list[int]:
    """``events``: (+key, size) births and (-key, 0) deaths; the sizes alive at the peak."""
    alive: dict[int, int] = {}
    now = peak = 0
    best: dict[int, int] = {}
    for key, size in events:
        if key > 0:
            alive[key] = size
            now += size
            if now > peak:
                peak, best = now, dict(alive)
        else:
            now -= alive.pop(-key, 0)
    return sorted(best.values(), reverse=True)


def _peak_blocks(trace: list[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
    """The allocator's events in order; the blocks alive when the allocated total peaked."""
    alive: dict[int, dict[str, Any]] = {}  # by address: an address is reused after its free
    now = peak = 0
    best: list[dict[str, Any]] = []
    for e in trace:
        if e["action"] == "alloc":
            alive[e["addr"]] = e
            now += e["size"]
            if now > peak:
                peak, best = now, list(alive.values())
        elif e["action"] == "free_completed" and e["addr"] in alive:
            now -= alive.pop(e["addr"])["size"]
    return peak, best


def gpu_side(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch

    s = predict_worker._setup(cfg)
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    predict_worker._run_steps(s, cfg["batch"])
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, blocks = _peak_blocks(snap["device_traces"][0])
    frames: dict[str, list[str]] = {}
    for e in blocks:
        where = [f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']} {f['name']}" for f in e.get("frames", [])]
        frames.setdefault(str(_round(e["size"])), [w for w in where if "torch/" not in w][:6] or where[:6])
    return {"peak": peak, "sizes": sorted((e["size"] for e in blocks), reverse=True), "frames": frames}


def cpu_side(cfg: dict[str, Any]) -> dict[str, Any]:
    from oomsight.predict import tracing
    from oomsight.predict.predictor import workspace_default

    s = predict_worker._setup(cfg)
    spec = s["spec"]
    trace = tracing.trace_steps(
        spec.build, lambda: spec.batch(cfg["batch"], "cpu"), lambda m: s["optimizer"](m.parameters()), s["step"],
        steps=predict_worker.STEPS, workspace_bytes=workspace_default((9, 0)),
    )  # fmt: skip
    sizes = _alive_at_peak([(k, _round(v)) if k > 0 else (k, v) for k, v in trace.events])
    return {"peak": sum(sizes), "sizes": sizes}


def kernel_meter(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Per ATen op of one warmed-up step on the GPU: the most it allocated and freed inside
    one call (peak during the call above what the call leaves), and what the model says."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from oomsight.predict import kernels

    seen: dict[str, dict[str, Any]] = {}

    class Meter(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = func(*args, **(kwargs or {}))
            private = torch.cuda.max_memory_allocated() - max(before, torch.cuda.memory_allocated())
            modelled = sum(kernels.private_bytes(func, args))
            row = seen.setdefault(str(func), {"op": str(func), "calls": 0, "max_private": 0, "max_modelled": 0})
            row["calls"] += 1
            if private > row["max_private"]:
                shapes = [(list(a.shape), str(a.dtype), list(a.stride())) for a in args if isinstance(a, torch.Tensor)]
                row.update(max_private=private, args=shapes[:4])
            row["max_modelled"] = max(row["max_modelled"], modelled)
            return out

    s = predict_worker._setup(cfg)
    spec = s["spec"]
    with torch.device("cuda"):
        model = spec.build()
    optimizer, batch = s["optimizer"](model.parameters()), spec.batch(cfg["batch"], "cuda")
    s["step"](model, batch, optimizer)  # workspaces and caches made before the metered step
    with Meter():
        s["step"](model, batch, optimizer)
    rows = [r for r in seen.values() if r["max_private"] or r["max_modelled"]]
    return sorted(rows, key=lambda r: -max(r["max_private"], r["max_modelled"]))


def compare(gpu: dict[str, Any], cpu: dict[str, Any]) -> list[dict[str, Any]]:
    g = collections.Counter(_round(x) for x in gpu["sizes"])
    c = collections.Counter(cpu["sizes"])
    rows = []
    for size in set(g) | set(c):
        diff = g[size] - c[size]
        if diff:
            rows.append({"size": size, "gpu": g[size], "trace": c[size], "bytes": diff * size,
                         "frames": gpu["frames"].get(str(size), [])})  # fmt: skip
    return sorted(rows, key=lambda r: -abs(r["bytes"]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--kernels", action="store_true", help="also meter kernel-private memory op by op")
    args = p.parse_args()
    cfg = next(c for c in bench_predict.CONFIGS if c["name"] == args.config)
    os.makedirs(args.out, exist_ok=True)
    gpu = gpu_side(cfg)
    cpu = cpu_side(cfg)
    rows = compare(gpu, cpu)
    doc = {"config": cfg, "gpu_peak": gpu["peak"], "trace_peak": cpu["peak"], "differences": rows[:40]}
    with open(os.path.join(args.out, f"diff-{args.config}.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
    print(json.dumps({k: doc[k] for k in ("gpu_peak", "trace_peak")}), flush=True)
    for r in rows[:15]:
        print(r["size"], r["gpu"], r["trace"], r["bytes"], " | ".join(r["frames"][:4]), flush=True)
    if args.kernels:  # after the history: the metered step leaves workspaces behind
        metered = kernel_meter(cfg)
        with open(os.path.join(args.out, f"kernels-{args.config}.json"), "w") as fh:
            json.dump({"config": cfg, "ops": metered}, fh, indent=1)
        for k in metered[:12]:
            print("KERNEL", k["op"], k["calls"], k["max_private"], k["max_modelled"], k.get("args"), flush=True)


if __name__ == "__main__":
    main()
