"""One line a run (runs.json) and one a judged workload (evaluate.py's JSON), for the device scripts.

    python3 benchmarks/heldout/summarize.py OUT JUDGED_JSON [--detail]

``OUT/heldout/runs.json`` (benchmarks/heldout/run.py) and ``OUT/JUDGED_JSON`` (benchmarks/corpus/evaluate.py
``--json``). ``--detail`` adds each judged workload's remedies and the start of its summary, and for each run
that ran out what it asked for, its cap and the device's free memory (from the OOM message in its tail).
"""

from __future__ import annotations

import json
import os
import re
import sys


def main(argv: list[str]) -> int:
    out, judged_name = argv[0], argv[1]
    detail = "--detail" in argv[2:]
    try:
        with open(os.path.join(out, "heldout", "runs.json")) as fh:
            runs = json.load(fh)
    except (OSError, ValueError) as exc:
        runs = []
        print("no runs.json:", exc)
    for r in runs:
        tag = r["scenario"] + (" --remedy" if r["remedy"] else "")
        line = f"run {tag:58s} label={r['label']:15s} rc={r['rc']} fits={r['fits']} {r['seconds']}s"
        tail = r.get("tail", "")
        ask = re.findall(r"Tried to allocate ([\d.]+ [KMG]iB)", tail)
        if detail and ask:
            cap = re.findall(r"([\d.]+ [KMG]iB) allowed", tail)
            free = re.findall(r"of which ([\d.]+ [KMG]iB) is free", tail)
            line += (f" | OOM asking {ask[-1]}, cap {cap[-1] if cap else 'none'}, "
                     f"device free {free[-1] if free else '?'}")
        print(line)
    try:
        with open(os.path.join(out, judged_name)) as fh:
            j = json.load(fh)
    except (OSError, ValueError) as exc:
        print(f"no judgement: {exc}")
        return 1
    for r in j["scenarios"]:
        print(f"{'ok ' if r['correct'] else 'BAD'} {r['scenario']:48s} label={r['label']:15s} got={r['cause']:15s} "
              f"first={r.get('first_remedy')!s:18s} applied={r.get('remedy_applied')!s:18s} "
              f"fits={r.get('remedy_fits')!s:5s} live_flag max={r['live_flag_max']} final={r['live_flag_final']}")
        if detail:
            print(f"    hook={r.get('hook_cause')} remedies={r.get('remedies')} "
                  f"summary={str(r.get('summary'))[:400]!r}")
    print(f"correct {j['correct']}/{j['total']}; first remedy verified to fit {j['remedy_first_and_fits']}/"
          f"{j['remedy_first_verified']}; false live leak flags: any snapshot {j['false_live_flags_any']}, "
          f"last snapshot {j['false_live_flags_final']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
