"""Every query of every generated dashboard (panels, template variables, annotations) and
the generated rules, against a real Prometheus that scraped a real ``oomsight sidecar``
serving the replay of a recorded run with a CUDA OOM in it.

The recording is the one made on an NVIDIA H200 (``exporter/oomsight/tools/data/h200-demo.tape.jsonl.gz``,
``python -m oomsight.tools.demo_train``): two ranks on one GPU under a 5 % memory cap; rank 1 leaks
evaluation outputs with their graph and dies of a CUDA OOM after rank 0 has finished.
The pod's owner comes from a second, static exposition as the sidecar will publish it;
the same sidecar is also scraped as a second pod without owner information, so both the
owner and the fall-back to the pod are proven.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from dashboards import config, rules
from oomsight.tools import tape
from oomsight.wire import schema
from oomsight.wire.spool import write_atomic
from oomsight_server.wsgi import serve
from oomsight_sidecar.claims import ClaimReader
from oomsight_sidecar.main import build_app
from oomsight_sidecar.settings import SidecarSettings

from fakes import GIB, ROOT
from kubetools import FakeKube
from panelquery import Probe, all_probes, substitute
from procs import exposition_server, http_get, owner_exposition, prometheus, promql_at, promql_range, wait_for

pytestmark = pytest.mark.e2e

H200_TAPE = os.path.join(ROOT, "exporter", "oomsight", "tools", "data", "h200-demo.tape.jsonl.gz")
RULES = os.path.join(ROOT, "helm", "oomsight", "rules", "oomsight.rules.yaml")
REPLAY_SECONDS = 12.0
"""A longer recording is replayed faster, to last about this long."""
NAMESPACE, POD, SOLO_POD, OWNER, CLUSTER = "ml-team", "train-demo-0", "solo-0", "train-demo", "gpu-east"


@dataclasses.dataclass(frozen=True)
class Live:
    url: str
    start: float
    """Just before the replay began: the start of the dashboards' time range."""
    end: float
    """A few scrapes after the replay ended: "now"."""
    tape_path: str

    def grafana_values(self) -> dict[str, str]:
        every = {name: ".*" for name in ("cluster", "namespace", "workload", "pod", "rank", "device")}
        window = f"{math.ceil(self.end - self.start) + 5}s"
        return {**every, "__rate_interval": "1m", "__range": window, "__interval": "2s", "__from": str(int(self.start))}


DCGM_USED_MIB = 9000
DCGM_UTIL_PERCENT = 87
"""What the static dcgm-exporter exposition says the GPU's framebuffer holds."""


def dcgm_exposition(uuid: str) -> bytes:
    """dcgm-exporter's framebuffer-used gauge as it publishes it (MiB; UUID, gpu, device=nvidia0),
    scraped with the labels of the dcgm-exporter pod, not the training pod's."""
    labels = f'gpu="0",UUID="{uuid}",device="nvidia0",modelName="NVIDIA H200",Hostname="node-1"'
    return (
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n# TYPE DCGM_FI_DEV_FB_USED gauge\n"
        f"DCGM_FI_DEV_FB_USED{{{labels}}} {DCGM_USED_MIB}\n"
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {DCGM_UTIL_PERCENT}\n"
    ).encode()


BUDGET_BYTES = 150 * GIB
"""The GPU memory share the pod claimed through DRA (more than the H200's 141 GiB, so the recorded peak
stays below it and the forecast has a share to reach)."""


def claims_reader() -> ClaimReader:
    """The sidecar's real claim reader, over a fake API holding one claim reserved for the pod."""
    from test_claims import claim

    fake = FakeKube()
    fake.claims = [claim("train-gpu", "pod-uid", f"{BUDGET_BYTES}")]
    reader = ClaimReader(lambda: fake, "ml", "pod-uid")
    reader.refresh()
    assert reader.budgets()
    return reader


def tape_gpu_uuid(path: str) -> str:
    _, records = tape.read(path)
    return str(next(r["doc"]["devices"][0]["uuid"] for r in records if r["path"].startswith("snapshots/")))


