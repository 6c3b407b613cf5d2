"""Judge the labelled corpus from its tapes (CPU): the diagnosis of every OOM, the leak flag
over time, and the remedy verification runs. The live flag is also read as exported
(``oomsight_leak_suspected``: the step rows' verdict or a forward pile): per run its max over the
tape's snapshots and its value in the last one (``live_flag_max`` / ``live_flag_final``).

    PYTHONPATH=exporter python3 benchmarks/corpus/evaluate.py TAPES_DIR [--json OUT]

Every OOM event is diagnosed again with the current ``analysis.diagnosis`` from the facts it
recorded, so a change of the rules is judged on the same runs. ``runs.json`` beside the
tapes (written on the GPU by ``run.py``) says whether each remedy run then fitted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from oomsight.analysis import trend
from oomsight.analysis.diagnosis import CAUSES, diagnose, facts_from_event
from oomsight.metrics.family import leak_suspected
from oomsight.tools import tape

LABELS = {
    "leak_outputs_fast": ("leak", "leak"),
    "leak_loss_slow": ("leak", "leak"),
    "leak_detached_cache": ("leak", "leak"),
    "growing_batch": ("growing_demand", "bound_input"),
    "growing_sequence": ("growing_demand", "bound_input"),
    "variable_length_outlier": ("growing_demand", "bound_input"),
    "steady_too_big": ("activations", "checkpointing"),
    "steady_too_big_autocast": ("activations", "checkpointing"),
    "steady_too_big_checkpointed": ("activations", "batch"),
    "recovered_by_user_code": ("activations", "checkpointing"),
    "optimizer_state_batch1": ("model_states", "bf16_params"),
    "gradients_do_not_fit": ("model_states", "bf16_params"),
    "fragmented_cache": ("fragmentation", "expandable"),
    "fragmented_cache_wide": ("fragmentation", "expandable"),
    "one_huge_tensor": ("oversized_request", "oversized"),
    "another_process_holds_memory": ("other_process", "other_process"),
    "library_cudamalloc": ("non_pytorch_memory", "non_pytorch"),
    "steady_fits": ("none", "-"),
    "variable_length_fits": ("none", "-"),
    "growing_then_steady_fits": ("none", "-"),
    "steady_autocast_accumulation_fits": ("none", "-"),
}
"""Scenario -> (true cause, the remedy key its ``--remedy`` run applies); ``none``: no OOM."""
EXPECTED_OUTCOME = {"recovered_by_user_code": "recovered"}


def leak_flag(dev: dict[str, Any]) -> Any:
    """The step at which a snapshot's device first showed the leak flag, or None without one: the
    hook's own verdict (wire 1.5: the step of the snapshot's last row), or an older writer's rows
    judged here (the first row at which they were a leak)."""
    rows = dev.get("steps_memory") or []
    judged = dev.get("step_trend")
    if judged is not None:
        return (int(rows[-1][trend.STEP]) if rows else 0) if judged.get("leak") else None
    capacity = dev.get("limit_bytes") or dev.get("total_bytes") or 1
    if rows and trend.analyse(rows, capacity).leak:
        return trend.first_leak_step(rows, capacity)
    return None


def judge_tape(path: str) -> dict[str, Any]:
    """The OOM diagnoses and the leak flag of one recorded run."""
    _header, records = tape.read(path)
    events: dict[str, dict[str, Any]] = {}
    first_flag = None
    flagged_rows = 0
    live: list[int] = []  # per snapshot: the exported oomsight_leak_suspected, any device
    for rec in records:
        doc = rec["doc"]
        if doc.get("kind") == "oom_event":
            events[rec["path"]] = doc  # the last write of each event (outcome settled)
        elif doc.get("kind") == "snapshot":
            live.append(max((int(leak_suspected(dev)) for dev in doc.get("devices", [])), default=0))
            for dev in doc.get("devices", []):
                flag = leak_flag(dev)
                if flag is not None:
                    flagged_rows += 1
                    first_flag = flag if first_flag is None else first_flag
    first = sorted(events.values(), key=lambda e: e["seq"])[:1]
    out: dict[str, Any] = {"ooms": len(events), "leak_flag_snapshots": flagged_rows, "leak_first_step": first_flag,
                           "live_flag_max": max(live, default=None), "live_flag_final": live[-1] if live else None,
                           "live_flag_snapshots": sum(live)}
    if first:
        ev = first[0]
        d = diagnose(facts_from_event(ev))
        out.update(
            cause=d["cause"],
            hook_cause=ev["diagnosis"]["cause"],
            first_remedy=(d["facts"].get("remedies") or [None])[0],
            remedies=d["facts"].get("remedies"),
            outcome=ev["outcome"],
            summary=d["summary"],
            job=ev.get("job"),
            phase=ev.get("phase"),
        )
    else:
        out.update(cause="none", first_remedy=None, outcome=None)
    return out


def labels_of(folder: str) -> dict[str, tuple[str, str]]:
    """The folder's ``labels.json`` ({name: [true cause, remedy key]}, written by a runner of
    another set of workloads, e.g. ``benchmarks/heldout``), else this corpus's LABELS."""
    path = os.path.join(folder, "labels.json")
    if not os.path.exists(path):
        return LABELS
    with open(path) as fh:
        return {name: (str(v[0]), str(v[1])) for name, v in json.load(fh).items()}


