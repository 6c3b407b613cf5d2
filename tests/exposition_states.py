"""Spool states and exposition formats of the regression fixtures (issue 25): the text ``/metrics``
served for each, recorded once from the tree before the plain collector (918675c) and compared byte for
byte by ``test_exposition.py``.

    PYTHONPATH=exporter:sidecar:tests .venv/bin/python tests/exposition_states.py --record

States (all on one collector per spool, as a long-lived sidecar sees them, with a fixed clock):
every record of the shipped demo tape and of every corpus tape, then the spool once its processes
went stale and once past retention; the benchmark spool (``benchmarks/bench_reader_scale.py``) with
1 and 8 ranks of this hook's and of an older writer's snapshot over three publishes; hostile-made
spools whose OOM events go pending, fatal and recovered, whose processes go stale, come back and
leave. Formats: every Accept header prometheus_client's ``choose_encoder`` tells apart.
"""

from __future__ import annotations

import functools
import glob
import gzip
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.exposition import choose_encoder

from oomsight.metrics.collector import SpoolCollector
from oomsight.tools import tape
from oomsight.tools.demo import TAPE

from hostile import NOW, event, event_path, put, snapshot, snapshot_path

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "fixtures", "exposition", "states.json.gz")
CORPUS = sorted(glob.glob(os.path.join(HERE, "fixtures", "corpus", "*.tape.jsonl.gz")))
ESCAPINGS = ("allow-utf-8", "underscores", "dots", "values")
ACCEPT = (
    "",
    *(f"text/plain; version=1.0.0; escaping={e}" for e in ESCAPINGS),
    "application/openmetrics-text",
    *(f"application/openmetrics-text; version=1.0.0; escaping={e}" for e in ESCAPINGS),
    "application/openmetrics-text; version=2.0.0; escaping=allow-utf-8",
)
"""Accept headers: text 0.0.4, text 1.0.0 and OpenMetrics 1.0.0 in every escaping, OpenMetrics 2.0.0."""

_BUILD = re.compile(rb"^((?:U__)?oomsight_+build_+info\{[^\n]*)$", re.M)
_VERSION = re.compile(rb'(python_version|version)="[^"]*"')

Render = Callable[[SpoolCollector, str], bytes]
"""What serves ``/metrics`` for a collector and an Accept header."""


def served(collector: SpoolCollector, accept: str) -> bytes:
    """The sidecar's answer to ``accept`` (its body before gzip)."""
    encoder, content_type = choose_encoder(accept)
    return collector.exposition(encoder, content_type)


def normal(text: bytes) -> bytes:
    """``text`` with the build info's versions blanked, in every escaping: oomsight's and Python's differ
    between machines (idempotent: the recorded texts are compared through it too)."""
    return _BUILD.sub(lambda m: _VERSION.sub(rb'\1=""', m.group(1)), text)


def states() -> Iterator[tuple[str, Callable[[Render], dict[str, bytes]]]]:
    """(name, run): ``run(render)`` builds the named spool step by step and gives the text of every
    state (``name/step`` -> text of each format, keyed ``step|accept``)."""
    for path in (TAPE, *CORPUS):
        yield os.path.basename(path).split(".")[0], lambda render, path=path: _tape(path, render)
    for n in (1, 8):
        for older in (False, True):
            yield f"bench-{n}-ranks{'-older' if older else ''}", lambda r, n=n, older=older: _bench(n, older, r)
    yield "hostile-lifecycle", _lifecycle


def _texts(collector: SpoolCollector, step: str, render: Render, out: dict[str, bytes]) -> None:
    for accept in ACCEPT:
        out[f"{step}|{accept}"] = normal(render(collector, accept))


def _tape(path: str, render: Render) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as spool:
        clock = [NOW]
        collector = SpoolCollector(spool, clock=lambda: clock[0])
        seen = [0]

        def after(rec: dict[str, Any]) -> None:
            seen[0] += 1
            clock[0] = NOW + float(rec["t"]) + 0.5
            _texts(collector, str(seen[0]), render, out)

        tape.replay(path, spool, speed=1.0, clock=lambda: NOW, sleep=lambda _s: None, on_record=after)
        clock[0] += 31.0  # stale
        _texts(collector, "stale", render, out)
        clock[0] += 400.0  # past retention
        _texts(collector, "retained", render, out)
    return out


def _bench(n: int, older: bool, render: Render) -> dict[str, bytes]:
    sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))
    try:
        from bench_reader_scale import move, reference_snapshot
    finally:
        sys.path.pop(0)
    doc = reference_snapshot(older)
    out: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as spool:
        collector = SpoolCollector(spool, stale_after_seconds=3600, clock=lambda: NOW + 10)
        for seq in range(3):
            for i in range(n):
                doc["process"].update(id=f"{i}-aa", rank=i, local_rank=i % 8)
                doc.update(time=NOW + seq, seq=seq)
                move(doc, seq, i)
                put(spool, f"snapshots/{i}-aa.json", doc)
            _texts(collector, str(seq), render, out)
    return out


def _lifecycle(render: Render) -> dict[str, bytes]:
    """Two ranks; OOMs pending, fatal and recovered; a rank stale then back; both leave."""
    out: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as spool:
        clock = [NOW]
        collector = SpoolCollector(spool, clock=lambda: clock[0])
        steps: list[tuple[str, Callable[[], None]]] = [
            ("two", lambda: [put(spool, snapshot_path(p), snapshot(pid=p, rank=p - 1)) for p in (1, 2)]),
            ("pending", lambda: put(spool, event_path(1, 1), event(pid=1, rank=0))),
            ("recovered", lambda: put(spool, event_path(1, 1), event(pid=1, rank=0, outcome="recovered"))),
            ("second", lambda: put(spool, event_path(2, 1), event(pid=2, rank=1, t=NOW + 1))),
            ("stale", lambda: clock.__setitem__(0, NOW + 40)),
            ("back", lambda: put(spool, snapshot_path(2), snapshot(pid=2, rank=1, t=NOW + 40))),
            ("fatal", lambda: put(spool, event_path(2, 1), event(pid=2, rank=1, t=NOW + 1, outcome="fatal"))),
            ("exited", lambda: put(spool, snapshot_path(1), {**snapshot(pid=1, rank=0, t=NOW + 41), **_EXITED})),
            ("gone", lambda: [os.remove(os.path.join(spool, snapshot_path(p))) for p in (1, 2)]),
            ("retained", lambda: clock.__setitem__(0, NOW + 500)),
        ]
        for name, step in steps:
            step()
            _texts(collector, name, render, out)
    return out


_EXITED = {"state": "exited", "exit_reason": "normal"}


def record(path: str = FIXTURE) -> dict[str, int]:
    """Write every state's text, identical texts kept once: {"texts": [...], "states": {name: {key: i}}}."""
    texts: list[str] = []
    index: dict[bytes, int] = {}
    table: dict[str, dict[str, int]] = {}
    for name, run in states():
        table[name] = {key: index.setdefault(text, len(index)) for key, text in run(served).items()}
    texts = [t.decode() for t in sorted(index, key=index.__getitem__)]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.open(path, "wt", compresslevel=9) as fh:
        json.dump({"texts": texts, "states": table}, fh, sort_keys=True)
    return {"states": sum(len(v) for v in table.values()), "texts": len(texts)}


@functools.cache
def recorded(path: str = FIXTURE) -> dict[str, Any]:
    with gzip.open(path, "rt") as fh:
        found: dict[str, Any] = json.load(fh)
    return found


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: exposition_states.py --record")
    print(record())
