"""The scorecard (issue 48): every labelled case the project has recorded, judged again by the current
diagnosis, and the verdicts that were right, which no change may make wrong.

A case is one recorded run with a label: the corpus (``tests/fixtures/corpus``, labelled in
``benchmarks/corpus/evaluate.LABELS``) and every fixture folder with a ``labels.json`` (the held-out runs on the
H200 and H100 of issues 33-48). Each is judged on three things, each recorded as right or wrong:

``cause``          the first OOM's cause (re-diagnosed from the event's recorded facts) is the label
``first_remedy``   the first remedy is the fix the GPU run applied, where that run fitted
``live_flag``      a job that keeps nothing never ends with the live leak flag up (its last snapshot)

    PYTHONPATH=exporter python3 benchmarks/scorecard.py            # print the card and the change against the record
    PYTHONPATH=exporter python3 benchmarks/scorecard.py --write    # record it (benchmarks/results/scorecard.json)

``tests/test_scorecard.py`` fails when any verdict the record holds right is wrong now; a change that makes
more right is recorded with ``--write`` and raises the bar.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from typing import Any, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "exporter")]

from benchmarks.corpus import evaluate  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
RECORD = os.path.join(ROOT, "benchmarks", "results", "scorecard.json")
CRITERIA = ("cause", "first_remedy", "live_flag")


def folders() -> list[str]:
    """The corpus and every fixture folder with a ``labels.json``."""
    labelled = sorted(n for n in os.listdir(FIXTURES) if os.path.exists(os.path.join(FIXTURES, n, "labels.json")))
    return ["corpus", *labelled]


def card() -> dict[str, dict[str, Optional[bool]]]:
    """Case ("folder/name") -> criterion -> right (None: not judged for this case)."""
    out: dict[str, dict[str, Optional[bool]]] = {}
    for folder in folders():
        for row in evaluate.evaluate(os.path.join(FIXTURES, folder))["scenarios"]:
            verified = row.get("remedy_fits") is True
            out[f"{folder}/{row['scenario']}"] = {
                "cause": bool(row["correct"]),
                "first_remedy": bool(row.get("remedy_is_first")) if verified else None,
                "live_flag": (not row.get("live_flag_final")) if row["label"] != "leak" else None,
            }
    return out


def totals(cases: dict[str, dict[str, Optional[bool]]]) -> dict[str, dict[str, int]]:
    return {
        c: {
            "right": sum(1 for v in cases.values() if v.get(c) is True),
            "judged": sum(1 for v in cases.values() if v.get(c) is not None),
        }
        for c in CRITERIA
    }


def lowered(record: dict[str, Any], now: dict[str, dict[str, Optional[bool]]]) -> list[str]:
    """Every (case, criterion) the record holds right that is not right now (a case gone counts as lowered)."""
    out = []
    for case, verdicts in record["cases"].items():
        for criterion, right in verdicts.items():
            if right is True and (now.get(case) or {}).get(criterion) is not True:
                out.append(f"{case}: {criterion}")
    return out


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="record the card as the new bar")
    args = ap.parse_args()
    now = card()
    record: dict[str, Any] = {"cases": {}}
    if os.path.exists(RECORD):
        with open(RECORD) as fh:
            record = json.load(fh)
    for criterion, t in totals(now).items():
        print(f"{criterion:13s} {t['right']}/{t['judged']}")
    wrong = sorted(f"{case}: {c}" for case, v in now.items() for c, right in v.items() if right is False)
    for line in wrong:
        print(f"wrong   {line}")
    down = lowered(record, now)
    for line in down:
        print(f"LOWERED {line}")
    if args.write:
        if down:
            print("not written: a verdict the record holds right is wrong now", file=sys.stderr)
            return 1
        doc = {
            "commit": _commit(),
            "date": datetime.date.today().isoformat(),
            "what": "every labelled case re-judged by the current diagnosis (benchmarks/scorecard.py)",
            "totals": totals(now),
            "cases": now,
        }
        with open(RECORD, "w") as fh:
            json.dump(doc, fh, indent=1, sort_keys=True)
            fh.write("\n")
    return 1 if down else 0


if __name__ == "__main__":
    sys.exit(main())
