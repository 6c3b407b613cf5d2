"""Hostile input for the tests and fuzzes: spools with hostile files, built from the documents of the
shipped H200 tape, and random changes to JSON documents."""

from __future__ import annotations

import copy
import json
import os
import time
from typing import Any, Callable

from hypothesis import strategies as st

from oomsight.tools import tape
from oomsight.tools.demo import TAPE

NOW = 1_800_000_000.0


def tape_docs() -> list[tuple[str, dict[str, Any]]]:
    _, records = tape.read(TAPE)
    return [(r["path"], r["doc"]) for r in records]


_DOCS = tape_docs()
SNAPSHOT = copy.deepcopy(next(d for _, d in _DOCS if d["kind"] == "snapshot" and d["devices"][0]["categories"]))
EVENT = copy.deepcopy(next(d for _, d in _DOCS if d["kind"] == "oom_event"))
_SNAPSHOT_JSON, _EVENT_JSON = json.dumps(SNAPSHOT), json.dumps(EVENT)
"""Copies are parsed from these: 20 times cheaper than ``copy.deepcopy`` (the fuzz makes 10,000)."""


def snapshot(pid: int = 1, rank: int = 0, t: float = NOW, **extra: Any) -> dict[str, Any]:
    doc = json.loads(_SNAPSHOT_JSON)
    doc["process"].update(id=f"{pid}-aa", pid=pid, rank=rank, local_rank=rank, started_at=t - 100)
    doc.update(time=t, state="running", exit_reason=None, **extra)
    return doc


def event(pid: int = 1, rank: int = 0, seq: int = 1, t: float = NOW, outcome: str = "pending") -> dict[str, Any]:
    doc = json.loads(_EVENT_JSON)
    doc["process"].update(id=f"{pid}-aa", pid=pid, rank=rank, local_rank=rank, started_at=t - 100)
    doc.update(seq=seq, time=t, outcome=outcome, outcome_time=None)
    doc["device"], doc["gpu_uuid"] = SNAPSHOT["devices"][0]["index"], SNAPSHOT["devices"][0]["uuid"]
    return doc


def paths_of(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    """Every (path to a container, key) in the JSON value ``doc``: the places a fuzz can change."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        out.append((prefix, key))
        out.extend(paths_of(value, (*prefix, key)))
    return out


def mutate(draw: Any, doc: Any, where: list[tuple[tuple[Any, ...], Any]], values: Any, most: int = 3) -> None:
    """Up to ``most`` times, remove the key at one of the places ``where`` of ``doc`` or replace its
    value with one drawn from the strategy ``values`` (in place; ``draw`` is hypothesis')."""
    for _ in range(draw(st.integers(min_value=0, max_value=most))):
        prefix, key = draw(st.sampled_from(where))
        target = doc
        try:
            for step in prefix:
                target = target[step]
            if draw(st.booleans()) and isinstance(target, dict):
                target.pop(key, None)
            else:
                target[key] = draw(values)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier change replaced the path


def cases_run(counts: dict[str, int], key: str, fuzz: Callable[[], None], seconds: float = 60) -> int:
    """``counts[key]``, the cases a fuzz ran in this session; when it has not run (its check was
    run alone), run ``fuzz`` first, which must take less than ``seconds`` of this process's CPU time (not
    the wall clock: other jobs on a shared machine do not make it fail)."""
    if counts[key] == 0:
        started = time.process_time()
        fuzz()
        assert time.process_time() - started < seconds
    return counts[key]


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
