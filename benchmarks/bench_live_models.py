"""What the scan for live models (``oomsight.hook.discovery.LiveModels``: every ``nn.Module`` no other module
holds, through the garbage collector) costs the training thread, at the layout walk's cadence.

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/bench_live_models.py --out benchmarks/results

The scan's cost follows the number of objects the garbage collector tracks, not the models' size: the
program holds a Llama-7B-shaped model (32 blocks) with an EMA copy beside it, plus 0.1, 1 and 3 million
other tracked objects (lists, as a data pipeline's samples or a tokenizer's tables would be). The figure
that matters is the scan's time against the interval it may use (``SCAN_SHARE`` of it: the next scan
waits ``took / SCAN_SHARE``), and whether it stays under ``SCAN_MAX_SECONDS``.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import sys
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_layout_walk import INTERVAL_SECONDS, model, timed
from common import write

from oomsight.hook import discovery


def case(filler: int) -> dict[str, Any]:
    student = model(32)
    ema = copy.deepcopy(student).requires_grad_(False)
    ballast = [[i] for i in range(filler)]  # lists: always tracked by the garbage collector
    tracked = len(gc.get_objects())

    def scan() -> list[Any]:
        live = discovery.LiveModels()
        return live.scan(gc, torch.nn.Module)

    found = scan()  # past SCAN_MAX_SECONDS the scan gives up: nothing found (the walk keeps its last result)
    cost = timed(scan, rounds=7)
    del ballast
    took = cost["median_ms"] / 1e3
    return {
        "tracked_objects": tracked,
        "scan": cost,
        "found_the_ema_copy": any(m is ema for m in found) and any(m is student for m in found),
        "next_scan_after_seconds": max(took / discovery.SCAN_SHARE, INTERVAL_SECONDS),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    cases = [case(n) for n in (100_000, 1_000_000, 3_000_000)]
    for c in cases:
        print(
            f"{c['tracked_objects']:9d} tracked objects: scan {c['scan']['median_ms']:.1f} ms "
            f"(p90 {c['scan']['p90_ms']:.1f}), next scan after {c['next_scan_after_seconds']:.0f} s, "
            f"found the EMA copy: {c['found_the_ema_copy']}"
        )
    doc = {"interval_seconds": INTERVAL_SECONDS, "scan_share": discovery.SCAN_SHARE, "cases": cases}
    write(args.out, "live_models.json", doc)


if __name__ == "__main__":
    main()
