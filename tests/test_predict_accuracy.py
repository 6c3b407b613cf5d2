"""The accuracy over every recorded GPU row (issue 51): ``benchmarks/bench_predict_accuracy.py``'s statistics
by hand on made-up rows, and its recorded output equal to what it computes from the files today."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_predict_accuracy as bench  # noqa: E402


def _row(name: str, predicted: int, measured: int, label: str = "real") -> dict[str, Any]:
    return {"name": name, "label": label, "predicted": {"peak_allocated_bytes": predicted},
            "measured": {"peak_allocated_bytes": measured}}  # fmt: skip


def test_median_p95_and_the_under_prediction_rate_are_the_hand_figures(tmp_path: Any) -> None:
    errors = [-0.05, -0.02, -0.005, 0.0, 0.01, 0.02, 0.03, 0.04, 0.06, 0.10]  # |e| sorted: .0 .005 .01 .02 .02 ...
    rows = [_row(f"r{i}", round(1000 * (1 + e)), 1000) for i, e in enumerate(errors)]
    rows.append(_row("stand-in", 2000, 1000, label="emulated"))  # never in a statistic
    for name, _ in bench.SOURCES:
        (tmp_path / name).write_text(json.dumps({"rows": rows if name == "predict.json" else []}))
    found = bench.accuracy(str(tmp_path))
    s = found["allocated"]
    assert s["rows"] == 10
    assert s["median_abs_error"] == pytest.approx(0.02)  # the 5th of 10 by nearest rank
    assert s["p95_abs_error"] == pytest.approx(0.10)  # the 10th: ceil(0.95 x 10)
    assert s["under_prediction_rate"] == pytest.approx(0.3)  # -5 %, -2 %, -0.5 %
    assert s["under_prediction_rate_beyond_1pct"] == pytest.approx(0.2)
    assert s["worst_row"] == {"name": "r9", "error": pytest.approx(0.10)}
    assert s["worst_under_prediction"] == {"name": "r0", "error": pytest.approx(-0.05)}
    assert found["emulated_rows_apart"] == ["stand-in"]
    assert found["reserved"] == {"rows": 0}


def test_the_recorded_accuracy_is_what_the_script_computes_from_the_recorded_rows() -> None:
    with open(os.path.join(bench.RESULTS, "predict-accuracy.json")) as f:
        recorded = json.load(f)
    assert recorded == json.loads(json.dumps(bench.accuracy()))
    assert not [n for n, why in recorded["not_counted"].items() if why.startswith("not known")]
    assert recorded["allocated"]["rows"] == recorded["reserved"]["rows"] == 34
