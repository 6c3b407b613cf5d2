"""How long after a real CUDA OOM ``/metrics`` shows it (goal: at most 1 s).

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/bench_oom_latency.py --out benchmarks/results

Each trial runs a job under ``oomsight run``; the job writes the wall time just before
the failing allocation, catches the OOM and idles. The benchmark polls ``/metrics``
every 5 ms and records when ``oomsight_oom_events_total`` first reads 1.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import summary, write

JOB = """
import sys, time, torch
x = torch.randn(1024, 1024, device="cuda") @ torch.randn(1024, 1024, device="cuda")
torch.cuda.synchronize()
time.sleep(2.0)
with open(sys.argv[1], "w") as fh:
    fh.write(repr(time.time()))
try:
    torch.empty(400 * 2**30, dtype=torch.uint8, device="cuda")
except torch.cuda.OutOfMemoryError:
    pass
time.sleep(3.0)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def trial(workdir: str) -> float:
    job = os.path.join(workdir, "job.py")
    with open(job, "w") as fh:
        fh.write(textwrap.dedent(JOB))
    marker = os.path.join(workdir, f"t0-{time.time_ns()}")
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "oomsight",
            "run",
            "--no-report",
            "--port",
            str(port),
            "--",
            sys.executable,
            job,
            marker,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seen = None
    try:
        deadline = time.time() + 60
        while time.time() < deadline and seen is None:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
            except OSError:
                time.sleep(0.005)
                continue
            if any(
                line.startswith("oomsight_oom_events_total{") and line.endswith(" 1.0") for line in body.splitlines()
            ):
                seen = time.time()
            time.sleep(0.005)
    finally:
        proc.wait(60)
    with open(marker) as fh:
        t0 = float(fh.read())
    assert seen is not None, "the OOM never showed up in /metrics"
    return seen - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--trials", type=int, default=5)
    args = p.parse_args()
    workdir = tempfile.mkdtemp()
    latencies = [trial(workdir) for _ in range(args.trials)]
    print("OOM -> /metrics latency seconds:", [round(x, 4) for x in latencies])
    write(
        args.out,
        "oom_latency.json",
        {"latency_seconds": summary(latencies), "raw": latencies, "poll_interval_seconds": 0.005},
    )


if __name__ == "__main__":
    main()
