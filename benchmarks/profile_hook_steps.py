"""Where the hook's time goes on a launch-bound loop, by function (cProfile), on the GPU machine.

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/profile_hook_steps.py --out $OUT/profile-hook-steps.json

The launch-bound model of ``bench_overhead.py`` (8 x Linear 256, AdamW, batch 32: ~2 ms a step), run as that
benchmark runs a round (``oomsight.start()``, warm-up, 100 steps, ``oomsight.stop()``), three ways: without the
hook, the first 100 steps after a start, 100 steps 2,000 steps after it, and the same without the step hook
(``step_hook=False``: no step or forward rows, no forward/backward watch). Each is profiled in the training
thread (the sampler thread's CPU is not in cProfile; the wall and process CPU per step are). The JSON keeps the
30 oomsight functions with the most cumulative time per window, and the per-step times.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import build

import oomsight


def _window(step, n: int) -> dict[str, object]:
    import torch

    torch.cuda.synchronize()
    prof = cProfile.Profile()
    w0, c0 = time.perf_counter(), time.process_time()
    prof.enable()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    prof.disable()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    stats = pstats.Stats(prof)
    rows = []
    for (filename, line, fn), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if "oomsight" in filename:
            rows.append({"function": f"{filename.split('oomsight/')[-1]}:{line}({fn})", "calls": nc,
                         "tottime_ms": round(tt * 1e3, 3), "cumtime_ms": round(ct * 1e3, 3)})
    rows.sort(key=lambda r: r["cumtime_ms"], reverse=True)
    hook_tt = sum(r["tottime_ms"] for r in rows)
    return {"steps": n, "wall_ms_per_step": wall / n * 1e3, "cpu_ms_per_step": cpu / n * 1e3,
            "oomsight_tottime_ms_per_step_profiled": hook_tt / n, "top": rows[:30]}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.environ["OOMSIGHT_DIR"] = tempfile.mkdtemp(prefix="oomsight-profile-")
    _, step = build(256, 32)
    for _ in range(300):
        step()
    out: dict[str, object] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    out["baseline"] = _window(step, 100)
    oomsight.start()
    for _ in range(30):  # bench_overhead's warm-up
        step()
    out["first_100_after_start"] = _window(step, 100)
    for _ in range(2000):
        step()
    out["steady_100"] = _window(step, 100)
    oomsight.stop()
    out["baseline_again"] = _window(step, 100)
    oomsight.start(step_hook=False)  # no step rows, no forward hook: what the forward/backward watch costs
    for _ in range(2000):
        step()
    out["steady_100_no_step_hook"] = _window(step, 100)
    oomsight.stop()
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
    for k in ("baseline", "first_100_after_start", "steady_100", "baseline_again", "steady_100_no_step_hook"):
        w = out[k]
        print(k, f"wall {w['wall_ms_per_step']:.3f} ms cpu {w['cpu_ms_per_step']:.3f} ms hook(profiled) "
              f"{w['oomsight_tottime_ms_per_step_profiled']:.3f} ms")
        for r in w["top"][:8]:
            print("   ", r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
