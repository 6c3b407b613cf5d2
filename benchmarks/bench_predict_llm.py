"""Issue 28's ground truth on the GPU: the jobs people size, predicted on the CPU and measured on the GPU.

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/bench_predict_llm.py --out $OUT/predict-llm.json

Each configuration is an ``oomsight predict`` command line. The prediction runs in a fresh process
with the GPU hidden (``CUDA_VISIBLE_DEVICES=``); the measurement in another fresh process builds the
same model through the same flags (``spec.spec_of``: configuration, ``--dtype``, ``--lora``) on
``cuda`` with random weights, runs the same step (``--steps`` training steps, or the ``--generate``
decode loop) and reads ``torch.cuda.max_memory_allocated/reserved()``. The error is
predicted / measured - 1. ``--device cpu`` runs the measuring code on the CPU without peaks (a smoke
test of the code path, not a measurement).

``--optimizer adamw8bit`` is measured with bitsandbytes' ``AdamW8bit`` where it is installed (else
the predictor's emulation runs, which measures nothing of bitsandbytes: the row says which).
Not measured here: a quantized base (``--quantize`` is bitsandbytes' storage emulated by the
predictor; measuring it needs bitsandbytes' own ``Linear4bit`` on the GPU) and several GPUs.
The true largest batch under a cap is not searched (``bench_predict.py`` does that for its models).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # common.py beside it

LLAMA_1B = (  # Llama-3.2-1B's shape
    "llama:hidden_size=2048,intermediate_size=8192,num_hidden_layers=16,num_attention_heads=32,"
    "num_key_value_heads=8,vocab_size=128256,max_position_embeddings=8192,rope_theta=500000,tie_word_embeddings=true"
)
LLAMA_3B = (  # Llama-3.2-3B's shape
    "llama:hidden_size=3072,intermediate_size=8192,num_hidden_layers=28,num_attention_heads=24,"
    "num_key_value_heads=8,vocab_size=128256,max_position_embeddings=8192,rope_theta=500000,tie_word_embeddings=true"
)
LLAMA_8B = (  # Llama-3.1-8B's shape
    "llama:hidden_size=4096,intermediate_size=14336,num_hidden_layers=32,num_attention_heads=32,"
    "num_key_value_heads=8,vocab_size=128256,max_position_embeddings=8192,rope_theta=500000"
)
TINY = (
    "llama:hidden_size=128,intermediate_size=256,num_hidden_layers=2,num_attention_heads=4,"
    "num_key_value_heads=2,vocab_size=512,max_position_embeddings=256"
)
CONFIGS: dict[str, list[str]] = {
    "llama1b-bf16-adamw-s2048-b4": ["--model", LLAMA_1B, "--dtype", "bf16", "--seq-len", "2048", "--batch", "4"],
    "llama1b-fp32-autocast-s1024-b4": ["--model", LLAMA_1B, "--autocast", "bf16", "--seq-len", "1024", "--batch", "4"],
    "llama3b-bf16-adamw-s2048-b2": ["--model", LLAMA_3B, "--dtype", "bf16", "--seq-len", "2048", "--batch", "2"],
    "llama3b-bf16-lora16-s4096-b2": [
        "--model", LLAMA_3B, "--dtype", "bf16", "--lora", "16", "--seq-len", "4096", "--batch", "2",
    ],
    "llama8b-bf16-lora16-s2048-b4": [
        "--model", LLAMA_8B, "--dtype", "bf16", "--lora", "16:q_proj,k_proj,v_proj,o_proj", "--seq-len", "2048",
        "--batch", "4",
    ],
    "llama8b-bf16-lora16-adamw8bit-s2048-b2": [
        "--model", LLAMA_8B, "--dtype", "bf16", "--lora", "16", "--optimizer", "adamw8bit", "--seq-len", "2048",
        "--batch", "2",
    ],
    "llama8b-bf16-generate-8192+256-b4": ["--model", LLAMA_8B, "--dtype", "bf16", "--generate", "8192:256",
                                          "--batch", "4"],
    "llama8b-bf16-generate-static-2048+512-b16": [
        "--model", LLAMA_8B, "--dtype", "bf16", "--generate", "2048:512", "--cache", "static", "--batch", "16",
    ],
    "llama1b-bf16-generate-4096+1024-b8": ["--model", LLAMA_1B, "--dtype", "bf16", "--generate", "4096:1024",
                                           "--batch", "8"],
    "llama3b-bf16-accum4-s2048-b2": [
        "--model", LLAMA_3B, "--dtype", "bf16", "--accumulation", "4", "--seq-len", "2048", "--batch", "2",
    ],
    # issue 51: the optimizer implementations (foreach is the row above of the same job); fp32 masters, so the
    # foreach step's temporary (4.9 GB) is the peak and fused/for-loop move it
    "llama1b-fp32-autocast-fused-s1024-b4": ["--model", LLAMA_1B, "--autocast", "bf16", "--seq-len", "1024",
                                             "--batch", "4", "--optimizer-impl", "fused"],
    "llama1b-fp32-autocast-forloop-s1024-b4": ["--model", LLAMA_1B, "--autocast", "bf16", "--seq-len", "1024",
                                               "--batch", "4", "--optimizer-impl", "for-loop"],
    "llama3b-bf16-fused-s2048-b2": ["--model", LLAMA_3B, "--dtype", "bf16", "--seq-len", "2048", "--batch", "2",
                                    "--optimizer-impl", "fused"],
    "tiny-smoke": ["--model", TINY, "--seq-len", "64", "--batch", "2"],
    "tiny-fused-smoke": ["--model", TINY, "--seq-len", "64", "--batch", "2", "--optimizer-impl", "fused"],
    "tiny-lora-adamw8bit-smoke": ["--model", TINY, "--seq-len", "64", "--batch", "2", "--lora", "4",
                                  "--optimizer", "adamw8bit"],
    "tiny-generate-smoke": ["--model", TINY, "--batch", "2", "--generate", "16:8", "--cache", "static"],
}  # fmt: skip


def _args(argv: list[str]) -> Any:
    """The ``PredictJob`` of ``oomsight predict ARGV``; what is wrong with the flags exits with its line."""
    from oomsight.predict.inputs import InputError
    from oomsight.predict.job import job_from_args
    from oomsight.tools import predict_command as command

    parser = argparse.ArgumentParser()
    command.add(parser.add_subparsers())
    try:
        return job_from_args(parser.parse_args(["predict", *argv]))
    except InputError as exc:
        raise SystemExit(str(exc)) from None


def measure(argv: list[str], device: str) -> dict[str, Any]:
    """Build the model the flags describe on ``device``, run its steps, read torch's peaks."""
    import torch

    from oomsight.predict import orchestration
    from oomsight.predict.spec import spec_of

    args = _args(argv)
    spec = spec_of(args)
    settings = orchestration.trace_settings(args)
    optimizer = spec.get("optimizer") or orchestration.optimizer_of(args)
    if args.optimizer == "adamw8bit" and importlib.util.find_spec("bitsandbytes"):
        import bitsandbytes  # the real 8-bit optimizer where the GPU machine has it

        optimizer = bitsandbytes.optim.AdamW8bit
    started = time.perf_counter()
    with torch.device(device):
        model = spec["build"]()
    opt = optimizer(model.parameters())
    batch = spec["batch"](args.batch, device)
    if device == "cuda":  # the steps' peak with the model resident, as predicted: not the build's
        torch.cuda.synchronize()  # (``--dtype bf16`` builds in fp32 and casts: 2x the weights at once)
        torch.cuda.reset_peak_memory_stats()
    step = spec.get("step") or _default_step(settings)
    for _ in range(settings["steps"]):
        step(model, batch, opt)
    if device == "cuda":
        torch.cuda.synchronize()
        peaks: dict[str, Any] = {
            "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
            "gpu": torch.cuda.get_device_name(0),
        }
    else:
        peaks = {"peak_allocated_bytes": None, "peak_reserved_bytes": None}
    used = f"{getattr(optimizer, '__module__', '')}.{getattr(optimizer, '__name__', type(optimizer).__name__)}"
    return {**peaks, "seconds": round(time.perf_counter() - started, 1), "torch": torch.__version__, "optimizer": used}


