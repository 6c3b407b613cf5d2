"""The step rows' verdict of each device document, judged once per document and carried while its rows stand.

A hook since wire 1.5 judges its own rows and writes the verdict (``step_trend``) into its snapshot; an
older writer's rows are judged here (``oomsight.analysis.trend``), the time-to-OOM forecast with them.
Judging costs time linear in the rows (issue 49), so it is done once per parsed document (the reader
keeps one per file identity: a file that did not change gives the same document), and a document
parsed again with the same rows and capacity is given its predecessor's verdict (:func:`carry_trend`):
never once per scrape. The carry holds the documents of the last read only (:func:`follow_trends`).
This is the stateful part of the families' values; ``oomsight.metrics.family`` holds the table.
"""

from __future__ import annotations

from typing import Optional

from oomsight.analysis import trend
from oomsight.analysis.inventory import Inventory
from oomsight.wire.schema import DeviceSnapshot, StepTrend

_TRENDS: dict[int, tuple[DeviceSnapshot, StepTrend]] = {}
"""One verdict per device document of an older writer (id -> (document, verdict)): readers
reuse unchanged documents."""


def device_trend(d: DeviceSnapshot) -> Optional[StepTrend]:
    """The verdict on a device's step rows: the hook's own (wire 1.5), or, for an older writer,
    judged here from the rows it carries; None when it has no step rows."""
    if d.get("step_trend") is not None or not d.get("steps_memory"):
        return trend.device_verdict(d)
    cached = _TRENDS.get(id(d))
    if cached is not None and cached[0] is d:
        return cached[1]
    found = trend.device_verdict(d)  # an older writer's rows: judged once per document
    if found is not None:
        _keep_trend(d, found)
    return found


def carry_trend(new: DeviceSnapshot, old: DeviceSnapshot) -> None:
    """Give ``new`` the trend already judged for ``old`` (the same device's previous document)
    when its step rows and capacity are the same: a process that publishes again without a new
    step row (steps longer than the publish interval, a paused job) is not judged again."""
    cached, known = _TRENDS.get(id(old)), _TRENDS.get(id(new))
    if cached is None or cached[0] is not old or (known is not None and known[0] is new):
        return
    if new.get("steps_memory") == old.get("steps_memory") and _capacity(new) == _capacity(old):
        _keep_trend(new, cached[1])


def follow_trends(before: Optional[Inventory], now: Inventory) -> None:
    """A long-lived reader's step: each rank's device documents parsed again keep the trend of
    their step rows when the rows did not move (:func:`carry_trend`), and the trends of every
    document but ``now``'s are forgotten (they would keep replaced documents alive). With no
    trend judged here (every writer judges its own rows) there is nothing to carry or forget."""
    if not _TRENDS:
        return
    last = {v.rank_labels: v.snapshot for v in before.processes} if before is not None else {}
    for v in now.processes:
        old = last.get(v.rank_labels)
        if old is not None and old is not v.snapshot:
            olds = {d["index"]: d for d in old["devices"]}
            for d in v.snapshot["devices"]:
                if d["index"] in olds:
                    carry_trend(d, olds[d["index"]])
    kept = {}
    for v in now.processes:
        for d in v.snapshot["devices"]:
            found = _TRENDS.get(id(d))
            if found is not None and found[0] is d:
                kept[id(d)] = found
    _TRENDS.clear()
    _TRENDS.update(kept)


def _capacity(d: DeviceSnapshot) -> int:
    return int(d.get("limit_bytes") or d.get("total_bytes") or 0) or 1


def _keep_trend(d: DeviceSnapshot, found: StepTrend) -> None:
    if len(_TRENDS) > 4096:
        _TRENDS.clear()
    _TRENDS[id(d)] = (d, found)
