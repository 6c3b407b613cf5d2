"""How fast the step-row leak verdict (``analysis.trend``) fires on leaks, and how often on noise.

    PYTHONPATH=exporter python3 benchmarks/bench_leak_detection.py [--out benchmarks/results]

Synthetic step rows ``[step, time, floor, peak, reserved, exact]``, judged as the hook judges them:
at every new row (the sampler re-judges each publish). Cases:

- ``noise``: floors ±400 MiB of Gaussian noise around a flat level (what a variable-length batch's
  outputs kept across the boundary do), peaks 6 GiB above; 1000 runs of 10..200 rows: any flag at any
  row is a false flag.
- ``noisy_leak``: the same noise on a 128 MiB-a-step leak (50 runs): the first step flagged.
- ``clean_leak``: 128 MiB a step, no noise; ``stairs``: 1 GiB every 10 steps, from the start and after
  150 steady steps; ``warm_up``: a floor that rises 300 MiB a step for 8 steps, then stays (lazily
  created optimizer state): flags while it rises and whether the flag is still up at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

from oomsight.analysis import trend

GIB, MIB = 1 << 30, 1 << 20


def rows(floors: list[float], peaks: list[float]) -> list[list[float]]:
    return [[i + 1, 100.0 + i * 0.1, f, p, p, 1] for i, (f, p) in enumerate(zip(floors, peaks))]


def noisy(rng: random.Random, n: int, slope: float) -> tuple[list[float], list[float]]:
    floors = [5 * GIB + i * slope + rng.gauss(0, 400 * MIB) for i in range(n)]
    return floors, [f + 6 * GIB + rng.gauss(0, 200 * MIB) for f in floors]


def flags(floors: list[float], peaks: list[float], capacity: int) -> list[bool]:
    return [trend.analyse(rows(floors[:k], peaks[:k]), capacity).leak for k in range(1, len(floors) + 1)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = ap.parse_args()
    t0 = time.time()
    runs = [noisy(random.Random(seed), random.Random(seed).randint(10, 200), 0) for seed in range(1000)]
    false_runs = sum(any(flags(f, p, 24 * GIB)) for f, p in runs)
    delays = sorted(trend.first_leak_step(rows(*noisy(random.Random(s), 150, 128 * MIB)), 80 * GIB) or -1
                    for s in range(50))
    clean = [5 * GIB + i * 128 * MIB for i in range(60)]
    stairs = [5 * GIB + (i // 10) * GIB for i in range(80)]
    late = [5 * GIB] * 150 + stairs
    warm = [5 * GIB + min(i, 8) * 300 * MIB for i in range(100)]
    warm_flags = flags(warm, [f + 4 * GIB for f in warm], 80 * GIB)
    result = {
        "benchmark": "bench_leak_detection",
        "noise": {"runs": len(runs), "runs_with_a_false_flag": false_runs},
        "noisy_leak_first_step": {"runs": len(delays), "min": delays[0], "median": delays[len(delays) // 2],
                                  "max": delays[-1], "never": delays.count(-1)},
        "clean_leak_first_step": trend.first_leak_step(rows(clean, [f + 4 * GIB for f in clean]), 80 * GIB),
        "stairs_first_step": trend.first_leak_step(rows(stairs, [f + 4 * GIB for f in stairs]), 80 * GIB),
        "stairs_after_150_steady_first_step": trend.first_leak_step(rows(late, [f + 4 * GIB for f in late]), 80 * GIB),
        "warm_up": {"rows_flagged": sum(warm_flags), "flag_at_end": warm_flags[-1]},
        "seconds": round(time.time() - t0, 1),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "leak_detection.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
