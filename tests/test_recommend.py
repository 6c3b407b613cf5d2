"""``oomsight recommend`` and the right-sizing rules (issue 38): a real Prometheus, with the chart's rules,
scrapes real sidecars over replayed tapes, and the command prints the expected rows; the catalogue of what
can be requested; the side-by-side with a sampled (dcgm-style) recommendation in docs/kubernetes.md.

Three workloads from the H200 recording (``exporter/oomsight/tools/data/h200-demo.tape.jsonl.gz``: two ranks on
one GPU, rank 1 leaks and dies of a CUDA OOM):

- ``train-demo`` (a Job): the whole recording, the OOM included; both processes have exited at the end, so
  nothing runs and nothing is wasted now;
- ``eval`` (a Job): rank 0 alone, still running, with a 20 GiB DRA claim (the sidecar's real claim reader);
- ``notebook-0`` (a pod nobody owns): the same rank 0 from a sidecar without a claim: the whole H200.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dashboards import config, rules
from oomsight.metrics.family import non_torch_bytes
from oomsight.predict import gpu
from oomsight.tools import catalogue, cli, recommend, tape

from fakes import GIB, ROOT
from procs import exposition_server, owner_exposition, prometheus, promql_at, wait_for

H200_TAPE = os.path.join(ROOT, "exporter", "oomsight", "tools", "data", "h200-demo.tape.jsonl.gz")
RULES = os.path.join(ROOT, "helm", "oomsight", "rules", "oomsight.rules.yaml")
NAMESPACE = "ml-team"
CLAIM_BYTES = 20 * GIB
SPEED = 5.0
"""The 41 s recording replays in about 8 s."""


# ------------------------------------------------------------------ what the tape says


def snapshots(records: list[dict[str, Any]], rank: int | None = None) -> list[dict[str, Any]]:
    return [r for r in records if r["path"].startswith("snapshots/") and rank in (None, r["doc"]["process"]["rank"])]


def outside(doc: dict[str, Any]) -> int:
    """``oomsight_gpu_non_torch_bytes`` of a snapshot, as the collector computes it."""
    return int(non_torch_bytes(doc["devices"][0]) or 0)


def expected_need(records: list[dict[str, Any]], ranks: tuple[int, ...], died: bool) -> int:
    """Lifetime peaks reserved summed, plus each process's memory outside the allocator, plus the failed
    allocation of the rank that died, at the highest state the run reached."""
    latest: dict[int, dict[str, Any]] = {}
    best = 0
    for rec in snapshots(records):
        rank = rec["doc"]["process"]["rank"]
        if rank not in ranks:
            continue
        latest[rank] = rec["doc"]
        peak = sum(d["devices"][0]["allocator"]["peak_reserved_bytes"] for d in latest.values())
        own = all(d["devices"][0]["nvml"]["process_visible"] for d in latest.values())  # each its own context
        best = max(best, peak + (sum if own else max)(outside(d) for d in latest.values()))
    ask = max(e["doc"]["requested_bytes"] for e in records if e["path"].startswith("events/")) if died else 0
    return best + ask


def write_tape(path: str, header: dict[str, Any], records: list[dict[str, Any]]) -> str:
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        for line in (header, *records):
            fh.write(json.dumps(line) + "\n")
    return path


def rank0_still_running(recording: str, path: str) -> str:
    """Rank 0's snapshots without its last (exited) one: a process that still runs at the end."""
    header, records = tape.read(recording)
    mine = [r for r in snapshots(records, 0) if r["doc"]["state"] != "exited"]
    return write_tape(path, header, mine)


# ------------------------------------------------------------------ the live cluster


@dataclasses.dataclass(frozen=True)
class Live:
    url: str
    records: list[dict[str, Any]]


