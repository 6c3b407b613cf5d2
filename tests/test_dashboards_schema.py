"""Every generated dashboard against Grafana's own schema: the JSON Schema that
``scripts/install-grafana-schema.sh`` generates from npm ``@grafana/schema`` (the types Grafana
generates from its CUE schemas), in its open form and its strict form (no key the schema does
not name), and every panel's options and custom field config against its panel plugin's
schema. Then the defects the schema cannot see: annotation times in milliseconds, peaks kept
at any step, links that keep the data source and the time range, no grafanalib legacy keys.

The strict form has one widening, written out in :func:`strict_schema`: Grafana's
``AnnotationQuery`` names only the built-in Grafana annotation's fields (its own comment: "this
should be a regular DataQuery that depends on the selected dashboard"), so the keys Grafana's
Prometheus data source reads from an annotation are added to it, and nothing else. Panel
targets are ``Record<string, unknown>`` in the schema; they are held to
:data:`PROMETHEUS_TARGET` here.
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from dashboards import legacy

from fakes import ROOT
from panelquery import dashboard_files, load, panels

SCHEMAS = os.path.join(ROOT, ".tools", "grafana-schema")
BOARDS = {os.path.basename(p): p for p in dashboard_files()}
PANEL_TYPES = ("timeseries", "table", "stat", "histogram", "piechart")
PROMETHEUS_ANNOTATION_KEYS = {
    "expr": {"type": "string"},
    "step": {"type": "string"},
    "titleFormat": {"type": "string"},
    "textFormat": {"type": "string"},
    "tagKeys": {"type": "string"},
    "useValueForTime": {"type": "boolean"},
}
"""What the Prometheus annotation editor writes (query, min step, title, text, tags, "Series value
as timestamp")."""
PROMETHEUS_TARGET = {
    "type": "object",
    "additionalProperties": False,
    "required": ["refId", "expr", "datasource"],
    "properties": {
        "datasource": {"type": "object", "required": ["type", "uid"]},
        "expr": {"type": "string", "minLength": 1},
        "legendFormat": {"type": "string"},
        "refId": {"type": "string", "pattern": "^[A-Z]$"},
        "instant": {"type": "boolean"},
        "range": {"type": "boolean"},
        "format": {"enum": ["time_series", "table", "heatmap"]},
        "interval": {"type": "string"},
        "hide": {"type": "boolean"},
    },
}
"""A Prometheus query as Grafana's Prometheus data source writes it."""


def schema(name: str) -> dict[str, Any]:
    path = os.path.join(SCHEMAS, f"{name}.json")
    assert os.path.exists(path), f"{path} is missing: run scripts/install-tools.sh (install-grafana-schema.sh)"
    with open(path) as fh:
        return json.load(fh)  # type: ignore[no-any-return]


def strict_schema() -> dict[str, Any]:
    doc = copy.deepcopy(schema("dashboard.strict"))
    doc["definitions"]["AnnotationQuery"]["properties"].update(PROMETHEUS_ANNOTATION_KEYS)
    return doc


def errors(doc: Any, against: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(against)
    found = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in found]


def definition(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return {**doc, "$ref": f"#/definitions/{name}"}


def leaf_panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    return (p for p in panels(board) if p["type"] != "row")


@pytest.mark.parametrize("form", ["open", "strict"])
@pytest.mark.parametrize("name", sorted(BOARDS))
def test_the_dashboard_is_valid_for_grafanas_dashboard_schema(name: str, form: str) -> None:
    board = load(BOARDS[name])
    doc = schema("dashboard.open") if form == "open" else strict_schema()
    assert errors(board, doc) == []
    # the anyOf over Panel | RowPanel reports only "not valid under any": check each against its own
    for panel in panels(board):
        kind = "RowPanel" if panel["type"] == "row" else "Panel"
        assert errors(panel, definition(doc, kind)) == [], panel["title"]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_target_is_a_prometheus_query_with_nothing_else(name: str) -> None:
    for panel in leaf_panels(load(BOARDS[name])):
        for target in panel["targets"]:
            assert errors(target, PROMETHEUS_TARGET) == [], panel["title"]


@pytest.mark.parametrize("form", ["open", "strict"])
@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_panels_options_and_field_config_are_valid_for_its_plugins_schema(name: str, form: str) -> None:
    checked = 0
    for panel in leaf_panels(load(BOARDS[name])):
        kind = panel["type"]
        assert kind in PANEL_TYPES, f"{panel['title']}: no schema test for panel type {kind}"
        assert errors(panel["options"], schema(f"{kind}.options.{form}")) == [], panel["title"]
        if os.path.exists(os.path.join(SCHEMAS, f"{kind}.fieldconfig.{form}.json")):
            custom = panel["fieldConfig"]["defaults"].get("custom", {})
            assert errors(custom, schema(f"{kind}.fieldconfig.{form}")) == [], panel["title"]
        checked += 1
    assert checked


def _break(board: dict[str, Any], how: str) -> dict[str, Any]:
    broken = copy.deepcopy(board)
    first = next(p for p in broken["panels"] if p["type"] != "row")
    if how == "no schemaVersion":
        del broken["schemaVersion"]
    elif how == "gridPos.w a string":
        first["gridPos"]["w"] = "12"
    elif how == "graphTooltip 7":
        broken["graphTooltip"] = 7
    elif how == "thresholds.mode abs":
        first["fieldConfig"]["defaults"]["thresholds"]["mode"] = "abs"
    elif how == "unit a number":
        first["fieldConfig"]["defaults"]["unit"] = 5
    return broken


@pytest.mark.parametrize(
    "how", ["no schemaVersion", "gridPos.w a string", "graphTooltip 7", "thresholds.mode abs", "unit a number"]
)
def test_the_schema_check_rejects_a_broken_copy(how: str) -> None:
    board = load(BOARDS["oomsight-pod.json"])
    for doc in (schema("dashboard.open"), strict_schema()):
        assert errors(board, doc) == []
        assert errors(_break(board, how), doc), f"{how} passed"


def test_the_strict_form_rejects_a_key_grafana_does_not_know() -> None:
    board = load(BOARDS["oomsight-pod.json"])
    for where in (board, board["annotations"]["list"][0], board["templating"]["list"][1]):
        where["sharedCrosshair"] = False
        assert errors(board, strict_schema()) and not errors(board, schema("dashboard.open"))
        del where["sharedCrosshair"]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_annotation_time_is_in_milliseconds(name: str) -> None:
    """Grafana's Prometheus data source reads a series value used as the time as milliseconds;
    the recorded OOM series holds Unix seconds (its name says so)."""
    annotations = load(BOARDS[name])["annotations"]["list"]
    assert annotations
    for ann in annotations:
        assert ann["useValueForTime"] is True
        assert re.match(r"^1000 \* \(?[a-z_:]+_timestamp_seconds", ann["expr"]), ann["expr"]


def test_no_grafanalib_legacy_key_is_left() -> None:
    text = "".join(Path(p).read_text() for p in BOARDS.values())
    for key in ('"rows"', '"sharedCrosshair"', '"style"', '"error"', '"metric"', '"step": 10', '"hideControls"'):
        assert key not in text, key
    assert '"maxDataPoints": 100' not in text
    for board in map(load, BOARDS.values()):
        for panel in panels(board):
            if panel["type"] == "row":
                assert set(panel) <= legacy.ROW_KEYS, panel["title"]


PEAK_GAUGES = re.compile(
    r"\b(oomsight_torch_(?:allocated|reserved|inactive_split|window_peak_\w+|peak_\w+)_bytes"
    r"|oomsight_step_peak_\w+_bytes|oomsight_gpu_memory_used_bytes|oomsight_gpu_non_torch_bytes"
    r"|oomsight_memory_by_category_bytes|[a-z_]+:oomsight_\w+_bytes:\w+|[a-z_]+:dcgm_\w+:\w+)\{"
)


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_time_series_of_memory_shows_the_extreme_of_each_step(name: str) -> None:
    """A step wider than the hook's 60 s window would skip the peaks between two points: every
    memory gauge in a time-series panel of bytes is taken as max_over_time (min for the floor) over
    $__interval, the step Grafana queries with."""
    found = 0
    for panel in leaf_panels(load(BOARDS[name])):
        if panel["type"] != "timeseries" or panel["fieldConfig"]["defaults"]["unit"] != "bytes":
            continue  # ratios (fragmentation) and counts are not peaks
        for target in panel["targets"]:
            for m in PEAK_GAUGES.finditer(target["expr"]):
                found += 1
                before = target["expr"][: m.start()]
                if before.endswith("predict_linear("):
                    continue  # the forecast is a fitted line, not a sample
                assert re.search(r"(max|min)_over_time\($", before), (panel["title"], target["expr"])
                after = target["expr"][m.end() :]
                assert re.match(r"[^}]*\}\[\$__interval\]\)", after), (panel["title"], target["expr"])
    assert found


def links(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in panels(board):
        for override in panel.get("fieldConfig", {}).get("overrides", []):
            for prop in override["properties"]:
                if prop["id"] == "links":
                    yield from ((panel["title"], link["url"]) for link in prop["value"])
        for link in panel.get("links", []):
            yield panel["title"], link["url"]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_link_to_a_dashboard_keeps_the_data_source_and_a_time_range(name: str) -> None:
    found = list(links(load(BOARDS[name])))
    assert found
    for title, url in found:
        assert url.startswith("/d/"), (title, url)
        assert "${datasource:queryparam}" in url, (title, url)
        assert "${__url_time_range}" in url or re.search(r"[?&]time=\$\{__value\.raw\}&time\.window=\d+", url), (
            title,
            url,
        )
