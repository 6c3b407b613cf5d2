"""The generated dashboards: in sync with their sources, readable by grafana-foundation-sdk's
dashboard model, and in the house style (datasource variable everywhere, unique ids, no
overlapping panels, a description on every panel)."""

from __future__ import annotations

import glob
import json
import os
import re
from pathlib import Path

import pytest
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard as sdk
from grafana_foundation_sdk.models import prometheus

from dashboards import config, generator, queries, rules

from fakes import ROOT
from panelquery import dashboard_files, load, panels

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
BOARDS = {os.path.basename(p): p for p in dashboard_files()}


def test_the_generated_files_match_their_sources() -> None:
    assert generator.drift(generator.outputs()) == []
    assert generator.main(["--check"]) == 0


def test_the_check_names_a_file_that_drifted_and_one_that_has_no_source() -> None:
    files = generator.outputs()
    stale = generator.dashboard_file(generator.SOURCES / "cluster.dashboard.py")
    files[stale] = files[stale].replace(config.UID_CLUSTER, "edited-by-hand")
    pod = generator.dashboard_file(generator.SOURCES / "pod.dashboard.py")
    del files[pod]
    assert generator.drift(files) == [
        "helm/oomsight/dashboards/oomsight-cluster.json differs",
        "helm/oomsight/dashboards/oomsight-pod.json has no source",
    ]


def test_there_is_one_dashboard_per_source_with_its_stable_uid() -> None:
    uids = {load(p)["uid"] for p in BOARDS.values()}
    assert sorted(BOARDS) == ["oomsight-cluster.json", "oomsight-forensics.json", "oomsight-pod.json"]
    assert uids == {config.UID_CLUSTER, config.UID_POD, config.UID_FORENSICS}


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_the_dashboard_parses_with_the_foundation_sdk_model(name: str) -> None:
    register_default_plugins()
    raw = load(BOARDS[name])
    board = sdk.Dashboard.from_json(raw)
    assert board.uid == raw["uid"] and board.schema_version == config.SCHEMA_VERSION
    parsed = [p for p in board.panels or [] if p.type_val != "row"]
    assert len(parsed) == sum(1 for p in raw["panels"] if p["type"] != "row")
    for panel in parsed:
        assert panel.targets, panel.title
        assert all(isinstance(t, prometheus.Dataquery) and t.expr for t in panel.targets), panel.title
        assert panel.options is not None and not isinstance(panel.options, dict), f"untyped options: {panel.title}"
    assert next(v.name for v in board.templating.list_val or []) == "datasource"
    assert board.annotations.list_val and board.annotations.list_val[0].expr


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_panel_ids_are_unique_and_no_two_panels_overlap(name: str) -> None:
    every = list(panels(load(BOARDS[name])))
    ids = [p["id"] for p in every]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in every:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_panel_has_a_description_and_uses_the_datasource_variable(name: str) -> None:
    board = load(BOARDS[name])
    first = board["templating"]["list"][0]
    assert (first["name"], first["type"], first["query"]) == ("datasource", "datasource", "prometheus")
    for p in panels(board):
        if p["type"] == "row":  # Grafana's RowPanel has a title and no description
            continue
        assert p.get("description"), f"{p['title']!r} has no description"
        assert p["datasource"] == DATASOURCE, p["title"]
        assert all(t["datasource"] == DATASOURCE for t in p.get("targets", [])), p["title"]
    for var in board["templating"]["list"][1:]:
        assert var["datasource"] == DATASOURCE and var["refresh"] == 2
    assert all(a["datasource"] == DATASOURCE for a in board["annotations"]["list"])


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_the_dashboard_follows_the_house_conventions(name: str) -> None:
    board = load(BOARDS[name])
    assert board["schemaVersion"] == config.SCHEMA_VERSION and board["tags"] == config.TAGS
    exprs = [t["expr"] for p in panels(board) for t in p.get("targets", [])]
    windows = [w for e in exprs for w in re.findall(r"\b(?:rate|increase)\([^[]*\[([^\]]+)\]", e)]
    assert windows and set(windows) <= {"$__rate_interval", "$__range"}, windows
    ann = board["annotations"]["list"][0]
    assert ann["useValueForTime"] is True and ann["expr"].startswith(f"1000 * {rules.OOM_EVENT}")


