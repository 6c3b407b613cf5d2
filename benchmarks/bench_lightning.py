"""oomsight against Lightning's DeviceStatsMonitor on the same model, in the same run.

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/bench_lightning.py --out benchmarks/results

Each round fits the GPU-bound reference model (8xLinear 2048, AdamW, batch 256) for the
same number of steps three ways, in a shuffled order: a plain Trainer, the Trainer with
DeviceStatsMonitor (and a CSV logger, which it needs), and the Trainer with oomsight.
Time is measured from a fixed warm step to the last step.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import summary, write


def fit(variant: str, steps: int, warm: int, L: Any, torch: Any, logdir: str) -> float:
    import oomsight

    class Timer(L.Callback):
        t0 = t1 = 0.0

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, idx: int) -> None:
            if idx == warm:
                torch.cuda.synchronize()
                Timer.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, module: Any, out: Any, batch: Any, idx: int) -> None:
            if idx == steps - 1:
                torch.cuda.synchronize()
                Timer.t1 = time.perf_counter()

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)])

        def training_step(self, batch: Any, idx: int) -> Any:
            return self.net(batch).square().mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    x = torch.randn(256, 2048)
    loader = torch.utils.data.DataLoader([x] * steps, batch_size=None)
    callbacks: list[Any] = [Timer()]
    if variant == "device_stats_monitor":
        callbacks.append(L.pytorch.callbacks.DeviceStatsMonitor())
    oomsight.stop()
    if variant == "oomsight":
        oomsight.start()
    trainer = L.Trainer(
        accelerator="gpu",
        devices=1,
        max_steps=steps,
        callbacks=callbacks,
        logger=L.pytorch.loggers.CSVLogger(logdir),
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(Module(), loader)
    oomsight.stop()
    return (Timer.t1 - Timer.t0) / (steps - 1 - warm)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=400)
    args = p.parse_args()
    import lightning as L
    import torch

    os.environ["OOMSIGHT_DIR"] = tempfile.mkdtemp()
    logdir = tempfile.mkdtemp()
    variants = ["plain", "device_stats_monitor", "oomsight"]
    per: dict[str, list[float]] = {v: [] for v in variants}
    rng = random.Random(0)
    fit("plain", 60, 10, L, torch, logdir)  # warm CUDA, cuBLAS and Lightning
    for _ in range(args.rounds):
        order = list(variants)
        rng.shuffle(order)
        for v in order:
            per[v].append(fit(v, args.steps, 50, L, torch, logdir))
    base = per["plain"]
    result = {
        "lightning": L.__version__,
        "steps": args.steps,
        "seconds_per_step": {v: summary(ts) for v, ts in per.items()},
        "overhead_ratio": {v: summary([t / b - 1 for t, b in zip(ts, base)]) for v, ts in per.items() if v != "plain"},
        "raw": per,
    }
    print({v: round(r["median"] * 100, 3) for v, r in result["overhead_ratio"].items()}, "% median")
    write(args.out, "lightning.json", result)


if __name__ == "__main__":
    main()
