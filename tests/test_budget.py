"""One memory budget (issue 36): the reader's bounds (``oomsight.wire.reader.Budget``) keep the real
sidecar under 85 % of the chart's memory limit (``helm/oomsight/values.yaml``, read here, never copied)
at each bound's corner: the most events of the largest valid size, the most ranks, the most devices.
The sidecar runs as in a pod (pod name, namespace and uid set): its Event poster reads the events too
and loads the kubernetes client. Figures: docs/kubernetes.md, "Sidecar memory"."""

from __future__ import annotations

import json
import os
import signal
import time
import tracemalloc
from typing import Any, Callable

import pytest
import yaml

from oomsight.wire.layout import MAX_FILE_BYTES
from oomsight.wire.reader import Budget, SpoolReader, memory_cost

from hostile import event, event_path, put, snapshot, snapshot_path
from procs import http_get, sidecar

ROOT = os.path.join(os.path.dirname(__file__), "..")
MARGIN = 0.85
"""The share of the chart's limit the worst valid spool may reach (issue 36)."""
BUDGET = Budget()
POD_ENV = {
    "OOMSIGHT_POD_NAME": "train-0",
    "OOMSIGHT_POD_NAMESPACE": "ml",
    "OOMSIGHT_POD_UID": "5a1d7c1e-0000-4000-8000-000000000001",
    "OOMSIGHT_EVENTS_INTERVAL_SECONDS": "0.2",
}


def chart_limit_kib() -> int:
    """``sidecar.resources.limits.memory`` of the chart's values.yaml, in KiB."""
    with open(os.path.join(ROOT, "helm", "oomsight", "values.yaml")) as fh:
        limit = yaml.safe_load(fh)["sidecar"]["resources"]["limits"]["memory"]
    assert limit.endswith("Mi"), limit
    return int(limit[:-2]) * 1024


def padded(doc: dict[str, Any], size: int = MAX_FILE_BYTES - 4096) -> dict[str, Any]:
    """``doc`` with an unknown key (readers accept them) holding one string of about ``size`` bytes in
    all with an astral character: the shape that holds the most memory for its cost, 4 bytes a byte
    (``test_the_memory_cost_bounds_what_a_parsed_document_holds``)."""
    doc["padding"] = "a" * (size - len(json.dumps(doc)) - 64) + "\U0001f600"
    return doc


def peak_of(spool: str, scrapes: int = 3) -> tuple[float, str]:
    """The real sidecar's peak RSS (VmHWM, KiB) over ``scrapes`` scrapes and its Event poster's ticks,
    and its last ``/metrics``."""
    env = {**os.environ, **POD_ENV}
    with sidecar(spool, env=env) as (proc, port):
        body = ""
        for _ in range(scrapes):
            status, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=30)
            assert status == 200, body[:500]
            time.sleep(0.3)  # the poster ticks in between
        with open(f"/proc/{proc.pid}/status") as fh:
            peak = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    return peak, body


