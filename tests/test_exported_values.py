"""What a hostile tenant can make /metrics serve (issue 44): no counter below 0 or not finite, no gauge
that is not finite but the forecasts' documented +Inf, no label value over ``LABEL_MAX_CHARS``. Every
number and string of the tape's snapshot, OOM event and profile is set in turn to what a hostile writer
would put there; the exposition is parsed back with prometheus_client's own parser. The bounds live in
the field table (``oomsight.wire.fields``: ``counter=True``, ``label=True``) and are checked where a
document is read, so a document that breaks one is refused whole and counted as ``invalid``."""

from __future__ import annotations

import copy
import logging
import math
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_budget import profile

from oomsight.metrics.collector import SpoolCollector
from oomsight.wire.fieldtypes import LABEL_MAX_CHARS
from oomsight.wire.reader import Budget
from oomsight.wire.schema import SchemaError, validate
from oomsight.wire.spool import SpoolReader

from hostile import NOW, event, event_path, paths_of, put, snapshot, snapshot_path

FORECASTS = ("oomsight_oom_forecast_steps", "oomsight_oom_forecast_seconds", "oomsight_oom_forecast_earliest_seconds")
"""The gauges whose +Inf means "no OOM in sight" (docs/metrics.md); made by the reader, never read from a file."""
HOSTILE_NUMBERS = (-5, float("nan"), float("inf"), float("-inf"))
LONG = "x" * 65536


def base_docs(i: int = 0) -> dict[str, dict[str, Any]]:
    """The documents of rank ``i``: a snapshot with a swallowed error (so the map of errors has a key and a
    value to change), an OOM event and a profile."""
    snap = snapshot(pid=i + 1, rank=i, t=NOW)
    snap["errors"] = {"sampler": 2}
    prof = profile(i + 1, i, 1)
    prof["process"] = copy.deepcopy(snap["process"])
    return {
        snapshot_path(i + 1): snap,
        event_path(i + 1, 1): event(pid=i + 1, rank=i, t=NOW),
        f"profiles/{i + 1}-aa.profile-r1.json": prof,
    }


ROOMY = Budget(ranks_per_spool=1024, snapshot_memory_bytes=1 << 30, series_per_scrape=10**6, metrics_bytes=1 << 30)
"""Every case of a test is a rank of one spool, so one scrape checks them all: no budget may leave one out."""


def scrape(spool: str) -> str:
    registry = CollectorRegistry()
    reader = SpoolReader(spool, budget=ROOMY)
    registry.register(SpoolCollector(spool, clock=lambda: NOW, stale_after_seconds=3600, reader=reader))
    return generate_latest(registry).decode()


def problems(text: str) -> list[str]:
    """Each sample of ``text`` that a counter cannot be, a gauge should not be, or a label too long."""
    found = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            value = float(s.value)
            long = [k for k, v in s.labels.items() if len(v) > LABEL_MAX_CHARS]
            if long:
                found.append(f"{s.name}: label {long[0]} of {len(s.labels[long[0]])} characters")
            if fam.type == "counter" and not (math.isfinite(value) and value >= 0):
                found.append(f"{s.name}{s.labels}: counter {value}")
            elif not math.isfinite(value) and not (fam.name in FORECASTS and value == math.inf):
                found.append(f"{s.name}{s.labels}: {value}")
    return found


def place(doc: Any, prefix: tuple[Any, ...]) -> Any:
    for step in prefix:
        doc = doc[step]
    return doc


def changes(kind: type) -> list[tuple[int, tuple[Any, ...], Any]]:
    """(which of :func:`base_docs`, path to a container, key) of every value of ``kind`` in the base
    documents (booleans aside), in the first item of each list (a snapshot holds hundreds of step rows)."""
    found = []
    for n, doc in enumerate(base_docs().values()):
        for prefix, key in paths_of(doc):
            value = place(doc, prefix)[key]
            first = all(step == 0 for step in (*prefix, key) if type(step) is int)  # one item of each list
            if first and isinstance(value, kind) and not isinstance(value, bool):
                found.append((n, prefix, key))
    return found


def write(spool: str, docs: dict[str, dict[str, Any]]) -> None:
    for rel, doc in docs.items():
        put(spool, rel, doc)


