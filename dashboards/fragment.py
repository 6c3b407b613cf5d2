"""Pieces of Grafana's JSON model that grafanalib does not write (or writes the legacy way), as
plain dicts: colours and threshold steps, Prometheus targets, the options Grafana's panel schemas
require, a table's column overrides and transformations, and the OOM annotation.

Nothing here imports grafanalib: :mod:`dashboards.panels` passes these into its builders.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from dashboards.queries import Query

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
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


def required(kind: str, custom: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """A panel's ``extraJson``: the options of ``kind`` from ``REQUIRED_OPTIONS``, and ``custom``
    as its field config's defaults."""
    extra: dict[str, Any] = {"options": REQUIRED_OPTIONS[kind]}
    if custom is not None:
        extra["fieldConfig"] = {"defaults": {"custom": custom}}
    return extra


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """``a`` with ``b`` merged in, dict by dict."""
    out = dict(a)
    for key, value in b.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


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


def distinct(columns: dict[str, str]) -> dict[str, Any]:
    """One row per distinct combination of the kept fields (every OOM event once)."""
    fields = {name: {"operation": "groupby", "aggregations": []} for name in columns}
    return {"id": "groupBy", "options": {"fields": fields}}


def organize(columns: dict[str, str]) -> dict[str, Any]:
    """The kept fields in ``columns``' order, renamed to their titles."""
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
