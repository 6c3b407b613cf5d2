"""Plain torch, no oomsight: do profiling sessions one after another still see GPU work,
and what does a later step cost, with and without Kineto's CUPTI teardown?

    TEARDOWN_CUPTI=1 python3 benchmarks/cupti_sessions.py --gap-steps 200
    TEARDOWN_CUPTI=0 python3 benchmarks/cupti_sessions.py --gap-steps 0

Prints one JSON line per session (GPU kernel events seen, CPU ms per matmul launch after
it) and one final line. Used to decide oomsight's default for ``TEARDOWN_CUPTI``.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sessions", type=int, default=3)
    p.add_argument("--gap-steps", type=int, default=200, help="launches between two sessions")
    args = p.parse_args()
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(256, 256, device="cuda")

    def launches(n: int) -> float:
        """Seconds per launch of a small matmul (launch-bound: CUPTI's callbacks show)."""
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            x @ x
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / max(n, 1)

    base = min(launches(2000) for _ in range(3))
    for i in range(args.sessions):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True) as prof:
            launches(50)
        kernels = sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)
        gap = launches(args.gap_steps) if args.gap_steps else 0.0
        after = min(launches(2000) for _ in range(3))
        row = {"session": i, "gpu_events": kernels, "gap_s_per_launch": gap, "after_over_before": after / base - 1}
        print(json.dumps(row), flush=True)
    print(json.dumps({"teardown_cupti": os.environ.get("TEARDOWN_CUPTI"), "done": True}), flush=True)


if __name__ == "__main__":
    main()
