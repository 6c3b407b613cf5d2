"""Stability of the metric families (issue 35, step 4): each row of ``family.FAMILIES`` is STABLE or
ALPHA, ``docs/metrics.md`` shows it, and the chart's dashboards and alerts read only STABLE
families, or the family's own cell says which of them reads it and why."""

from __future__ import annotations

import os
import re

from dashboards import generator
from oomsight.metrics.family import ALPHA, FAMILIES, STABLE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LABELS = {"oomsight_io_inject"}
"""``oomsight_*`` names in the generated files that are labels, not families (the chart's pod label)."""


def documented() -> dict[str, str]:
    """Every family of docs/metrics.md -> its stability cell."""
    found = {}
    with open(os.path.join(ROOT, "docs", "metrics.md")) as fh:
        for table in re.split(r"\n(?!\|)", fh.read()):
            rows = [line.split(" | ") for line in table.splitlines() if line.startswith("|")]
            if not rows or rows[0][0] != "| metric":
                continue
            column = rows[0].index("stability")
            for row in rows[2:]:
                found[row[0].strip("| `")] = row[column]
    return found


def read_by_dashboards_and_alerts() -> dict[str, set[str]]:
    """Every family a generated dashboard or rule file names (recording rules' own names excluded) ->
    the files that name it."""
    names: dict[str, set[str]] = {}
    for path, text in generator.outputs().items():
        for match in re.finditer(r"(?<![:\w])(oomsight_[a-z0-9_]+)(?![:\w])(?!\s*[=!]~?\")", text):
            names.setdefault(match.group(1), set()).add(path.name)
    return names


def test_every_family_is_stable_or_alpha():
    assert {f.stability for f in FAMILIES} <= {STABLE, ALPHA}
    assert all(f.stability == ALPHA for f in FAMILIES if f.alpha_read), "a reason to read ALPHA on a STABLE row"


def test_the_metrics_page_shows_each_familys_stability_as_the_table_gives_it():
    cells = documented()
    for family in FAMILIES:
        assert cells.get(family.exposed) == family.stability_note, family.exposed
    assert all(cell.split(":")[0] in (STABLE, ALPHA) for cell in cells.values()), cells


def test_dashboards_and_alerts_read_only_stable_families_or_say_why():
    cells = documented()
    read = read_by_dashboards_and_alerts()
    assert "oomsight_torch_allocated_bytes" in read  # the scan sees the queries
    unknown = set(read) - set(cells) - LABELS
    assert not unknown, f"read but not in docs/metrics.md: {sorted(unknown)}"
    unexplained = {name: sorted(read[name]) for name in set(read) - LABELS if cells[name] == ALPHA}
    assert not unexplained, f"ALPHA families read with no reason in their row: {unexplained}"


def test_a_reason_to_read_an_alpha_family_goes_once_nobody_reads_it():
    read = read_by_dashboards_and_alerts()
    stale = [name for name, cell in documented().items() if cell.startswith(ALPHA + ":") and name not in read]
    assert not stale, f"ALPHA families with a reason but no reader: {stale}"
