"""The real sidecar under spool poison (issue 49), a CI-sized replay of the issue's run (``bench_scrape_budget.py``
runs it whole: 10,000 documents and 100,000 junk files): every key of the tape's snapshot set to each of 33 hostile
values, and 30,000 junk files, served as in a pod (its Event poster reads the events too) within 85 % of the chart's
memory limit, and every valid rank served or named."""

import os
import sys
import time

from test_budget import POD_ENV, chart_limit_kib

from hostile import put, snapshot
from procs import http_get, sidecar

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))


def test_the_sidecar_stays_within_85_percent_of_its_limit_under_poison_and_serves_every_valid_rank(tmp_path):
    from bench_scrape_budget import junk, poison

    spool = str(tmp_path)
    for folder in ("snapshots", "events", "profiles"):
        os.makedirs(os.path.join(spool, folder))
    for r in range(4):
        put(spool, f"snapshots/{r + 1}-aa.json", snapshot(pid=r + 1, rank=r, t=time.time()))
    poison(spool, total=2_000)
    junk(spool, count=30_000)
    env = {**os.environ, **POD_ENV}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    with sidecar(spool, env=env) as (proc, port):
        for _ in range(2):
            status, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=60)
            assert status == 200
        with open(f"/proc/{proc.pid}/status") as fh:
            peak = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
    assert peak <= 0.85 * chart_limit_kib(), peak
    for r in range(4):  # the poison's newer files take the 64 ranks read: each valid rank served or named
        labels = f'{{local_rank="{r}",rank="{r}"'
        served = f"oomsight_process_up{labels}}} 1.0" in body
        assert served or f'oomsight_spool_hidden_snapshots{labels},reason="too_many_files"}}' in body
    assert 'reason="clock_behind"' in body  # mutated times of 0 and below, named
