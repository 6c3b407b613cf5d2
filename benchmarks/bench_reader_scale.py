"""Scrape cost of the spool reader and collector at a pod's scale, this tree against an older one in the
same run (issue 25's budget; CPU only).

    PYTHONPATH=exporter:sidecar python3 benchmarks/bench_reader_scale.py --before 918675c --out benchmarks/results

Each rank's snapshot is a real one from the shipped H200 tape (one device with categories, its step
rows as this hook writes them: the verdict and the last row), marked running. Before every scrape every
rank publishes again (the worst case, and the usual one: the hook publishes every second, Prometheus
scrapes every 15 or 30 s) and each publish moves what a real one moves (``move``). A scrape is what the
sidecar's ``/metrics`` does without the HTTP: read, inventory and the text (``SpoolCollector.exposition``
in the Prometheus text format), timed whole, with the sidecar's garbage collection thresholds. The older
tree (``--before``: a commit, checked out as a git worktree) runs the same measurement in its own
process; so does this tree. Then a real ``oomsight sidecar`` of each tree serves 16 ranks that publish
between scrapes, over HTTP, and its resident memory (VmRSS, VmHWM) is read.

Budget (issue 25): 8 ranks p99 <= 30 ms, 16 ranks <= 50 ms, 64 ranks <= 250 ms; sidecar RSS <= 40 MiB
at 16 ranks.

``--unchanged`` (issues 36 and 44) measures instead the CPU of a scrape of 64 ranks whose files did not
change, in interleaved rounds of one process, in four modes (:data:`MODES`): nothing kept (``off``), the
reader's parsed documents kept (``parsed``: the tree before issue 36's samples), those and the collector's
samples of each snapshot document (``samples``: the tree before issue 44), and those with each process's
text as the encoder wrote it (``text``: this tree); each part of the scrape apart (the read, the inventory
and the families, the text), and the samples of each family. Then the wall time of a scrape of 64 ranks
that all changed, ``samples`` against ``text`` in turns (what keeping the text costs when nothing can be
reused; CPU and wall):

    PYTHONPATH=exporter:sidecar python3 benchmarks/bench_reader_scale.py --unchanged --out benchmarks/results
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from functools import partial
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RANKS = {1: 200, 8: 200, 16: 150, 64: 60}
"""Ranks -> scrapes timed."""
BUDGET_P99_MS = {8: 30, 16: 50, 64: 250}
BUDGET_RSS_MIB = 40
RSS_RANKS = 16
SIDECAR = (
    "import argparse, sys; from oomsight_sidecar.command import register; "
    "p = argparse.ArgumentParser(); register(p.add_subparsers()); a = p.parse_args(); sys.exit(a.handler(a))"
)


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


def reference_snapshot(older: bool = False) -> dict[str, Any]:
    """The tape's last snapshot, running: as this hook writes it (wire 1.5: the verdict on its
    step rows and the last row alone, no sampled trend), or, ``older``, as the tape holds it
    (every step row, 20 KB)."""
    from oomsight.analysis import trend
    from oomsight.tools import tape
    from oomsight.tools.demo import TAPE

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
    from oomsight.wire.spool import write_atomic

    for i in range(n):
        doc["process"].update(id=f"{i}-aa", rank=i, local_rank=i % 8)
        doc.update(time=time.time(), seq=seq)
        move(doc, seq, i)
        write_atomic(os.path.join(root, "snapshots", f"{i}-aa.json"), json.dumps(doc).encode(), durable=False)


def stats(ms: list[float]) -> dict[str, float]:
    vs = sorted(ms)
    pick = lambda p: vs[min(len(vs) - 1, round(p / 100 * (len(vs) - 1)))]  # noqa: E731
    return {"n": len(vs), "p50_ms": round(pick(50), 2), "p99_ms": round(pick(99), 2), "max_ms": round(vs[-1], 2)}


def measure_changed(n: int, scrapes: int) -> dict[str, Any]:
    """Every rank changed since the last scrape; a scrape timed whole."""
    from prometheus_client import generate_latest
    from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

    from oomsight.metrics.collector import SpoolCollector

    doc = reference_snapshot()
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "snapshots"))
        collector = SpoolCollector(root, stale_after_seconds=3600)
        ms = []
        for seq in range(scrapes + 2):
            publish_all(root, doc, n, seq)
            t0 = time.perf_counter()
            text = collector.exposition(generate_latest, CONTENT_TYPE_PLAIN_0_0_4)
            if seq >= 2:  # the first two fill the reader's caches
                ms.append((time.perf_counter() - t0) * 1000)
        samples = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
        return {**stats(ms), "samples": samples, "bytes": len(text)}


def worker() -> int:
    """This process's tree (on PYTHONPATH) measured at every rank count: JSON on stdout."""
    gc.set_threshold(50_000, 20, 10)  # the sidecar's (oomsight_sidecar.main.GC_THRESHOLD)
    print(json.dumps({str(n): measure_changed(n, scrapes) for n, scrapes in RANKS.items()}))
    return 0