def ranks_served(text: str) -> set[str]:
    families = text_string_to_metric_families(text)
    return {s.labels["rank"] for fam in families for s in fam.samples if s.name == "oomsight_process_up"}


def test_the_base_documents_serve_what_a_counter_and_a_gauge_can_be(tmp_path: Any) -> None:
    write(str(tmp_path), base_docs())
    text = scrape(str(tmp_path))
    assert 'oomsight_hook_errors_total{component="sampler",local_rank="0",rank="0"} 2.0' in text
    assert "oomsight_profile_op_self_cuda_memory_bytes" in text and "oomsight_oom_events_total" in text
    assert problems(text) == []


@pytest.mark.parametrize("bad", HOSTILE_NUMBERS, ids=["minus5", "nan", "inf", "-inf"])
def test_no_number_a_hostile_writer_puts_anywhere_serves_a_bad_counter_or_gauge(
    tmp_path: Any, bad: float, caplog: Any
) -> None:
    """Each number of each document in turn, each case a rank of one spool (the issue's -5 was served as
    -5.0 on 7 ``_total`` series)."""
    caplog.set_level(logging.ERROR, logger="oomsight")  # one refusal line per case otherwise
    cases = changes((int, float))
    assert len(cases) > 60
    for i, (n, prefix, key) in enumerate(cases):
        docs = base_docs(i)
        if (prefix, key) in (((), "schema_version"), (("process",), "rank"), (("process",), "pid")):
            continue  # a case of its own rank: these say whose it is
        place(list(docs.values())[n], prefix)[key] = bad
        write(str(tmp_path), docs)
    text = scrape(str(tmp_path))
    assert problems(text) == []
    assert len(ranks_served(text)) > (len(cases) // 3 if bad == -5 else 0)  # a gauge may be -5


def test_a_counter_below_0_is_refused_whole_and_counted_invalid(tmp_path: Any) -> None:
    docs = base_docs()
    docs[snapshot_path(1)]["devices"][0]["allocator"]["alloc_retries"] = -5
    write(str(tmp_path), docs)
    text = scrape(str(tmp_path))
    assert 'oomsight_spool_skipped_files_total{reason="invalid"} 1.0' in text
    assert "oomsight_process_up{" not in text  # the rank that wrote it is not served at all
    with pytest.raises(SchemaError, match=r"alloc_retries is not int \(a counter: >= 0\)"):
        validate(docs[snapshot_path(1)])


def test_no_string_a_hostile_writer_makes_64_kib_long_serves_a_long_label(tmp_path: Any, caplog: Any) -> None:
    """Each string of each document in turn, and each key of its maps (``sources``, ``errors``), each
    case a rank of one spool: where it would be a label value, its document is refused, counted ``invalid``."""
    caplog.set_level(logging.ERROR, logger="oomsight")
    cases = changes(str) + [(0, (), ("key", name)) for name in ("sources", "errors")]
    for i, (n, prefix, key) in enumerate(cases):
        docs = base_docs(i)
        doc = list(docs.values())[n]
        if isinstance(key, tuple):  # a map's key
            doc[key[1]][LONG] = next(iter(doc[key[1]].values()))
        elif place(doc, prefix)[key] not in ("snapshot", "oom_event", "profile", "running"):  # closed choices
            place(doc, prefix)[key] = LONG
        write(str(tmp_path), docs)
    text = scrape(str(tmp_path))
    assert problems(text) == []
    families = text_string_to_metric_families(text)
    invalid = next(s.value for f in families for s in f.samples if s.labels.get("reason") == "invalid")
    assert invalid >= 12  # uuid x2, name, 4 versions, exit reason, cause, op, sources, errors (and more)


def test_a_label_value_of_the_bound_is_served_whole(tmp_path: Any) -> None:
    docs = base_docs()
    docs[snapshot_path(1)]["devices"][0]["name"] = "n" * LABEL_MAX_CHARS
    write(str(tmp_path), docs)
    text = scrape(str(tmp_path))
    assert f'name="{"n" * LABEL_MAX_CHARS}"' in text and problems(text) == []
    docs[snapshot_path(1)]["devices"][0]["name"] += "n"
    with pytest.raises(SchemaError, match=f"at most {LABEL_MAX_CHARS} characters"):
        validate(docs[snapshot_path(1)])
