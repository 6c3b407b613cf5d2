"""Sidecar scrape latency (median, p99) and memory with N processes writing the spool.

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/bench_sidecar.py --out benchmarks/results [--cpu-fake]

By default N real CUDA processes (``import oomsight.auto``) train a small model and
write the spool while a real ``oomsight sidecar`` serves it. ``--cpu-fake`` writes the
same number of processes with the hook over fakes (for machines without a GPU).
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

from common import percentile, write

WORKER = """
import oomsight.auto
import time, torch
from torch import nn
model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(4)]).cuda()
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(64, 1024, device="cuda")
end = time.time() + float(__import__("sys").argv[1])
while time.time() < end:
    model(x).square().mean().backward(); opt.step(); opt.zero_grad()
    time.sleep(0.01)
"""


SIDECAR = (
    "import argparse, sys; from oomsight_sidecar.command import register; "
    "p = argparse.ArgumentParser(); register(p.add_subparsers()); a = p.parse_args(); sys.exit(a.handler(a))"
)
"""``oomsight sidecar`` from the tree: its entry point is registered only where the package is installed."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out


def scrape(url: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    body = urllib.request.urlopen(url, timeout=5).read()
    return time.perf_counter() - t0, len(body)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--processes", type=int, default=8)
    p.add_argument("--scrapes", type=int, default=300)
    args = p.parse_args()
    spool = tempfile.mkdtemp(prefix="oomsight-sidecar-bench-")
    job = os.path.join(spool, "..", f"worker-{os.getpid()}.py")
    with open(job, "w") as fh:
        fh.write(textwrap.dedent(WORKER))
    env = {**os.environ, "OOMSIGHT_DIR": spool}
    workers = [
        subprocess.Popen([sys.executable, job, "40"], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
        for r in range(args.processes)
    ]
    port = free_port()
    sidecar = subprocess.Popen(
        [sys.executable, "-c", SIDECAR, "sidecar", "--spool", spool, "--host", "127.0.0.1", "--port", str(port)],
        env=env,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                body = urllib.request.urlopen(url, timeout=2).read().decode()
                if body.count("oomsight_process_up{") >= args.processes:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        latencies, size = [], 0
        for _ in range(args.scrapes):
            dt, size = scrape(url)
            latencies.append(dt)
        memory = rss_kib(sidecar.pid)
    finally:
        sidecar.terminate()
        sidecar.wait(10)
        for w in workers:
            w.terminate()
            w.wait(30)
    result = {
        "processes": args.processes,
        "scrapes": args.scrapes,
        "scrape_seconds": {
            "median": percentile(latencies, 50),
            "p99": percentile(latencies, 99),
            "max": max(latencies),
        },
        "exposition_bytes": size,
        "sidecar_memory_kib": memory,
    }
    print(result)
    write(args.out, "sidecar.json", result)


if __name__ == "__main__":
    main()
