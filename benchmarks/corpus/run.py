"""Run the labelled scenario corpus on a GPU, each scenario under ``oomsight run --tape``.

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/corpus/run.py --out DIR [--jobs 4] [--only a,b]

For every scenario: the plain run (its tape ``DIR/<name>.tape.jsonl.gz``) and, for those that
ended in an OOM, the run with its label's remedy applied (``--remedy``). ``DIR/runs.json``
lists exit codes, whether each printed FITS, and seconds. Scenarios that fill the real device
(other_process, non_pytorch_memory) run alone, after the capped ones.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REMEDY_KEYS: dict[str, str] = {}
ALONE = ("another_process_holds_memory", "library_cudamalloc")


def scenarios() -> list[tuple[str, str, str]]:
    out = subprocess.run([sys.executable, os.path.join(HERE, "scenarios.py"), "--list"], capture_output=True, text=True)
    return [tuple(line.split()) for line in out.stdout.splitlines() if line.strip()]  # type: ignore[misc]


def run_one(out_dir: str, name: str, remedy: bool) -> dict[str, object]:
    tag = f"{name}.remedy" if remedy else name
    spool = os.path.join(out_dir, "spools", tag)
    cmd = [sys.executable, "-m", "oomsight", "run", "--port", "0", "--no-report", "--spool", spool]
    if not remedy:
        cmd += ["--tape", os.path.join(out_dir, f"{name}.tape.jsonl.gz")]
    cmd += ["--", sys.executable, os.path.join(HERE, "scenarios.py"), name] + (["--remedy"] if remedy else [])
    env = {**os.environ, "OOMSIGHT_PUBLISH_INTERVAL_SECONDS": "0.5"}
    if remedy and REMEDY_KEYS.get(name) == "expandable":
        env["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
        rc, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, text = -1, f"timeout: {exc}"
    return {
        "scenario": name,
        "remedy": remedy,
        "rc": rc,
        "fits": "FITS" in text,
        "seconds": round(time.time() - t0, 1),
        "tail": text[-1500:],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--only", default="")
    ap.add_argument("--no-remedy", action="store_true", help="only the plain runs (re-record tapes)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    wanted = set(filter(None, args.only.split(",")))
    found = scenarios()
    REMEDY_KEYS.update({n: key for n, _label, key in found})
    todo = [(n, label) for n, label, _key in found if not wanted or n in wanted]
    labels = dict(todo)
    runs: list[dict[str, object]] = []

    def batch(items: list[tuple[str, bool]], jobs: int) -> None:
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            for r in pool.map(lambda it: run_one(args.out, *it), items):
                r["label"] = labels[str(r["scenario"])]
                runs.append(r)
                print(json.dumps({k: v for k, v in r.items() if k != "tail"}), flush=True)
                with open(os.path.join(args.out, "runs.json"), "w") as fh:
                    json.dump(runs, fh, indent=1)

    capped = [n for n, _ in todo if n not in ALONE]
    alone = [n for n, _ in todo if n in ALONE]
    batch([(n, False) for n in capped], args.jobs)
    if not args.no_remedy:
        batch([(n, True) for n in capped if labels[n] != "none"], args.jobs)
    for n in alone:
        batch([(n, False)], 1)
        batch([(n, True)], 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
