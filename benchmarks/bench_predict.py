"""Predicted vs measured peak memory of training steps, and the largest batch, on the H200.

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/bench_predict.py --out $OUT [--only a,b]

For every configuration below:

* **predicted** (``oomsight.tools.predict``, on this machine's CPU with the GPU hidden):
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
GIB = 1 << 30
MARGIN = 0.10
STEPS = 3
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


def _setup(cfg: dict[str, Any]) -> dict[str, Any]:
    import functools

    import torch

    from oomsight.tools.predict import models, tracing

    spec = models.get(cfg["model"])
    if cfg.get("optimizer") == "sgd":
        make_opt: Any = functools.partial(torch.optim.SGD, lr=0.01, momentum=0.9)
    else:
        make_opt = functools.partial(torch.optim.AdamW, lr=1e-4)
    autocast = torch.bfloat16 if cfg.get("autocast") == "bf16" else None
    step = tracing.default_step(accumulation=cfg.get("accumulation", 1), autocast=autocast)
    return {"spec": spec, "optimizer": make_opt, "step": step}


def predict(cfg: dict[str, Any]) -> dict[str, Any]:
    """The predictions of one configuration (CPU only)."""
    from oomsight.tools.predict import largest_batch, predict_peak

    s = _setup(cfg)
    spec = s["spec"]
    kwargs = {"expandable_segments": bool(cfg.get("expandable")), "steps": STEPS}
    if cfg.get("history"):
        _dump_trace(cfg)
    p = predict_peak(spec.build, lambda b: spec.batch(b, "cpu"), cfg["batch"], s["optimizer"], s["step"], **kwargs)
    search = largest_batch(
        spec.build,
        lambda b: spec.batch(b, "cpu"),
        int(cfg["cap_gib"] * GIB),
        s["optimizer"],
        s["step"],
        margin=MARGIN,
        start=max(1, cfg["batch"] // 2),
        **kwargs,
    )
    pressure = {}
    for key in ("known_max_fits", "known_max_fails"):
        b = cfg.get(key)
        if b:
            q = predict_peak(spec.build, lambda n: spec.batch(n, "cpu"), b, s["optimizer"], s["step"], **kwargs)
            pressure[key] = {"batch": b, "allocated_share_of_cap": q.peak_allocated_bytes / (cfg["cap_gib"] * GIB)}
    largest = {k: v for k, v in search.to_dict().items() if k != "prediction"}
    return {"prediction": p.to_dict(), "largest": largest, "pressure": pressure}


def _run_steps(s: dict[str, Any], batch_size: int) -> None:
    import torch

    spec = s["spec"]
    with torch.device("cuda"):
        model = spec.build()
    optimizer = s["optimizer"](model.parameters())
    batch = spec.batch(batch_size, "cuda")
    try:
        for _ in range(STEPS):
            s["step"](model, batch, optimizer)
        torch.cuda.synchronize()
    finally:
        del model, optimizer, batch


def measure(cfg: dict[str, Any]) -> dict[str, Any]:
    """Worker: the measured peaks at the batch size, then the true largest batch under the cap."""
    import gc

    import torch

    import oomsight

    oomsight.start()
    s = _setup(cfg)
    if cfg.get("check_only"):  # measured before (--measured): only run the predicted largest batch
        return _check_only(torch, s, cfg)
    torch.cuda.reset_peak_memory_stats()
    if cfg.get("history"):
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, context=None, stacks="python")
    _run_steps(s, cfg["batch"])
    if cfg.get("history"):
        _dump_history(torch, cfg)
    measured = {
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
    }
    gc.collect()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    cap = int(cfg["cap_gib"] * GIB)
    torch.cuda.set_per_process_memory_fraction(cap / total)
    runs: dict[int, bool] = {}

    def fits(b: int) -> bool:
        if b not in runs:
            try:
                _run_steps(s, b)
                runs[b] = True
            except torch.OutOfMemoryError:
                runs[b] = False
            gc.collect()
            torch.cuda.empty_cache()
        return runs[b]

    predicted_max = cfg.get("predicted_max")
    predicted_ok = fits(predicted_max) if predicted_max else None
    if cfg.get("check_only"):
        return {"predicted_max_ran": predicted_ok, "runs": sorted(runs.items())}
    if cfg.get("known_max"):  # measured by an earlier run of this script (--reuse): not searched again
        good, bad = cfg["known_max"]
    else:
        good, bad = _true_max(fits, cfg["batch"], measured["peak_reserved_bytes"], cap, predicted_max)
    return {
        "measured": measured,
        "true_max_batch": good,
        "first_failing_batch": bad,
        "predicted_max_ran": predicted_ok,
        "runs": sorted(runs.items()),
    }


def _check_only(torch: Any, s: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(int(cfg["cap_gib"] * GIB) / total)
    try:
        _run_steps(s, cfg["predicted_max"])
        ok = True
    except torch.OutOfMemoryError:
        ok = False
    return {"predicted_max_ran": ok, "runs": [[cfg["predicted_max"], ok]]}


def _dump_history(torch: Any, cfg: dict[str, Any]) -> None:
    """The allocator's own event list of the measured steps: [action, size] pairs."""
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = [[e["action"], e["size"]] for e in snap["device_traces"][0] if e["action"] in ("alloc", "free_completed")]
    with open(os.path.join(cfg["history"], f"history-{cfg['name']}.json"), "w") as fh:
        json.dump(events, fh)


