"""The step rows' verdict of an older writer (no ``step_trend``) is judged by the reader once per changed snapshot
(issue 49), never once per scrape: an unchanged file is not judged again, a file published again with the same
rows carries its verdict, and a new row is judged once."""

import json
import os
import sys

from prometheus_client import generate_latest

from oomsight.analysis import trend
from oomsight.metrics.collector import SpoolCollector
from oomsight.wire.spool import write_atomic

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))


def test_an_older_writer_s_rows_are_judged_once_per_changed_snapshot(tmp_path, monkeypatch):
    from bench_reader_scale import reference_snapshot

    doc = reference_snapshot(older=True)
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "snapshots"))
    path = os.path.join(root, "snapshots", "1-aa.json")
    judged = []
    real = trend.analyse
    monkeypatch.setattr(trend, "analyse", lambda rows, cap: judged.append(len(rows)) or real(rows, cap))
    collector = SpoolCollector(root, stale_after_seconds=1e9, retention_seconds=1e9)

    def publish(seq):
        doc["seq"] = seq
        write_atomic(path, json.dumps(doc).encode(), durable=False)

    publish(1)
    for _ in range(3):
        collector.exposition(generate_latest)
    assert len(judged) == 1  # unchanged: judged at the first scrape alone
    publish(2)  # published again, the same rows
    collector.exposition(generate_latest)
    assert len(judged) == 1
    rows = doc["devices"][0]["steps_memory"]
    rows.append([rows[-1][0] + 1, rows[-1][1] + 0.1, *rows[-1][2:]])
    publish(3)
    for _ in range(2):
        collector.exposition(generate_latest)
    assert len(judged) == 2
