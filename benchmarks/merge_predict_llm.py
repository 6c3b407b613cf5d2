"""Merge the H200 runs of ``bench_predict_llm.py`` into ``results/predict-llm-h200.json``.

    python3 benchmarks/merge_predict_llm.py FIRST.json MEASURED.json PREDICTED.json OUT.json
    python3 benchmarks/merge_predict_llm.py --rederive benchmarks/results/predict-llm-h200.json

FIRST: a ``--phase both`` run whose training rows stand (their peak lies in the steps, after the
build), MEASURED: a ``--phase measure`` run (peak reset after the build), PREDICTED: that file after
``--phase predict`` filled it (rows whose prediction did not finish keep ``predicted: {}``). A row of
MEASURED replaces FIRST's row of the same name.

Each row gets ``error_allocated`` and ``error_reserved`` (predicted / measured - 1) and a ``label``:
``emulated`` for the 8-bit optimizer row that ran the predictor's own AdamW8bit (no bitsandbytes),
``measured`` otherwise (the predictor's own program run on CUDA); the summary gives each label and
peak apart (issue 34: emulated rows are never in the median). ``--rederive`` recomputes these from a
merged file's own peaks, in place.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_predict_llm import _emulated, _errors, _summary  # beside this file

EMULATED_NOTE = "no bitsandbytes on the GPU machine: the predictor's emulation measured, not bitsandbytes"


def _rows(path: str) -> dict[str, dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return {r["name"]: r for r in json.load(fh)["rows"]}


def derive(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Errors and labels into each row (in place); the summary by label and peak."""
    for row in rows:
        row.pop("error_allocated", None)
        row.pop("error_reserved", None)
        row.update(
            _errors(row["predicted"], row["measured"]), label="emulated" if _emulated(row["measured"]) else "measured"
        )
        if row["label"] == "emulated":
            row["note"] = EMULATED_NOTE
    return _summary(rows)


def rederive(path: str) -> None:
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    doc["summary"] = derive(doc["rows"])
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
    print(json.dumps(doc["summary"]))


def main(first: str, measured: str, predicted: str, out: str) -> None:
    rows, later, filled = _rows(first), _rows(measured), _rows(predicted)
    for name, row in later.items():
        row = {**row, "predicted": filled.get(name, row).get("predicted") or {}, "peak_reset_after_build": True}
        rows[name] = row
    merged = list(rows.values())
    doc: dict[str, Any] = {"benchmark": "bench_predict_llm", "gpu": "NVIDIA H200", "date": "2026-12-05", "rows": merged}
    doc["summary"] = derive(merged)
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
    print(json.dumps(doc["summary"]))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rederive"]:
        rederive(sys.argv[2])
    else:
        main(*sys.argv[1:5])
