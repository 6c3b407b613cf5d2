"""Check the caps of the cluster-job scenarios on a CPU before the GPU runs them: each scenario runs
at its GPU shapes on fake tensors under oomsight's peak predictor (``oomsight.predict``,
measured within 0.04 % median on the H200: docs/prediction.md), once plainly and once with its
remedy; the plain peak must exceed the scenario's cap and the remedy's stay below it.

    PYTHONPATH=exporter python3 benchmarks/corpus/sizing.py [NAME ...] [--json OUT]

Only scenarios whose steps the predictor can trace are sized here (TRACEABLE): routing that sizes a
tensor from the data, memory outside the allocator, CUDA graphs and several processes are not.
``save_on_cpu``'s host copies count as device memory in the trace (the emulation treats the CPU as
the GPU), so ``offload_still_too_big``'s predictions are upper bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster

TRACEABLE = (
    "lora_frozen_base_no_room",
    "lora_activations_too_big",
    "distill_teacher_records_graph",
    "async_backend_too_big",
    "offload_still_too_big",
)


def predicted_peak(name: str, remedy: bool) -> tuple[int, float]:
    """(peak allocated bytes, the cap in GiB) of one scenario run, predicted."""
    from oomsight.predict import predict_peak

    fn = cluster.SCENARIOS[name][2]
    cluster.SMOKE.traced = True
    try:
        found = predict_peak(
            lambda: nn.Linear(1, 1),  # the scenario builds its own models inside the traced step
            lambda _n: torch.zeros(1),
            1,
            optimizer=lambda params: torch.optim.SGD(params, lr=0.0),
            step=lambda _m, _b, _o: fn(remedy),
            steps=1,
        )
    finally:
        cluster.SMOKE.traced = False
    return found.peak_allocated_bytes, cluster.SMOKE.cap_gib


def size(name: str) -> dict[str, Any]:
    plain, cap_gib = predicted_peak(name, False)
    fixed, _ = predicted_peak(name, True)
    gib = 1 << 30
    return {
        "scenario": name,
        "cap_gib": cap_gib,
        "plain_peak_gib": round(plain / gib, 2),
        "remedy_peak_gib": round(fixed / gib, 2),
        "holds": plain > cap_gib * gib > fixed,
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", default=list(TRACEABLE))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = [size(n) for n in args.names]
    for r in rows:
        print(
            f"{r['scenario']:32s} cap {r['cap_gib']:5.2f} GiB  plain {r['plain_peak_gib']:6.2f}  "
            f"remedy {r['remedy_peak_gib']:6.2f}  {'ok' if r['holds'] else 'WRONG'}"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0 if all(r["holds"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
