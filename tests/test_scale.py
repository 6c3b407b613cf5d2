"""The series counts docs/scale.md states, counted from the real collector's exposition."""

from __future__ import annotations

import os
import re

from prometheus_client import CollectorRegistry, generate_latest

from oomsight.metrics.collector import SpoolCollector

from fakes import GIB, ROOT
from spoolmaker import hooked_process


def series(spool: str) -> dict[str, int]:
    """Samples of the exposition by scope: per (process, GPU), per process, per sidecar."""
    reg = CollectorRegistry()
    reg.register(SpoolCollector(spool))
    counts = {"gpu": 0, "process": 0, "sidecar": 0}
    for line in generate_latest(reg).decode().splitlines():
        if line and not line.startswith("#"):
            scope = "gpu" if 'gpu_uuid="' in line else "process" if 'rank="0"' in line else "sidecar"
            counts[scope] += 1
    return counts


def stated() -> dict[str, int]:
    with open(os.path.join(ROOT, "docs", "scale.md")) as fh:
        text = fh.read()
    numbers = re.findall(r"\| \*\*(\d+)\*\* \|", text)
    per_pod = int(re.search(r"spool `source_up` \| (\d+) \|", text)[1])  # type: ignore[index]
    return {"gpu": int(numbers[0]), "process": int(numbers[1]), "total": int(numbers[2]), "sidecar": per_pod}


def test_a_gpu_costs_the_series_docs_scale_states(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch, step_peaks=False)
    counted, doc = series(spool), stated()
    assert (counted["gpu"], counted["process"], counted["sidecar"]) == (doc["gpu"], doc["process"], doc["sidecar"])
    assert doc["total"] == doc["gpu"] + doc["process"]


def test_step_peaks_and_an_oom_add_the_series_docs_scale_states(spool, monkeypatch):
    _hook, cuda = hooked_process(spool, monkeypatch=monkeypatch, step_peaks=True)
    cuda.observer(0, 10 * GIB, 140 * GIB, GIB)
    assert series(spool)["gpu"] == stated()["gpu"] + 2 + 4
