"""Spools with hostile files, built from the documents of the shipped H200 tape."""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from oomsight.tools import tape
from oomsight.tools.demo import TAPE

NOW = 1_800_000_000.0


def tape_docs() -> list[tuple[str, dict[str, Any]]]:
    _, records = tape.read(TAPE)
    return [(r["path"], r["doc"]) for r in records]


_DOCS = tape_docs()
SNAPSHOT = copy.deepcopy(next(d for _, d in _DOCS if d["kind"] == "snapshot" and d["devices"][0]["categories"]))
EVENT = copy.deepcopy(next(d for _, d in _DOCS if d["kind"] == "oom_event"))


def snapshot(pid: int = 1, rank: int = 0, t: float = NOW, **extra: Any) -> dict[str, Any]:
    doc = copy.deepcopy(SNAPSHOT)
    doc["process"].update(id=f"{pid}-aa", pid=pid, rank=rank, local_rank=rank, started_at=t - 100)
    doc.update(time=t, state="running", exit_reason=None, **extra)
    return doc


def event(pid: int = 1, rank: int = 0, seq: int = 1, t: float = NOW, outcome: str = "pending") -> dict[str, Any]:
    doc = copy.deepcopy(EVENT)
    doc["process"].update(id=f"{pid}-aa", pid=pid, rank=rank, local_rank=rank, started_at=t - 100)
    doc.update(seq=seq, time=t, outcome=outcome, outcome_time=None)
    doc["device"], doc["gpu_uuid"] = SNAPSHOT["devices"][0]["index"], SNAPSHOT["devices"][0]["uuid"]
    return doc


def put(root: str, rel: str, content: Any) -> str:
    """Write ``content`` (bytes, or a value as JSON with NaN allowed) at ``root/rel`` atomically."""
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = content if isinstance(content, bytes) else json.dumps(content).encode("utf-8", "surrogatepass")
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)
    return path


def snapshot_path(pid: int = 1) -> str:
    return f"snapshots/{pid}-aa.json"


def event_path(pid: int = 1, seq: int = 1) -> str:
    return f"events/{pid}-aa.oom-{seq:05d}.json"
