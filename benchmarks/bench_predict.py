"""Predicted vs measured peak memory of training steps, and the largest batch, on the H200.

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/bench_predict.py --out $OUT [--only a,b]

A re-check of new predictions against recorded measurements (a few minutes, see
docs/prediction.md for the command used):

    ... --measured R --reuse R --fresh a,b --diff c --deadline 300   (R: results/predict.json)

``--measured`` keeps an earlier run's measurements (only a changed predicted largest batch is
run, under the cap), ``--fresh`` measures those configurations again all the same,
``--reuse`` keeps the true largest batches (no exhaustive search), ``--diff`` runs
``predict_diff.py --kernels`` for those configurations first, and ``--deadline`` starts no
GPU work after that many seconds (the rest keep their recorded measurements, marked). The
JSON is rewritten after every configuration, so a run cut short leaves what it did.

For every configuration below:

* **predicted** (``oomsight.predict``, on this machine's CPU with the GPU hidden):
  peak allocated and reserved over 3 steps at the measured batch size, and the largest
  batch that fits the cap with ``MARGIN``;
* **measured** (a fresh process, the oomsight hook started): the same 3 steps of the same
  model on the GPU, ``torch.cuda.max_memory_allocated/reserved()``;
* **true largest batch**: under ``set_per_process_memory_fraction`` = the cap, real steps
  with real OOMs, bracketing and bisecting from a line through two measured batches; and
  whether the predicted largest batch ran without OOM.

Predictions run in a process pool beside the GPU measurements (they need no GPU).
Calibration first: the cuBLAS workspace bytes of the forward and the backward thread, and
the SDPA backend PyTorch picks, against the predictor's rules.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from predict_worker import MARGIN, STEPS, calibrate, measure, predict

# fmt: off
CONFIGS: list[dict[str, Any]] = [
    {"name": "gpt2-fp32-adamw", "model": "gpt2", "batch": 8, "cap_gib": 40},
    {"name": "gpt2-bf16-adamw", "model": "gpt2", "autocast": "bf16", "batch": 8, "cap_gib": 40},
    {"name": "gpt2-bf16-checkpointed", "model": "gpt2-checkpointed", "autocast": "bf16", "batch": 16, "cap_gib": 40},
    {"name": "gpt2-bf16-accum4", "model": "gpt2", "autocast": "bf16", "accumulation": 4, "batch": 4, "cap_gib": 40},
    {"name": "gpt2-bf16-expandable", "model": "gpt2", "autocast": "bf16", "batch": 8, "cap_gib": 40, "expandable": True},
    {"name": "llama-fp32-adamw", "model": "llama", "batch": 4, "cap_gib": 40},
    {"name": "llama-bf16-adamw", "model": "llama", "autocast": "bf16", "batch": 8, "cap_gib": 40},
    {"name": "llama-bf16-checkpointed", "model": "llama-checkpointed", "autocast": "bf16", "batch": 16, "cap_gib": 40},
    {"name": "llama-bf16-sgd", "model": "llama", "autocast": "bf16", "optimizer": "sgd", "batch": 8, "cap_gib": 40},
    {"name": "bert-fp32-adamw", "model": "bert", "batch": 16, "cap_gib": 40},
    {"name": "bert-bf16-adamw", "model": "bert", "autocast": "bf16", "batch": 32, "cap_gib": 40},
    {"name": "resnet50-fp32-sgd", "model": "resnet50", "optimizer": "sgd", "batch": 64, "cap_gib": 24},
    {"name": "resnet50-bf16-adamw", "model": "resnet50", "autocast": "bf16", "batch": 128, "cap_gib": 24},
    {"name": "vit_b_16-fp32-adamw", "model": "vit_b_16", "batch": 64, "cap_gib": 24},
    {"name": "vit_b_16-bf16-accum2", "model": "vit_b_16", "autocast": "bf16", "accumulation": 2, "batch": 64, "cap_gib": 24},
]
# fmt: on


def _worker(args: argparse.Namespace) -> None:
    cfg = json.loads(args.worker)
    result = calibrate() if cfg.get("calibrate") else measure(cfg)
    print("RESULT " + json.dumps(result), flush=True)


def _spawn(cfg: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = dict(os.environ)
    env["OOMSIGHT_DIR"] = f"/tmp/oomsight-predict-{cfg.get('name', 'calibrate')}"
    if cfg.get("expandable"):
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(cfg)]
    from common import child_result

    return child_result(cmd, env, timeout, tail=2000)


def _predict_in_pool(configs: list[dict[str, Any]]) -> dict[str, Any]:
    env_before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the pool's children must not touch the GPU
    try:  # workers start at submit, with the GPU hidden; the pool is not waited for here
        pool = concurrent.futures.ProcessPoolExecutor(max_workers=min(len(configs), os.cpu_count() or 14))
        futures = {c["name"]: pool.submit(predict, c) for c in configs}
    finally:
        if env_before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = env_before
    return futures


def _measured_rows(path: str) -> dict[str, dict[str, Any]]:
    if not path:
        return {}
    with open(path) as fh:
        return {r["config"]["name"]: r for r in json.load(fh)["rows"] if "measured" in r}


def _reused(row: Any, cfg: dict[str, Any], late: bool = False) -> dict[str, Any]:
    """An earlier run's measurements; the predicted largest batch is run only if it changed
    and exceeds the measured true largest (not when ``late``: then it stays unchecked)."""
    got = {k: row[k] for k in ("measured", "true_max_batch", "first_failing_batch", "runs")}
    ran = {b: ok for b, ok in row["runs"]}
    if cfg["predicted_max"] in ran:
        got["predicted_max_ran"] = ran[cfg["predicted_max"]]
    elif cfg["predicted_max"] <= row["true_max_batch"]:  # a smaller batch than one that ran
        got["predicted_max_ran"] = True
        got["predicted_max_ran_by"] = "at or below the measured true largest batch"
    elif late:
        got["predicted_max_ran"] = None
        got["skipped"] = "deadline: the changed predicted largest batch was not run"
    else:
        checked = _spawn({**cfg, "check_only": True}, 120)
        got["predicted_max_ran"] = checked.get("predicted_max_ran")
        got["runs"] = sorted(row["runs"] + checked.get("runs", []))
    return got


def _known_maxima(paths: str) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for path in filter(None, paths.split(",")):
        with open(path) as fh:
            for row in json.load(fh)["rows"]:
                if "true_max_batch" in row:
                    found[row["config"]["name"]] = [row["true_max_batch"], row["first_failing_batch"]]
    return found


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's figures: median |error| of peak allocated, worst under-prediction, batch checks."""
    errs = [r["error_allocated"] for r in rows if "error_allocated" in r]
    within = [r for r in rows if r.get("largest_within_10pct") is not None]
    return {
        "configurations": len(rows),
        "median_abs_error_allocated": statistics.median(abs(e) for e in errs) if errs else None,
        "worst_under_prediction_allocated": min(errs) if errs else None,
        "median_abs_error_reserved": statistics.median(abs(r["error_reserved"]) for r in rows if "error_reserved" in r)
        if errs
        else None,
        "predicted_max_ran_without_oom": sum(1 for r in rows if r.get("predicted_max_ran")),
        "predicted_max_within_10pct": sum(1 for r in within if r["largest_within_10pct"]),
    }


