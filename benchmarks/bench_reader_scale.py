"""Scrape cost of the spool reader and collector with N ranks publishing (CPU only).

    PYTHONPATH=exporter:sidecar python3 benchmarks/bench_reader_scale.py --out benchmarks/results

Each rank's snapshot is a real one from the shipped H200 tape (one device with categories
and 246 step rows, 20 KB), marked running. Every publish moves what a real one moves (the
tape's consecutive snapshots of a rank differ in 6 to 11 of their 48 samples): the step
count and times, allocated, active and requested bytes, NVML used and free bytes and
utilization. A scrape is what the sidecar's ``/metrics`` does without the HTTP:
``SpoolCollector.exposition`` (read, inventory, the cached exposition) in the Prometheus
text format; uncached is ``generate_latest`` over a registry holding the collector, what
``/metrics`` did before the cache (and what ``collect()`` users still get). Every case also
counts the full garbage collections that ran inside its timed scrapes, and the longest
(``full_gc_in_scrapes``): they, not the reader, make most of the 1,000-rank p99. Cases per N:

- ``changed``: every rank rewrote its snapshot since the last scrape (the worst case, and the
  usual one: the hook publishes every second, Prometheus scrapes every 15 or 30 s), so the
  scrape parses and validates all N. A scrape is one call, as ``/metrics`` makes it, timed
  whole; its parts: ``read`` (parse and validate, the reader alone, timed inside it) and
  ``render`` (the rest: inventory, building the changed processes' parts, writing their lines,
  the assembly). Until December 2026 a scrape was timed as a read and then a second call
  whose own read found nothing changed, which counted one unchanged read too many;
  ``changed_uncached``: the same with ``render`` done as before the cache;
- ``unchanged``: no file changed since the last scrape (an ``lstat`` per file, the ages);
- ``live``: a separate writer process rewrites every snapshot at ``--hz`` while this process
  scrapes at its own rate; the scrape parses whatever changed in between
  (``parsed_per_scrape``).

Every publish also slides the device's step rows (one row in, the oldest out), as the hook's
ring does between two real publishes, so a changed file's trend is judged again. The process
runs with the sidecar's garbage collection thresholds (``oomsight_sidecar.main.tune_gc``);
``--gc default`` keeps CPython's. ``--before FILE`` keeps an earlier run's results in the new
file, under ``before``.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any, Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.openmetrics import exposition as openmetrics

from oomsight.analysis import trend
from oomsight.metrics.collector import SpoolCollector
from oomsight.tools import tape
from oomsight.tools.demo import TAPE
from oomsight.wire.spool import write_atomic


def move(doc: dict[str, Any], seq: int, i: int) -> None:
    """What a publish moves (the writer process below runs this function's source)."""
    s, d = doc["steps"], doc["devices"][0]
    s["count"] += 1
    s["duration_seconds_total"] += 0.025
    s["last_duration_seconds"] = 0.025 + (seq % 7) * 1e-4
    a, nv = d["allocator"], d["nvml"]
    a["allocated_bytes"] = a["active_bytes"] = a["requested_bytes"] = 7360741376 - (seq % 13) * 2**20 - i
    nv["used_bytes"] = 8276213760 + (seq % 5) * 2**21
    nv["free_bytes"] = nv["total_bytes"] - nv["used_bytes"]
    nv["utilization_ratio"] = (seq % 100) / 100
    rows = d["steps_memory"]  # the hook's ring of step rows slides: one row in, the oldest out
    last = rows[-1]
    rows.append([last[0] + 1, last[1] + 0.025, last[2], last[3] - (seq % 3) * 2**20, last[4], last[5]])
    del rows[0]
    judged = d.get("step_trend")
    if judged is not None:  # a 1.5 writer: only the last row, and its verdict judged again
        judged["points"] += 1
        judged["floor_slope_bytes"] = float((seq % 11) * 1024)


WRITER = """
import json, os, sys, time
from typing import Any
root, n, hz, doc = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), json.loads(sys.stdin.read())
seq = 0
while True:
    t0 = time.time()
    seq += 1
    for i in range(n):
        doc["process"].update(id=f"{i}-aa", rank=i, local_rank=i % 8)
        doc.update(time=time.time(), seq=seq)
        move(doc, seq, i)
        path = os.path.join(root, "snapshots", f"{i}-aa.json")
        tmp = os.path.join(root, "snapshots", f".{i}-aa.json.tmp-{os.getpid()}")
        with open(tmp, "w") as fh:
            fh.write(json.dumps(doc))
        os.replace(tmp, path)
    time.sleep(max(0.0, 1 / hz - (time.time() - t0)))
"""
TEXT = (generate_latest, CONTENT_TYPE_PLAIN_0_0_4)
OPENMETRICS = (openmetrics.generate_latest, openmetrics.CONTENT_TYPE_LATEST)


def _writer_source() -> str:
    head, loop = WRITER.split("seq = 0\n", 1)
    return textwrap.dedent(head) + inspect.getsource(move) + "seq = 0\n" + loop


def reference_snapshot(older: bool = False) -> dict[str, Any]:
    """The tape's last snapshot, running: as this hook writes it (wire 1.5: the verdict on its
    step rows and the last row alone, no sampled trend), or, ``older``, as the tape holds it
    (every step row, 20 KB)."""
    _, records = tape.read(TAPE)
    doc = next(r["doc"] for r in reversed(records) if r["doc"]["kind"] == "snapshot")
    doc.update(state="running", exit_reason=None)
    if not older:
        for d in doc["devices"]:
            rows = d["steps_memory"]
            d["step_trend"] = trend.verdict(trend.analyse(rows, d.get("limit_bytes") or d["total_bytes"]))
            d["steps_memory"], d["trend"] = rows[-1:], []
    return doc


def publish_all(root: str, doc: dict[str, Any], n: int, seq: int) -> None:
    for i in range(n):
        doc["process"].update(id=f"{i}-aa", rank=i, local_rank=i % 8)
        doc.update(time=time.time(), seq=seq)
        move(doc, seq, i)
        write_atomic(os.path.join(root, "snapshots", f"{i}-aa.json"), json.dumps(doc).encode(), durable=False)


class FullCollections:
    """Times CPython's full (generation 2) garbage collections while ``on``: with 1,000 parsed
    20 KB documents alive, one traverses millions of objects."""

    def __init__(self) -> None:
        self.on, self.ms, self._t0 = False, [], 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self.on:
            self.ms.append((time.perf_counter() - self._t0) * 1000)

    def summary(self) -> dict[str, Any]:
        gc.callbacks.remove(self._callback)
        return {"count": len(self.ms), "max_ms": round(max(self.ms, default=0.0), 1)}


FULL_GC: FullCollections | None = None


def timed_ms(work: Callable[[], Any]) -> float:
    if FULL_GC is not None:
        FULL_GC.on = True
    t0 = time.perf_counter()
    work()
    took = (time.perf_counter() - t0) * 1000
    if FULL_GC is not None:
        FULL_GC.on = False
    return took


def stats(ms: list[float]) -> dict[str, float]:
    vs = sorted(ms)
    pick = lambda p: vs[min(len(vs) - 1, round(p / 100 * (len(vs) - 1)))]  # noqa: E731
    return {"n": len(vs), "p50_ms": round(pick(50), 2), "p99_ms": round(pick(99), 2), "max_ms": round(vs[-1], 2)}


def collector_for(root: str) -> SpoolCollector:
    return SpoolCollector(root, stale_after_seconds=3600)


def measured(work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``work()``'s figures, with the full collections that ran inside its timed scrapes."""
    global FULL_GC
    FULL_GC = FullCollections()
    try:
        found = work()
    finally:
        full, FULL_GC = FULL_GC.summary(), None
    return {**found, "full_gc_in_scrapes": full}


def measure_changed(
    n: int, scrapes: int, fmt: tuple[Any, str] = TEXT, cached: bool = True, older: bool = False
) -> dict[str, Any]:
    """Every rank changed since the last scrape. A scrape is one call of what ``/metrics`` calls
    (the collector's exposition; ``cached=False``: ``generate_latest`` over a registry holding the
    collector, as before the cache), timed whole; its parts: ``read`` (the reader parsing and
    validating the changed files, timed inside the scrape) and ``render`` (the rest: inventory,
    building the changed processes' parts, writing their lines, the assembly). ``older``: every
    rank an older writer's 20 KB snapshot, whose step rows the reader judges."""
    doc = reference_snapshot(older)
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "snapshots"))
        collector, registry = collector_for(root), CollectorRegistry()
        registry.register(collector)
        render = (lambda: collector.exposition(*fmt)) if cached else (lambda: fmt[0](registry))
        reads: list[float] = []
        read = collector.reader.read

        def timed_read() -> Any:
            t0 = time.perf_counter()
            try:
                return read()
            finally:
                reads.append((time.perf_counter() - t0) * 1000)

        collector.reader.read = timed_read
        parts: dict[str, list[float]] = {"scrape": [], "read": [], "render": []}
        for seq in range(scrapes + 2):
            publish_all(root, doc, n, seq)
            reads.clear()
            took = timed_ms(render)
            if seq >= 2:  # the first two fill the caches
                parts["scrape"].append(took)
                parts["read"].append(sum(reads))
                parts["render"].append(took - sum(reads))
        text = collector.exposition(*fmt).decode()
        samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        return {
            **stats(parts["scrape"]),
            "samples": samples,
            "bytes": len(text),
            "per_changed_file_ms": round(stats(parts["scrape"])["p50_ms"] / n, 3),
            "parts": {k: stats(v) for k, v in parts.items()},
        }