def claims_reader(budget: int) -> Any:
    """The sidecar's real claim reader over a fake API holding one claim reserved for the pod."""
    from test_claims import claim

    from oomsight_sidecar.claims import ClaimReader

    from kubetools import FakeKube

    fake = FakeKube()
    fake.claims = [claim("eval-gpu", "pod-uid", f"{budget}")]
    reader = ClaimReader(lambda: fake, "ml", "pod-uid")
    reader.refresh()
    return reader


def sidecar(spool: str, claims: Any = None) -> Any:
    from oomsight_server.wsgi import serve
    from oomsight_sidecar.main import build_app
    from oomsight_sidecar.settings import SidecarSettings

    app = build_app(SidecarSettings(spool_dir=spool, host="127.0.0.1", port=0), claims=claims)
    return serve(app, "127.0.0.1", 0)


def job(name: str, port: int, pod: str) -> dict[str, Any]:
    labels = {"namespace": NAMESPACE, "pod": pod, "container": "oomsight"}
    return {"job_name": name, "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": labels}]}


@pytest.fixture(scope="module")
def live(tmp_path_factory: Any) -> Iterator[Live]:
    work = tmp_path_factory.mktemp("recommend")
    full, alone = str(work / "full"), str(work / "alone")
    os.makedirs(full)
    os.makedirs(alone)
    solo_tape = rank0_still_running(H200_TAPE, str(work / "rank0.tape.jsonl.gz"))
    servers = [sidecar(full), sidecar(alone, claims_reader(CLAIM_BYTES)), sidecar(alone)]
    try:
        with (
            exposition_server(lambda path: owner_exposition("train-demo")) as train_owner,
            exposition_server(lambda path: owner_exposition("eval")) as eval_owner,
        ):
            a, b, c = (s.server_port for s in servers)
            targets = [
                job("train", a, "train-demo-0"),
                job("train-owner", train_owner, "train-demo-0"),
                job("eval", b, "eval-0"),
                job("eval-owner", eval_owner, "eval-0"),
                job("notebook", c, "notebook-0"),
            ]
            with prometheus(str(work), [], rule_files=[RULES], scrape_configs=targets) as url:
                wait_for(lambda: len(promql_at(url, "up == 1", time.time())) == len(targets), timeout=30)
                replays = [
                    threading.Thread(target=tape.replay, args=(H200_TAPE, full, SPEED)),
                    threading.Thread(target=tape.replay, args=(solo_tape, alone, SPEED)),
                ]
                for t in replays:
                    t.start()
                for t in replays:
                    t.join()
                time.sleep(3.0)  # the final state scraped and the rules evaluated on it
                yield Live(url, tape.read(H200_TAPE)[1])
    finally:
        for s in servers:
            s.shutdown()


def run_recommend(capsys: Any, *args: str) -> tuple[int, str, str]:
    code = cli.main(["recommend", *args])
    out, err = capsys.readouterr()
    return code, out, err