def scrape_configs(sidecar: str, owner: str, dcgm: str = "") -> list[dict[str, Any]]:
    def job(name: str, target: str, pod: str, cluster: dict[str, str]) -> dict[str, Any]:
        labels = {"namespace": NAMESPACE, "pod": pod, "container": "oomsight", **cluster}
        return {"job_name": name, "static_configs": [{"targets": [target], "labels": labels}]}

    # the pod of a cluster-labelled Prometheus (Thanos, Mimir), and one of a Prometheus without the label
    east = {"cluster": CLUSTER}
    jobs = [
        job("sidecar", sidecar, POD, east),
        job("sidecar-solo", sidecar, SOLO_POD, {}),
        job("owner", owner, POD, east),
    ]
    if dcgm:
        labels = {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-x", "container": "dcgm-exporter", **east}
        jobs.append({"job_name": "dcgm", "static_configs": [{"targets": [dcgm], "labels": labels}]})
    return jobs


@pytest.fixture(scope="module")
def recording() -> str:
    assert os.path.exists(H200_TAPE), f"{H200_TAPE} is missing: the dashboards are proven on the H200 recording"
    return H200_TAPE


@pytest.fixture(scope="module")
def live(recording: str, tmp_path_factory: Any) -> Iterator[Live]:
    work = tmp_path_factory.mktemp("live")
    spool = str(work / "spool")
    os.makedirs(spool)
    app = build_app(SidecarSettings(spool_dir=spool, host="127.0.0.1", port=0), claims=claims_reader())
    sidecar = serve(app, "127.0.0.1", 0)
    try:
        uuid = tape_gpu_uuid(recording)
        with (
            exposition_server(lambda path: owner_exposition(OWNER)) as owner,
            exposition_server(lambda path: dcgm_exposition(uuid)) as dcgm,
        ):
            targets = scrape_configs(f"127.0.0.1:{sidecar.server_port}", f"127.0.0.1:{owner}", f"127.0.0.1:{dcgm}")
            yield from _run(recording, spool, str(work), targets)
    finally:
        sidecar.shutdown()


def _run(recording: str, spool: str, work: str, targets: list[dict[str, Any]]) -> Iterator[Live]:
    """Prometheus scrapes the sidecar, the owner and dcgm while the recording replays into the spool."""
    with prometheus(work, [], rule_files=[RULES], scrape_configs=targets) as url:
        wait_for(lambda: len(promql_at(url, "up == 1", time.time())) == len(targets), timeout=30)
        start = time.time()
        _, records = tape.read(recording)
        _add_profile(spool, records)
        tape.replay(recording, spool, speed=max(1.0, float(records[-1]["t"]) / REPLAY_SECONDS))
        _add_findings(spool)
        time.sleep(3.0)  # a last scrape of the final state, and the rules evaluated on it
        yield Live(url, start, time.time(), recording)


def _add_profile(spool: str, records: list[dict[str, Any]]) -> None:
    """The recording has no profiling window: add one for rank 1, a document as the hook writes
    it (schema-checked), its memory column the top 5 of the H200 profile test
    (benchmarks/results/gpu-profile-memory-only-h200.log), its CUDA times made up."""
    process = next(
        r["doc"]["process"] for r in records if r["path"].startswith("snapshots/") and r["doc"]["process"]["rank"] == 1
    )
    measured = [("aten::mm", 744488960), ("aten::empty_strided", 671418880), ("aten::addmm", 83886080)]
    ops = [
        {
            "op": op,
            "calls": 40,
            "self_cuda_memory_bytes": mem,
            "self_cuda_time_us": 900.0 - 100 * i,
            "cuda_time_us": 1e3,
            "cpu_time_us": 50.0,
        }
        for i, (op, mem) in enumerate(measured)
    ]
    now = time.time()
    doc = {
        "schema_version": 1,
        "kind": "profile",
        "process": process,
        "request_id": "e2e",
        "start_step": 10,
        "steps": 5,
        "started_at": now,
        "ended_at": now + 1,
        "device": 0,
        "peak_allocated_bytes": 2 << 30,
        "top_by_memory": ops,
        "top_by_time": ops,
        "cuda_time": True,
        "table_artifact": None,
        "trace_artifact": None,
    }
    assert schema.validate(doc) == "profile"
    os.makedirs(os.path.join(spool, "profiles"), exist_ok=True)
    write_atomic(os.path.join(spool, "profiles", f"{process['id']}.profile-e2e.json"), json.dumps(doc).encode(), False)


def _add_findings(spool: str) -> None:
    """The recording predates the leak scan and has no batch probe: the final snapshots get a
    leak finding for rank 1 (which leaked) and a probe answer for rank 0, in the hook's format
    (schema-checked) with illustrative values: 120 kept outputs of 64 x 2048 floats."""
    now = time.time()
    for name in os.listdir(os.path.join(spool, "snapshots")):
        path = os.path.join(spool, "snapshots", name)
        with open(path) as fh:
            doc = json.load(fh)
        if doc["process"]["rank"] == 1:
            leak = {"checked_at": now, "step": doc["steps"]["count"], "graph_tensors": 120, "growth_bytes": None}
            doc["leak"] = {**leak, "graph_bytes": 120 * 64 * 2048 * 4, "sites": ["demo_train.py:74 in worker"]}
        else:
            advice = {"measured_at": now, "device": 0, "max_batch_size": 96, "margin_ratio": 0.1, "source": "probe"}
            advice |= {"capacity_bytes": 7 << 30, "fixed_bytes": 1 << 30, "bytes_per_sample": 60 << 20}
            doc["batch_advice"] = {**advice, "points": [[8, 1.5 * (1 << 30)], [32, 2.9 * (1 << 30)]]}
        doc["devices"][0]["prediction"] = _prediction(doc["process"]["rank"], doc["devices"][0]["allocator"], now)
        assert schema.validate(doc) == "snapshot"
        write_atomic(path, json.dumps(doc).encode(), durable=False)


PREDICTION_RATIOS = {0: (1.02, 0.97), 1: (0.90, None)}
"""The recording predates predictions: rank 0's job carries oomsight predict's JSON (2 % over the measured
peak allocated, 3 % under the reserved one), rank 1's a bare size 10 % under its peak."""


def _prediction(rank: int, allocator: dict[str, Any], now: float) -> dict[str, Any]:
    allocated, reserved = PREDICTION_RATIOS[rank]
    return {
        "peak_allocated_bytes": round(allocated * allocator["peak_allocated_bytes"]),
        "peak_reserved_bytes": None if reserved is None else round(reserved * allocator["peak_reserved_bytes"]),
        "source": "env",
        "model": "gpt2" if reserved is not None else None,
        "batch_size": 8 if reserved is not None else None,
        "recorded_at": now,
    }


def _finite(series: list[dict[str, Any]]) -> bool:
    values = [s["value"] for s in series if "value" in s] + [v for s in series for v in s.get("values", [])]
    return any(math.isfinite(float(v[1])) for v in values)


@pytest.mark.parametrize("probe", all_probes(), ids=lambda p: p.name)
def test_every_dashboard_query_returns_data_from_the_recorded_run(live: Live, probe: Probe) -> None:
    """Time-series targets, variables and annotations run as Grafana runs them over the range. A
    stat or table shows its instant query at the moment you look: it must show data at some
    moment of the run (one Prometheus step at a time), with the same time range."""
    expr = substitute(probe.expr, live.grafana_values())
    result = promql_range(live.url, expr, live.start, live.end)
    assert result, f"{probe.name} returned no series:\n{expr}"
    if probe.kind == "variable":
        assert {s["metric"].get(probe.label) for s in result} - {None}, f"{probe.name}: no {probe.label} values"
    else:
        assert _finite(result), f"{probe.name} returned only NaN:\n{expr}"
    if probe.kind == "annotation":  # Grafana reads the value as the event's time in milliseconds
        times = {float(v[1]) for s in result for v in s["values"]}
        assert all(live.start * 1000 <= t <= live.end * 1000 for t in times), (
            f"{probe.name}: not OOM times in ms: {times}"
        )


def _last_oom(tape_path: str) -> dict[str, Any]:
    _, records = tape.read(tape_path)
    events = [r["doc"] for r in records if r["path"].startswith("events/")]
    return max(events, key=lambda e: (e["time"], e["outcome"] != "pending"))  # type: ignore[no-any-return]


def test_the_oom_alert_fires_with_its_cause_remedy_and_runbook(live: Live) -> None:
    event = _last_oom(live.tape_path)
    cause = event["diagnosis"]["cause"]
    status, body = http_get(f"{live.url}/api/v1/alerts")
    alerts = json.loads(body)["data"]["alerts"]
    firing = [a for a in alerts if a["labels"]["alertname"] == "OomsightCudaOutOfMemory"]
    assert status == 200 and firing, body
    mine = [a for a in firing if a["labels"]["pod"] == POD and a["labels"]["rank"] == str(event["process"]["rank"])]
    assert len(mine) == 1 and mine[0]["state"] == "firing"
    assert mine[0]["labels"]["cause"] == cause and mine[0]["labels"]["workload"] == OWNER
    assert config.CAUSE_REMEDY[cause] in mine[0]["annotations"]["description"]
    assert mine[0]["annotations"]["runbook_url"].endswith("/docs/runbooks/oomsightcudaoutofmemory.md")


def test_the_workload_is_the_owner_where_known_and_the_pod_elsewhere(live: Live) -> None:
    owners = promql_at(live.url, rules.OWNER, live.end)
    found = {(s["metric"]["pod"], s["metric"]["workload"], s["metric"]["workload_type"]) for s in owners}
    assert found == {(POD, OWNER, "Job"), (SOLO_POD, SOLO_POD, "Pod")}


def test_the_oom_table_names_requested_and_free_bytes_cause_and_remedy(live: Live) -> None:
    from dashboards import queries

    event = _last_oom(live.tape_path)
    values = {**live.grafana_values(), "pod": POD}
    time_, requested, free = (promql_at(live.url, substitute(q.expr, values), live.end) for q in queries.OOM_TABLE[:3])
    rank = str(event["process"]["rank"])
    row = next(s for s in requested if s["metric"]["rank"] == rank)
    assert float(row["value"][1]) == event["requested_bytes"]
    assert float(next(s for s in free if s["metric"]["rank"] == rank)["value"][1]) == event["device_free_bytes"]
    stamp = next(s for s in time_ if s["metric"]["rank"] == rank)
    assert live.start <= float(stamp["value"][1]) / 1000 <= live.end
    assert row["metric"]["remedy"] == config.CAUSE_REMEDY[event["diagnosis"]["cause"]]


def test_the_profile_tables_list_rank_1s_operators_largest_first(live: Live) -> None:
    from dashboards import queries

    expr = substitute(queries.PROFILE_MEMORY[0].expr, live.grafana_values())
    rows = {
        (s["metric"]["pod"], s["metric"]["rank"], s["metric"]["op"]): float(s["value"][1])
        for s in promql_at(live.url, expr, live.end)
    }
    assert rows[(POD, "1", "aten::mm")] == 744488960 and rows[(POD, "1", "aten::addmm")] == 83886080
    assert {rank for _, rank, _ in rows} == {"1"}  # rank 0 had no window
    expr = substitute(queries.PROFILE_TIME[0].expr, live.grafana_values())
    times = {
        s["metric"]["op"]: float(s["value"][1])
        for s in promql_at(live.url, expr, live.end)
        if s["metric"]["pod"] == POD
    }
    assert times["aten::mm"] == pytest.approx(900e-6)  # microseconds in the spool, seconds in Prometheus


def test_the_leak_panels_show_each_rank_and_rank_1s_scan_and_the_probe_rank_0s_answer(live: Live) -> None:
    from dashboards import queries

    def series(query: Any) -> dict[str, list[float]]:
        expr = substitute(query.expr, live.grafana_values())
        got = promql_range(live.url, expr, live.start, live.end)
        return {s["metric"]["rank"]: [float(v[1]) for v in s["values"]] for s in got if s["metric"]["pod"] == POD}

    suspected = series(queries.LEAK_SUSPECTED[0])
    # judged from the recording's own floors; it predates limit_bytes, so growth is measured
    # against the whole H200 (5 % = 7 GB) rather than rank 1's 7 GB cap, and stays 0 here
    assert set(suspected) == {"0", "1"} and {v for vs in suspected.values() for v in vs} <= {0.0, 1.0}
    assert series(queries.LEAK_GRAPH[0])["1"][-1] == 120 * 64 * 2048 * 4
    assert series(queries.MAX_BATCH[0])["0"][-1] == 96


def test_a_peak_between_two_points_of_a_wide_step_still_shows(live: Live) -> None:
    """At a step four times the scrape spacing (and more), the panel's points still reach the highest
    sample of the run: each point is the maximum of its step, not the sample at its end."""
    from dashboards import queries

    step = max(4.0, math.floor((live.end - live.start) / 4))
    values = {**live.grafana_values(), "pod": POD, "__interval": f"{step:g}s"}
    end = live.start + step * math.floor((live.end - live.start) / step)
    shown = promql_range(live.url, substitute(queries.TIMELINE[0].expr, values), live.start + step, end, step)
    raw = f'oomsight_torch_allocated_bytes{{pod="{POD}"}}'
    truth = promql_at(live.url, f"max_over_time({raw}[{end - live.start:g}s])", end)
    highest = {s["metric"]["rank"]: float(s["value"][1]) for s in truth}
    points = {s["metric"]["rank"]: max(float(v[1]) for v in s["values"]) for s in shown}
    assert highest and points == highest


def test_dcgms_framebuffer_joins_oomsights_pods_on_the_gpu_uuid_in_bytes(live: Live) -> None:
    got = promql_at(live.url, rules.GPU_DCGM_FB_USED, live.end - 3)
    found = {(s["metric"]["pod"], s["metric"]["gpu_uuid"]): float(s["value"][1]) for s in got}
    uuid = tape_gpu_uuid(live.tape_path)
    assert found and set(found.values()) == {DCGM_USED_MIB * (1 << 20)}
    assert {gpu for _, gpu in found} == {uuid}
    assert {s["metric"]["workload"] for s in got if s["metric"]["pod"] == POD} == {OWNER}


def test_the_documented_dcgm_join_runs_as_written(live: Live) -> None:
    with open(os.path.join(ROOT, "docs", "alerts.md")) as fh:
        text = fh.read()
    section = text[text.index("## dcgm-exporter") :]
    query = section.split("```promql\n", 1)[1].split("```", 1)[0]
    got = promql_at(live.url, query, live.end - 3)
    assert {(s["metric"]["namespace"], s["metric"]["pod"], float(s["value"][1])) for s in got} == {
        (NAMESPACE, POD, DCGM_UTIL_PERCENT)
    }


def test_every_generated_rule_evaluates_without_error_on_the_real_prometheus(live: Live) -> None:
    """Recording and alerting rules alike (a many-to-many join or a bad label would show here)."""
    status, body = http_get(f"{live.url}/api/v1/rules")
    groups = json.loads(body)["data"]["groups"]
    rules_ = [r for g in groups for r in g["rules"]]
    with open(RULES) as fh:
        expected = sum(len(g["rules"]) for g in yaml.safe_load(fh)["groups"])
    assert status == 200 and len(rules_) == expected
    broken = {r["name"]: r.get("lastError") for r in rules_ if r["health"] != "ok"}
    assert broken == {}


def test_the_prediction_table_and_stat_show_each_ranks_error_and_who_outgrew_its_prediction(live: Live) -> None:
    from dashboards import prediction_panels

    def at_end(query: Any) -> dict[str, float]:
        expr = substitute(query.expr, {**live.grafana_values(), "pod": POD})
        return {s["metric"]["rank"]: float(s["value"][1]) for s in promql_at(live.url, expr, live.end)}

    _predicted, _measured, allocated, reserved, ratio = (at_end(q) for q in prediction_panels.ERRORS)
    assert allocated == {"0": pytest.approx(0.02, abs=1e-6), "1": pytest.approx(-0.10, abs=1e-6)}
    assert reserved == {"0": pytest.approx(-0.03, abs=1e-6)}  # rank 1's job gave a bare size: no reserved
    assert ratio == {"0": pytest.approx(1 / 1.02, abs=1e-6), "1": pytest.approx(1 / 0.90, abs=1e-6)}
    assert ratio["1"] > prediction_panels.ABOVE > ratio["0"]  # rank 1 outgrew it: red
    expr = substitute(prediction_panels.HIGHEST[0].expr, {**live.grafana_values(), "pod": POD})
    (highest,) = promql_at(live.url, expr, live.end)
    assert float(highest["value"][1]) == pytest.approx(1 / 0.90, abs=1e-6)  # the stat: the highest ratio


def test_the_claimed_budget_divides_the_pods_gpu_peak_on_the_real_prometheus(live: Live) -> None:
    """The sidecar's budget series (read from a claim by the real reader) joins the pod's GPUs."""
    at = live.end - 3
    ratio = {
        s["metric"]["gpu_uuid"]: float(s["value"][1])
        for s in promql_at(live.url, rules.GPU_PEAK_PER_BUDGET, at)
        if s["metric"]["pod"] == POD
    }
    peak = {
        s["metric"]["gpu_uuid"]: float(s["value"][1])
        for s in promql_at(live.url, rules.GPU_PEAK_RESERVED, at)
        if s["metric"]["pod"] == POD
    }
    assert ratio and set(ratio) == set(peak)
    assert all(math.isclose(ratio[g], peak[g] / BUDGET_BYTES) and 0 < ratio[g] < 1 for g in ratio)
