"""Overhead of on-demand profiling: inside the window, and after it, against a control.

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/bench_profile.py --out benchmarks/results

Each run is a fresh process (what a profile leaves behind lives in the process) that trains
the model with oomsight started: ``before`` steps, a 20-step window, the steps while the
results are built, ``after`` steps, then steps after ``oomsight.stop()``. Every phase is
divided by the same process's ``before`` median, so clocks and tenants that differ between
processes cancel. The variants, interleaved over repetitions in a shuffled order:

- ``control``: no profile at all (the same phases: drift within a process shows here);
- ``teardown_off``: a profile with ``TEARDOWN_CUPTI=0``: CUPTI stays attached afterwards,
  as Kineto does by default;
- ``teardown_on``: a profile with ``TEARDOWN_CUPTI=1`` set once oomsight has started (with
  it set at start oomsight refuses to profile: ``profiling.unavailable_reason``), so that
  Kineto detaches CUPTI when the window stops. It measures what detaching would buy.
- ``memory_only``: a memory-only window (``oomsight profile --memory-only``: the autograd
  profiler without Kineto, ``profiling.open_profiler``), ``TEARDOWN_CUPTI`` unset.
  ``results/profile_overhead_kineto_cpu_only.json`` was recorded when a memory-only window
  was a Kineto profile of CPU activity alone; its ``memory_only`` variant is that.

``--variants`` picks some; ``--name`` the result file.

``results/profile_overhead.json`` was recorded by the previous version of this script, in
which oomsight itself set ``TEARDOWN_CUPTI=1`` at the window's start: its ``oomsight``
variant is this ``teardown_on`` (each run records the value it ran with).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import MODELS, build, summary, write

VARIANTS = {"control": None, "teardown_off": "0", "teardown_on": None, "memory_only": None}
"""Each variant's TEARDOWN_CUPTI in the child's environment (None: unset)."""
PHASES = ["before", "window", "finishing", "after", "stopped"]


def child(model: str, variant: str, window: int, before: int, after: int) -> dict[str, object]:
    import torch

    import oomsight
    from oomsight.hook import runtime as hook
    from oomsight.wire.requests import write_request

    spool = tempfile.mkdtemp(prefix="oomsight-profile-bench-")
    os.environ["OOMSIGHT_DIR"] = spool
    spec = MODELS[model]
    _, step = build(spec["width"], spec["batch"])
    for _ in range(100):
        step()
    oomsight.start()
    if variant == "teardown_on":
        os.environ["TEARDOWN_CUPTI"] = "1"  # Kineto reads it when the trace stops
    running = hook.current()
    assert running is not None and running.profiler is not None and running.steps is not None
    prof = running.profiler
    times: dict[str, list[float]] = {ph: [] for ph in PHASES}

    def timed(phase: str) -> None:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times[phase].append(time.perf_counter() - t0)

    for _ in range(before):
        timed("before")
    if variant == "control":
        for _ in range(window):
            timed("window")
    else:
        cuda_time = variant != "memory_only"
        write_request(spool, "bench", steps=window, start_step=running.steps.count + 1, cuda_time=cuda_time)
        running.sampler.publish()
        while prof.plan is not None or prof.running is not None:
            timed("window" if prof.running is not None else "before")
        while prof.finishing is not None:
            timed("finishing")
    for _ in range(after):
        timed("after")
    oomsight.stop()
    for _ in range(before):
        timed("stopped")
    base = statistics.median(times["before"])
    return {
        "teardown_cupti": os.environ.get("TEARDOWN_CUPTI"),
        "window_profiler": window_profiler(torch, variant),
        "profiles_written": len(os.listdir(os.path.join(spool, "profiles"))) if variant != "control" else 0,
        "before_seconds": base,
        "steps": {ph: len(ts) for ph, ts in times.items()},
        "over_before": {ph: statistics.median(ts) / base - 1 for ph, ts in times.items() if ts and ph != "before"},
    }


def window_profiler(torch: object, variant: str) -> object:
    """Which profiler the variant's window ran (``profiling.open_profiler``'s choice)."""
    if variant == "control":
        return None
    legacy = hasattr(getattr(torch, "autograd", None), "profiler_legacy")
    return "legacy" if variant == "memory_only" and legacy else "kineto"


def run_child(args: argparse.Namespace, model: str, variant: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
    if VARIANTS[variant] is not None:
        env["TEARDOWN_CUPTI"] = VARIANTS[variant]  # type: ignore[assignment]
    cmd = [sys.executable, __file__, "--child", variant, "--models", model, "--window", str(args.window)]
    cmd += ["--before", str(args.before), "--after", str(args.after)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"{model}/{variant} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(line[len("RESULT ") :])  # type: ignore[no-any-return]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--models", default="gpu_bound,launch_bound")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--before", type=int, default=300)
    p.add_argument("--after", type=int, default=1500)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--name", default="profile_overhead.json")
    p.add_argument("--child", choices=list(VARIANTS), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.models, args.child, args.window, args.before, args.after)), flush=True)
        return
    rng = random.Random(0)
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants: {', '.join(sorted(unknown))}")
    runs: dict[str, dict[str, list[dict[str, object]]]] = {}
    for model in args.models.split(","):
        runs[model] = {v: [] for v in variants}
        for _ in range(args.reps):
            order = list(variants)
            rng.shuffle(order)
            for variant in order:
                got = run_child(args, model, variant)
                runs[model][variant].append(got)
                print(model, variant, {k: round(v * 100, 1) for k, v in got["over_before"].items()}, "%", flush=True)
    result = {"window_steps": args.window, "before": args.before, "after": args.after, "runs": runs}
    result["over_before"] = {
        model: {
            v: {
                ph: summary(vals)
                for ph in PHASES[1:]
                if (vals := [r["over_before"][ph] for r in rs if ph in r["over_before"]])
            }
            for v, rs in per.items()
        }
        for model, per in runs.items()
    }
    write(args.out, args.name, result)


if __name__ == "__main__":
    main()
