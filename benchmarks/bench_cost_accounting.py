"""What oomsight costs the launch-bound loop, accounted piece by piece in the same run.

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/bench_cost_accounting.py --out benchmarks/results

An A/B of wall time per step cannot resolve 0.5 % on a VM whose rounds differ by ±5 %
(``overhead-launch-bound.json``). This measures each thing oomsight adds, against the
baseline step time of the same process:

- the optimizer step hook: the registered callable timed over many calls, per step;
- the sampler thread: its own CPU time (``/proc/self/task/<tid>/schedstat``, ns on a
  CPU) over the wall time of a training stretch with the hook running. The training
  thread can lose at most that much to it (the sampler holds the GIL only while it
  runs), so ``hook + sampler`` bounds the overhead from above.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import MODELS, build, time_steps, write


def thread_cpu_ns(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/schedstat") as fh:
        return int(fh.read().split()[0])


def oomsight_threads() -> list[int]:
    return [t.native_id for t in threading.enumerate() if t.name.startswith("oomsight") and t.native_id]


def hook_seconds_per_call(running: Any, optimizer: Any, calls: int) -> float:
    """The optimizer step hook (its pre and post callables) timed over ``calls`` calls."""
    pre, post = running.steps.pre_step, running.steps.post_step
    c0 = time.perf_counter()
    for _ in range(calls):
        pre(optimizer, (), {})
        post(optimizer, (), {})
    return (time.perf_counter() - c0) / calls


def step_memory_read_seconds(running: Any) -> tuple[float, float]:
    """Seconds per step-memory read (one raw allocator call per device), and the ``min_interval``
    at most every which one happens."""
    memory, interval = running.step_memory, running.step_memory.min_interval
    memory.min_interval = 0.0
    c0 = time.perf_counter()
    for i in range(2000):
        memory.on_step(10_000 + i)
    read_seconds = (time.perf_counter() - c0) / 2000
    memory.min_interval = interval
    return read_seconds, interval


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--model", default="launch_bound", choices=list(MODELS))
    p.add_argument("--seconds", type=float, default=30.0, help="training stretch with the hook running")
    p.add_argument("--hook-calls", type=int, default=50000)
    args = p.parse_args()
    import oomsight
    from oomsight.hook import runtime as hook

    os.environ["OOMSIGHT_DIR"] = tempfile.mkdtemp(prefix="oomsight-accounting-")
    spec = MODELS[args.model]
    _, step = build(spec["width"], spec["batch"])
    for _ in range(300):
        step()
    baseline = statistics.median(time_steps(step, 200)[0] for _ in range(15))

    oomsight.start()
    running = hook.current()
    assert running is not None and running.steps is not None
    for _ in range(100):
        step()
    tids = oomsight_threads()
    cpu0, t0, steps = sum(thread_cpu_ns(t) for t in tids), time.perf_counter(), 0
    while time.perf_counter() - t0 < args.seconds:
        step()
        steps += 1
    wall = time.perf_counter() - t0
    sampler_cpu = (sum(thread_cpu_ns(t) for t in tids) - cpu0) / 1e9
    with_hook = statistics.median(time_steps(step, 200)[0] for _ in range(15))

    hook_per_call = hook_seconds_per_call(running, step.optimizer, args.hook_calls)  # type: ignore[attr-defined]
    read_seconds, interval = step_memory_read_seconds(running)
    oomsight.stop()

    hook_ratio = hook_per_call / baseline
    sampler_ratio = sampler_cpu / wall
    memory_ratio = read_seconds / max(interval, baseline)
    result = {
        "model": args.model,
        "baseline_seconds_per_step": baseline,
        "with_oomsight_seconds_per_step": with_hook,
        "stretch": {"seconds": wall, "steps": steps, "threads": len(tids)},
        "step_hook_seconds_per_call": hook_per_call,
        "step_hook_ratio": hook_ratio,
        "sampler_cpu_seconds_per_second": sampler_ratio,
        "step_memory_read_seconds": read_seconds,
        "step_memory_min_interval_seconds": interval,
        "step_memory_ratio": memory_ratio,
        "bound_ratio": hook_ratio + sampler_ratio + memory_ratio,
    }
    print({k: v for k, v in result.items() if k.endswith("ratio") or k.endswith("second")})
    write(args.out, f"cost_accounting_{args.model}.json", result)


if __name__ == "__main__":
    main()
