"""What Prometheus needs for a fleet of GPUs: series, memory, CPU, rule evaluation time and the
cluster overview's query latency, measured on a real Prometheus with the generated rules.

    PATH=$PWD/.tools/bin:$PATH .venv/bin/python benchmarks/bench_prometheus_scale.py --gpus 1000

One real sidecar serves a spool of ``--gpus-per-pod`` ranks (the real hook over the test
fakes, one GPU each); Prometheus scrapes it once per pod under that pod's target labels, so
``--gpus`` GPUs look like ``gpus / gpus-per-pod`` pods spread over ``--workloads`` owners.
Values do not change, so compression is better than in life: disk is estimated at a
typical 1.5 bytes per sample instead of measured. Results go to docs/scale.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from dashboards import queries, rules  # noqa: E402
from oomsight_server.wsgi import serve  # noqa: E402
from oomsight_sidecar.main import build_app  # noqa: E402
from oomsight_sidecar.settings import SidecarSettings  # noqa: E402

from fakerank import Rank  # noqa: E402
from fakes import GIB  # noqa: E402
from panelquery import substitute  # noqa: E402
from procs import exposition_server, owner_exposition, prometheus, promql_at, promql_range, wait_for  # noqa: E402

RULES = os.path.join(ROOT, "helm", "oomsight", "rules", "oomsight.rules.yaml")
BYTES_PER_SAMPLE = 1.5


def spool_of(ranks: int) -> str:
    spool = tempfile.mkdtemp(prefix="oomsight-scale-")
    for r in range(ranks):
        rank = Rank(spool, r, (10 + r) * GIB)
        rank.step(20 * GIB, GIB)
        rank.hook.sampler.publish()
    return spool


def scrape_configs(args: argparse.Namespace, sidecar: str, owner: str) -> list[dict[str, Any]]:
    pods = args.gpus // args.gpus_per_pod
    sidecars, owners = [], []
    for i in range(pods):
        labels = {"namespace": f"team-{i % args.namespaces}", "pod": f"train-{i}", "container": "oomsight"}
        sidecars.append({"targets": [sidecar], "labels": labels})
        owners.append(
            {"targets": [owner], "labels": {**labels, "__metrics_path__": f"/owner/job-{i % args.workloads}"}}
        )
    return [
        {"job_name": "oomsight", "static_configs": sidecars},
        {"job_name": "oomsight-owner", "static_configs": owners},
    ]


def one(url: str, expr: str) -> float:
    result = promql_at(url, expr, time.time())
    return float(result[0]["value"][1]) if result else float("nan")


def own_metrics(url: str) -> dict[str, float]:
    """Prometheus' own /metrics, summed by name and by rule group (it does not scrape itself here)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            tag = s.labels.get("rule_group", "").rsplit(";", 1)[-1] or s.labels.get("quantile", "")
            key = f"{s.name}{{{tag}}}" if tag else s.name
            out[key] = out.get(key, 0.0) + s.value
    return out


def overview_latency(url: str, start: float, end: float, step: float) -> dict[str, float]:
    values = {"namespace": ".*", "workload": ".*", "__rate_interval": "1m", "__from": str(int(start))}
    values["__range"] = f"{int(end - start)}s"
    timings = []
    for q in [
        *queries.FLEET_USED,
        *queries.RESERVED_BY_NAMESPACE,
        *queries.USED_BY_WORKLOAD,
        *queries.TOP_PEAK_PODS,
        *queries.HEADROOM_DISTRIBUTION,
        *queries.IDLE_GPUS,
        *queries.OOM_RATE,
    ]:
        expr = substitute(q.expr, values)
        t0 = time.perf_counter()
        promql_range(url, expr, start, end, step)
        timings.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(timings), "max_s": max(timings), "queries": len(timings)}


def measure(url: str, args: argparse.Namespace, start: float, before: dict[str, float]) -> dict[str, Any]:
    end = time.time()
    now = own_metrics(url)
    took = end - before["at"]
    samples_per_s = (
        now["prometheus_tsdb_head_samples_appended_total"] - before["prometheus_tsdb_head_samples_appended_total"]
    ) / took
    return {
        "gpus": args.gpus,
        "pods": args.gpus // args.gpus_per_pod,
        "workloads": args.workloads,
        "scrape_interval": args.interval,
        "head_series": now["prometheus_tsdb_head_series"],
        "oomsight_series": one(url, 'count({__name__=~"oomsight_.*"})'),
        "recorded_series": one(url, 'count({__name__=~".+:oomsight_.+"})'),
        "target_series": one(url, 'count({__name__=~"up|scrape_.*"})'),
        "samples_per_second": samples_per_s,
        "rss_bytes": now["process_resident_memory_bytes"],
        "heap_inuse_bytes": now["go_memstats_heap_inuse_bytes"],
        "cpu_cores": (now["process_cpu_seconds_total"] - before["process_cpu_seconds_total"]) / took,
        "rule_group_seconds": now["prometheus_rule_group_last_duration_seconds{oomsight.rules}"],
        "alert_group_seconds": now["prometheus_rule_group_last_duration_seconds{oomsight.alerts}"],
        "group_evaluation_seconds_p50": now["prometheus_rule_group_duration_seconds{0.5}"],
        "group_evaluation_seconds_p99": now["prometheus_rule_group_duration_seconds{0.99}"],
        "disk_bytes_per_day_estimate": samples_per_s * 86400 * BYTES_PER_SAMPLE,
        "overview_query": overview_latency(url, start, end, float(args.interval.rstrip("s"))),
    }


def run(args: argparse.Namespace, sidecar: str, owner: str) -> dict[str, Any]:
    targets = scrape_configs(args, sidecar, owner)
    with tempfile.TemporaryDirectory() as work, prometheus(work, [], [RULES], args.interval, targets) as url:
        start = time.time()
        wait_for(lambda: promql_at(url, f"count({rules.WL_GPUS})", time.time()), timeout=120)
        time.sleep(60)  # warm-up: every target scraped and every rule evaluated a few times
        before = {**own_metrics(url), "at": time.time()}
        time.sleep(args.minutes * 60)
        return measure(url, args, start, before)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=1000)
    p.add_argument("--gpus-per-pod", type=int, default=8)
    p.add_argument("--workloads", type=int, default=25)
    p.add_argument("--namespaces", type=int, default=5)
    p.add_argument("--interval", default="15s", help="scrape and rule evaluation interval")
    p.add_argument("--minutes", type=float, default=4.0)
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args()
    spool = spool_of(args.gpus_per_pod)
    settings = SidecarSettings(
        spool_dir=spool, host="127.0.0.1", port=0, stale_after_seconds=1e9, retention_seconds=1e9
    )
    sidecar = serve(build_app(settings), "127.0.0.1", 0)
    with exposition_server(lambda path: owner_exposition(path.rsplit("/", 1)[-1])) as owner:
        result = run(args, f"127.0.0.1:{sidecar.server_port}", f"127.0.0.1:{owner}")
    sidecar.shutdown()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"prometheus_scale_{args.gpus}gpus.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
