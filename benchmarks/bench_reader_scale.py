"""Scrape cost of the spool reader and collector with N ranks publishing (CPU only).

    PYTHONPATH=exporter:sidecar python3 benchmarks/bench_reader_scale.py --out benchmarks/results

Each rank's snapshot is a real one from the shipped H200 tape (one device with categories
and a trend). Two measurements per N:

- ``changed``: every rank rewrote its snapshot since the last scrape (the worst case: a
  scrape interval at or above the publish interval), so the scrape parses and validates all N;
- ``live``: a separate writer process rewrites every snapshot at ``--hz`` while this process
  scrapes at the same rate; the scrape parses whatever changed in between.

A scrape is ``generate_latest`` over a registry holding a ``SpoolCollector``: reading, the
inventory and the exposition text, what ``/metrics`` does without the HTTP.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from oomsight.metrics.collector import SpoolCollector
from oomsight.tools import tape
from oomsight.tools.demo import TAPE
from oomsight.wire.spool import write_atomic

WRITER = """
import json, os, sys, time
root, n, hz, doc = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), json.loads(sys.stdin.read())
seq = 0
while True:
    t0 = time.time()
    seq += 1
    for i in range(n):
        doc["process"].update(id=f"{i}-aa", rank=i, local_rank=i % 8)
        doc.update(time=time.time(), seq=seq)
        path = os.path.join(root, "snapshots", f"{i}-aa.json")
        tmp = os.path.join(root, "snapshots", f".{i}-aa.json.tmp-{os.getpid()}")
        with open(tmp, "w") as fh:
            fh.write(json.dumps(doc))
        os.replace(tmp, path)
    time.sleep(max(0.0, 1 / hz - (time.time() - t0)))
"""


def reference_snapshot() -> dict[str, Any]:
    _, records = tape.read(TAPE)
    return next(r["doc"] for r in reversed(records) if r["doc"]["kind"] == "snapshot")


def publish_all(root: str, doc: dict[str, Any], n: int, seq: int) -> None:
    for i in range(n):
        doc["process"].update(id=f"{i}-aa", rank=i, local_rank=i % 8)
        doc.update(time=time.time(), seq=seq)
        write_atomic(os.path.join(root, "snapshots", f"{i}-aa.json"), json.dumps(doc).encode(), durable=False)


def scrape_ms(registry: CollectorRegistry) -> float:
    t0 = time.perf_counter()
    generate_latest(registry)
    return (time.perf_counter() - t0) * 1000


def stats(ms: list[float]) -> dict[str, float]:
    vs = sorted(ms)
    pick = lambda p: vs[min(len(vs) - 1, round(p / 100 * (len(vs) - 1)))]  # noqa: E731
    return {"n": len(vs), "p50_ms": round(pick(50), 2), "p99_ms": round(pick(99), 2), "max_ms": round(vs[-1], 2)}


def registry_for(root: str) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(SpoolCollector(root, stale_after_seconds=3600))
    return reg


class _Families:
    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> list[Any]:
        return self.families


def measure_changed(n: int, scrapes: int) -> dict[str, Any]:
    """Every rank changed since the last scrape; the scrape and its three parts apart."""
    doc = reference_snapshot()
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "snapshots"))
        reg = registry_for(root)
        collector = SpoolCollector(root, stale_after_seconds=3600)
        parts: dict[str, list[float]] = {"scrape": [], "read": [], "collect": [], "exposition": []}
        for seq in range(scrapes + 2):
            publish_all(root, doc, n, seq)
            took = scrape_ms(reg)
            t0 = time.perf_counter()
            collector.reader.read()
            t1 = time.perf_counter()
            families = list(collector.collect())  # the read inside is of unchanged files: ~0
            t2 = time.perf_counter()
            only = CollectorRegistry()
            only.register(_Families(families))  # type: ignore[arg-type]
            expo = scrape_ms(only)
            if seq >= 2:  # the first two warm the caches and imports
                parts["scrape"].append(took)
                parts["read"].append((t1 - t0) * 1000)
                parts["collect"].append((t2 - t1) * 1000)
                parts["exposition"].append(expo)
        samples = sum(len(f.samples) for f in families)
        return {**stats(parts["scrape"]), "samples": samples, "parts": {k: stats(v) for k, v in parts.items()}}


def measure_live(n: int, hz: float, seconds: float, scrape_hz: float = 0.0) -> dict[str, Any]:
    """A writer process publishes every rank at ``hz``; this one scrapes at ``scrape_hz``."""
    scrape_hz = scrape_hz or hz
    doc = reference_snapshot()
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "snapshots"))
        publish_all(root, doc, n, 0)
        writer = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(WRITER), root, str(n), str(hz)], stdin=subprocess.PIPE, text=True
        )
        assert writer.stdin is not None
        writer.stdin.write(json.dumps(doc))
        writer.stdin.close()
        try:
            reg = registry_for(root)
            scrape_ms(reg)
            ms, end = [], time.time() + seconds
            while time.time() < end:
                t0 = time.time()
                ms.append(scrape_ms(reg))
                time.sleep(max(0.0, 1 / scrape_hz - (time.time() - t0)))
        finally:
            writer.kill()
            writer.wait()
        return {**stats(ms), "writer_hz": hz, "scrape_hz": scrape_hz}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    results = {
        "64_ranks": {
            "changed": measure_changed(64, 200),
            "live_publish_10hz_scrape_10hz": measure_live(64, 10.0, args.seconds),
            "live_publish_1hz_scrape_10hz": measure_live(64, 1.0, args.seconds, scrape_hz=10.0),
        },
        "1000_ranks": {
            "changed": measure_changed(1000, 20),
            "live_publish_1hz_scrape_1hz": measure_live(1000, 1.0, args.seconds),
        },
    }
    doc = {
        "benchmark": "bench_reader_scale",
        "goal": {"64_ranks_p99_ms": 15, "1000_ranks_p99_ms": 200},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "results": results,
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "reader_scale.json")
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
