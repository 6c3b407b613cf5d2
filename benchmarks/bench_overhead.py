"""Step overhead of oomsight against a baseline in the same process, interleaved rounds.

    PYTHONPATH=exporter:sidecar python3 benchmarks/bench_overhead.py --out benchmarks/results

For each model (GPU-bound and launch-bound) and round, every variant runs the same
number of steps in a shuffled order; the overhead of a variant is its time per step
over the baseline's of the same round, minus one. Reported: median and spread.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import MODELS, build, summary, time_steps, write

import oomsight

VARIANTS = {
    "baseline": None,
    "oomsight_defaults": {},
    "oomsight_history_state": {"record_history": True, "history_mode": "state"},
    "oomsight_history_all": {"record_history": True, "history_mode": "all"},
}


def run(rounds: int, warmup: int, models: list[str], clock: str = "wall") -> dict[str, object]:
    os.environ["OOMSIGHT_DIR"] = tempfile.mkdtemp(prefix="oomsight-bench-")
    rng = random.Random(0)
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 4:
        os.sched_setaffinity(0, {2, 3})  # less migration noise; the sampler shares the cores
    results: dict[str, object] = {}
    for name, spec in MODELS.items():
        if name not in models:
            continue
        _, step = build(spec["width"], spec["batch"])
        for _ in range(3 * warmup):
            step()
        per_round: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _ in range(rounds):
            order = list(VARIANTS)
            rng.shuffle(order)
            for variant in order:
                settings = VARIANTS[variant]
                oomsight.stop()
                if settings is not None:
                    oomsight.start(**settings)
                for _ in range(warmup):
                    step()
                per_round[variant].append(time_steps(step, spec["steps"], clock))
            oomsight.stop()
        base = per_round["baseline"]
        results[name] = {
            "steps_per_measurement": spec["steps"],
            "seconds_per_step": {v: summary(ts) for v, ts in per_round.items()},
            "overhead_ratio": {
                v: summary([t / b - 1 for t, b in zip(ts, base)]) for v, ts in per_round.items() if v != "baseline"
            },
            "raw_seconds_per_step": per_round,
        }
        print(name, {v: round(r["median"] * 100, 3) for v, r in results[name]["overhead_ratio"].items()}, "% median")
    return results


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of the models")
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time per step, or the process's CPU time per step (all threads)",
    )
    args = p.parse_args()
    doc = {
        "rounds": args.rounds,
        "models": MODELS,
        "clock": args.clock,
        "results": run(args.rounds, args.warmup, args.models.split(","), args.clock),
    }
    write(args.out, "overhead.json" if args.clock == "wall" else "overhead-cpu-time.json", doc)


if __name__ == "__main__":
    main()