def _dump_trace(cfg: dict[str, Any]) -> None:
    """The predictor's events of the same steps, to compare with the allocator's."""
    from oomsight.tools.predict import tracing

    s = _setup(cfg)
    spec = s["spec"]
    trace = tracing.trace_steps(
        spec.build, lambda: spec.batch(cfg["batch"], "cpu"), lambda m: s["optimizer"](m.parameters()), s["step"],
        steps=STEPS, workspace_bytes=0,
    )  # fmt: skip
    with open(os.path.join(cfg["history"], f"trace-{cfg['name']}.json"), "w") as fh:
        json.dump({"events": trace.events, "categories": trace.categories, "step_ends": trace.step_ends}, fh)


def _true_max(fits: Any, b0: int, peak0: int, cap: int, hint: Any) -> tuple[int, int]:
    guess = hint or max(1, int(b0 * cap / max(peak0, 1)))
    if fits(guess):
        good, b = guess, guess + max(1, guess // 20)
        while fits(b):
            good, b = b, b + max(1, (b - good) * 2)
        bad = b
    else:
        bad, b = guess, guess - max(1, guess // 20)
        while b > 1 and not fits(b):
            bad, b = b, b - max(1, (bad - b) * 2)
        good = max(1, b)
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good, bad


def calibrate() -> dict[str, Any]:
    """cuBLAS workspaces (forward thread, autograd's device thread) and the SDPA backend choice."""
    import torch

    from oomsight.tools.predict.emulation import sdpa_backend

    a = torch.randn(64, 64, device="cuda", requires_grad=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    y = a @ a
    torch.cuda.synchronize()
    forward = torch.cuda.memory_allocated() - before - y.untyped_storage().nbytes()
    before = torch.cuda.memory_allocated()
    y.sum().backward()
    torch.cuda.synchronize()
    backward = torch.cuda.memory_allocated() - before - a.grad.untyped_storage().nbytes()
    members = torch.nn.attention.SDPBackend.__members__
    names = {int(m.value): name for name, m in members.items()}
    choices = []
    for dtype, mask, kv_heads in [
        (torch.bfloat16, False, 16),
        (torch.float32, False, 16),
        (torch.bfloat16, True, 16),
        (torch.float32, True, 16),
        (torch.bfloat16, False, 4),
        (torch.float32, False, 4),
    ]:
        q = torch.randn(2, 16, 128, 64, device="cuda", dtype=dtype)
        k = torch.randn(2, kv_heads, 128, 64, device="cuda", dtype=dtype)
        m = torch.ones(2, 1, 128, 128, device="cuda", dtype=torch.bool) if mask else None
        gqa = kv_heads != 16
        try:
            got = torch._fused_sdp_choice(q, k, k, attn_mask=m, dropout_p=0.0, is_causal=not mask, enable_gqa=gqa)
            chosen = names.get(int(got), str(got))
        except Exception as exc:
            chosen = f"error: {exc}"[:200]
        ours = sdpa_backend(q, m, 0.0, gqa)
        choices.append({"dtype": str(dtype), "mask": mask, "kv_heads": kv_heads, "torch": chosen, "ours": ours})
    return {
        "cublas_workspace_forward_bytes": forward,
        "cublas_workspace_backward_bytes": backward,
        "capability": list(torch.cuda.get_device_capability()),
        "sdpa": choices,
    }


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
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    return {"error": (out.stderr or out.stdout)[-2000:]}


def _predict_in_pool(configs: list[dict[str, Any]]) -> dict[str, Any]:
    env_before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the pool's children must not touch the GPU
    try:  # workers start at submit, with the GPU hidden; the pool is not waited for here
        pool = concurrent.futures.ProcessPoolExecutor(max_workers=min(len(configs), 14))
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


def _reused(row: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """An earlier run's measurements; the predicted largest batch is run again only if it changed."""
    got = {k: row[k] for k in ("measured", "true_max_batch", "first_failing_batch", "runs")}
    ran = {b: ok for b, ok in row["runs"]}
    if cfg["predicted_max"] in ran:
        got["predicted_max_ran"] = ran[cfg["predicted_max"]]
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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--only", default="")
    p.add_argument("--worker", default=None)
    p.add_argument("--reuse", default="", help="earlier predict.json files: their true largest batches are kept")
    p.add_argument(
        "--measured", default="", help="an earlier predict.json: its measurements are kept, only predictions rerun"
    )
    p.add_argument("--history", default="", help="configurations whose allocator events are dumped into --out")
    args = p.parse_args()
    if args.worker is not None:
        return _worker(args)
    from common import write

    configs = [c for c in CONFIGS if not args.only or c["name"] in args.only.split(",")]
    configs = [{**c, "history": args.out} if c["name"] in args.history.split(",") else c for c in configs]
    known = _known_maxima(args.reuse)
    earlier = _measured_rows(args.measured)
    configs = [{**c, "known_max": known[c["name"]]} if c["name"] in known else c for c in configs]
    configs = [
        {**c, "known_max_fits": c["known_max"][0], "known_max_fails": c["known_max"][1]} if "known_max" in c else c
        for c in configs
    ]
    started = time.time()
    futures = _predict_in_pool(configs)
    calibration = _spawn({"calibrate": True, "name": "calibrate"}, 120)
    print("CALIBRATION", json.dumps(calibration), flush=True)
    rows = []
    for cfg in configs:
        try:
            predicted = futures[cfg["name"]].result()
        except Exception as exc:  # a model this machine cannot build: recorded, not fatal
            rows.append({"config": cfg, "error": f"prediction failed: {type(exc).__name__}: {exc}"[:500]})
            continue
        cfg = {**cfg, "predicted_max": predicted["largest"]["max_batch_size"]}
        got = _reused(earlier.get(cfg["name"]), cfg) if cfg["name"] in earlier else _spawn(cfg, 240)
        row = {"config": cfg, **predicted, **got}
        if "measured" in got:
            pa, ma = predicted["prediction"]["peak_allocated_bytes"], got["measured"]["peak_allocated_bytes"]
            pr, mr = predicted["prediction"]["peak_reserved_bytes"], got["measured"]["peak_reserved_bytes"]
            row["error_allocated"] = (pa - ma) / ma
            row["error_reserved"] = (pr - mr) / mr
            true_max, pmax = got["true_max_batch"], cfg["predicted_max"]
            row["largest_within_10pct"] = abs(pmax - true_max) <= 0.10 * true_max
            row["predicted_max_ran"] = got["predicted_max_ran"]
        rows.append(row)
        print("ROW", json.dumps({k: row.get(k) for k in ("error_allocated", "error_reserved")}), cfg["name"],
              row.get("true_max_batch"), cfg["predicted_max"], row.get("error", ""), flush=True)  # fmt: skip
    write(
        args.out,
        "predict.json",
        {
            "benchmark": "bench_predict",
            "margin": MARGIN,
            "steps": STEPS,
            "calibration": calibration,
            "summary": summarize(rows),
            "rows": rows,
            "seconds": round(time.time() - started, 1),
        },
    )


if __name__ == "__main__":
    main()
