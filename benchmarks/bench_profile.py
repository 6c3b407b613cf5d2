"""Overhead of on-demand profiling: step time before, inside and after a profiling window.

PYTHONPATH=exporter:sidecar python3 benchmarks/bench_profile.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import build, write


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--after", type=int, default=3000)
    args = p.parse_args()
    import torch

    import oomsight
    from oomsight import hook
    from oomsight.profiling import write_request

    spool = tempfile.mkdtemp()
    os.environ["OOMSIGHT_DIR"] = spool
    _, step = build(2048, 256)
    oomsight.start()
    times: list[tuple[str, float]] = []
    running = hook.current()
    assert running is not None and running.profiler is not None

    def timed(phase: str) -> None:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((phase, time.perf_counter() - t0))

    for _ in range(200):
        timed("before")
    start = running.steps.count if running.steps else 0
    write_request(spool, "bench", steps=args.window, start_step=start + 1)
    running.sampler.publish()
    while running.profiler.plan is not None or running.profiler.running is not None:
        timed("inside" if running.profiler.running is not None else "before")
    while running.profiler.finishing is not None:
        timed("finishing")
    for i in range(args.after):
        timed(f"after-{i * 10 // args.after}")  # ten buckets: does the cost decay?
    oomsight.stop()
    for _ in range(200):
        timed("stopped")
    phases = ["before", "inside", "finishing"] + [f"after-{i}" for i in range(10)] + ["stopped"]
    by = {ph: [t for p_, t in times if p_ == ph] for ph in phases}
    med = {ph: statistics.median(ts) if ts else None for ph, ts in by.items()}
    result = {
        "window_steps": args.window,
        "median_step_seconds": med,
        "steps": {ph: len(ts) for ph, ts in by.items()},
        "inside_over_before": med["inside"] / med["before"] - 1 if med["inside"] else None,
        "after_over_before": {ph: med[ph] / med["before"] - 1 for ph in phases[3:] if med[ph]},
    }
    print(result)
    write(args.out, "profile_overhead.json", result)


if __name__ == "__main__":
    main()
