"""What the hook takes from the training thread per step, by entry point, on the CPU (fakes for CUDA).

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/bench_step_hook_parts.py --out benchmarks/results

A launch-bound training step (8 x Linear 64, AdamW, batch 8: about 1-2 ms on one CPU core, all of it Python
and kernel launches) run with the real hook over a fake allocator, in interleaved rounds against the same loop
without the hook and with the hook but no step hook (``step_hook=False``: no step or forward rows, no
forward/backward watch). The training thread's CPU time (``time.thread_time``) per step is the A/B; each of the
hook's entry points (the forward pre-hook and hook, the pre-hook on the output's ``grad_fn`` that tells what a
backward consumed, the backward's end callback, the optimizer's pre- and post-step hooks) is then timed by a
wrapper over 3,000 steps, its microseconds per step. On the GPU, ``bench_overhead.py --models launch_bound``
(wall and process CPU) and ``profile_hook_steps.py`` (by function) measure the whole.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from common import summary, write

VARIANTS = ("baseline", "oomsight_defaults", "oomsight_no_step_hook")


def _loop() -> Callable[[], None]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(8)])
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(8, 64)

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _hook(variant: str) -> Any:
    import torch

    from oomsight.config import Settings
    from oomsight.hook.runtime import Hook

    from fakes import GIB, FakeCuda

    cuda = FakeCuda(total=80 * GIB)
    cuda.set(0, allocated=GIB, reserved=2 * GIB)
    settings = Settings().replace(spool_dir=tempfile.mkdtemp(prefix="oomsight-parts-"), termination_message_path="")
    if variant == "oomsight_no_step_hook":
        settings = settings.replace(step_hook=False)
    hook = Hook(settings, cuda, None, torch=torch)
    for part in (hook.forwards, hook.steps):
        if part is not None:
            part.device_type = "cpu"  # the model's tensors count as device 0's
    hook.start()
    return hook


def ab(step: Callable[[], None], rounds: int, steps: int) -> dict[str, list[float]]:
    per_step: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        for variant in VARIANTS[r % 3 :] + VARIANTS[: r % 3]:
            hook = _hook(variant) if variant != "baseline" else None
            for _ in range(60):  # the first walk and the job probe's window come in the first steps
                step()
            t0 = time.thread_time()
            for _ in range(steps):
                step()
            per_step[variant].append((time.thread_time() - t0) / steps)
            if hook is not None:
                hook.stop()
    return per_step


def parts(step: Callable[[], None], steps: int) -> dict[str, dict[str, float]]:
    """Microseconds per step spent in each entry point the hook gives torch, and the calls per step."""
    from oomsight.hook import forwards, stepmemory
    from oomsight.hook import steps as steps_mod

    spent: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    points = {
        "forward pre-hook": (forwards.BeforeForward, "__call__"),
        "forward hook (and the grad_fn pre-hook it registers)": (forwards.AfterForward, "__call__"),
        "grad_fn pre-hook: what a backward consumed": (forwards.Consumed, "__call__"),
        "backward's end callback": (forwards.ForwardMemory, "_after_backward"),
        "optimizer pre-step hook": (steps_mod.StepTracker, "pre_step"),
        "optimizer post-step hook": (steps_mod.StepTracker, "post_step"),
        "of which the step row": (stepmemory.StepMemory, "on_step"),
    }
    saved = {name: getattr(cls, attr) for name, (cls, attr) in points.items()}

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter_ns() - t
                calls[name] += 1

        return wrapper

    for name, (cls, attr) in points.items():
        setattr(cls, attr, timed(name, saved[name]))
    try:
        hook = _hook("oomsight_defaults")
        for _ in range(300):
            step()
        spent.clear()
        calls.clear()
        for _ in range(steps):
            step()
        hook.stop()
    finally:
        for name, (cls, attr) in points.items():
            setattr(cls, attr, saved[name])
    return {name: {"us_per_step": spent[name] / steps / 1000, "calls_per_step": calls[name] / steps} for name in points}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    step = _loop()
    for _ in range(300):
        step()
    per_step = ab(step, args.rounds, args.steps)
    base = statistics.median(per_step["baseline"])
    extra = {v: [(t - b) * 1e6 for t, b in zip(per_step[v], per_step["baseline"])] for v in VARIANTS[1:]}
    results = {
        "seconds_per_step": {v: summary(vals) for v, vals in per_step.items()},
        "extra_microseconds_per_step": {v: summary(vals) for v, vals in extra.items()},
        "extra_share_of_baseline_step": {v: statistics.median(vals) / (base * 1e6) for v, vals in extra.items()},
        "entry_points": parts(step, 3000),
    }
    for v, s in results["extra_microseconds_per_step"].items():
        print(f"{v}: +{s['median']:.1f} us a step (baseline {base * 1e6:.0f} us)")
    for name, p in results["entry_points"].items():
        print(f"  {name}: {p['us_per_step']:.1f} us a step ({p['calls_per_step']:.2f} calls)")
    write(args.out, "step_hook_parts_cpu.json", {"benchmark": "bench_step_hook_parts", "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