def measure_unchanged(n: int, scrapes: int) -> dict[str, Any]:
    """Nothing changed since the last scrape."""
    doc = reference_snapshot()
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "snapshots"))
        publish_all(root, doc, n, 0)
        collector = collector_for(root)
        collector.exposition(*TEXT)
        parsed = collector.reader.parsed
        ms = [timed_ms(lambda: collector.exposition(*TEXT)) for _ in range(scrapes)]
        assert collector.reader.parsed == parsed, "an unchanged file was parsed again"
        return stats(ms)


def measure_live(n: int, hz: float, seconds: float, scrape_hz: float = 0.0) -> dict[str, Any]:
    """A writer process publishes every rank at ``hz``; this one scrapes at ``scrape_hz``."""
    scrape_hz = scrape_hz or hz
    doc = reference_snapshot()
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "snapshots"))
        publish_all(root, doc, n, 0)
        writer = subprocess.Popen(
            [sys.executable, "-c", _writer_source(), root, str(n), str(hz)], stdin=subprocess.PIPE, text=True
        )
        assert writer.stdin is not None
        writer.stdin.write(json.dumps(doc))
        writer.stdin.close()
        try:
            collector = collector_for(root)
            collector.exposition(*TEXT)
            parsed = collector.reader.parsed
            ms, end = [], time.time() + seconds
            while time.time() < end:
                t0 = time.time()
                ms.append(timed_ms(lambda: collector.exposition(*TEXT)))
                time.sleep(max(0.0, 1 / scrape_hz - (time.time() - t0)))
        finally:
            writer.kill()
            writer.wait()
        per_scrape = (collector.reader.parsed - parsed) / len(ms)
        return {**stats(ms), "writer_hz": hz, "scrape_hz": scrape_hz, "parsed_per_scrape": round(per_scrape, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--gc", choices=("sidecar", "default"), default="sidecar", help="thresholds (default: sidecar)")
    parser.add_argument("--before", help="an earlier run's results file, kept under 'before' (default: none)")
    args = parser.parse_args()
    if args.gc == "sidecar":
        from oomsight_sidecar.main import tune_gc

        tune_gc()
    results = {
        "64_ranks": {
            "changed": measured(lambda: measure_changed(64, 200)),
            "changed_uncached": measured(lambda: measure_changed(64, 200, cached=False)),
            "changed_older_writer": measured(lambda: measure_changed(64, 100, older=True)),
            "changed_openmetrics": measured(lambda: measure_changed(64, 50, OPENMETRICS)),
            "unchanged": measured(lambda: measure_unchanged(64, 200)),
            "live_publish_10hz_scrape_10hz": measured(lambda: measure_live(64, 10.0, args.seconds)),
            "live_publish_1hz_scrape_10hz": measured(lambda: measure_live(64, 1.0, args.seconds, scrape_hz=10.0)),
        },
        "1000_ranks": {
            "changed": measured(lambda: measure_changed(1000, 20)),
            "changed_uncached": measured(lambda: measure_changed(1000, 20, cached=False)),
            "changed_older_writer": measured(lambda: measure_changed(1000, 10, older=True)),
            "unchanged": measured(lambda: measure_unchanged(1000, 50)),
            "live_publish_1hz_scrape_1hz": measured(lambda: measure_live(1000, 1.0, 3 * args.seconds)),
            "live_publish_0.1hz_scrape_1hz": measured(
                lambda: measure_live(1000, 0.1, 3 * args.seconds, scrape_hz=1.0)
            ),
        },
    }
    doc = {
        "benchmark": "bench_reader_scale",
        "goal": {"64_ranks_p99_ms": 15, "1000_ranks_p99_ms": 200},
        "machine": {
            "cpus": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(),
            "platform": platform.platform(),
            "gc_threshold": list(gc.get_threshold()),
        },
        "results": results,
    }
    if args.before:
        with open(args.before) as fh:
            doc["before"] = json.load(fh)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "reader_scale.json")
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
