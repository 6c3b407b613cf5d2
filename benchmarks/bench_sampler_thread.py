"""CPU time the sampler thread is charged per second, against an idle thread that only
wakes at the same rate, in the same run; and one snapshot write on tmpfs and on ``/tmp``.
No GPU: the hook runs over the tests' fake ``torch.cuda`` and NVML, so this isolates what
the thread itself costs the machine.

    PYTHONPATH=exporter:sidecar:tests python3 benchmarks/bench_sampler_thread.py --out benchmarks/results

Per-thread CPU time is ``/proc/self/task/<tid>/schedstat`` (ns on a CPU, kernel time included).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_cost_accounting import thread_cpu_ns
from common import summary, write


def charged_ms_per_second(native_id: int, seconds: float) -> float:
    c0, t0 = thread_cpu_ns(native_id), time.perf_counter()
    time.sleep(seconds)
    return (thread_cpu_ns(native_id) - c0) / 1e6 / (time.perf_counter() - t0)


def fake_hook(spool_root: str) -> Any:
    """A started hook over fake CUDA and NVML, its spool under ``spool_root``."""
    from oomsight.config import Settings
    from oomsight.hook.nvml import Nvml
    from oomsight.hook.runtime import Hook

    from fakes import FakeCuda, FakeNvmlModule

    cuda = FakeCuda()
    cuda.set(0, allocated=1 << 30, reserved=2 << 30)
    nvml = Nvml(FakeNvmlModule(used=3 << 30, procs=[(os.getpid(), 3 << 30)]))
    spool = tempfile.mkdtemp(prefix="oomsight-thread-", dir=spool_root)
    hook = Hook(Settings().replace(spool_dir=spool, termination_message_path=""), cuda, nvml)
    hook.start()
    return hook


def sampler(spool_root: str, seconds: float) -> float:
    hook = fake_hook(spool_root)
    try:
        time.sleep(1.0)
        (tid,) = [t.native_id for t in threading.enumerate() if t.name == "oomsight-sampler" and t.native_id]
        return charged_ms_per_second(tid, seconds)
    finally:
        hook.stop()


def idle_waiter(interval: float, seconds: float) -> float:
    stop = threading.Event()
    thread = threading.Thread(target=lambda: [None for _ in iter(lambda: stop.wait(interval), True)])
    thread.start()
    try:
        time.sleep(0.5)
        assert thread.native_id is not None
        return charged_ms_per_second(thread.native_id, seconds)
    finally:
        stop.set()
        thread.join()


def write_snapshot_us(spool_root: str, n: int = 300) -> float:
    """CPU µs of one snapshot write (temporary file, write, rename)."""
    hook = fake_hook(spool_root)
    hook.sampler.stop_thread()
    try:
        doc = hook.sampler.build()
        c0 = time.thread_time_ns()
        for _ in range(n):
            hook.sampler.writer.write_snapshot(doc)
        return (time.thread_time_ns() - c0) / n / 1e3
    finally:
        hook.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=5.0)
    args = p.parse_args()
    roots = {"tmpfs": "/dev/shm", "tmp": tempfile.gettempdir()}
    got: dict[str, list[float]] = {"idle_10hz": [], **{f"sampler_{k}": [] for k in roots}}
    for _ in range(args.rounds):  # interleaved
        got["idle_10hz"].append(idle_waiter(0.1, args.seconds))
        for name, root in roots.items():
            got[f"sampler_{name}"].append(sampler(root, args.seconds))
    doc = {
        "seconds_per_measurement": args.seconds,
        "ms_per_second": {k: summary(v) for k, v in got.items()},
        "write_snapshot_us": {name: write_snapshot_us(root) for name, root in roots.items()},
        "raw": got,
    }
    print({k: round(v["median"], 2) for k, v in doc["ms_per_second"].items()}, doc["write_snapshot_us"])  # type: ignore[attr-defined]
    write(args.out, "sampler_thread_cpu.json", doc)


if __name__ == "__main__":
    main()
