"""The predictor's accuracy over every recorded GPU row, stated as estimator papers state theirs (issue 51).

    python benchmarks/bench_predict_accuracy.py --out benchmarks/results/predict-accuracy.json

Reads the results files of ``benchmarks/results/predict*.json`` that hold a prediction beside a GPU
measurement, takes one row per measured configuration (the latest prediction of each: a re-prediction
file replaces the file it re-predicts), and gives, for the peak allocated and the peak reserved, the
median and 95th-percentile |error| (nearest rank), the under-prediction rate (error below 0, and below
-1 %), and the worst row by name. Error = predicted / measured - 1. Rows whose library the GPU machine
lacked (``emulated``: the predictor's own bitsandbytes stand-ins) are listed apart and never in a
statistic. Nothing is measured here: it reads files, on any machine, in under a second.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, Optional

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SOURCES = (
    ("predict.json", "15 configurations, H200 (bench_predict.py)"),
    ("predict-llm-h200.json", "LLM jobs, the predictor's own programs, H200 (bench_predict_llm.py)"),
    ("predict-real-h100-bnb-repredicted.json", "programs users run, H100, re-predicted (bench_predict_real.py)"),
)
"""The files whose rows are the current predictions of GPU measurements, one row per configuration."""
SUPERSEDED = {
    "predict-real-h100-bnb.json": "the same measurements as predict-real-h100-bnb-repredicted.json, predicted "
    "by the step of that day",
    "predict-real-h100.json": "an earlier run of the same programs without bitsandbytes (the same measurements)",
    "predict-real-h100-repredicted.json": "that earlier run re-predicted (the same measurements)",
    "predict-llm-h200-first.json": "an input of predict-llm-h200.json",
    "predict-llm-h200-measured.json": "an input of predict-llm-h200.json",
    "predict-peers.json": "others' estimators on predict.json's measurements (oomsight's column is predict.json's)",
    "predict-large-cpu.json": "CPU only: no measurement",
    "predict-accuracy.json": "this script's output",
}
"""Every other ``predict*.json`` and why its rows are not counted again."""
UNDER = -0.01
"""An under-prediction worth a user's attention: the job needed 1 % more than predicted."""


def rows_of(name: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """One dict a row: ``name``, ``source``, ``label``, predicted and measured peaks (bytes)."""
    found = []
    for row in data.get("rows", []):
        predicted = row.get("prediction") or row.get("predicted") or {}
        measured = row.get("measured") or {}
        if not predicted.get("peak_allocated_bytes") or not measured.get("peak_allocated_bytes"):
            continue
        label = row.get("label") or "measured"
        found.append({
            "name": row.get("name") or (row.get("config") or {}).get("name"),
            "source": name,
            "label": "emulated" if label == "emulated" else "measured",
            "predicted_allocated_bytes": int(predicted["peak_allocated_bytes"]),
            "measured_allocated_bytes": int(measured["peak_allocated_bytes"]),
            "predicted_reserved_bytes": _int(predicted.get("peak_reserved_bytes")),
            "measured_reserved_bytes": _int(measured.get("peak_reserved_bytes")),
        })  # fmt: skip
    return found


def _int(value: Any) -> Optional[int]:
    return int(value) if value else None


def error(row: dict[str, Any], what: str) -> Optional[float]:
    predicted, measured = row[f"predicted_{what}_bytes"], row[f"measured_{what}_bytes"]
    return predicted / measured - 1 if predicted and measured else None


def percentile(values: list[float], share: float) -> float:
    """Nearest rank: the smallest value with at least ``share`` of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def statistics(rows: list[dict[str, Any]], what: str) -> dict[str, Any]:
    errors = [(e, r["name"]) for r in rows if (e := error(r, what)) is not None]
    if not errors:
        return {"rows": 0}
    absolute = [abs(e) for e, _ in errors]
    worst = max(errors, key=lambda item: abs(item[0]))
    lowest = min(errors)
    return {
        "rows": len(errors),
        "median_abs_error": percentile(absolute, 0.5),
        "p95_abs_error": percentile(absolute, 0.95),
        "under_prediction_rate": sum(e < 0 for e, _ in errors) / len(errors),
        "under_prediction_rate_beyond_1pct": sum(e < UNDER for e, _ in errors) / len(errors),
        "worst_row": {"name": worst[1], "error": worst[0]},
        "worst_under_prediction": {"name": lowest[1], "error": lowest[0]} if lowest[0] < 0 else None,
    }


def accuracy(results: str = RESULTS) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for name, _what in SOURCES:
        with open(os.path.join(results, name)) as f:
            rows.extend(rows_of(name, json.load(f)))
    counted = [r for r in rows if r["label"] == "measured"]
    for r in rows:
        r["error_allocated"], r["error_reserved"] = error(r, "allocated"), error(r, "reserved")
    listed = sorted(n for n in os.listdir(results) if n.startswith("predict") and n.endswith(".json"))
    return {
        "benchmark": "bench_predict_accuracy",
        "sources": {name: what for name, what in SOURCES},
        "not_counted": {
            n: SUPERSEDED.get(n, "not known to this script: add it to SOURCES or SUPERSEDED")
            for n in listed
            if n not in dict(SOURCES)
        },
        "allocated": statistics(counted, "allocated"),
        "reserved": statistics(counted, "reserved"),
        "emulated_rows_apart": [r["name"] for r in rows if r["label"] == "emulated"],
        "rows": rows,
    }


def table(found: dict[str, Any]) -> str:
    lines = ["| peak | rows | median abs error | p95 abs error | under-predicted | below -1 % | worst row |",
             "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for what in ("allocated", "reserved"):
        s = found[what]
        worst = s["worst_row"]
        lines.append(
            f"| {what} | {s['rows']} | {s['median_abs_error']:.3%} | {s['p95_abs_error']:.2%} | "
            f"{s['under_prediction_rate']:.0%} | {s['under_prediction_rate_beyond_1pct']:.0%} | "
            f"`{worst['name']}` {worst['error']:+.2%} |"
        )
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the JSON here")
    parser.add_argument("--results", default=RESULTS, help="the results folder (default benchmarks/results)")
    args = parser.parse_args(argv)
    found = accuracy(args.results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(found, f, indent=1)
            f.write("\n")
    print(table(found))
    unknown = [n for n, why in found["not_counted"].items() if why.startswith("not known")]
    if unknown:
        print(f"results files this script does not know: {', '.join(unknown)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
