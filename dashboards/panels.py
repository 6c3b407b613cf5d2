"""The house-style builder: the only module that imports grafanalib (pinned, 0.7.1).

grafanalib's last release is from January 2024; keeping it behind these few functions
keeps a move to grafana-foundation-sdk cheap. Every panel and target uses the
``datasource`` template variable, has a description and gets its grid position from
:func:`grid`, which never lets two panels overlap. The plain JSON pieces it passes in are in
:mod:`dashboards.fragment`, the legacy keys :func:`render` drops in :mod:`dashboards.legacy`;
the dashboards import only this module (colours, ``steps`` and ``column`` included).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Optional, Union

import attr
from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from dashboards import config as c
from dashboards import legacy
from dashboards.fragment import (
    DATASOURCE,
    OOM_COLUMNS,
    TABLE_CUSTOM,
    distinct,
    merge,
    oom_annotation,
    organize,
    required,
    targets,
)
from dashboards.fragment import GREEN as GREEN
from dashboards.fragment import ORANGE as ORANGE
from dashboards.fragment import RED as RED
from dashboards.fragment import column as column
from dashboards.fragment import steps as steps
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

WIDTH = 24


def _common(title: str, description: str, queries: Sequence[Query]) -> dict[str, Any]:
    return {
        "title": title,
        "description": description,
        "dataSource": DATASOURCE,
        "targets": targets(queries),
        "thresholds": steps((GREEN, None)),
        "maxDataPoints": None,  # grafanalib's 100 widens every step: Grafana then uses the panel's width
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
        extraJson=required("timeseries"),
    )


def stat(
    title: str,
    description: str,
    queries: Sequence[Query],
    unit: str,
    thresholds: list[dict[str, Any]],
    no_value: str = "0",
) -> Panel:
    """``no_value``: what the panel says when its query returns nothing."""
    return g.Stat(
        **{**_common(title, description, queries), "thresholds": thresholds},
        format=unit,
        reduceCalc="lastNotNull",
        graphMode="none",
        colorMode="value",
        noValue=no_value,
        extraJson=required("stat"),
    )


def histogram(title: str, description: str, queries: Sequence[Query], unit: str) -> Panel:
    return g.Histogram(
        **_common(title, description, queries),
        combine=True,
        extraJson=merge(required("histogram"), {"fieldConfig": {"defaults": {"unit": unit, "min": 0, "max": 1}}}),
    )


def pie(title: str, description: str, queries: Sequence[Query]) -> Panel:
    return g.PieChartv2(
        **_common(title, description, queries),
        pieType="donut",
        legendDisplayMode="table",
        legendPlacement="right",
        legendValues=["value"],
        reduceOptionsCalcs=["lastNotNull"],
        extraJson=required("piechart"),
    )


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
        steps_.append(distinct(columns))
    steps_.append({"id": "filterFieldsByName", "options": {"include": {"names": list(columns)}}})
    steps_.append(organize(columns))
    first_value = next(name for field, name in columns.items() if field in values)
    return g.Table(
        **_common(title, description, queries),
        transformations=steps_,
        overrides=list(overrides),
        sortBy=[g.TableSortByField(displayName=first_value, desc=True)],
        filterable=True,
        extraJson=required("table", TABLE_CUSTOM),
    )


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


def render(board: Any) -> str:
    """Stable JSON text: sorted keys, two-space indent, newline at the end."""
    plain = json.loads(json.dumps(board.to_json_data(), cls=DashboardEncoder))
    return json.dumps(legacy.modern(plain), sort_keys=True, indent=2) + "\n"
