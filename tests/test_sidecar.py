"""The sidecar as a real process, and end to end with a real Prometheus."""

import os
import signal
import subprocess
import sys
import time

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


@pytest.mark.parametrize("where", ["flag", "variable", "inside"])
def test_a_spool_that_is_a_file_is_refused_at_start_in_one_line_with_exit_2(tmp_path, where):
    """Issue 36: ``oomsight sidecar --spool FILE`` served forever; a file can never become the spool."""
    from oomsight.tools import exitcode

    file = tmp_path / "spool.json"
    file.write_text("{}")
    path = str(file / "spool") if where == "inside" else str(file)
    env = {**os.environ, "OOMSIGHT_SIDECAR_PORT": "0", "OOMSIGHT_ADMIN_PORT": "0"}
    args = ["--spool", path] if where != "variable" else []
    if where == "variable":
        env["OOMSIGHT_DIR"] = path
    result = subprocess.run(
        [sys.executable, "-m", "oomsight", "sidecar", *args], capture_output=True, text=True, env=env, timeout=30
    )
    named = "OOMSIGHT_DIR=" if where == "variable" else "--spool "
    kind = "inside a file" if where == "inside" else "a file"
    assert result.returncode == exitcode.USAGE == 2
    assert result.stderr == f"oomsight sidecar: {named}{path} is {kind}, not a folder\n"
    assert result.stdout == ""


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


def _scrape(port):
    import time
    import urllib.request

    started = time.monotonic()
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return body, time.monotonic() - started


def _sample(body, name, **labels):
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def _peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 1024


def test_a_hostile_but_valid_spool_cannot_starve_or_bloat_the_real_sidecar(tmp_path):
    """Issue 26, against the real process: 20 valid snapshots of 200 devices each and 20,000 empty
    files in events/ (once: 108 MB of /metrics, a 55 s scrape, 1 GB; 5 s and 17 MB of log)."""
    from test_hostile import many_devices

    from hostile import put, snapshot, snapshot_path

    spool = str(tmp_path / "spool")
    put(spool, snapshot_path(1), snapshot(pid=1, rank=0, t=time.time()))
    for pid in range(2, 22):
        put(spool, snapshot_path(pid), many_devices(pid, pid, 200))
    events = os.path.join(spool, "events")
    os.makedirs(events, exist_ok=True)
    for i in range(20_000):
        open(os.path.join(events, f"{i:06d}.json"), "wb").close()
    with sidecar(spool) as (proc, port):
        body, first = _scrape(port)
        assert first < 5 and len(body) < 200_000
        assert _sample(body, "oomsight_spool_skipped_files_total", reason="too_many_devices") == 20
        assert _sample(body, "oomsight_spool_skipped_files_total", reason="too_many_files") >= 1
        assert _sample(body, "oomsight_process_up", rank="0") == 1
        later = [_scrape(port)[1] for _ in range(5)]
        assert max(later) < 1.0, later
        assert _peak_rss_mib(proc.pid) < 128
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=20)[0]
    assert output.count("skipped spool files") <= 2, output[-2000:]


def test_the_real_sidecar_keeps_a_fatal_oom_fatal_through_the_rank_coming_back_and_a_restart(tmp_path):
    from hostile import event, event_path, put, snapshot, snapshot_path

    spool = str(tmp_path / "spool")
    now = time.time()
    put(spool, snapshot_path(1), snapshot(pid=1, t=now - 10))
    put(spool, event_path(1, 1), event(pid=1, t=now - 10))
    flags = ("--stale-after-seconds", "2")
    counts = []
    with sidecar(spool, *flags) as (_, port):
        counts.append(_oom_counts(_scrape(port)[0]))  # silent for 10 s, stale after 2: fatal
        put(spool, snapshot_path(1), snapshot(pid=1, t=time.time()))  # back, and it recovered
        put(spool, event_path(1, 1), event(pid=1, t=now - 10, outcome="recovered"))
        counts.append(_oom_counts(_scrape(port)[0]))
    with sidecar(spool, *flags) as (_, port):  # a restart
        counts.append(_oom_counts(_scrape(port)[0]))
    assert counts == [(1, 1, 0)] * 3


def _oom_counts(body):
    return tuple(
        _sample(body, f"oomsight_oom_{name}_total", rank="0") for name in ("events", "fatal_events", "recovered_events")
    )
