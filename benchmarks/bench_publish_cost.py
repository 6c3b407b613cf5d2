"""What one publish costs the hook's sampler thread on the CPU (a fake CUDA device and NVML; the
real spool writer, JSON and file system), without step rows and with the 246 rows of the shipped
H200 tape's last snapshot: before wire 1.5 they were all written, since 1.5 the verdict and the
last row are. Run from a checkout; ``--label`` names the code it ran on.

    PYTHONPATH=exporter:tests python3 benchmarks/bench_publish_cost.py --label now --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

from oomsight.config import Settings
from oomsight.hook.nvml import Nvml
from oomsight.hook.runtime import Hook
from oomsight.tools import tape
from oomsight.tools.demo import TAPE

from fakes import GIB, FakeCuda, FakeNvmlModule  # tests/ on the path


def publish_us(rows: list[list[float]], n: int) -> dict[str, float]:
    cuda = FakeCuda()
    cuda.set(0, allocated=GIB, reserved=2 * GIB)
    settings = Settings().replace(
        spool_dir=tempfile.mkdtemp(), publish_interval_seconds=3600, window_seconds=3600, termination_message_path=""
    )
    hook = Hook(settings, cuda, Nvml(FakeNvmlModule()))
    hook.sampler.tick()
    if rows:
        hook.step_memory.rows[0] = [list(r) for r in rows]
    samples = []
    for i in range(n):
        if rows and i % 10 == 0:  # a new step row every tenth publish (steps slower than publishes)
            hook.step_memory._append(0, [rows[-1][0] + i, *rows[-1][1:]])
        t0 = time.perf_counter_ns()
        hook.sampler.publish()
        samples.append((time.perf_counter_ns() - t0) / 1000.0)
    samples.sort()
    return {"median_us": round(samples[n // 2], 1), "p99_us": round(samples[int(n * 0.99)], 1), "n": n}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--label", required=True)
    parser.add_argument("-n", type=int, default=2000)
    args = parser.parse_args()
    _, records = tape.read(TAPE)
    rows = next(r["doc"] for r in reversed(records) if r["doc"]["kind"] == "snapshot")["devices"][0]["steps_memory"]
    found: dict[str, Any] = {"no_step_rows": publish_us([], args.n), "246_step_rows": publish_us(rows, args.n)}
    path = os.path.join(args.out, "publish_cost_cpu.json")
    doc: dict[str, Any] = {"benchmark": "bench_publish_cost", "runs": {}}
    if os.path.exists(path):
        with open(path) as fh:
            doc = json.load(fh)
    doc["runs"][args.label] = {"cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()], **found}
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