def _default_step(settings: dict[str, Any]) -> Any:
    from oomsight.predict import tracing

    return tracing.default_step(accumulation=settings["accumulation"], autocast=settings["autocast"])


def _child(what: str, name: str, device: str, timeout: float) -> dict[str, Any]:
    env = dict(os.environ)
    if what == "predict":
        env["CUDA_VISIBLE_DEVICES"] = ""
    cmd = [sys.executable, os.path.abspath(__file__), f"--{what}", name, "--device", device]
    from common import child_result

    return child_result(cmd, env, timeout, tail=1500)


def _predict(name: str) -> dict[str, Any]:
    from oomsight.predict import orchestration
    from oomsight.predict.spec import spec_of

    args = _args(CONFIGS[name])
    started = time.perf_counter()
    result = orchestration.predicted(args, spec_of(args))
    return {**result["prediction"], "wall_seconds": round(time.perf_counter() - started, 1)}


def _rows(path: str | None) -> dict[str, dict[str, Any]]:
    """The rows an earlier ``--phase measure`` run wrote to ``path``, by name."""
    if not path or not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        return {row["name"]: row for row in json.load(fh)["rows"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None)
    parser.add_argument("--only", default=None, help="comma-separated names (default: all but the tiny-* smoke tests)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per child")
    parser.add_argument(
        "--phase",
        default="both",
        choices=("both", "measure", "predict"),
        help="measure only (on the GPU machine), or predict only, filling the rows of --out's measurements",
    )
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--predict", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure or args.predict:
        found = measure(CONFIGS[args.measure], args.device) if args.measure else _predict(args.predict)
        print("RESULT " + json.dumps(found), flush=True)
        return 0
    names = args.only.split(",") if args.only else [n for n in CONFIGS if not n.startswith("tiny-")]
    earlier = _rows(args.out) if args.phase == "predict" else {}
    rows = []
    for name in names:
        predicted = _child("predict", name, args.device, args.timeout) if args.phase != "measure" else {}
        measured = earlier.get(name, {}).get("measured", {})
        if args.phase != "predict":
            measured = _child("measure", name, args.device, args.timeout)
        row: dict[str, Any] = {"name": name, "argv": CONFIGS[name], "predicted": predicted, "measured": measured}
        row.update(_errors(predicted, measured), label="emulated" if _emulated(measured) else "measured")
        rows.append(row)
        print(f"{name}: error {row.get('error_allocated')}, {measured.get('error', '')[:200]}", flush=True)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as fh:
                json.dump({"benchmark": "bench_predict_llm", "rows": rows, "summary": _summary(rows)}, fh, indent=1)
    return 0


def _errors(predicted: dict[str, Any], measured: dict[str, Any]) -> dict[str, float]:
    """``error_allocated`` and ``error_reserved`` (predicted / measured - 1) where both peaks are known."""
    found = {}
    for peak in ("allocated", "reserved"):
        p, m = predicted.get(f"peak_{peak}_bytes"), measured.get(f"peak_{peak}_bytes")
        if p and m:
            found[f"error_{peak}"] = p / m - 1.0
    return found


def _emulated(measured: dict[str, Any]) -> bool:
    """The 8-bit optimizer row ran the predictor's own AdamW8bit (no bitsandbytes): it measures the emulation."""
    return "oomsight" in str(measured.get("optimizer", "")) and "AdamW8bit" in str(measured.get("optimizer", ""))


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median |error| of the measured rows, both peaks; emulated rows apart (issue 34: never in the median).
    ``measured``: the predictor's own program (its step, its decode loop) run on CUDA; the real user programs
    (``generate()``, Trainer, accelerate) are ``bench_predict_real.py``'s."""
    summary: dict[str, Any] = {}
    for label in ("measured", "emulated"):
        for peak in ("allocated", "reserved"):
            errors = [r[f"error_{peak}"] for r in rows if r.get("label") == label and f"error_{peak}" in r]
            summary[label + "_" + peak] = {
                "median_abs_error": statistics.median(abs(e) for e in errors) if errors else None,
                "min_error": min(errors, default=None), "max_error": max(errors, default=None), "rows": len(errors),
            }  # fmt: skip
    return summary


if __name__ == "__main__":
    sys.exit(main())
