"""How long ``oomsight predict`` takes for the models people size (issue 28: a 7 B configuration
must predict in under two minutes on the two-core CI machine), and what it predicts.

Each configuration runs ``oomsight predict ... --json`` in a fresh process; the wall time and the
child's largest resident set are recorded beside the prediction.

    python benchmarks/bench_predict_large.py --out benchmarks/results/predict-large-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

LLAMA2_7B = (
    "llama:hidden_size=4096,intermediate_size=11008,num_hidden_layers=32,num_attention_heads=32,"
    "num_key_value_heads=32,vocab_size=32000,max_position_embeddings=4096"
)
LLAMA3_8B = (
    "llama:hidden_size=4096,intermediate_size=14336,num_hidden_layers=32,num_attention_heads=32,"
    "num_key_value_heads=8,vocab_size=128256,max_position_embeddings=8192,rope_theta=500000"
)
CONFIGS: dict[str, list[str]] = {
    "llama2-7b-fp32-adamw-b1-s2048": ["--model", LLAMA2_7B, "--seq-len", "2048", "--batch", "1"],
    "llama2-7b-bf16-lora16-b1-s2048-A100-80GB": [
        "--model", LLAMA2_7B, "--seq-len", "2048", "--batch", "1", "--dtype", "bf16", "--lora", "16",
        "--gpu", "A100-80GB",
    ],
    "llama2-7b-qlora4bit-adamw8bit-b4-s2048-L4": [
        "--model", LLAMA2_7B, "--seq-len", "2048", "--batch", "4", "--dtype", "bf16", "--lora", "16",
        "--quantize", "4bit", "--optimizer", "adamw8bit", "--gpu", "L4",
    ],
    "llama2-7b-bf16-generate-2048+256-b8-dynamic": [
        "--model", LLAMA2_7B, "--batch", "8", "--dtype", "bf16", "--generate", "2048:256",
    ],
    "llama3-8b-bf16-fsdp2-x8-H100-gpus-needed": [
        "--model", LLAMA3_8B, "--seq-len", "4096", "--batch", "1", "--dtype", "bf16", "--world-size", "8",
        "--parallel", "fsdp2", "--gpu", "H100", "--gpus-needed",
    ],
    "llama3-8b-bf16-fsdp2-x8-H100-largest-batch": [
        "--model", LLAMA3_8B, "--seq-len", "4096", "--batch", "1", "--dtype", "bf16", "--world-size", "8",
        "--parallel", "fsdp2", "--gpu", "H100", "--largest-batch",
    ],
}  # fmt: skip


def run(name: str, argv: list[str]) -> dict[str, Any]:
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "oomsight", "predict", *argv, "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    stdout, stderr = child.communicate()
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the largest child so far, KiB
    row: dict[str, Any] = {"name": name, "argv": argv, "exit": child.returncode, "seconds": round(seconds, 1)}
    row["max_rss_mib_of_any_run_so_far"] = round(usage / 1024)
    if child.returncode == 0:
        row["result"] = json.loads(stdout)
    else:
        row["stderr"] = stderr[-600:]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None)
    parser.add_argument("--only", default=None, help="comma-separated configuration names")
    args = parser.parse_args(argv)
    chosen = args.only.split(",") if args.only else list(CONFIGS)
    rows = []
    for name in chosen:
        row = run(name, CONFIGS[name])
        rows.append(row)
        peak = row.get("result", {}).get("prediction", {}).get("peak_allocated_bytes")
        print(f"{name}: exit {row['exit']}, {row['seconds']} s, peak {peak}", flush=True)
    if args.out and os.path.exists(args.out):  # keep the rows of configurations not run this time
        with open(args.out, encoding="utf-8") as fh:
            ran = {r["name"] for r in rows}
            rows = [r for r in json.load(fh)["rows"] if r["name"] not in ran] + rows
    if args.out:
        env = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"benchmark": "bench_predict_large", "environment": env, "rows": rows}, fh, indent=1)
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
