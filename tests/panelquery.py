"""Every query a generated dashboard would send to Prometheus: panel targets, template
variables and annotations, with Grafana's variables filled in the way Grafana would."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator
from typing import Any, Optional

from fakes import ROOT

DASHBOARDS = os.path.join(ROOT, "helm", "oomsight", "dashboards")
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.*),\s*(?P<label>\w+)\)$", re.S)
VARIABLE = re.compile(r"\$\{(?P<braced>[A-Za-z_]\w*)(?::[^}]*)?\}|\$(?P<plain>[A-Za-z_]\w*)")


@dataclasses.dataclass(frozen=True)
class Probe:
    dashboard: str
    kind: str
    """``panel``, ``variable`` or ``annotation``."""
    where: str
    expr: str
    instant: bool = False
    label: Optional[str] = None
    """For ``label_values(selector, label)`` variables: the label whose values are listed."""

    @property
    def name(self) -> str:
        return f"{self.dashboard}: {self.kind} {self.where!r}"


def dashboard_files() -> list[str]:
    return sorted(os.path.join(DASHBOARDS, f) for f in os.listdir(DASHBOARDS) if f.endswith(".json"))


def load(path: str) -> dict[str, Any]:
    with open(path) as fh:
        return json.load(fh)  # type: ignore[no-any-return]


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def probes(path: str) -> Iterator[Probe]:
    board = load(path)
    name = os.path.basename(path)
    for panel in panels(board):
        for target in panel.get("targets") or []:
            where = f"{panel['title']} / {target['refId']}"
            yield Probe(name, "panel", where, target["expr"], instant=bool(target.get("instant")))
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            m = LABEL_VALUES.match(var["query"])
            assert m, f"{name}: variable {var['name']} is not label_values(selector, label)"
            yield Probe(name, "variable", var["name"], m["selector"], label=m["label"])
    for ann in board["annotations"]["list"]:
        yield Probe(name, "annotation", ann["name"], ann["expr"])


def all_probes() -> list[Probe]:
    return [p for path in dashboard_files() for p in probes(path)]


def substitute(expr: str, values: dict[str, str]) -> str:
    """Fill in ``$name`` and ``${name:format}`` as Grafana would; unknown names fail loudly."""

    def one(m: re.Match[str]) -> str:
        key = m["braced"] or m["plain"]
        if key not in values:
            raise KeyError(f"no test value for Grafana variable ${key} in {expr!r}")
        return values[key]

    return VARIABLE.sub(one, expr)
