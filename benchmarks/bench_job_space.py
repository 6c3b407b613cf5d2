"""The space of jobs (``tests/jobspace.py``) run through the real hook, each to its OOM, with the
invariants of issue 33 checked on every job: violations grouped by what broke, each group with its
smallest reproducing job (the fewest axes away from the first value of each axis).

    .venv/bin/python benchmarks/bench_job_space.py                 # the whole space (long)
    .venv/bin/python benchmarks/bench_job_space.py --single 600 --distributed 60

Single-process jobs run in ``--workers`` processes; distributed ones in groups of 2 gloo ranks.
Writes ``benchmarks/results/job_space.json``.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import platform
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "exporter"))

import jobspace  # noqa: E402

RESULT = os.path.join(ROOT, "benchmarks", "results", "job_space.json")


def _single(ids: list[str]) -> list[dict[str, Any]]:
    return [jobspace.run(jobspace.Job.parse(i)).as_dict() for i in ids]


def run_single(jobs: list[jobspace.Job], workers: int) -> list[dict[str, Any]]:
    chunks = [[j.id for j in jobs[k::workers]] for k in range(workers)]
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        return [o for found in pool.map(_single, chunks) for o in found]


def run_distributed(jobs: list[jobspace.Job], per_group: int) -> list[dict[str, Any]]:
    import jobspace_worker

    found: list[dict[str, Any]] = []
    for start in range(0, len(jobs), per_group):
        ids = [j.id for j in jobs[start : start + per_group]]
        with tempfile.TemporaryDirectory() as out:
            ranks = jobspace_worker.spawn(ids, out)
        for rank, outcomes in enumerate(ranks):
            found += outcomes
            for missing in ids[len(outcomes) :]:
                found.append(jobspace.Outcome(job=missing, rank=rank, error="the rank group died").as_dict())
    return found


def signature(invariant: str, text: str) -> str:
    """What one violation is about, to group it: the categories miscounted, the cause, the remedy."""
    if invariant == "bytes":
        return "bytes: " + ", ".join(sorted(part.split(" counted")[0] for part in text.split("; ")))
    if invariant == "cause":
        return "cause: " + text.split(" ")[0]
    if invariant in ("first_remedy", "first_fix"):
        return f"{invariant}: " + text.split(" ")[0]
    if invariant == "harness":
        return "harness: " + text.split(":")[0]
    return invariant


def distance(job: jobspace.Job) -> int:
    """Axes away from each axis' first value: the smaller, the simpler the reproduction."""
    return sum(getattr(job, axis) != values[0] for axis, values in jobspace.AXES.items())


def report(outcomes: list[dict[str, Any]], seconds: float, planned: int) -> dict[str, Any]:
    by_invariant: collections.Counter[str] = collections.Counter()
    groups: dict[str, dict[str, Any]] = {}
    jobs_violating: set[str] = set()
    for o in outcomes:
        job = jobspace.Job.parse(o["job"])
        for invariant, text in jobspace.violations(job, jobspace.Outcome(**o)).items():
            by_invariant[invariant] += 1
            jobs_violating.add(o["job"])
            key = signature(invariant, text)
            g = groups.setdefault(key, {"invariant": invariant, "jobs": 0, "minimal": None, "detail": ""})
            g["jobs"] += 1
            known = g["minimal"]
            if known is None or (distance(job), job.id) < (distance(jobspace.Job.parse(known)), known):
                g["minimal"], g["detail"], g["rank"] = job.id, text[:400], o["rank"]
    axes_counts = {
        axis: dict(collections.Counter(getattr(jobspace.Job.parse(o["job"]), axis) for o in outcomes))
        for axis in jobspace.AXES
    }
    return {
        "what": "issue 33 item 4: jobs composed from independent axes, each run through the real hook to an OOM "
        "(CPU torch, gloo where distributed); invariants checked on every job (tests/jobspace.py)",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "torch": jobspace.torch.__version__,
        "axes": {k: list(v) for k, v in jobspace.AXES.items()},
        "space_valid_jobs": len(jobspace.space()),
        "jobs_planned": planned,
        "outcomes": len(outcomes),
        "jobs_with_violations": len(jobs_violating),
        "seconds": round(seconds, 1),
        "violations_by_invariant": dict(by_invariant),
        "violations": dict(sorted(groups.items(), key=lambda kv: -kv[1]["jobs"])),
        "jobs_by_axis_value": axes_counts,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--single", type=int, default=0, help="single-process jobs sampled (0: all)")
    parser.add_argument("--distributed", type=int, default=0, help="distributed jobs sampled (0: all)")
    parser.add_argument("--seed", type=int, default=33)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--per-group", type=int, default=12)
    parser.add_argument("--compiled-at-most", type=int, default=None)
    parser.add_argument("--slow-at-most", type=int, default=None, help="jobs of each slow shape at most")
    parser.add_argument("--out", default=RESULT)
    args = parser.parse_args()
    space = jobspace.space()
    single = (
        jobspace.sample(args.single, args.seed, False, args.compiled_at_most, slow_at_most=args.slow_at_most)
        if args.single
        else [j for j in space if not j.distributed]
    )
    dist = (
        jobspace.sample(args.distributed, args.seed, True, args.compiled_at_most, slow_at_most=args.slow_at_most)
        if args.distributed
        else [j for j in space if j.distributed]
    )
    started = time.perf_counter()
    outcomes = run_single(single, args.workers) + run_distributed(dist, args.per_group)
    found = report(outcomes, time.perf_counter() - started, len(single) + len(dist))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(found, fh, indent=1)
        fh.write("\n")
    print(json.dumps({k: found[k] for k in ("outcomes", "jobs_with_violations", "seconds", "violations_by_invariant")}))
    for key, g in found["violations"].items():
        print(f"{g['jobs']:5d}  {key:60s} {g['minimal']}")


if __name__ == "__main__":
    main()
