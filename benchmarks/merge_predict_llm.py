"""Merge the H200 runs of ``bench_predict_llm.py`` into ``results/predict-llm-h200.json``.

    python3 benchmarks/merge_predict_llm.py FIRST.json MEASURED.json PREDICTED.json OUT.json

FIRST: a ``--phase both`` run whose training rows stand (their peak lies in the steps, after the
build), MEASURED: a ``--phase measure`` run (peak reset after the build), PREDICTED: that file after
``--phase predict`` filled it (rows whose prediction did not finish keep ``predicted: {}``). A row of
MEASURED replaces FIRST's row of the same name.
"""

from __future__ import annotations

import json
import statistics
import sys


def _rows(path: str) -> dict[str, dict]:
    with open(path, encoding="utf-8") as fh:
        return {r["name"]: r for r in json.load(fh)["rows"]}


def main(first: str, measured: str, predicted: str, out: str) -> None:
    rows, later, filled = _rows(first), _rows(measured), _rows(predicted)
    for name, row in later.items():
        row = {**row, "predicted": filled.get(name, row).get("predicted") or {}, "peak_reset_after_build": True}
        row.pop("error_allocated", None)
        p, m = row["predicted"].get("peak_allocated_bytes"), row["measured"].get("peak_allocated_bytes")
        if p and m:
            row["error_allocated"] = p / m - 1.0
        rows[name] = row
    for row in rows.values():
        if "AdamW8bit" in str(row["measured"].get("optimizer", "")) and "oomsight" in row["measured"]["optimizer"]:
            row["note"] = "no bitsandbytes on the GPU machine: the predictor's emulation measured, not bitsandbytes"
    errors = [abs(r["error_allocated"]) for r in rows.values() if "error_allocated" in r]
    summary = {"median_abs_error": statistics.median(errors), "max_abs_error": max(errors), "measured": len(errors)}
    doc = {"benchmark": "bench_predict_llm", "gpu": "NVIDIA H200", "date": "2026-12-05", "rows": list(rows.values())}
    with open(out, "w", encoding="utf-8") as fh:
        json.dump({**doc, "summary": summary}, fh, indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main(*sys.argv[1:5])