def by_workload(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {w["workload"]: w for w in doc["workloads"]}


@pytest.mark.e2e
def test_recommend_prints_each_workloads_peak_request_slice_gpu_waste_and_claim(live: Live, capsys: Any) -> None:
    code, out, err = run_recommend(capsys, "--prometheus", live.url, "--json")
    assert code == 0, err
    rows = by_workload(json.loads(out))
    assert set(rows) == {"train-demo", "eval", "notebook-0"}
    train, evl, nb = rows["train-demo"], rows["eval"], rows["notebook-0"]
    assert (train["workload_type"], evl["workload_type"], nb["workload_type"]) == ("Job", "Job", "Pod")

    assert train["observed_peak_bytes"] == expected_need(live.records, (0, 1), died=True)
    assert train["oom_failed_allocation_bytes"] == 16 << 20
    alone = expected_need(live.records, (0,), died=False)
    assert evl["observed_peak_bytes"] == nb["observed_peak_bytes"] == alone
    for row in rows.values():
        assert row["recommended_bytes"] == pytest.approx(row["observed_peak_bytes"] * 1.1)
        rec = row["recommended_bytes"]
        assert row["mig"] == [{"gpu": b.model, "profile": p.name} for b, p in catalogue.smallest_profiles(rec)]
        smallest = catalogue.smallest_gpu(rec)
        assert smallest is not None and row["gpu"] == smallest.name

    (oom,) = train["ooms"]
    event = max((r["doc"] for r in live.records if r["path"].startswith("events/")), key=lambda e: e["time"])
    assert (oom["pod"], oom["rank"], oom["cause"]) == ("train-demo-0", "1", event["diagnosis"]["cause"])
    assert evl["ooms"] == nb["ooms"] == []

    total = snapshots(live.records, 0)[-1]["doc"]["devices"][0]["nvml"]["total_bytes"]
    assert train["granted_bytes"] == [] and train["waste_bytes"] == 0  # both processes have exited
    assert evl["claimed"] and evl["granted_bytes"] == [CLAIM_BYTES]
    assert evl["waste_bytes"] == pytest.approx(CLAIM_BYTES - evl["recommended_bytes"])
    assert not nb["claimed"] and nb["granted_bytes"] == [total]
    assert nb["waste_bytes"] == pytest.approx(total - nb["recommended_bytes"])

    claim = train["resource_claim_template"]
    assert claim["apiVersion"] == "resource.k8s.io/v1" and claim["kind"] == "ResourceClaimTemplate"
    request = claim["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert request["capacity"]["requests"]["memory"] == catalogue.quantity(train["recommended_bytes"])


@pytest.mark.e2e
def test_the_recorded_request_is_what_recommend_prints_with_the_charts_defaults(live: Live, capsys: Any) -> None:
    now = time.time()
    recorded = {s["metric"]["workload"]: float(s["value"][1]) for s in promql_at(live.url, rules.RS_REQUEST, now)}
    _, out, _ = run_recommend(capsys, "--prometheus", live.url, "--json")
    printed = {w: row["recommended_bytes"] for w, row in by_workload(json.loads(out)).items()}
    assert recorded.keys() == printed.keys()
    assert all(recorded[w] == pytest.approx(printed[w]) for w in printed)
    waste = {s["metric"]["workload"]: float(s["value"][1]) for s in promql_at(live.url, rules.RS_WASTE, time.time())}
    assert waste["eval"] == pytest.approx(CLAIM_BYTES - printed["eval"])


@pytest.mark.e2e
def test_the_text_names_the_oom_and_carries_a_claim_template_per_workload(live: Live, capsys: Any) -> None:
    code, out, _ = run_recommend(capsys, "--prometheus", live.url, "--workload", "train-demo", "--window", "1h")
    assert code == 0
    assert out.startswith(f"{NAMESPACE}/train-demo (Job), per GPU, over 1h")
    assert "OOM in window    train-demo-0 rank 1 GPU 0" in out
    assert "16.00 MiB a run that died of an OOM asked for" in out
    quantity = catalogue.quantity(expected_need(live.records, (0, 1), died=True) * 1.1)
    assert "kind: ResourceClaimTemplate" in out and f"memory: {quantity}" in out and quantity == "11Gi"
    assert "eval" not in out
    print(out, file=sys.stderr)  # docs/kubernetes.md shows this output


@pytest.mark.e2e
def test_a_workload_without_history_is_pointed_at_predict_as_a_starting_figure(live: Live, capsys: Any) -> None:
    code, out, _ = run_recommend(capsys, "--prometheus", live.url, "--workload", "ghost")
    assert code == 0
    assert "no history for workload 'ghost'" in out and "oomsight predict" in out and "prediction" in out
    code, out, _ = run_recommend(capsys, "--prometheus", live.url, "--workload", "ghost", "--json")
    assert json.loads(out)["workloads"] == [] and "oomsight predict" in json.loads(out)["no_history"]


# ------------------------------------------------------------------ mistakes: one line, exit 2


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--prometheus", "prometheus:9090"], "not an http(s) URL"),
        (["--prometheus", "http://127.0.0.1:1"], "cannot reach Prometheus at http://127.0.0.1:1"),
        (["--prometheus", "http://127.0.0.1:1", "--window", "a week"], "not a PromQL duration"),
        (["--prometheus", "http://127.0.0.1:1", "--margin", "-1"], "--margin -1"),
    ],
    ids=["no scheme", "unreachable", "bad window", "bad margin"],
)
def test_a_bad_url_an_unreachable_prometheus_or_a_bad_window_is_one_line_and_exit_2(
    capsys: Any, args: list[str], says: str
) -> None:
    code, out, err = run_recommend(capsys, *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and says in err
    assert "Traceback" not in err and "[Errno" not in err


def test_a_server_that_is_not_prometheus_is_one_line_and_exit_2(capsys: Any) -> None:
    with exposition_server(lambda path: b"<html>hello</html>") as port:
        code, _, err = run_recommend(capsys, "--prometheus", f"http://127.0.0.1:{port}")
    assert code == 2 and "not a Prometheus API" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------ one declaration, two readers


def test_the_command_reads_the_series_the_rules_record_with_the_charts_defaults() -> None:
    assert {name: getattr(rules, name) for name in recommend.SERIES} == recommend.SERIES
    assert recommend.BUDGET == rules.POD_BUDGET and recommend.OOM_EVENT == rules.OOM_EVENT
    assert config.THRESHOLDS.rightsizing_window == recommend.DEFAULT_WINDOW
    assert config.THRESHOLDS.rightsizing_margin_ratio == recommend.DEFAULT_MARGIN


def test_the_workload_filter_is_an_escaped_exact_match() -> None:
    assert recommend.selector('a"b') == '{workload="a\\"b"}'
    assert all("[7d]" in q for name, q in recommend.queries("7d", None).items() if name not in ("granted", "claimed"))


# ------------------------------------------------------------------ the catalogue


def test_every_mig_profiles_memory_fits_its_share_of_its_gpu() -> None:
    for board in catalogue.MIG:
        assert board.profiles, board.model
        for p in board.profiles:
            assert p.memory_bytes <= board.memory_bytes, (board.model, p.name)
            assert p.memory_bytes <= board.memory_bytes * p.eighths / 8, (board.model, p.name)
            assert p.instances * p.eighths <= 8, (board.model, p.name)
            assert re.fullmatch(r"[1-7]g\.\d+gb", p.name)


def test_the_catalogue_reuses_predicts_gpus_and_names_its_sources_in_the_docs() -> None:
    whole = [(b, b.whole) for b in catalogue.MIG if b.whole is not None]
    assert whole and all(b.memory_bytes == gpu.GPUS[name].total_bytes for b, name in whole)
    assert catalogue.smallest_gpu(1) is min(gpu.GPUS.values(), key=lambda g: g.total_bytes)
    with open(os.path.join(ROOT, "docs", "kubernetes.md")) as fh:
        text = fh.read()
    assert all(url in text for url in catalogue.SOURCES) and catalogue.SOURCE_DATE in text
    assert all(b.model in text for b in catalogue.MIG)


def test_the_smallest_slice_is_the_least_memory_that_holds_the_request() -> None:
    h200 = next(b for b in catalogue.MIG if b.model.startswith("H200"))
    fits, above = catalogue.smallest_profile(h200, 18e9), catalogue.smallest_profile(h200, 18e9 + 1)
    assert fits is not None and fits.name == "1g.18gb"
    assert above is not None and above.name == "1g.35gb"
    assert catalogue.smallest_profile(h200, 142e9) is None
    assert catalogue.quantity(GIB) == "1Gi" and catalogue.quantity(GIB + 1) == "2Gi"


# ------------------------------------------------------------------ what sampling misses (docs/kubernetes.md)


def device_used(records: list[dict[str, Any]]) -> list[tuple[float, int]]:
    """The GPU's NVML used bytes over the recording (what dcgm-exporter's framebuffer-used reads), and 0
    once both processes have exited."""
    rows = [(r["t"], r["doc"]["devices"][0]["nvml"]["used_bytes"]) for r in snapshots(records)]
    return [*rows, (records[-1]["t"] + 0.001, 0)]


def sampled_peak(series: list[tuple[float, int]], every: float, phase: float) -> int:
    """The highest reading of a sampler that reads the latest value every ``every`` seconds from ``phase``."""
    best, at, i, last = 0, phase, 0, 0
    while at <= series[-1][0] + every:
        while i < len(series) and series[i][0] <= at:
            last = series[i][1]
            i += 1
        best, at = max(best, last), at + every
    return best


def sampling_table(records: list[dict[str, Any]]) -> dict[int, tuple[int, int]]:
    series = device_used(records)
    out = {}
    for every in (15, 30):
        peaks = [sampled_peak(series, every, phase / 10) for phase in range(every * 10)]
        out[every] = (min(peaks), max(peaks))
    return out


def test_the_docs_side_by_side_is_what_the_recording_gives() -> None:
    """docs/kubernetes.md's table: the sampled framebuffer peaks (worst and best phase of a 15 s and a 30 s
    sampler) against oomsight's exact need of the same run, in MB as printed there."""
    records = tape.read(H200_TAPE)[1]
    exact = expected_need(records, (0, 1), died=True)
    with open(os.path.join(ROOT, "docs", "kubernetes.md")) as fh:
        text = fh.read()
    section = text[text.index("## Right-sizing") :]
    assert f"| oomsight (exact peaks, outside the allocator, the failed allocation) | {exact / 1e6:,.0f} |" in section
    for every, (low, high) in sampling_table(records).items():
        assert f"| {every} s sampling of framebuffer used | {low / 1e6:,.0f} to {high / 1e6:,.0f} |" in section


# ------------------------------------------------------------------ the waste factor moved by a quarter


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("factor", "fires_for"),
    [(0.75, {"big", "twice"}), (1.0, {"big"}), (1.25, set())],
    ids=["-25%", "as set", "+25%"],
)
def test_the_oversized_claims_verdicts_as_its_factor_moves_by_a_quarter(
    tmp_path: Any, factor: float, fires_for: set[str]
) -> None:
    """tests/rules/rightsizing.test.yaml's claims are 2.5 ("big") and 2 ("twice") times their need, and "new"
    is 5 times a need seen for less than a window: at 1.5 "twice" fires too, at 2.5 neither does; "new" never."""
    import subprocess

    import yaml

    with open(RULES) as fh:
        doc = yaml.safe_load(fh)
    (alert,) = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == "OomsightGpuMemoryClaimOversized"]
    default = config.THRESHOLDS.claim_oversized_factor
    assert f"> {default:g}\n" in alert["expr"]
    alert["expr"] = alert["expr"].replace(f"> {default:g}\n", f"> {default * factor:g}\n")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(doc))
    with open(os.path.join(ROOT, "tests", "rules", "rightsizing.test.yaml")) as fh:
        tests = yaml.safe_load(fh)
    tests["rule_files"] = [str(tmp_path / "rules.yaml")]
    waste = [t for t in tests["tests"] if t.get("alert_rule_test", [{}])[0].get("alertname", "").endswith("Oversized")]
    series = [s for t in waste for s in t["input_series"]]
    case = {"eval_time": "200h", "alertname": "OomsightGpuMemoryClaimOversized", "exp_alerts": []}
    tests["tests"] = [{"name": "moved", "interval": "1h", "input_series": series, "alert_rule_test": [case]}]
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(tests))
    result = subprocess.run(["promtool", "test", "rules", str(tmp_path / "t.yaml")], capture_output=True, text=True)
    fired = set(re.findall(r'pod="([a-z]+)"', result.stdout + result.stderr))
    assert fired == fires_for, result.stdout + result.stderr
