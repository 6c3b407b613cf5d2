"""The space of jobs (``tests/jobspace.py``) run through the real hook, each to its OOM, with the
invariants of issue 33 checked on every job: violations grouped by what broke, each group with its
smallest reproducing job (the fewest axes away from the first value of each axis).

    .venv/bin/python benchmarks/bench_job_space.py                 # the whole space (long)
    .venv/bin/python benchmarks/bench_job_space.py --single 600 --distributed 60
    .venv/bin/python benchmarks/bench_job_space.py --only generate,trainer_eval --single 20 --distributed 4 \
        --out benchmarks/results/job_space_issue48.json     # jobs with one of these values (any axis)

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


FACTS = ("cause", "remedies", "module_training", "module_frozen", "grad_enabled", "error")
"""What a violating job's event says, beside its violations (``--facts``)."""


def facts(o: dict[str, Any], found: dict[str, str]) -> dict[str, Any]:
    """One violating outcome: its event's key facts and what broke (each text cut to 300 characters)."""
    consumption = o.get("consumption") or {}
    return {
        "job": o["job"],
        "rank": o["rank"],
        **{k: o.get(k) for k in FACTS},
        "forwards_since_backward": consumption.get("forwards_since_backward"),
        "most_forwards_per_backward": consumption.get("most_forwards_per_backward"),
        "summary": o.get("summary", "")[:300],
        "violations": {k: v[:300] for k, v in found.items()},
    }


def verdicts(outcomes: list[dict[str, Any]], values: frozenset[str]) -> dict[str, dict[str, int]]:
    """Per value named: how often each (cause, first remedy) came, over every rank's outcome."""
    found: dict[str, collections.Counter[str]] = {v: collections.Counter() for v in sorted(values)}
    for o in outcomes:
        first = (o.get("remedies") or [None])[0]
        for v in jobspace.Job.parse(o["job"]).values & values:
            found[v][f"{o.get('cause')} / {first}" if not o.get("error") else "error"] += 1
    return {v: dict(c.most_common()) for v, c in found.items()}


def report(
    outcomes: list[dict[str, Any]],
    seconds: float,
    planned: int,
    with_facts: bool = False,
    values: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    by_invariant: collections.Counter[str] = collections.Counter()
    listed: list[dict[str, Any]] = []
    groups: dict[str, dict[str, Any]] = {}
    jobs_violating: set[str] = set()
    for o in outcomes:
        job = jobspace.Job.parse(o["job"])
        found = jobspace.violations(job, jobspace.Outcome(**o))
        if found and with_facts:
            listed.append(facts(o, found))
        for invariant, text in found.items():
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
        **({"violating_outcomes": listed} if with_facts else {}),
        **({"cause_first_remedy_by_value": verdicts(outcomes, values)} if values else {}),
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
    parser.add_argument("--only", default="", help="comma-separated axis values: only jobs with one of them")
    parser.add_argument("--facts", action="store_true", help="list every violating job with its event's facts")
    args = parser.parse_args()
    only = frozenset(v for v in args.only.split(",") if v)
    space = [j for j in jobspace.space() if not only or j.values & only]
    pick = {"compiled_at_most": args.compiled_at_most, "slow_at_most": args.slow_at_most, "only": only}
    single = jobspace.sample(args.single, args.seed, False, **pick) if args.single else [
        j for j in space if not j.distributed
    ]
    dist = jobspace.sample(args.distributed, args.seed, True, **pick) if args.distributed else [
        j for j in space if j.distributed
    ]
    started = time.perf_counter()
    outcomes = run_single(single, args.workers) + run_distributed(dist, args.per_group)
    found = report(outcomes, time.perf_counter() - started, len(single) + len(dist), args.facts, only)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(found, fh, indent=1)
        fh.write("\n")
    print(json.dumps({k: found[k] for k in ("outcomes", "jobs_with_violations", "seconds", "violations_by_invariant")}))
    for key, g in found["violations"].items():
        print(f"{g['jobs']:5d}  {key:60s} {g['minimal']}")


if __name__ == "__main__":
    main()