def sample(body: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def within_the_chart(spool: str, check: Callable[[str], None]) -> float:
    peak, body = peak_of(spool)
    check(body)
    limit = chart_limit_kib()
    print(f"peak {peak / 1024:.1f} MiB of {limit / 1024:.0f} MiB ({peak / limit:.0%})")
    assert peak <= MARGIN * limit, f"peak {peak / 1024:.1f} MiB over {MARGIN:.0%} of the chart's {limit / 1024:.0f} MiB"
    return peak


def test_the_memory_cost_bounds_what_a_parsed_document_holds() -> None:
    from hostile import EVENT, SNAPSHOT

    mib = 1 << 16
    shapes = {
        "event": json.dumps(EVENT).encode(),
        "snapshot": json.dumps(SNAPSHOT).encode(),
        "empty objects": b"[" + b",".join([b"{}"] * (mib // 3)) + b"]",
        "empty lists": b"[" + b",".join([b"[]"] * (mib // 3)) + b"]",
        "short strings": b"[" + b",".join([b'"ab"'] * (mib // 5)) + b"]",
        "distinct strings": b"[" + b",".join([b'"%d"' % i for i in range(mib // 9)]) + b"]",
        "floats": b"[" + b",".join([b"1.5"] * (mib // 4)) + b"]",
        "distinct keys": b"{" + b",".join([b'"k%d":0' % i for i in range(mib // 10)]) + b"}",
        "small objects": json.dumps([{"a": i % 10} for i in range(mib // 10)]).encode(),
        "an astral character": b'["' + b"a" * mib + "\U0001f600".encode() + b'"]',
    }
    for name, raw in shapes.items():
        tracemalloc.start()
        try:
            doc = json.loads(raw)
            held = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        del doc
        assert held <= memory_cost(raw), f"{name}: holds {held}, costed {memory_cost(raw)}"


def test_documents_past_the_memory_budget_are_refused_unparsed_and_counted(tmp_path: Any) -> None:
    spool = str(tmp_path)
    small = Budget(event_memory_bytes=4 * memory_cost(json.dumps(event()).encode()) + 1)
    for seq in range(1, 7):
        path = put(spool, event_path(1, seq), event(pid=1, seq=seq))
        os.utime(path, (1e9 + seq, 1e9 + seq))
    reader = SpoolReader(spool, budget=small)
    state = reader.read()
    assert sorted(e["seq"] for e in state.events) == [3, 4, 5, 6]  # the newest that fit
    assert state.skipped_total["too_many_files"] == 2 and reader.parsed == 4
    reader.read()
    assert reader.read().skipped_total["too_many_files"] == 2 and reader.parsed == 4  # counted once, never parsed
    os.remove(os.path.join(spool, event_path(1, 6)))
    assert sorted(e["seq"] for e in reader.read().events) == [2, 3, 4, 5]  # room again: read now
    assert os.path.exists(os.path.join(spool, event_path(1, 1)))  # nothing is deleted


def test_the_most_events_of_the_tape_s_size_keep_the_sidecar_within_the_chart(tmp_path: Any) -> None:
    """The issue's case: 1,024 copies of the demo tape's 24 KB OOM event, each of its own rank (an OOM
    series each): 125.6 MiB before, against 128."""
    spool = str(tmp_path)
    put(spool, snapshot_path(1), snapshot(pid=1, rank=0, t=time.time()))
    for i in range(BUDGET.events_per_spool):
        put(spool, event_path(i + 2, 1), event(pid=i + 2, rank=i + 1, t=time.time()))

    def check(body: str) -> None:
        assert sample(body, "oomsight_process_up", rank="0") == 1
        assert sample(body, "oomsight_spool_skipped_files_total", reason="too_many_files") > 0

    within_the_chart(spool, check)


def test_the_most_events_of_the_largest_valid_size_keep_the_sidecar_within_the_chart(tmp_path: Any) -> None:
    spool = str(tmp_path)
    put(spool, snapshot_path(1), snapshot(pid=1, rank=0, t=time.time()))
    big = json.dumps(padded(event(pid=2, rank=1, t=time.time()))).encode()
    assert len(big) <= MAX_FILE_BYTES
    fits = BUDGET.event_memory_bytes // memory_cost(big)
    for seq in range(1, fits + 4):
        doc = json.loads(big)
        doc["seq"] = seq
        put(spool, event_path(2, seq), doc)

    def check(body: str) -> None:
        assert sample(body, "oomsight_oom_events_total", rank="1") == fits
        assert sample(body, "oomsight_spool_skipped_files_total", reason="too_many_files") == 3

    within_the_chart(spool, check)


@pytest.mark.parametrize("devices", [1, BUDGET.devices_per_document])
def test_the_most_ranks_of_the_largest_valid_snapshots_keep_the_sidecar_within_the_chart(
    tmp_path: Any, devices: int
) -> None:
    """Twice the ranks a spool may have, each listing the most devices a snapshot may, each padded to
    the largest file: the memory budget, the rank budget and the series budget all reached."""
    from test_hostile import many_devices

    spool = str(tmp_path)
    for pid in range(1, 2 * BUDGET.ranks_per_spool + 1):
        doc = many_devices(pid, pid, devices) if devices > 1 else snapshot(pid=pid, rank=pid)
        doc["time"] = time.time()
        put(spool, snapshot_path(pid), padded(doc) if pid % 2 else doc)

    def check(body: str) -> None:
        assert sample(body, "oomsight_spool_skipped_files_total", reason="too_many_files") >= BUDGET.ranks_per_spool
        assert sample(body, "oomsight_process_up", rank=str(2 * BUDGET.ranks_per_spool)) == (devices == 1)
        if devices > 1:  # the newest ranks are read; those past the series budget left out, lowest rank first
            assert sample(body, "oomsight_spool_skipped_files_total", reason="too_many_series") > 0

    within_the_chart(spool, check)


def profile(pid: int, rank: int, request: int) -> dict[str, Any]:
    """A profile document as a rank writes it when its window is done."""
    proc = snapshot(pid=pid, rank=rank)["process"]
    ops = [
        {"op": f"aten::op{i}", "calls": 12, "self_cuda_memory_bytes": 2**30, "self_cuda_time_us": 5.0}
        for i in range(10)
    ]
    return {
        "schema_version": 1,
        "kind": "profile",
        "process": proc,
        "request_id": f"r{request}",
        "start_step": 9,
        "steps": 5,
        "started_at": 1.0,
        "ended_at": 2.0 + request,
        "device": 0,
        "peak_allocated_bytes": 5 * 2**30,
        "top_by_memory": [op | {"cuda_time_us": 7.0, "cpu_time_us": 1.0} for op in ops],
        "top_by_time": [op | {"cuda_time_us": 7.0, "cpu_time_us": 1.0} for op in ops],
        "table_artifact": "x.table.txt",
        "trace_artifact": None,
    }


def test_every_folder_at_its_corner_at_once_keeps_the_sidecar_within_the_chart(tmp_path: Any) -> None:
    """The largest snapshots of the most devices for twice the ranks, the largest events and the largest
    profiles, all in one spool: every memory share full at once."""
    from test_hostile import many_devices

    spool = str(tmp_path)
    for pid in range(1, 2 * BUDGET.ranks_per_spool + 1):
        doc = many_devices(pid, pid, BUDGET.devices_per_document)
        doc["time"] = time.time()
        put(spool, snapshot_path(pid), padded(doc))
    big = json.dumps(padded(event(pid=2, rank=2, t=time.time()))).encode()
    for seq in range(1, BUDGET.event_memory_bytes // memory_cost(big) + 4):
        doc = json.loads(big)
        doc["seq"] = seq
        put(spool, event_path(2, seq), doc)
    for request in range(1, 20):
        put(spool, f"profiles/{request}-aa.profile-r{request}.json", padded(profile(request, request, request)))

    def check(body: str) -> None:
        assert sample(body, "oomsight_spool_skipped_files_total", reason="too_many_files") > BUDGET.ranks_per_spool

    within_the_chart(spool, check)


def served_ranks(collector: Any) -> tuple[set[str], dict[tuple[str, str, str], float]]:
    """The ranks ``collector`` serves (``oomsight_process_up``) and its ``oomsight_spool_hidden_snapshots``."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(collector)
    body = generate_latest(registry).decode()
    from prometheus_client.parser import text_string_to_metric_families

    ranks, hidden = set(), {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            if s.name == "oomsight_process_up":
                ranks.add(s.labels["rank"])
            elif s.name == "oomsight_spool_hidden_snapshots":
                hidden[(s.labels["rank"], s.labels["local_rank"], s.labels["reason"])] = s.value
    return ranks, hidden


def tape_ranks(spool: str, n: int) -> None:
    """``n`` ranks, each the shipped tape's last snapshot as recorded (20 KB, every step row: costed 206 KB)."""
    from oomsight.tools import tape
    from oomsight.tools.demo import TAPE

    _, records = tape.read(TAPE)
    last = json.dumps(next(r["doc"] for r in reversed(records) if r["doc"]["kind"] == "snapshot"))
    assert 200_000 < memory_cost(last.encode()) <= BUDGET.rank_memory_bytes
    for pid in range(1, n + 1):
        doc = json.loads(last)
        doc["process"].update(id=f"{pid}-aa", pid=pid, rank=pid - 1, local_rank=pid - 1)
        doc.update(time=time.time(), state="running", exit_reason=None)
        path = put(spool, snapshot_path(pid), doc)
        os.utime(path, (1e9 + pid, 1e9 + pid))


def test_64_ranks_of_the_tape_s_snapshot_are_all_served_and_none_is_said_hidden(tmp_path: Any) -> None:
    """Issue 44: 12 MiB for the parsed snapshots together left 3 of these 64 ranks out, said by a counter alone."""
    from oomsight.metrics.collector import SpoolCollector

    spool = str(tmp_path)
    tape_ranks(spool, BUDGET.ranks_per_spool)
    collector = SpoolCollector(spool, stale_after_seconds=3600)
    assert served_ranks(collector) == ({str(r) for r in range(BUDGET.ranks_per_spool)}, {})


@pytest.mark.parametrize("hostile", ["padded", "dense"])
def test_a_rank_over_its_share_of_memory_is_left_out_named_and_hides_no_valid_rank(tmp_path: Any, hostile: str) -> None:
    """The newest file of the spool is a hostile rank's, read first before issue 44: one padded to the largest
    file (costed 4 MiB), or 100 KB of ``[{}, ...]`` (costed 9.5 MB, no rank named)."""
    from oomsight.metrics.collector import SpoolCollector

    spool = str(tmp_path)
    tape_ranks(spool, BUDGET.ranks_per_spool - 1)
    if hostile == "padded":
        put(spool, snapshot_path(999), padded(snapshot(pid=999, rank=99, t=time.time())))
    else:
        put(spool, snapshot_path(999), b"[" + b"{}," * 34_000 + b"{}]")
    collector = SpoolCollector(spool, stale_after_seconds=3600)
    ranks, hidden = served_ranks(collector)
    assert ranks == {str(r) for r in range(BUDGET.ranks_per_spool - 1)}
    named = ("99", "99") if hostile == "padded" else ("", "")
    assert hidden == {(*named, "too_many_files"): 1.0}
    assert served_ranks(collector) == (ranks, hidden)  # while it stays, unparsed: its claim is remembered
    assert collector.reader.parsed == BUDGET.ranks_per_spool - 1
    os.remove(os.path.join(spool, snapshot_path(999)))
    assert served_ranks(collector) == (ranks, {})  # gone: the series goes


def test_the_claim_of_a_file_refused_unparsed_is_its_process_object_or_nothing() -> None:
    from oomsight.wire.reader import claim

    assert claim(json.dumps(snapshot(pid=3, rank=7)).encode()) == ("7", "7")
    assert claim(b'{"process": {"rank": 1}}') == ("", "")  # no local rank
    assert claim(b'{"process": {"rank": "1", "local_rank": 0}}') == ("", "")
    assert claim(b'{"process": {"rank": 1e400, "local_rank": 0}}') == ("", "")
    assert claim(b'{"process": {"rank": 2, "local_rank": 0') == ("", "")
    assert claim(b'{"process": {"rank": 2' + b" " * 5000 + b', "local_rank": 0}}') == ("", "")  # bounded search