def sidecar_memory(tree: str, n: int = RSS_RANKS, scrapes: int = 100) -> dict[str, Any]:
    """A real sidecar of ``tree`` serving ``n`` ranks that all publish between scrapes."""
    doc = reference_snapshot()
    env = {**os.environ, "PYTHONPATH": _path(tree)}
    with tempfile.TemporaryDirectory() as spool:
        os.makedirs(os.path.join(spool, "snapshots"))
        publish_all(spool, doc, n, 0)
        port = _free_port()
        cmd = [sys.executable, "-c", SIDECAR, "sidecar", "--spool", spool, "--host", "127.0.0.1", "--port", str(port)]
        sidecar = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url, ms, size = f"http://127.0.0.1:{port}/metrics", [], 0
        try:
            _wait_for(url)
            for seq in range(1, scrapes + 1):
                publish_all(spool, doc, n, seq)
                t0 = time.perf_counter()
                size = len(urllib.request.urlopen(url, timeout=10).read())
                ms.append((time.perf_counter() - t0) * 1000)
            memory = _rss_kib(sidecar.pid)
        finally:
            sidecar.terminate()
            sidecar.wait(10)
    return {
        "ranks": n,
        "http_scrape": stats(ms),
        "bytes": size,
        "rss_mib": round(memory["VmRSS"] / 1024, 1),
        "peak_rss_mib": round(memory["VmHWM"] / 1024, 1),
    }


def _path(tree: str) -> str:
    return os.pathsep.join(os.path.join(tree, d) for d in ("exporter", "sidecar"))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(url: str) -> None:
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"no answer from {url}")


def _rss_kib(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as fh:
        return {ln.split(":")[0]: int(ln.split()[1]) for ln in fh if ln.startswith(("VmRSS:", "VmHWM:"))}


def measure_tree(tree: str) -> dict[str, Any]:
    found = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker"],
        env={**os.environ, "PYTHONPATH": _path(tree)},
        capture_output=True,
        text=True,
        check=True,
        cwd=tree,
    )
    return {"changed": json.loads(found.stdout), "sidecar": sidecar_memory(tree)}


UNCHANGED_RANKS, UNCHANGED_ROUNDS, UNCHANGED_SCRAPES = 64, 7, 30
UNCHANGED_BUDGET_CPU_MS = 5.0
"""Issues 36 and 44: an unchanged 64-rank spool costs at most 5 ms of CPU per scrape."""
MODES = {"off": (False, False, False), "parsed": (True, False, False), "samples": (True, True, False)}
MODES["text"] = (True, True, True)
"""What is kept between scrapes: (the reader's parsed documents, by file identity; the collector's samples
of each snapshot document, by file identity and state; their text, by those and the encoder). ``parsed`` is
the tree before issue 36's samples, ``samples`` the tree before issue 44's text."""
CHANGED_ROUNDS, CHANGED_SCRAPES = 7, 12


class _Built:
    """A registry of families already built: ``generate_latest`` of it times the text alone."""

    def __init__(self, built: list[Any]) -> None:
        self.built = built

    def collect(self) -> list[Any]:
        return self.built


def _cpu_ms(fn: Any, scrapes: int) -> float:
    t0 = time.process_time()
    for _ in range(scrapes):
        fn()
    return (time.process_time() - t0) / scrapes * 1000


