"""What grafanalib writes from Grafana's pre-5 JSON model (or its own defaults) that Grafana's
dashboard schema no longer has, and :func:`modern`, which drops it from a dashboard's plain JSON.

Nothing here imports grafanalib: :func:`dashboards.panels.render` hands in the JSON it wrote.
"""

from __future__ import annotations

from typing import Any

LEGACY = {
    "dashboard": {"rows", "sharedCrosshair", "style", "hideControls", "__inputs"},
    "timepicker": {"time_options"},
    "panel": {"error", "editable", "maxDataPoints"},
    "table": {"color", "columns", "fontSize", "mappings"},
    "table custom": {"displayMode"},
    "variable": {"auto", "auto_count", "auto_min", "useTags"},
    "variable current": {"tags"},
}
"""Keys dropped from every dashboard (``maxDataPoints`` only where it is grafanalib's default of 100)."""
ROW_KEYS = {"collapsed", "datasource", "gridPos", "id", "panels", "title", "type"}
"""A row panel is only these (Grafana's ``RowPanel``): grafanalib gives it a whole panel's keys."""


def modern(board: dict[str, Any]) -> dict[str, Any]:
    """``board`` (grafanalib's JSON, decoded) without its nulls and legacy keys."""
    return _modern(_prune(board))


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