def _configurations(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``CONFIGS`` chosen by ``--only``, with ``--history`` and ``--reuse``'s largest batches added."""
    configs = [c for c in CONFIGS if not args.only or c["name"] in args.only.split(",")]
    configs = [{**c, "history": args.out} if c["name"] in args.history.split(",") else c for c in configs]
    known = _known_maxima(args.reuse)
    configs = [{**c, "known_max": known[c["name"]]} if c["name"] in known else c for c in configs]
    return [
        {**c, "known_max_fits": c["known_max"][0], "known_max_fails": c["known_max"][1]} if "known_max" in c else c
        for c in configs
    ]


def _row(cfg: dict[str, Any], predicted: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
    """One configuration's row: predictions, measurements and the errors between them."""
    row = {"config": cfg, **predicted, **got}
    if "measured" in got:
        pa, ma = predicted["prediction"]["peak_allocated_bytes"], got["measured"]["peak_allocated_bytes"]
        pr, mr = predicted["prediction"]["peak_reserved_bytes"], got["measured"]["peak_reserved_bytes"]
        row["error_allocated"] = (pa - ma) / ma
        row["error_reserved"] = (pr - mr) / mr
        true_max, pmax = got["true_max_batch"], cfg["predicted_max"]
        row["largest_within_10pct"] = abs(pmax - true_max) <= 0.10 * true_max
        row["predicted_max_ran"] = got["predicted_max_ran"]
    return row


def _arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--only", default="")
    p.add_argument("--worker", default=None)
    p.add_argument("--reuse", default="", help="earlier predict.json files: their true largest batches are kept")
    p.add_argument(
        "--measured", default="", help="an earlier predict.json: its measurements are kept, only predictions rerun"
    )
    p.add_argument("--fresh", default="", help="with --measured: configurations measured again all the same")
    p.add_argument("--diff", default="", help="configurations to run predict_diff.py --kernels for, into --out")
    p.add_argument("--deadline", type=float, default=0.0, help="seconds after which no GPU work starts (0: none)")
    p.add_argument("--history", default="", help="configurations whose allocator events are dumped into --out")
    return p.parse_args()


def _diffs(args: argparse.Namespace, started: float) -> dict[str, Any]:
    """``predict_diff.py --kernels`` for each ``--diff`` configuration (one process each)."""
    done: dict[str, Any] = {}
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "predict_diff.py")
    for name in filter(None, args.diff.split(",")):
        if args.deadline and time.time() - started > args.deadline / 2:
            done[name] = "skipped: half the deadline had passed"
            continue
        cmd = [sys.executable, script, "--config", name, "--out", args.out, "--kernels"]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
            done[name] = {"rc": out.returncode, "stdout": out.stdout[-4000:], "stderr": out.stderr[-2000:]}
        except subprocess.TimeoutExpired:
            done[name] = "timed out after 180 s"
        print("DIFF", name, json.dumps(done[name])[:3000], flush=True)
    return done


def _document(rows: list[dict[str, Any]], extra: dict[str, Any], started: float) -> dict[str, Any]:
    return {
        "benchmark": "bench_predict",
        "margin": MARGIN,
        "steps": STEPS,
        **extra,
        "summary": summarize(rows),
        "rows": rows,
        "seconds": round(time.time() - started, 1),
    }


def main() -> None:
    args = _arguments()
    if args.worker is not None:
        return _worker(args)
    from common import write

    configs = _configurations(args)
    earlier = _measured_rows(args.measured)
    fresh = set(filter(None, args.fresh.split(",")))
    started = time.time()
    futures = _predict_in_pool(configs)
    extra: dict[str, Any] = {"calibration": _spawn({"calibrate": True, "name": "calibrate"}, 120)}
    print("CALIBRATION", json.dumps(extra["calibration"]), flush=True)
    extra["diffs"] = _diffs(args, started)
    rows = []
    for cfg in configs:
        try:
            predicted = futures[cfg["name"]].result()
        except Exception as exc:  # a model this machine cannot build: recorded, not fatal
            rows.append({"config": cfg, "error": f"prediction failed: {type(exc).__name__}: {exc}"[:500]})
            continue
        cfg = {**cfg, "predicted_max": predicted["largest"]["max_batch_size"]}
        late = bool(args.deadline) and time.time() - started > args.deadline
        if cfg["name"] in earlier and (cfg["name"] not in fresh or late):
            got = _reused(earlier[cfg["name"]], cfg, late)
            if cfg["name"] in fresh:
                got["skipped"] = "deadline: not measured again, the recorded measurements kept"
        else:
            got = _spawn(cfg, 240)
        row = _row(cfg, predicted, got)
        rows.append(row)
        print("ROW", json.dumps({k: row.get(k) for k in ("error_allocated", "error_reserved")}), cfg["name"],
              row.get("true_max_batch"), cfg["predicted_max"], row.get("error", ""), flush=True)  # fmt: skip
        write(args.out, "predict.json", {**_document(rows, extra, started), "partial": True})
    write(args.out, "predict.json", _document(rows, extra, started))


if __name__ == "__main__":
    main()
