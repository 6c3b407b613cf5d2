"""How close the time-to-OOM forecast (``analysis.forecast``, read by ``OomsightCudaOomPredicted``)
comes to the real time left, on recorded tapes and on long generated series.

    PYTHONPATH=exporter python3 benchmarks/bench_forecast.py [--runs 20] [--before REV] [--oracle-draws 30]
        [--out benchmarks/results]

Scored in one run: ``current`` is this tree's forecast, ``baseline`` the one issue 37 replaced
(the floor's slope over the leak window, else the recent peaks' slope when they grow, from the last
row's peak), recomputed from the same verdict so both see the same rows; with ``--before REV``,
``before`` is ``analysis/forecast.py`` as it stood at git revision REV, run on the same rows in the
same process (the threshold table is this tree's), so a change to the forecast is scored against
the one it changes.

- **Tapes**: every recorded tape with a fatal OOM and step rows (``tests/fixtures/`` corpus,
  held-out, held-out wire-1.5 and wire-1.7). At each snapshot before the OOM the rows the hook held
  then (the OOM event's rows up to the snapshot's time) are judged; the truth is the OOM's time
  minus the last row's. Every tape runs out within a minute: rescaling its time by any factor moves
  forecast and truth alike, so its relative errors stand for any horizon.
- **Generated**: ``tests/memory_series.py`` runs of each kind (noisy leak, stair leak, growing
  demand, curriculum, data-dependent outliers) whose trend reaches capacity after about 8 hours,
  judged at 24 times from 1 minute to 6 hours before their OOM with the rows the hook held then.

Per group: forecasts made, median and p90 of |forecast / truth - 1|, the share of forecasts later
than 1.5x the truth (the alert comes late), the share of times with no central forecast, the share
of earliest times later than the truth (over every earliest time published, with a central one or
without), and the share of times with an earliest time but no central one (``too_noisy``: when the
OOM comes is chance beyond the bar; the alert still reads the earliest time). Generated groups are also cut by kind
and horizon together (``by_kind_and_horizon``).

``oracle`` (generated views under an hour, ``--oracle-draws`` runs each, 0 for none): the median
time left over new runs of the same generator with its true parameters from the same step (new
draws of noise and outliers). No forecast from the rows can know more, so its errors are what the
series' own randomness costs at that horizon: the views are picked by their real time left, and a
run that happened to run out early sits in the short horizons whatever anyone forecast.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import memory_series  # noqa: E402

from oomsight.analysis import forecast, trend  # noqa: E402
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


BEFORE: Optional[Any] = None
"""``analysis/forecast.py`` at the ``--before`` revision, loaded as a module of its own (None: not asked)."""


def load_before(rev: str) -> Any:
    """``analysis/forecast.py`` as it stood at git revision ``rev``, as a module."""
    source = subprocess.run(
        ["git", "-C", ROOT, "show", f"{rev}:exporter/oomsight/analysis/forecast.py"],
        check=True, capture_output=True, text=True,
    ).stdout
    spec = importlib.util.spec_from_loader("forecast_before", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    exec(compile(source, f"{rev}:forecast.py", "exec"), module.__dict__)
    return module


def judge(rows: list[list[float]], capacity: float, truth: float, **where: Any) -> dict[str, Any]:
    t = trend.analyse(rows, int(capacity))
    shown = t.points >= trend.MIN_POINTS
    case = {
        **where,
        "truth": truth,
        "current": t.seconds_to_oom if shown else None,
        "earliest": t.earliest_seconds_to_oom if shown else None,
        "reason": t.no_forecast_reason,
        "forecast_kind": t.forecast_kind,
        "baseline": baseline(t, capacity),
    }
    if BEFORE is not None:
        trend.fc = BEFORE  # the same rows through the forecast at --before
        try:
            b = trend.analyse(rows, int(capacity))
        finally:
            trend.fc = forecast
        case["before"] = b.seconds_to_oom if shown else None
        case["before_earliest"] = b.earliest_seconds_to_oom if shown else None
    return case


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


def generated_cases(runs: int, draws: int = 0) -> list[dict[str, Any]]:
    cases = []
    ahead = memory_series.horizons()
    for kind in memory_series.KINDS:
        for seed in range(runs):
            r = memory_series.run(kind, seed, ahead)
            for when, rows in r.views:
                case = judge(rows, r.shape.capacity, r.oom_time - when, kind=kind, seed=seed)
                if draws and case["truth"] < ORACLE_UP_TO:
                    case["oracle"] = oracle(r.shape, int(rows[-1][0]), draws, f"{kind}-{seed}-{when}")
                cases.append(case)
    return cases


ORACLE_UP_TO = 3600.0
"""The oracle is run at horizons under an hour (at longer ones the forecast's errors are already small)."""


def oracle(shape: memory_series.Shape, step: int, draws: int, seed: str) -> float:
    """The best any forecast can say from the rows: the median time left over ``draws`` runs of the
    same generator, with its true parameters, from the same step on (new draws of noise and
    outliers). Its error against the run's own OOM is what the series' randomness alone costs."""
    rng = random.Random(seed)
    left = []
    for _ in range(draws):
        t, k = 0.0, step
        while True:
            k += 1
            t += shape.seconds_per_step * rng.uniform(0.9, 1.1)
            if memory_series._true_step(shape, k, rng)[1] >= shape.capacity or k > 4 * shape.steps_to_oom:
                break
        left.append(t)
    return sorted(left)[draws // 2]


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
    if key in ("current", "before"):
        low = "earliest" if key == "current" else "before_earliest"
        early = [c for c in cases if c[low] is not None]  # published with or without a central time
        out["earliest_later_than_truth_share"] = (
            round(sum(c[low] > c["truth"] for c in early) / len(early), 3) if early else None
        )
        out["earliest_only_share"] = round(sum(c[key] is None for c in early) / len(cases), 3) if cases else None
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
        out[value] = scores(part)
    return out


def scores(cases: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``current`` and ``baseline``, and ``before`` where ``--before`` was asked."""
    keys = ("current", "before", "baseline") if BEFORE is not None else ("current", "baseline")
    out = {key: score(cases, key) for key in keys}
    if ORACLE[0] and cases and all("oracle" in c for c in cases):
        out["oracle"] = score(cases, "oracle")
    return out


ORACLE = [False]


def _commit(rev: str) -> str:
    done = subprocess.run(["git", "-C", ROOT, "rev-parse", rev], check=True, capture_output=True, text=True)
    return done.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20, help="generated runs per kind")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--oracle-draws", type=int, default=30,
                    help="runs per generated view under an hour for the oracle column (0: none)")
    ap.add_argument("--before", metavar="REV", help="also score analysis/forecast.py as it stood at this git revision")
    args = ap.parse_args()
    global BEFORE
    BEFORE = load_before(args.before) if args.before else None
    t0 = time.time()
    tapes = tape_cases()
    generated = generated_cases(args.runs, args.oracle_draws)
    ORACLE[0] = args.oracle_draws > 0
    for c in generated:
        c["horizon"] = bucket(c["truth"])
        c["kind_horizon"] = f"{c['kind']}, {c['horizon']}"
    paging = [c for c in generated if c["truth"] >= 300]
    result = {
        "benchmark": "bench_forecast",
        "late_means": f"forecast > {LATE} x the truth",
        "before": args.before,
        "before_commit": _commit(args.before) if args.before else None,
        "tapes": {
            "all": scores(tapes),
            "by_kind": table(tapes, "kind"),
            "by_tape": table(tapes, "tape"),
        },
        "generated": {
            "runs_per_kind": args.runs,
            "horizons_5min_to_6h": scores(paging),
            "by_horizon": table(generated, "horizon"),
            "by_kind": table(generated, "kind"),
            "by_kind_5min_to_6h": table(paging, "kind"),
            "by_kind_and_horizon": table(generated, "kind_horizon"),
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