def test_the_pod_dashboard_has_variables_for_namespace_workload_pod_rank_and_device() -> None:
    names = [v["name"] for v in load(BOARDS["oomsight-pod.json"])["templating"]["list"]]
    assert names == ["datasource", "cluster", "namespace", "workload", "pod", "rank", "device"]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_dashboard_has_the_optional_cluster_variable_and_every_query_selects_on_it(name: str) -> None:
    board = load(BOARDS[name])
    cluster = board["templating"]["list"][1]
    assert (cluster["name"], cluster["includeAll"], cluster["allValue"]) == ("cluster", True, ".*")
    assert cluster["query"] == "label_values(oomsight_build_info, cluster)"
    exprs = [t["expr"] for p in panels(board) for t in p.get("targets", [])]
    exprs += [a["expr"] for a in board["annotations"]["list"]]
    exprs += [v["query"] for v in board["templating"]["list"][2:]]
    for expr in exprs:
        selectors = re.findall(r"\{[^}]*\}", expr.replace("{{", "").replace("}}", ""))
        assert selectors and all('cluster=~"$cluster"' in s for s in selectors if "=~" in s), expr


def test_the_dcgm_row_is_collapsed_last_and_joins_on_the_gpu_uuid() -> None:
    board = load(BOARDS["oomsight-pod.json"])
    last = board["panels"][-1]
    assert last["type"] == "row" and last["collapsed"] is True and "dcgm" in last["title"]
    note, *inner = [p for p in last["panels"] if "dcgm" in p["title"] or "dcgm" in p["description"]]
    assert inner and all(rules.GPU_DCGM_FB_USED in t["expr"] for p in inner for t in p["targets"][:1])
    assert note["type"] == "stat" and config.DCGM_FB_USED in note["targets"][0]["expr"]


def test_the_budget_panels_read_the_recorded_budget_series_and_mark_the_claimed_share() -> None:
    last = load(BOARDS["oomsight-pod.json"])["panels"][-1]
    budget = [p for p in last["panels"] if "DRA" in p["title"] or "claimed share" in p["title"]]
    exprs = [t["expr"] for p in budget for t in p["targets"]]
    assert any(rules.GPU_PEAK_PER_BUDGET in e for e in exprs) and any(rules.GPU_BUDGET_FORECAST in e for e in exprs)
    steps = budget[0]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1]["value"] == config.THRESHOLDS.budget_exceeded_ratio


def test_the_dcgm_note_reads_both_forms_and_says_so_when_neither_is_there() -> None:
    note = load(BOARDS["oomsight-pod.json"])["panels"][-1]["panels"][0]
    expr = note["targets"][0]["expr"]
    assert "DCGM_FI_DEV_FB_USED{" in expr and "DCGM_FI_DEV_FB_USED_.+" in expr and "* 1048576" in expr
    assert "neither" in note["fieldConfig"]["defaults"]["noValue"]


def test_the_cluster_overview_reads_only_recorded_series() -> None:
    exprs = [t["expr"] for p in panels(load(BOARDS["oomsight-cluster.json"])) for t in p.get("targets", [])]
    raw = [e for e in exprs if re.search(r"(?<![:\w])oomsight_\w+\{", e)]
    assert raw == [q.expr for q in queries.OOM_RATE], raw  # the per-interval OOM count needs raw counters


def test_only_the_panels_module_imports_grafanalib() -> None:
    importing = re.compile(r"^\s*(from|import) grafanalib", re.M)
    sources = glob.glob(os.path.join(ROOT, "dashboards", "*.py"))
    assert {os.path.basename(s) for s in sources if importing.search(Path(s).read_text())} == {"panels.py"}


def test_every_table_column_override_names_a_kept_column() -> None:
    for path in BOARDS.values():
        for p in panels(load(path)):
            if p["type"] != "table":
                continue
            organize = next(t for t in p["transformations"] if t["id"] == "organize")["options"]
            kept = [organize["renameByName"].get(k, k) for k in organize["indexByName"]]
            overridden = [o["matcher"]["options"] for o in p["fieldConfig"]["overrides"]]
            assert set(overridden) <= set(kept), (p["title"], overridden, kept)
            assert p["options"]["sortBy"][0]["displayName"] in kept


def test_the_dashboards_json_is_stable_text() -> None:
    for path in BOARDS.values():
        text = Path(path).read_text()
        assert text == json.dumps(json.loads(text), sort_keys=True, indent=2) + "\n"