def evaluate(folder: str) -> dict[str, Any]:
    runs_path = os.path.join(folder, "runs.json")
    runs = []
    if os.path.exists(runs_path):
        with open(runs_path) as fh:
            runs = json.load(fh)
    remedy_fit = {r["scenario"]: r["fits"] for r in runs if r["remedy"]}
    rows = []
    for name, (label, applied) in labels_of(folder).items():
        path = os.path.join(folder, f"{name}.tape.jsonl.gz")
        if not os.path.exists(path):
            continue
        j = judge_tape(path)
        j.update(scenario=name, label=label, correct=j["cause"] == label)
        if name in EXPECTED_OUTCOME:
            j["correct"] = j["correct"] and j["outcome"] == EXPECTED_OUTCOME[name]
        if label != "none":
            j["remedy_applied"] = applied
            j["remedy_is_first"] = j["first_remedy"] == applied
            j["remedy_fits"] = remedy_fit.get(name)
        rows.append(j)
    causes = [*CAUSES, "none"]
    matrix = {t: dict.fromkeys(causes, 0) for t in causes}
    for r in rows:
        matrix[r["label"]][r["cause"]] += 1
    verified = [r for r in rows if r.get("remedy_is_first") and r.get("remedy_fits") is not None]
    return {
        "scenarios": rows,
        "correct": sum(r["correct"] for r in rows),
        "total": len(rows),
        "confusion": matrix,
        "remedy_first_and_fits": sum(bool(r["remedy_fits"]) for r in verified),
        "remedy_first_verified": len(verified),
        "false_leak_flags": sum(1 for r in rows if r["label"] != "leak" and r["leak_flag_snapshots"]),
        "false_live_flags_any": sum(1 for r in rows if r["label"] != "leak" and r["live_flag_max"]),
        "false_live_flags_final": sum(1 for r in rows if r["label"] != "leak" and r["live_flag_final"]),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    result = evaluate(args.folder)
    for r in result["scenarios"]:
        mark = "ok " if r["correct"] else "BAD"
        print(
            f"{mark} {r['scenario']:36s} label={r['label']:20s} got={r['cause']:20s} "
            f"first={r.get('first_remedy')!s:16s} fits={r.get('remedy_fits')!s:5s} "
            f"leak_first_step={r['leak_first_step']} flags={r['leak_flag_snapshots']} "
            f"live_flag max={r['live_flag_max']} final={r['live_flag_final']}"
        )
    print(f"correct {result['correct']}/{result['total']}; first remedy verified to fit "
          f"{result['remedy_first_and_fits']}/{result['remedy_first_verified']}; "
          f"false leak flags {result['false_leak_flags']}; live flag (oomsight_leak_suspected) up on a non-leak "
          f"job at any snapshot {result['false_live_flags_any']}, at the last {result['false_live_flags_final']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
