"""Run the labelled scenario corpus on a GPU, each scenario under ``oomsight run --tape``.

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/corpus/run.py --out DIR [--jobs 4] [--only a,b]
    ... run.py --script cluster --out DIR                  # the cluster-job scenarios (cluster.py), one GPU
    ... run.py --script multigpu --nproc N --out DIR       # DDP / FSDP2 / ZeRO under torchrun, N GPUs a run
    ... run.py --script cluster --cpu-smoke --bare --out DIR   # the same loop on a CPU, tiny shapes

For every scenario: the plain run (its tape ``DIR/<name>.tape.jsonl.gz``) and, for those that
ended in an OOM, the run with its label's remedy applied (``--remedy``). ``DIR/runs.json``
lists exit codes, whether each printed FITS, and seconds. Scenarios that fill the real device
(other_process, non_pytorch_memory) run alone, after the capped ones; with ``--nproc`` every run
takes all the GPUs, so runs go one at a time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
from typing import NamedTuple, Optional, Union

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scenarios.py")
REMEDY_KEYS: dict[str, str] = {}
ALONE_LABELS = ("other_process", "non_pytorch_memory")
"""Scenarios with these labels fill the real device: they run alone, after the capped ones."""


def scenarios(script: str = SCRIPT) -> list[tuple[str, str, str]]:
    """``(name, true cause, remedy key)`` of every scenario ``script --list`` prints."""
    out = subprocess.run([sys.executable, script, "--list"], capture_output=True, text=True)
    return [tuple(line.split()) for line in out.stdout.splitlines() if line.strip()]  # type: ignore[misc]


class Launch(NamedTuple):
    """How each scenario run starts (a named tuple, not a dataclass: heldout/run.py loads this file
    by path, without a module in sys.modules, which a dataclass needs)."""

    script: str = SCRIPT
    bare: bool = False
    """Without oomsight: outcomes and times only."""
    nproc: int = 0
    """Above 0: under ``torch.distributed.run --standalone`` with this many processes."""
    cpu_smoke: bool = False
    """Pass ``--cpu-smoke`` (tiny shapes on the CPU) to the scenario."""
    timeout_seconds: float = 240.0


def scenario_command(name: str, remedy: bool, launch: Launch) -> list[str]:
    cmd = [sys.executable]
    if launch.nproc:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={launch.nproc}"]
    cmd += [launch.script, name] + (["--remedy"] if remedy else [])
    return cmd + (["--cpu-smoke"] if launch.cpu_smoke else [])


def run_one(out_dir: str, name: str, remedy: bool, launch: Union[Launch, str] = SCRIPT) -> dict[str, object]:
    """One run of ``script NAME [--remedy]`` under ``oomsight run --tape`` (``launch.bare``: without it)."""
    launch = Launch(script=launch) if isinstance(launch, str) else launch
    tag = f"{name}.remedy" if remedy else name
    spool = os.path.join(out_dir, "spools", tag)
    cmd = [sys.executable, "-m", "oomsight", "run", "--port", "0", "--no-report", "--spool", spool]
    if not remedy:
        cmd += ["--tape", os.path.join(out_dir, f"{name}.tape.jsonl.gz")]
    cmd = [] if launch.bare else [*cmd, "--"]
    cmd += scenario_command(name, remedy, launch)
    env = {**os.environ, "OOMSIGHT_PUBLISH_INTERVAL_SECONDS": "0.5"}
    if remedy and REMEDY_KEYS.get(name) == "expandable":
        env["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=launch.timeout_seconds, env=env)
        rc, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, text = -1, f"timeout: {exc}"
    facts = [line.split("{", 1)[-1] for line in text.splitlines() if line.startswith("FACTS ") and "{" in line]
    return {
        "scenario": name,
        "remedy": remedy,
        "rc": rc,
        "fits": "FITS" in text,
        "facts": json.loads("{" + facts[-1]) if facts else None,
        "seconds": round(time.time() - t0, 1),
        "tail": text[-1500:],
    }


def main(argv: Optional[list[str]] = None, script: str = SCRIPT) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--only", default="")
    ap.add_argument("--no-remedy", action="store_true", help="only the plain runs (re-record tapes)")
    ap.add_argument("--bare", action="store_true", help="without oomsight: check outcomes and times only")
    ap.add_argument("--script", default=script, help="scenarios.py (default), cluster, multigpu or a path")
    ap.add_argument("--nproc", type=int, default=0, help="launch each run with torchrun, N processes")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU (scripts that have it)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds a run may take")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    script = args.script if os.path.sep in args.script else os.path.join(HERE, args.script.removesuffix(".py") + ".py")
    launch = Launch(script, args.bare, args.nproc, args.cpu_smoke, args.timeout)
    jobs = 1 if args.nproc else args.jobs
    wanted = set(filter(None, args.only.split(",")))
    found = scenarios(script)
    REMEDY_KEYS.update({n: key for n, _label, key in found})
    with open(os.path.join(args.out, "labels.json"), "w") as fh:  # for evaluate.py
        json.dump({n: [label, key] for n, label, key in found}, fh, indent=1)
    todo = [(n, label) for n, label, _key in found if not wanted or n in wanted]
    labels = dict(todo)
    runs: list[dict[str, object]] = []

    def batch(items: list[tuple[str, bool]], jobs: int) -> None:
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            for r in pool.map(lambda it: run_one(args.out, *it, launch=launch), items):
                r["label"] = labels[str(r["scenario"])]
                runs.append(r)
                print(json.dumps({k: v for k, v in r.items() if k != "tail"}), flush=True)
                with open(os.path.join(args.out, "runs.json"), "w") as fh:
                    json.dump(runs, fh, indent=1)

    capped = [n for n, label in todo if label not in ALONE_LABELS]
    alone = [n for n, label in todo if label in ALONE_LABELS]
    batch([(n, False) for n in capped], jobs)
    if not args.no_remedy:
        batch([(n, True) for n in capped if labels[n] != "none"], jobs)
    for n in alone:
        batch([(n, False)], 1)
        batch([(n, True)], 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
