"""What judging the step rows in the hook costs the training process, and what it saves the
spool's reader (wire 1.5), per publish, on the CPU.

    PYTHONPATH=exporter python3 benchmarks/bench_step_verdict.py --out benchmarks/results

The hook keeps up to 256 step rows a device. Before 1.5 it wrote them all into every snapshot
(and judged them anyway, before each publish, for its own leak scan); since 1.5 it judges them once
after each new row (``StepMemory.judged``) and writes the verdict and the last row. Measured on the
shipped H200 tape's last snapshot (246 rows), in this process: the judging, the snapshot's
``json.dumps`` (what the sampler thread pays to write it) and the reader's parse and validation of
the result (what every scrape pays per changed process).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import measure

from oomsight.analysis import trend
from oomsight.tools import tape
from oomsight.tools.demo import TAPE
from oomsight.wire.schema import validate


def median_us(fn: Callable[[], Any], n: int) -> float:
    return round(measure(fn, n)["median_us"], 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("-n", type=int, default=2000)
    args = parser.parse_args()
    _, records = tape.read(TAPE)
    older = next(r["doc"] for r in reversed(records) if r["doc"]["kind"] == "snapshot")
    d = older["devices"][0]
    rows, capacity = d["steps_memory"], d.get("limit_bytes") or d["total_bytes"]
    newer = copy.deepcopy(older)
    verdict = trend.verdict(trend.analyse(rows, capacity))
    newer["devices"][0].update(step_trend=verdict, steps_memory=rows[-1:], trend=[])
    texts = {"before_1_5": json.dumps(older), "since_1_5": json.dumps(newer)}
    judging = median_us(lambda: trend.analyse(rows, capacity), args.n)
    results: dict[str, Any] = {"rows": len(rows), "judge_rows_us": judging}
    for name, doc in (("before_1_5", older), ("since_1_5", newer)):
        text = texts[name]
        results[name] = {
            "snapshot_bytes": len(text),
            "hook_json_dumps_us": median_us(lambda doc=doc: json.dumps(doc), args.n),
            "reader_parse_and_validate_us": median_us(lambda text=text: validate(json.loads(text), True), args.n),
        }
    out = {
        "benchmark": "bench_step_verdict",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "results": results,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "step_verdict.json"), "w") as fh:
        json.dump(out, fh, indent=1, sort_keys=True)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
