"""Shared pieces of the benchmarks: the two reference models and statistics."""

from __future__ import annotations

import json
import os
import platform
import random
import statistics
import subprocess
import time
from typing import Any

MODELS = {
    # DESIGN.md's reference: 8xLinear 2048, AdamW, batch 256 (GPU-bound, ~2.4 ms/step on an H200)
    "gpu_bound": {"width": 2048, "batch": 256, "steps": 200},
    # the same shape at 256 wide, batch 32: kernel-launch-bound, CPU time costs in full
    "launch_bound": {"width": 256, "batch": 32, "steps": 300},
}
EVAL_MODELS = {
    # the launch-bound shape as an evaluation loop: forwards with autograd recording, no optimizer
    # (oomsight rows the memory after each forward there: hook.forwards)
    "eval_launch_bound": {"width": 256, "batch": 32, "steps": 300, "train": False},
}


def build(width: int, batch: int, train: bool = True) -> tuple[Any, Any]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(8)]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device="cuda")
    if not train:

        def forward() -> None:
            model(x).square().mean()  # autograd records; the output and its graph are dropped

        return model, forward

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step.optimizer = opt  # type: ignore[attr-defined]
    return model, step


def time_steps(step: Any, n: int) -> tuple[float, float]:
    """Wall and process CPU seconds per step over ``n`` steps, synchronised at both ends.

    The CPU time is the whole process's (every thread, the sampler's included): on a
    launch-bound loop that is the cost, and it does not move with GPU clocks or with other
    tenants of the machine the way wall time does.
    """
    import torch

    torch.cuda.synchronize()
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - w0) / n, (time.process_time() - c0) / n


def summary(values: list[float]) -> dict[str, float]:
    """Median, quartiles, range and a bootstrap 95 % interval of the median."""
    vs = sorted(values)
    q = statistics.quantiles(vs, n=4) if len(vs) >= 2 else [vs[0]] * 3
    rng = random.Random(1)
    boot = sorted(statistics.median(rng.choices(vs, k=len(vs))) for _ in range(2000))
    return {
        "median": statistics.median(vs),
        "min": vs[0],
        "max": vs[-1],
        "q1": q[0],
        "q3": q[2],
        "median_ci95_low": boot[49],
        "median_ci95_high": boot[1949],
        "n": len(vs),
    }


def percentile(values: list[float], p: float) -> float:
    vs = sorted(values)
    return vs[min(len(vs) - 1, round(p / 100 * (len(vs) - 1)))]


def measure(fn: Any, n: int) -> dict[str, float]:
    """Median and p99 microseconds of one call of ``fn`` over ``n`` calls, after a warm-up."""
    for _ in range(min(n, 200)):
        fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1000.0)
    return {"median_us": percentile(samples, 50), "p99_us": percentile(samples, 99), "n": n}


def environment() -> dict[str, Any]:
    import torch

    return {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "host": platform.node(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def write(out_dir: str, name: str, doc: dict[str, Any]) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    with open(path, "w") as fh:
        json.dump({"environment": environment(), **doc}, fh, indent=1, sort_keys=True)
    print(f"wrote {path}")
    return path


def child_result(cmd: list[str], env: dict[str, str], timeout: float, tail: int = 2000) -> dict[str, Any]:
    """Run a measuring child process; its ``RESULT {json}`` line, or ``{"error": ...}`` with the end of
    its output (a fresh process per measurement: peaks from torch's own counters, nothing shared)."""
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    return {"error": (out.stderr or out.stdout)[-tail:]}