def measure_unchanged(n: int = UNCHANGED_RANKS) -> dict[str, Any]:
    """CPU per scrape of ``n`` unchanged ranks in each of :data:`MODES` in turns: the read alone, the read
    with the inventory and the families, the text of families already built (``generate_latest`` alone)
    and the whole scrape with its text; the samples of each family, and where a scrape's time goes
    (:func:`profile_scrape`)."""
    from prometheus_client import generate_latest

    from oomsight.metrics.collector import SpoolCollector
    from oomsight.wire.spool import SpoolReader

    doc = reference_snapshot()
    parts: dict[str, dict[str, list[float]]] = {mode: {} for mode in MODES}
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "snapshots"))
        publish_all(root, doc, n, 0)
        for _ in range(UNCHANGED_ROUNDS):
            for mode, (parsed, samples, kept_text) in MODES.items():
                reader = SpoolReader(root, cache=parsed)
                collector = SpoolCollector(root, stale_after_seconds=3600, reader=reader, cache=samples, text=kept_text)
                collector.exposition(generate_latest)  # fills the caches
                built = _Built(list(collector.collect()))
                measured = {
                    "read": _cpu_ms(reader.read, UNCHANGED_SCRAPES),
                    "text_of_built_families": _cpu_ms(partial(generate_latest, built), UNCHANGED_SCRAPES),
                    "read_inventory_families": _cpu_ms(
                        lambda c=collector: c.families.build(c.inventory()), UNCHANGED_SCRAPES
                    ),
                    "whole_scrape": _cpu_ms(partial(collector.exposition, generate_latest), UNCHANGED_SCRAPES),
                }
                for part, ms in measured.items():
                    parts[mode].setdefault(part, []).append(round(ms, 3))
        text = collector.exposition(generate_latest)
        same = same_text(root)
        profiled = profile_scrape(partial(collector.exposition, generate_latest), UNCHANGED_SCRAPES)
        changed = measure_changed_modes(root, doc, n)
    median = {c: {p: sorted(v)[len(v) // 2] for p, v in ps.items()} for c, ps in parts.items()}
    count = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    whole = median["text"]["whole_scrape"]
    return {
        "ranks": n,
        "samples": count,
        "samples_by_family": samples_by_family(built.built, n),
        "text_us_per_sample_median": round(median["samples"]["text_of_built_families"] / count * 1000, 2),
        "bytes": len(text),
        "text_same_as_nothing_kept": same,
        "cpu_ms_per_scrape_median": median,
        "cpu_ms_per_scrape_rounds": parts,
        "budget_cpu_ms": UNCHANGED_BUDGET_CPU_MS,
        "met": whole <= UNCHANGED_BUDGET_CPU_MS,
        "speedup_whole_scrape_text_vs_samples": round(median["samples"]["whole_scrape"] / whole, 1),
        "profile_top_own_time_share": profiled,
        "changed_ms_per_scrape": changed,
    }


def same_text(root: str) -> bool:
    """Whether the kept text of the spool at ``root`` is, byte for byte, the text of a collector that keeps
    nothing it built, at one time (its second scrape, from what the first kept; for every Accept header)."""
    from prometheus_client.exposition import choose_encoder

    from oomsight.metrics.collector import SpoolCollector

    kept, fresh = (SpoolCollector(root, clock=lambda: 2e9, stale_after_seconds=3600, cache=c) for c in (True, False))
    accepts = ("", "application/openmetrics-text", "text/plain; version=1.0.0; escaping=dots")
    kept.exposition(choose_encoder("")[0])
    return all(kept.exposition(choose_encoder(a)[0]) == fresh.exposition(choose_encoder(a)[0]) for a in accepts)


def measure_changed_modes(root: str, doc: dict[str, Any], n: int) -> dict[str, Any]:
    """CPU and wall time of a scrape of ``n`` ranks that all published since the last, ``samples`` against
    ``text`` in turns (:data:`CHANGED_ROUNDS` rounds of :data:`CHANGED_SCRAPES` scrapes each)."""
    from prometheus_client import generate_latest

    from oomsight.metrics.collector import SpoolCollector

    found: dict[str, list[float]] = {"samples": [], "text": []}
    cpu: dict[str, list[float]] = {"samples": [], "text": []}
    seq = 1
    for _ in range(CHANGED_ROUNDS):
        for mode in found:
            collector = SpoolCollector(root, stale_after_seconds=3600, text=mode == "text")
            collector.exposition(generate_latest)
            for _ in range(CHANGED_SCRAPES):
                seq += 1
                publish_all(root, doc, n, seq)
                t0, c0 = time.perf_counter(), time.process_time()
                collector.exposition(generate_latest)
                found[mode].append((time.perf_counter() - t0) * 1000)
                cpu[mode].append((time.process_time() - c0) * 1000)
    return {mode: {"wall": stats(found[mode]), "cpu": stats(cpu[mode])} for mode in found}


def samples_by_family(built: list[Any], ranks: int) -> dict[str, Any]:
    """The samples of each family built (a family with none left out), and of each scope: per rank (those
    with a ``rank`` label other than "") or per pod."""
    from oomsight.metrics.family import FAMILIES

    scope = {row.name: row.scope for row in FAMILIES}
    per_family = {f.name: len(f.samples) for f in built if f.samples}
    per_scope: dict[str, int] = {}
    for name, n in per_family.items():
        per_scope[scope.get(name, "?")] = per_scope.get(scope.get(name, "?"), 0) + n
    per_rank = sum(1 for f in built for s in f.samples if s.labels.get("rank"))
    total = sum(per_family.values())
    return {
        "per_family": per_family,
        "per_scope": per_scope,
        "per_rank": {"samples": per_rank, "of_each_rank": round(per_rank / ranks, 2)},
        "per_pod": total - per_rank,
    }


def profile_scrape(scrape: Any, scrapes: int, top: int = 8) -> dict[str, Any]:
    """The ``top`` functions of an unchanged scrape by their own time (cProfile, cache on), as shares of
    the whole: cProfile's overhead inflates every call alike, so the shares, not the times, are the figure."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(scrapes):
        scrape()
    profiler.disable()
    rows = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    own = {f"{os.path.join(*f.split(os.sep)[-2:])}:{line}({name})": v[2] for (f, line, name), v in rows.items()}
    total = sum(own.values()) or 1.0
    return {k: round(v / total, 3) for k, v in sorted(own.items(), key=lambda kv: -kv[1])[:top]}


def main_unchanged(out: str) -> int:
    gc.set_threshold(50_000, 20, 10)  # the sidecar's (oomsight_sidecar.main.GC_THRESHOLD)
    before = [round(x, 2) for x in os.getloadavg()]
    result = measure_unchanged()
    doc = {
        "benchmark": "bench_reader_scale --unchanged",
        "commit": _commit(),
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_before": before,
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(),
            "platform": platform.platform(),
            "prometheus_client": importlib.metadata.version("prometheus_client"),
        },
        "result": result,
    }
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "reader_unchanged.json"), "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
    keys = ("cpu_ms_per_scrape_median", "met", "text_same_as_nothing_kept", "changed_ms_per_scrape")
    print(json.dumps({k: result[k] for k in keys}, indent=1))
    return 0


def _commit() -> str:
    """The commit measured, with ``+changes`` where the tree differs from it."""
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", ROOT, "diff", "--quiet", "HEAD", "--", "exporter", "sidecar"], check=False)
    return head.stdout.strip() + ("+changes" if dirty.returncode else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unchanged", action="store_true", help="the CPU of unchanged ranks, in each cache mode")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--before", default="918675c", help="the commit to measure against (default: 918675c)")
    parser.add_argument("--git", default=ROOT, help="the repository holding --before (default: this one)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker()
    if args.unchanged:
        return main_unchanged(args.out)
    old = tempfile.mkdtemp(prefix="oomsight-before-")
    subprocess.run(
        ["git", "-C", args.git, "worktree", "add", "--detach", old, args.before], check=True, capture_output=True
    )
    try:
        results = {"this_tree": measure_tree(ROOT), "before": measure_tree(old)}
    finally:
        subprocess.run(["git", "-C", args.git, "worktree", "remove", "--force", old], check=False)
    now = results["this_tree"]
    doc = {
        "benchmark": "bench_reader_scale",
        "budget": {"p99_ms": BUDGET_P99_MS, "sidecar_rss_mib_at_16_ranks": BUDGET_RSS_MIB},
        "met": {
            **{f"{n}_ranks": now["changed"][str(n)]["p99_ms"] <= ms for n, ms in BUDGET_P99_MS.items()},
            "sidecar_rss": now["sidecar"]["rss_mib"] <= BUDGET_RSS_MIB,
        },
        "before_commit": args.before,
        "machine": {
            "cpus": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "results": results,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "reader_scale.json"), "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
    print(json.dumps({k: doc[k] for k in ("met", "results")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
