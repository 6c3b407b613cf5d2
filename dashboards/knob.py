"""Alert thresholds the chart lets users override (``prometheusRule.thresholds``), as tokens in rule text.

An alert writes ``knob("fragmentation_ratio")`` where its expression or description needs a
threshold. The plain rule file fills the token in with ``config.THRESHOLDS``; the chart's rule
spec (``helm/oomsight/rules/oomsight.rules.spec.json``) keeps it as a part that
``templates/prometheusrule.yaml`` fills in from the values, formatted exactly as :func:`fill`
formats it here (a test renders the defaults and compares with the plain file).
"""

from __future__ import annotations

import re
from typing import Any, Union

from dashboards import config as c

FIELDS = (
    "oom_recent_seconds",
    "near_capacity_warning_ratio",
    "near_capacity_critical_ratio",
    "forecast_lookback",
    "forecast_horizon_minutes",
    "forecast_headroom_ratio",
    "fragmentation_ratio",
    "fragmentation_min_bytes",
    "retries_window",
    "retries_min",
    "underused_peak_ratio",
    "underused_window",
    "webhook_certificate_days",
    "webhook_errors_window",
    "webhook_errors_min",
    "rightsizing_window",
    "rightsizing_margin_ratio",
    "claim_oversized_factor",
    "prediction_margin_ratio",
)
"""The overridable ``config.Thresholds`` fields. Not here: ``busy_ratio``
(dashboards only) and the ``*_for`` durations (``prometheusRule.customRules.<alert>.for``)."""
FORMATS = ("value", "percent", "times")
TOKEN = re.compile(r"⟦(?P<field>[a-z_]+)\|(?P<as>[a-z]+)\|(?P<by>\d+)⟧")
Part = Union[str, dict[str, Any]]


def knob(field: str, as_: str = "value", by: int = 1) -> str:
    """A token for threshold ``field``: its value, its value as a whole percentage (``0.1`` → ``10%``),
    or its value times ``by``."""
    if field not in FIELDS or as_ not in FORMATS:
        raise ValueError(f"unknown knob {field!r} or format {as_!r}")
    return f"⟦{field}|{as_}|{by}⟧"


def camel(field: str) -> str:
    head, *rest = field.split("_")
    return head + "".join(w.capitalize() for w in rest)


def defaults() -> dict[str, Any]:
    """``prometheusRule.thresholds`` as the chart's values.yaml must carry it."""
    return {camel(f): getattr(c.THRESHOLDS, f) for f in FIELDS}


def _format(value: Any, as_: str, by: int) -> str:
    if as_ == "percent":
        return f"{value:.0%}"
    if isinstance(value, str):
        return value
    if as_ == "times":
        value = value * by
    return str(int(value)) if float(value).is_integer() else str(value)


def fill(text: str, thresholds: c.Thresholds = c.THRESHOLDS) -> str:
    """``text`` with every token replaced by its threshold."""
    return TOKEN.sub(lambda m: _format(getattr(thresholds, m["field"]), m["as"], int(m["by"])), text)


def parts(text: str) -> list[Part]:
    """``text`` as literal strings and ``{"knob", "as", "by"}`` parts, for the chart's template."""
    out: list[Part] = []
    at = 0
    for m in TOKEN.finditer(text):
        if m.start() > at:
            out.append(text[at : m.start()])
        out.append({"knob": camel(m["field"]), "as": m["as"], "by": int(m["by"])})
        at = m.end()
    if at < len(text):
        out.append(text[at:])
    return out
