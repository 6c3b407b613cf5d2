"""The sidecar as a real process, and end to end with a real Prometheus."""

import os
import signal
import subprocess
import sys

import pytest

from fakes import GIB
from procs import http_get, prometheus, promql, sidecar, wait_for
from spoolmaker import hooked_process


def test_readyz_waits_for_the_spool_and_healthz_does_not(tmp_path):
    spool = str(tmp_path / "spool")
    with sidecar(spool) as (_, port):
        assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        assert http_get(f"http://127.0.0.1:{port}/readyz")[0] == 503
        os.makedirs(spool)
        assert http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200
        assert http_get(f"http://127.0.0.1:{port}/nope")[0] == 404


def test_sigterm_stops_the_sidecar_cleanly(tmp_path):
    with sidecar(str(tmp_path)) as (proc, _):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def test_a_bad_setting_fails_at_start_with_a_clear_message(tmp_path):
    env = {**os.environ, "OOMSIGHT_RETENTION_SECONDS": "forever"}
    result = subprocess.run(
        [sys.executable, "-m", "oomsight", "sidecar", "--spool", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert result.returncode == 2
    assert "OOMSIGHT_RETENTION_SECONDS='forever' is not a number of seconds" in result.stderr


def test_openmetrics_is_served_when_asked_for(tmp_path, monkeypatch):
    spool = str(tmp_path / "spool")
    hooked_process(spool, monkeypatch=monkeypatch)
    with sidecar(spool) as (_, port):
        import urllib.request

        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        body = urllib.request.urlopen(req, timeout=5).read().decode()
    assert body.rstrip().endswith("# EOF")
    assert "# UNIT oomsight_torch_allocated_bytes bytes" in body


@pytest.mark.e2e
def test_two_processes_reach_promql_through_sidecar_and_prometheus(tmp_path, monkeypatch):
    spool = str(tmp_path / "spool")
    hooked_process(spool, rank=0, allocated=3 * GIB, reserved=4 * GIB, monkeypatch=monkeypatch)
    _hook1, cuda1 = hooked_process(spool, rank=1, allocated=7 * GIB, reserved=8 * GIB, monkeypatch=monkeypatch)
    cuda1.observer(0, 100 * GIB, 140 * GIB, 2 * GIB)
    with sidecar(spool) as (_, port), prometheus(str(tmp_path), [f"127.0.0.1:{port}"]) as url:
        wait_for(lambda: promql(url, "oomsight_torch_allocated_bytes"), timeout=30)
        by_rank = {r["metric"]["rank"]: float(r["value"][1]) for r in promql(url, "oomsight_torch_allocated_bytes")}
        assert by_rank == {"0": 3 * GIB, "1": 7 * GIB}
        total = promql(url, 'sum by (pod) (oomsight_oom_events_total{namespace="team-a"})')
        assert [float(r["value"][1]) for r in total] == [1.0]
        cause = promql(url, "oomsight_last_oom_cause_info")
        assert [(r["metric"]["rank"], r["metric"]["cause"]) for r in cause] == [("1", "oversized_request")]
        # the first OOM of a series is visible through the timestamp gauge
        assert promql(url, "time() - oomsight_last_oom_timestamp_seconds < 600")


def test_the_sidecar_sets_its_garbage_collection_thresholds_at_start(monkeypatch):
    """Parsed snapshots are kept between scrapes: CPython's default thresholds re-scan them all
    many times a scrape (docs/testing.md, "Reader scale")."""
    import gc

    from oomsight_sidecar import main

    before = gc.get_threshold()
    monkeypatch.setattr(main, "run", lambda *a, **kw: gc.get_threshold())
    monkeypatch.setattr(main.signal, "signal", lambda *a: None)  # not this test process's handlers
    try:
        assert main.main({}) == main.GC_THRESHOLD
    finally:
        gc.set_threshold(*before)
