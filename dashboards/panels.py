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
Line = Union[str, tuple[int, Sequence[Cell]]]
"""A row title, or (height, cells) laid out left to right."""

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH = 24
RED, ORANGE, GREEN = "red", "orange", "green"


def steps(*pairs: tuple[str, Optional[float]]) -> list[dict[str, Any]]:
    """Threshold steps: ``steps((GREEN, None), (RED, 0.9))``."""
    return [{"color": color, "value": value} for color, value in pairs]


def targets(queries: Sequence[Query]) -> list[Any]:
    return [
        g.Target(
            expr=q.expr,
            legendFormat=q.legend,
            refId=chr(ord("A") + i),
            instant=q.instant,
            format="table" if q.table else "time_series",
            intervalFactor=1,
            datasource=DATASOURCE,
        )
        for i, q in enumerate(queries)
    ]


def _common(title: str, description: str, queries: Sequence[Query]) -> dict[str, Any]:
    return {
        "title": title,
        "description": description,
        "dataSource": DATASOURCE,
        "targets": targets(queries),
        "thresholds": steps((GREEN, None)),
    }


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
    )


def stat(title: str, description: str, queries: Sequence[Query], unit: str, thresholds: list[dict[str, Any]]) -> Panel:
    return g.Stat(
        **{**_common(title, description, queries), "thresholds": thresholds},
        format=unit,
        reduceCalc="lastNotNull",
        graphMode="none",
        colorMode="value",
        noValue="0",
    )


def histogram(title: str, description: str, queries: Sequence[Query], unit: str) -> Panel:
    return g.Histogram(
        **_common(title, description, queries),
        combine=True,
        extraJson={"fieldConfig": {"defaults": {"unit": unit, "min": 0, "max": 1}}},
    )


def pie(title: str, description: str, queries: Sequence[Query]) -> Panel:
    return g.PieChartv2(
        **_common(title, description, queries),
        pieType="donut",
        legendDisplayMode="table",
        legendPlacement="right",
        legendValues=["value"],
        reduceOptionsCalcs=["lastNotNull"],
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
    )


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


def row(title: str) -> Panel:
    return g.RowPanel(title=title, description=title, dataSource=DATASOURCE, collapsed=False)


def grid(lines: Sequence[Line]) -> list[Panel]:
    """Place panels left to right, line after line, with ids in reading order."""
    placed: list[Panel] = []
    y = 0
    for line in lines:
        if isinstance(line, str):
            placed.append(attr.evolve(row(line), gridPos=g.GridPos(h=1, w=WIDTH, x=0, y=y), id=len(placed) + 1))
            y += 1
            continue
        height, cells = line
        x = 0
        for panel, width in cells:
            if x + width > WIDTH:
                raise ValueError(f"line at y={y} is wider than {WIDTH} columns")
            placed.append(attr.evolve(panel, gridPos=g.GridPos(h=height, w=width, x=x, y=y), id=len(placed) + 1))
            x += width
        y += height
    return placed


def datasource_variable() -> Any:
    return g.Template(name="datasource", label="Data source", query="prometheus", type="datasource", default="default")


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
    """CUDA OOMs as annotations: the series value is the OOM's Unix time."""
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
    uid: str, title: str, description: str, variables: list[Any], annotation: str, lines: Sequence[Line]
) -> Any:
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
        templating=g.Templating(list=[datasource_variable(), *variables]),
        annotations=g.Annotations(list=[oom_annotation(annotation)]),
        links=links(),
        panels=grid(lines),
    )


def render(board: Any) -> str:
    """Stable JSON text: sorted keys, two-space indent, newline at the end."""
    plain = json.loads(json.dumps(board.to_json_data(), cls=DashboardEncoder))
    return json.dumps(_prune(plain), sort_keys=True, indent=2) + "\n"


def _prune(node: Any) -> Any:
    """Drop the ``null`` settings grafanalib writes for everything it does not set (Grafana and
    the foundation SDK read a missing key as the default, a null as a broken object). A threshold
    step's ``"value": null`` (the base step) stays."""
    if isinstance(node, dict):
        return {k: _prune(v) for k, v in node.items() if v is not None or k == "value"}
    if isinstance(node, list):
        return [_prune(v) for v in node]
    return node
