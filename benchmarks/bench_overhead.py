"""Step overhead of oomsight against a baseline in the same process, interleaved rounds.

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/bench_overhead.py --out benchmarks/results

For each model (GPU-bound and launch-bound) and round, every variant runs the same
number of steps in a shuffled order; the overhead of a variant is its time per step
over the baseline's of the same round, minus one. Reported: median and spread, for wall
time and for the process's CPU time (all threads), both taken over the same steps.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import EVAL_MODELS, MODELS, build, summary, time_steps, write

import oomsight

VARIANTS = {
    "baseline": None,
    "oomsight_defaults": {},
    "oomsight_history_state": {"record_history": True, "history_mode": "state"},
    "oomsight_history_all": {"record_history": True, "history_mode": "all"},
    # the sampler at 100x its default rate: its cost per tick, amplified out of the noise
    "oomsight_sample_1khz": {"sample_interval_seconds": 0.001},
    # no step hook and so no forward rows: beside oomsight_defaults on an evaluation loop, the forward hook's cost
    "oomsight_no_step_hook": {"step_hook": False},
}


def run(rounds: int, warmup: int, models: list[str], variants: list[str], steps: int = 0) -> dict[str, object]:
    """Every variant of ``variants`` (the first is the baseline) once per round, shuffled."""
    os.environ["OOMSIGHT_DIR"] = tempfile.mkdtemp(prefix="oomsight-bench-")
    rng = random.Random(0)
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 4:
        os.sched_setaffinity(0, {2, 3})  # less migration noise; the sampler shares the cores
    results: dict[str, object] = {}
    for name in models:
        spec = {**MODELS, **EVAL_MODELS}[name]
        n = steps or spec["steps"]
        _, step = build(spec["width"], spec["batch"], bool(spec.get("train", True)))
        for _ in range(3 * warmup):
            step()
        wall: dict[str, list[float]] = {v: [] for v in variants}
        cpu: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(rounds):
            order = list(variants)
            rng.shuffle(order)
            for variant in order:
                settings = VARIANTS[variant]
                oomsight.stop()
                if settings is not None:
                    oomsight.start(**settings)
                for _ in range(warmup):
                    step()
                w, c = time_steps(step, n)
                wall[variant].append(w)
                cpu[variant].append(c)
            oomsight.stop()
        results[name] = {
            "steps_per_measurement": n,
            "seconds_per_step": {v: summary(ts) for v, ts in wall.items()},
            "overhead_ratio": _ratios(wall, variants[0]),
            "cpu_seconds_per_step": {v: summary(ts) for v, ts in cpu.items()},
            "cpu_overhead_ratio": _ratios(cpu, variants[0]),
            "raw_seconds_per_step": wall,
            "raw_cpu_seconds_per_step": cpu,
        }
        for clock in ("overhead_ratio", "cpu_overhead_ratio"):
            got = results[name][clock]  # type: ignore[index]
            print(name, clock, {v: round(r["median"] * 100, 3) for v, r in got.items()}, "% median")
    return results


def _ratios(per_round: dict[str, list[float]], baseline: str) -> dict[str, dict[str, float]]:
    """Each variant's time over the baseline's of the same round, minus one."""
    base = per_round[baseline]
    return {v: summary([t / b - 1 for t, b in zip(ts, base)]) for v, ts in per_round.items() if v != baseline}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--name", default="overhead.json", help="file name of the result under --out")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--steps", type=int, default=0, help="steps per measurement (default: the model's own)")
    p.add_argument(
        "--models", default=",".join(MODELS), help=f"comma-separated subset of the models, or {', '.join(EVAL_MODELS)}"
    )
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, the baseline first")
    args = p.parse_args()
    variants = args.variants.split(",")
    if variants[0] != "baseline" or not set(variants) <= set(VARIANTS):
        p.error(f"--variants: the first must be baseline, all of {', '.join(VARIANTS)}")
    doc = {
        "rounds": args.rounds,
        "models": {**MODELS, **EVAL_MODELS},
        "variants": variants,
        "results": run(args.rounds, args.warmup, args.models.split(","), variants, args.steps),
    }
    write(args.out, args.name, doc)


if __name__ == "__main__":
    main()
