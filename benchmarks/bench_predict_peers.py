"""The estimators people use today beside ``oomsight predict``, against the peaks measured on the H200.

For each configuration measured in ``benchmarks/results/predict.json`` (15 training steps on an
NVIDIA H200, peaks from torch's own counters) this builds the same model on the meta device and asks:

- **accelerate** (installed): ``accelerate estimate-memory``'s own functions, run on the model
  itself because the command wants a Hub name (``accelerate.utils.calculate_maximum_sizes`` and
  ``accelerate.commands.estimate.estimate_training_usage``; the "Training using Adam" column is the
  largest of its model/gradients/optimizer/step figures; ``float32`` for an fp32 job, ``float16``
  for a bf16 autocast job);
- **DeepSpeed** (not installable here): ``estimate_zero2_model_states_mem_needs`` and
  ``estimate_zero3_model_states_mem_needs`` for one GPU without offload, by their documented
  formulas (``runtime/zero/stage_1_and_2.py:3081-3098``, ``runtime/zero/stage3.py:3744-3780`` at
  DeepSpeed ``edaa7221``, as written down in /work/shared/reference/distributed-memory.md §4.3):
  ZeRO-2 ``2P + 18P/N``, ZeRO-3 ``4L + 18P/N`` bytes, P the parameters (each once), L the largest
  module's own parameters, N = 1;
- **oomsight**: the prediction recorded beside the measurement in the same file.

All three are set against the measured peak allocated: error = estimate / measured - 1.

    python benchmarks/bench_predict_peers.py --out benchmarks/results/predict-peers.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

ZERO_GRAD_OPTIMIZER_BYTES = 18
"""DeepSpeed's per-parameter model states: 2 fp16 grads + 4 fp32 grads + 4 fp32 params + 8 Adam m, v."""
ZERO_FP16_PARAM_BYTES = 2
ZERO3_LARGEST_LAYER_BYTES = 4


def deepspeed_estimates(model: Any, num_gpus: int = 1) -> dict[str, int]:
    """ZeRO-2 and ZeRO-3 GPU bytes for ``model`` without offload (each parameter counted once)."""
    params = {id(p): p.numel() for p in model.parameters()}
    total = sum(params.values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    per_gpu = ZERO_GRAD_OPTIMIZER_BYTES * total // num_gpus
    return {
        "zero2": ZERO_FP16_PARAM_BYTES * total + per_gpu,
        "zero3": ZERO3_LARGEST_LAYER_BYTES * largest + per_gpu,
    }


def accelerate_estimate(model: Any, mixed: bool) -> int:
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes

    total, _largest = calculate_maximum_sizes(model)
    return int(max(estimate_training_usage(total, "float16" if mixed else "float32").values()))


def row_for(measured_row: dict[str, Any]) -> dict[str, Any]:
    import torch

    from oomsight.predict import models

    config = measured_row["config"]
    with torch.device("meta"):
        model = models.get(config["model"]).build()
    measured = measured_row["measured"]["peak_allocated_bytes"]
    estimates = {
        "accelerate": accelerate_estimate(model, bool(config.get("autocast"))),
        **{f"deepspeed_{k}": v for k, v in deepspeed_estimates(model).items()},
        "oomsight": measured_row["prediction"]["peak_allocated_bytes"],
    }
    return {
        "name": config["name"],
        "measured_peak_allocated_bytes": measured,
        "estimate_bytes": estimates,
        "error": {k: round(v / measured - 1.0, 6) for k, v in estimates.items()},
    }


def table(rows: list[dict[str, Any]]) -> str:
    names = list(rows[0]["estimate_bytes"])
    lines = [
        "| configuration | measured peak | " + " | ".join(names) + " |",
        "| --- | --- | " + " | ".join("---" for _ in names) + " |",
    ]
    for r in rows:
        errs = " | ".join(f"{100 * r['error'][n]:+.1f} %" for n in names)
        lines.append(f"| {r['name']} | {r['measured_peak_allocated_bytes'] / 2**30:.2f} GiB | {errs} |")
    medians = " | ".join(f"{100 * statistics.median(abs(r['error'][n]) for r in rows):.1f} %" for n in names)
    lines.append(f"| median abs error | | {medians} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured", default="benchmarks/results/predict.json")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    with open(args.measured, encoding="utf-8") as fh:
        measured = json.load(fh)
    rows = []
    for r in measured["rows"]:
        try:
            rows.append(row_for(r))
        except ImportError as exc:  # a model whose builder is not installed: counted, not fatal
            print(f"skipped {r['config']['name']}: {exc}", file=sys.stderr)
    print(table(rows))
    if args.out:
        result = {
            "benchmark": "bench_predict_peers",
            "measured_on": measured.get("environment", {}),
            "rows": rows,
            "skipped": len(measured["rows"]) - len(rows),
            "seconds": round(time.perf_counter() - started, 1),
        }
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
