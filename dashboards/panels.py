"""The house-style builder: the only module that imports grafanalib (pinned, 0.7.1).

grafanalib's last release is from January 2024; keeping it behind these few functions
keeps a move to grafana-foundation-sdk cheap. Every panel and target uses the
``datasource`` template variable, has a description and gets its grid position from
:func:`grid`, which never lets two panels overlap.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Optional, Union

import attr
from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from dashboards import config as c
from dashboards.queries import Query

Panel = Any
"""A grafanalib panel (grafanalib has no type hints)."""
Cell = tuple[Panel, int]
"""A panel and its width in grid columns (24 make a line)."""
Cells = tuple[int, Sequence[Cell]]
"""(height, cells) laid out left to right."""


@attr.s(frozen=True, auto_attribs=True)
class Collapsed:
    """A row that starts collapsed and holds its own lines (only as the last row of a dashboard)."""

    title: str
    lines: Sequence[Cells]


Line = Union[str, Cells, Collapsed]
"""A row title, a line of cells, or a collapsed row."""

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH = 24
RED, ORANGE, GREEN = "red", "orange", "green"


def steps(*pairs: tuple[str, Optional[float]]) -> list[dict[str, Any]]:
    """Threshold steps: ``steps((GREEN, None), (RED, 0.9))``."""
    return [{"color": color, "value": value} for color, value in pairs]


def targets(queries: Sequence[Query]) -> list[dict[str, Any]]:
    """Prometheus targets as Grafana's Prometheus data source writes them (grafanalib's ``Target``
    adds the legacy ``metric``, ``step`` and ``target`` keys)."""
    return [
        {
            "datasource": DATASOURCE,
            "expr": q.expr,
            "legendFormat": q.legend,
            "refId": chr(ord("A") + i),
            "instant": q.instant,
            "range": not q.instant,
            "format": "table" if q.table else "time_series",
        }
        for i, q in enumerate(queries)
    ]


def _common(title: str, description: str, queries: Sequence[Query]) -> dict[str, Any]:
    return {
        "title": title,
        "description": description,
        "dataSource": DATASOURCE,
        "targets": targets(queries),
        "thresholds": steps((GREEN, None)),
        "maxDataPoints": None,  # grafanalib's 100 widens every step: Grafana then uses the panel's width
    }


LEGEND = {"showLegend": True, "calcs": []}
TOOLTIP = {"mode": "single", "sort": "none"}
REQUIRED_OPTIONS: dict[str, dict[str, Any]] = {
    "timeseries": {"legend": {"showLegend": True}},
    "stat": {"percentChangeColorMode": "standard", "showPercentChange": False, "wideLayout": True},
    "table": {"frameIndex": 0},
    "histogram": {"legend": LEGEND, "tooltip": TOOLTIP},
    "piechart": {"legend": LEGEND, "tooltip": TOOLTIP, "displayLabels": [], "orientation": "auto", "sort": "desc"},
}
"""Options Grafana's panel-config schemas require and grafanalib does not write (Grafana fills in the
same defaults when it loads a panel; written out, the schema check can hold every panel to it)."""
TABLE_CUSTOM = {"align": "auto", "cellOptions": {"type": "auto"}, "inspect": False, "filterable": True}


def _required(kind: str, custom: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    extra: dict[str, Any] = {"options": REQUIRED_OPTIONS[kind]}
    if custom is not None:
        extra["fieldConfig"] = {"defaults": {"custom": custom}}
    return extra


def timeseries(
    title: str,
    description: str,
    queries: Sequence[Query],
    unit: str = "bytes",
    stack: bool = False,
    bars: bool = False,
    thresholds: Optional[list[dict[str, Any]]] = None,
) -> Panel:
    return g.TimeSeries(
        **{**_common(title, description, queries), "thresholds": thresholds or steps((GREEN, None))},
        unit=unit,
        stacking={"mode": "normal", "group": "A"} if stack else {},
        drawStyle="bars" if bars else "line",
        fillOpacity=60 if bars else (25 if stack else 0),
        legendDisplayMode="table",
        legendCalcs=["max", "lastNotNull"],
        tooltipMode="multi",
        tooltipSort="desc",
        thresholdsStyleMode="dashed" if thresholds else "off",
        valueMin=0,
        extraJson=_required("timeseries"),
    )


def stat(title: str, description: str, queries: Sequence[Query], unit: str, thresholds: list[dict[str, Any]]) -> Panel:
    return g.Stat(
        **{**_common(title, description, queries), "thresholds": thresholds},
        format=unit,
        reduceCalc="lastNotNull",
        graphMode="none",
        colorMode="value",
        noValue="0",
        extraJson=_required("stat"),
    )


def histogram(title: str, description: str, queries: Sequence[Query], unit: str) -> Panel:
    return g.Histogram(
        **_common(title, description, queries),
        combine=True,
        extraJson=_merge(_required("histogram"), {"fieldConfig": {"defaults": {"unit": unit, "min": 0, "max": 1}}}),
    )


def pie(title: str, description: str, queries: Sequence[Query]) -> Panel:
    return g.PieChartv2(
        **_common(title, description, queries),
        pieType="donut",
        legendDisplayMode="table",
        legendPlacement="right",
        legendValues=["value"],
        reduceOptionsCalcs=["lastNotNull"],
        extraJson=_required("piechart"),
    )


def column(name: str, unit: str = "", thresholds: Optional[list[dict[str, Any]]] = None, link: str = "") -> Any:
    """A field override for a table column, matched by its (renamed) display name."""
    props: list[dict[str, Any]] = [{"id": "unit", "value": unit}] if unit else []
    if thresholds:
        props += [
            {"id": "thresholds", "value": {"mode": "absolute", "steps": thresholds}},
            {"id": "custom.cellOptions", "value": {"type": "color-background", "mode": "gradient"}},
        ]
    if link:
        props.append({"id": "links", "value": [{"title": "Open", "url": link}]})
    return {"matcher": {"id": "byName", "options": name}, "properties": props}


def table(
    title: str,
    description: str,
    queries: Sequence[Query],
    columns: dict[str, str],
    overrides: Sequence[Any] = (),
    group_by_value: bool = False,
) -> Panel:
    """Table queries merged into one row per label set; ``columns`` maps the fields to keep
    (labels; ``Value``, or ``Value #A`` for query A's value when there are several) to their
    titles, in order. ``group_by_value`` keeps one row per distinct combination (event logs)."""
    values = ["Value"] if len(queries) == 1 else [f"Value #{chr(ord('A') + i)}" for i in range(len(queries))]
    steps_: list[dict[str, Any]] = [{"id": "merge", "options": {}}]
    if group_by_value:
        steps_.append(_distinct(columns))
    steps_.append({"id": "filterFieldsByName", "options": {"include": {"names": list(columns)}}})
    steps_.append(_organize(columns))
    first_value = next(name for field, name in columns.items() if field in values)
    return g.Table(
        **_common(title, description, queries),
        transformations=steps_,
        overrides=list(overrides),
        sortBy=[g.TableSortByField(displayName=first_value, desc=True)],
        filterable=True,
        extraJson=_required("table", TABLE_CUSTOM),
    )


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """``a`` with ``b`` merged in, dict by dict."""
    out = dict(a)
    for key, value in b.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _distinct(columns: dict[str, str]) -> dict[str, Any]:
    """One row per distinct combination of the kept fields (every OOM event once)."""
    fields = {name: {"operation": "groupby", "aggregations": []} for name in columns}
    return {"id": "groupBy", "options": {"fields": fields}}


def _organize(columns: dict[str, str]) -> dict[str, Any]:
    return {
        "id": "organize",
        "options": {
            "indexByName": {name: i for i, name in enumerate(columns)},
            "renameByName": {k: v for k, v in columns.items() if k != v},
            "excludeByName": {},
        },
    }


OOM_COLUMNS = {
    "Value #A": "OOM time",
    "namespace": "namespace",
    "workload": "workload",
    "pod": "pod",
    "rank": "rank",
    "device": "GPU",
    "Value #B": "Requested",
    "Value #C": "Free",
    "cause": "Cause",
    "remedy": "Remedy",
    "Value #D": "OOMs",
    "Value #E": "Fatal",
}
"""Columns of ``queries.OOM_TABLE``: the OOM's time, where, requested and free bytes, why, the remedy,
and the pod's OOM and fatal OOM counts."""


def oom_table(title: str, description: str, queries: Sequence[Query], time_link: str, pod_link: str = "") -> Panel:
    """The last OOM of each rank and GPU, one row each, newest first."""
    overrides = [
        column("OOM time", "dateTimeAsIso", link=time_link),
        column("Requested", "bytes"),
        column("Free", "bytes"),
        column("Fatal", thresholds=steps((GREEN, None), (RED, 1))),
    ]
    if pod_link:
        overrides.append(column("pod", link=pod_link))
    return table(title, description, queries, OOM_COLUMNS, overrides)


def row(title: str, collapsed: bool = False, panels: Sequence[Panel] = ()) -> Panel:
    """A row title; a ``collapsed`` row holds its ``panels`` itself and shows them when opened."""
    return g.RowPanel(title=title, dataSource=DATASOURCE, collapsed=collapsed, panels=list(panels))


def grid(lines: Sequence[Line]) -> list[Panel]:
    """Place panels left to right, line after line, with ids in reading order."""
    placed: list[Panel] = []
    y = 0
    for i, line in enumerate(lines):
        if isinstance(line, Collapsed):
            if i != len(lines) - 1:
                raise ValueError(f"collapsed row {line.title!r} must be the last row")
            inner, _ = _place(line.lines, y + 1, len(placed) + 2)
            placed.append(_at(row(line.title, True, inner), 1, WIDTH, 0, y, len(placed) + 1))
        elif isinstance(line, str):
            placed.append(_at(row(line), 1, WIDTH, 0, y, len(placed) + 1))
            y += 1
        else:
            more, y = _place([line], y, len(placed) + 1)
            placed += more
    return placed


def _place(lines: Sequence[Cells], y: int, first_id: int) -> tuple[list[Panel], int]:
    placed: list[Panel] = []
    for height, cells in lines:
        x = 0
        for panel, width in cells:
            if x + width > WIDTH:
                raise ValueError(f"line at y={y} is wider than {WIDTH} columns")
            placed.append(_at(panel, height, width, x, y, first_id + len(placed)))
            x += width
        y += height
    return placed, y


def _at(panel: Panel, h: int, w: int, x: int, y: int, id_: int) -> Panel:
    return attr.evolve(panel, gridPos=g.GridPos(h=h, w=w, x=x, y=y), id=id_)


def datasource_variable() -> Any:
    return g.Template(name="datasource", label="Data source", query="prometheus", type="datasource", default="default")


def cluster_variable(query: str) -> Any:
    """kubernetes-mixin's ``cluster``: one cluster at a time, *All* (``.*``) by default so that a
    Prometheus whose series carry no ``cluster`` label (one cluster) matches everything."""
    var = g.Template(
        name="cluster",
        label="Cluster",
        query=query,
        dataSource=DATASOURCE,
        includeAll=True,
        allValue=".*",
        refresh=g.REFRESH_ON_TIME_RANGE_CHANGE,
        sort=g.SORT_ALPHA_IGNORE_CASE_ASC,
    )
    var._current = {"selected": True, "text": "All", "value": "$__all"}  # one value: not lists
    return var


def variable(name: str, label: str, query: str) -> Any:
    """A multi-value query variable, *All* by default; *All* means every value listed (so a selected
    workload narrows its pods), not ``.*``."""
    var = g.Template(
        name=name,
        label=label,
        query=query,
        dataSource=DATASOURCE,
        includeAll=True,
        multi=True,
        refresh=g.REFRESH_ON_TIME_RANGE_CHANGE,
        sort=g.SORT_ALPHA_IGNORE_CASE_ASC,
    )
    var._current = {"selected": True, "text": ["All"], "value": ["$__all"]}  # grafanalib has no setter for it
    return var


def oom_annotation(expr: str) -> dict[str, Any]:
    """CUDA OOMs as annotations. With ``useValueForTime`` ("Series value as timestamp") Grafana's
    Prometheus data source reads the series value as the event's time in **milliseconds**, so
    ``expr`` must return the OOM's Unix time in ms (``queries.ms``)."""
    return {
        "name": "CUDA OOM",
        "datasource": DATASOURCE,
        "enable": True,
        "iconColor": RED,
        "expr": expr,
        "step": "30s",
        "useValueForTime": True,
        "titleFormat": "CUDA OOM: {{pod}} rank {{rank}} GPU {{device}}",
        "textFormat": "cause: {{cause}}. Remedy: {{remedy}}",
        "tagKeys": "namespace,workload,cause",
    }


def links() -> list[Any]:
    """A drop-down of every oomsight dashboard, keeping the time range and variables."""
    return [
        g.DashboardLink(
            title="oomsight",
            tags=c.TAGS[:1],
            type="dashboards",
            asDropdown=True,
            keepTime=True,
            includeVars=True,
        )
    ]


def dashboard(
    uid: str,
    title: str,
    description: str,
    variables: list[Any],
    annotation: str,
    lines: Sequence[Line],
    cluster_query: str,
) -> Any:
    """A dashboard in the house style: the data source and cluster variables first, then ``variables``."""
    return g.Dashboard(
        uid=uid,
        title=title,
        description=description,
        tags=c.TAGS,
        editable=True,
        schemaVersion=c.SCHEMA_VERSION,
        time=g.Time(c.DEFAULT_TIME, "now"),
        refresh=c.REFRESH,
        timezone="browser",
        graphTooltip=g.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
        templating=g.Templating(list=[datasource_variable(), cluster_variable(cluster_query), *variables]),
        annotations=g.Annotations(list=[oom_annotation(annotation)]),
        links=links(),
        panels=grid(lines),
    )


LEGACY = {
    "dashboard": {"rows", "sharedCrosshair", "style", "hideControls", "__inputs"},
    "timepicker": {"time_options"},
    "panel": {"error", "editable", "maxDataPoints"},
    "table": {"color", "columns", "fontSize", "mappings"},
    "table custom": {"displayMode"},
    "variable": {"auto", "auto_count", "auto_min", "useTags"},
    "variable current": {"tags"},
}
"""What grafanalib writes from Grafana's pre-5 JSON model (or its own defaults) that Grafana's
dashboard schema no longer has: dropped from every dashboard (``maxDataPoints`` only where it is
grafanalib's default of 100)."""
ROW_KEYS = {"collapsed", "datasource", "gridPos", "id", "panels", "title", "type"}
"""A row panel is only these (Grafana's ``RowPanel``): grafanalib gives it a whole panel's keys."""


def render(board: Any) -> str:
    """Stable JSON text: sorted keys, two-space indent, newline at the end."""
    plain = json.loads(json.dumps(board.to_json_data(), cls=DashboardEncoder))
    return json.dumps(_modern(_prune(plain)), sort_keys=True, indent=2) + "\n"


def _modern(board: dict[str, Any]) -> dict[str, Any]:
    """``board`` without grafanalib's legacy keys (``LEGACY``, ``ROW_KEYS``)."""
    out = _without(board, "dashboard")
    out["timepicker"] = _without(board.get("timepicker", {}), "timepicker")
    out["panels"] = [_modern_panel(p) for p in board.get("panels", [])]
    variables = board.get("templating", {}).get("list", [])
    out["templating"] = {"list": [_modern_variable(v) for v in variables]}
    return out


def _modern_panel(panel: dict[str, Any]) -> dict[str, Any]:
    if panel["type"] == "row":
        kept = {k: v for k, v in panel.items() if k in ROW_KEYS}
        return {**kept, "panels": [_modern_panel(p) for p in panel.get("panels", [])]}
    out = _without(panel, "panel")
    if panel.get("maxDataPoints", 100) != 100:
        out["maxDataPoints"] = panel["maxDataPoints"]
    if panel["type"] == "table":
        out = _without(out, "table")
        defaults = out["fieldConfig"]["defaults"]
        defaults["custom"] = _without(defaults.get("custom", {}), "table custom")
    return out


def _modern_variable(variable: dict[str, Any]) -> dict[str, Any]:
    out = _without(variable, "variable")
    if "current" in out:
        out["current"] = _without(out["current"], "variable current")
    return out


def _without(node: dict[str, Any], kind: str) -> dict[str, Any]:
    return {k: v for k, v in node.items() if k not in LEGACY[kind]}


def _prune(node: Any) -> Any:
    """Drop the ``null`` settings grafanalib writes for everything it does not set (Grafana and
    the foundation SDK read a missing key as the default, a null as a broken object). A threshold
    step's ``"value": null`` (the base step) stays."""
    if isinstance(node, dict):
        return {k: _prune(v) for k, v in node.items() if v is not None or k == "value"}
    if isinstance(node, list):
        return [_prune(v) for v in node]
    return node
