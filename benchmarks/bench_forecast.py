"""How close the time-to-OOM forecast (``analysis.forecast``, read by ``OomsightCudaOomPredicted``)
comes to the real time left, on recorded tapes and on long generated series.

    PYTHONPATH=exporter python3 benchmarks/bench_forecast.py [--runs 20] [--out benchmarks/results]

Scored two ways in one run: ``current`` is this tree's forecast, ``baseline`` the one it replaced
(the floor's slope over the leak window, else the recent peaks' slope when they grow, from the last
row's peak), recomputed from the same verdict so both see the same rows.

- **Tapes**: every recorded tape with a fatal OOM and step rows (``tests/fixtures/`` corpus,
  held-out, held-out wire-1.5 and wire-1.7). At each snapshot before the OOM the rows the hook held
  then (the OOM event's rows up to the snapshot's time) are judged; the truth is the OOM's time
  minus the last row's. Every tape runs out within a minute: rescaling its time by any factor moves
  forecast and truth alike, so its relative errors stand for any horizon.
- **Generated**: ``tests/memory_series.py`` runs of each kind (noisy leak, stair leak, growing
  demand, curriculum, data-dependent outliers) whose trend reaches capacity after about 8 hours,
  judged at 24 times from 1 minute to 6 hours before their OOM with the rows the hook held then.

Per group: forecasts made, median and p90 of |forecast / truth - 1|, the share of forecasts later
than 1.5x the truth (the alert comes late), the share of times with no forecast (the alert does not
come), and the share of earliest times later than the truth.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import memory_series  # noqa: E402

from oomsight.analysis import trend  # noqa: E402
from oomsight.tools import tape  # noqa: E402

FOLDERS = ("corpus", "heldout", "heldout-wire15", "heldout-wire17")
TAPE_KINDS = {
    "leak_loss_slow": "steady_leak",
    "leak_outputs_fast": "steady_leak",
    "leak_detached_cache": "steady_leak",
    "gpt2_keeps_outputs": "steady_leak",
    "gpt2_debug_keeps_attentions_fast": "steady_leak",
    "llama_retain_graph_loss_log": "steady_leak",
    "segformer_caches_probs_for_metrics": "steady_leak",
    "vit_forward_hook_activations": "steady_leak",
    "bert_dynpad_keeps_hidden_states": "noisy_leak",
    "encoder_grad_snapshots_every_10": "stair_leak",
    "growing_sequence": "growing_demand",
    "growing_batch": "growing_demand",
    "llama_seqlen_curriculum": "curriculum",
    "variable_length_outlier": "outliers",
    "llama_classifier_untruncated_outlier": "outliers",
}
"""What each tape with a fatal OOM and step rows runs out of (its scenario's own description)."""
BUCKETS = ((60, "1-5 min"), (300, "5-15 min"), (900, "15-60 min"), (3600, "1-3 h"), (10800, "3-6 h"))
LATE = 1.5


def baseline(t: trend.Trend, capacity: float) -> Optional[float]:
    """The forecast this tree replaced, from the same verdict: the leak's floor slope, else the
    growing peaks' slope, from the last row's peak to capacity at the mean step time."""
    slope = t.floor_slope if t.leak else t.peak_slope if t.growing else 0.0
    if slope <= 0 or t.seconds_per_step is None or t.points < trend.MIN_POINTS:
        return None
    return max(capacity - t.last_peak_bytes, 0.0) / slope * t.seconds_per_step


def judge(rows: list[list[float]], capacity: float, truth: float, **where: Any) -> dict[str, Any]:
    t = trend.analyse(rows, int(capacity))
    shown = t.points >= trend.MIN_POINTS
    return {
        **where,
        "truth": truth,
        "current": t.seconds_to_oom if shown else None,
        "earliest": t.earliest_seconds_to_oom if shown else None,
        "reason": t.no_forecast_reason,
        "forecast_kind": t.forecast_kind,
        "baseline": baseline(t, capacity),
    }


def tape_cases() -> list[dict[str, Any]]:
    cases = []
    for folder in FOLDERS:
        for path in sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", folder, "*.tape.jsonl.gz"))):
            name = os.path.basename(path).split(".")[0]
            _header, records = tape.read(path)
            fatal = [r["doc"] for r in records if r["path"].startswith("events") and r["doc"].get("outcome") == "fatal"]
            if not fatal or name not in TAPE_KINDS:
                continue
            event = fatal[0]
            rows = event.get("steps_memory") or []
            capacity = float(event.get("limit_bytes") or event.get("device_total_bytes") or 0)
            for rec in records:
                doc = rec["doc"]
                if not rec["path"].startswith("snapshots") or doc["time"] >= event["time"]:
                    continue
                held = [r for r in rows if r[1] <= doc["time"]]
                if len(held) < 2:
                    continue
                cases.append(judge(held, capacity, event["time"] - held[-1][1], tape=f"{folder}/{name}",
                                   kind=TAPE_KINDS[name]))
    return cases


def generated_cases(runs: int) -> list[dict[str, Any]]:
    cases = []
    ahead = memory_series.horizons()
    for kind in memory_series.KINDS:
        for seed in range(runs):
            r = memory_series.run(kind, seed, ahead)
            for when, rows in r.views:
                cases.append(judge(rows, r.shape.capacity, r.oom_time - when, kind=kind, seed=seed))
    return cases


def bucket(seconds: float) -> str:
    return next((label for low, label in reversed(BUCKETS) if seconds >= low), "under 1 min")


def score(cases: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
    made = [c for c in cases if c[key] is not None]
    errors = sorted(abs(c[key] / c["truth"] - 1) for c in made)
    out: dict[str, Any] = {
        "cases": len(cases),
        "forecasts": len(made),
        "median_abs_error": _q(errors, 0.5),
        "p90_abs_error": _q(errors, 0.9),
        "late_share": round(sum(c[key] > LATE * c["truth"] for c in made) / len(made), 3) if made else None,
        "no_forecast_share": round(1 - len(made) / len(cases), 3) if cases else None,
    }
    if key == "current":
        early = [c for c in made if c["earliest"] is not None]
        out["earliest_later_than_truth_share"] = (
            round(sum(c["earliest"] > c["truth"] for c in early) / len(early), 3) if early else None
        )
        reasons: dict[str, int] = {}
        for c in cases:
            if c[key] is None:
                reasons[c["reason"] or "none"] = reasons.get(c["reason"] or "none", 0) + 1
        out["no_forecast_reasons"] = reasons
    return out


def _q(ordered: Sequence[float], q: float) -> Optional[float]:
    return round(ordered[min(int(q * len(ordered)), len(ordered) - 1)], 3) if ordered else None


def table(cases: Sequence[dict[str, Any]], group: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for value in sorted({c[group] for c in cases}):
        part = [c for c in cases if c[group] == value]
        out[value] = {"current": score(part, "current"), "baseline": score(part, "baseline")}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20, help="generated runs per kind")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    t0 = time.time()
    tapes = tape_cases()
    generated = generated_cases(args.runs)
    for c in generated:
        c["horizon"] = bucket(c["truth"])
    paging = [c for c in generated if c["truth"] >= 300]
    result = {
        "benchmark": "bench_forecast",
        "late_means": f"forecast > {LATE} x the truth",
        "tapes": {
            "all": {"current": score(tapes, "current"), "baseline": score(tapes, "baseline")},
            "by_kind": table(tapes, "kind"),
            "by_tape": table(tapes, "tape"),
        },
        "generated": {
            "runs_per_kind": args.runs,
            "horizons_5min_to_6h": {"current": score(paging, "current"), "baseline": score(paging, "baseline")},
            "by_horizon": table(generated, "horizon"),
            "by_kind": table(generated, "kind"),
            "by_kind_5min_to_6h": table(paging, "kind"),
        },
        "seconds": round(time.time() - t0, 1),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "forecast.json"), "w") as fh:
        json.dump(result, fh, indent=1)
        fh.write("\n")
    print(json.dumps({k: result[k] for k in ("tapes", "generated")}, indent=1)[:20000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
