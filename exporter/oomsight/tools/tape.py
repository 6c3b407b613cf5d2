"""Spool tapes: a recording of every document a real run wrote to its spool, with
timing, that can be replayed into a fresh spool later (the demo on machines without
a GPU, and the test fixtures recorded on the H200).

Format: gzip'd JSON lines. The first line is the header
``{"tape": "oomsight-spool-tape", "version": 1, "start": <unix time>, "meta": {...}}``;
every other line is ``{"t": <seconds since start>, "path": "snapshots/<id>.json", "doc": {...}}``.
"""

from __future__ import annotations

import gzip
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any, BinaryIO, Callable, Optional, Union

from oomsight.wire import decoding
from oomsight.wire.spool import EVENTS, MAX_FILE_BYTES, SNAPSHOTS, SUBDIRS, SpoolWriter, timeline_row, write_atomic

TAPE_MAGIC = "oomsight-spool-tape"
TAPE_VERSION = 1
_TIME_KEYS = ("time", "started_at", "last_step_time", "outcome_time", "measured_at")


class TapeError(ValueError):
    """The file is not a spool tape this version can read."""


def record(
    spool_dir: str,
    tape_path: Union[str, BinaryIO],
    stop: threading.Event,
    interval: float = 0.05,
    meta: Optional[dict[str, Any]] = None,
) -> int:
    """Poll the spool until ``stop`` is set (then once more); return the records written. ``tape_path``
    may be a file already open for binary writing (``oomsight run`` opens it before its command starts,
    so a tape that cannot be written is said at once); a write that fails raises ``OSError``."""
    seen: dict[str, tuple[int, int]] = {}
    start = time.time()
    count = 0
    with gzip.open(tape_path, "wt", encoding="utf-8") as out:
        out.write(json.dumps({"tape": TAPE_MAGIC, "version": TAPE_VERSION, "start": start, "meta": meta or {}}) + "\n")
        while True:
            final = stop.is_set()
            for rel, doc in _changed(spool_dir, seen):
                out.write(json.dumps({"t": round(time.time() - start, 4), "path": rel, "doc": doc}) + "\n")
                count += 1
            if final:
                return count
            stop.wait(interval)


def _changed(spool_dir: str, seen: dict[str, tuple[int, int]]) -> Iterator[tuple[str, Any]]:
    for sub in (SNAPSHOTS, EVENTS):
        folder = os.path.join(spool_dir, sub)
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            if name.startswith(".") or not name.endswith(".json"):
                continue
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
                if seen.get(path) == (st.st_mtime_ns, st.st_size):
                    continue
                # the spool is every container's: a FIFO, device or symlink in it must not hang or
                # mislead the recorder (O_NOFOLLOW | O_NONBLOCK, type checked on the descriptor)
                raw, st = decoding.read_file(path, MAX_FILE_BYTES)
                doc = decoding.decode(raw)
            except (OSError, decoding.Unusable):
                continue
            seen[path] = (st.st_mtime_ns, st.st_size)
            yield f"{sub}/{name}", doc


def read(tape_path: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, records) of a tape; raises :class:`TapeError` on anything else."""
    try:
        with gzip.open(tape_path, "rt", encoding="utf-8") as fh:
            lines = [json.loads(line) for line in fh if line.strip()]
    except (OSError, ValueError, EOFError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc  # no "[Errno N]"
        raise TapeError(f"{tape_path}: not a readable tape ({reason})") from exc
    if not lines or not isinstance(lines[0], dict) or lines[0].get("tape") != TAPE_MAGIC:
        raise TapeError(f"{tape_path}: no oomsight tape header")
    if lines[0].get("version") != TAPE_VERSION:
        raise TapeError(f"{tape_path}: tape version {lines[0].get('version')} is not {TAPE_VERSION}")
    return lines[0], lines[1:]


REPLAY_NOTE = "oomsight-replay.txt"
"""The file at a replayed spool's top that says so: ``oomsight report`` and its HTML page show its line."""


def replayed(spool_dir: str) -> Optional[str]:
    """The line that says ``spool_dir`` was written by a replay, and at which speed; None for a live run's."""
    try:
        with open(os.path.join(spool_dir, REPLAY_NOTE), encoding="utf-8") as fh:
            return fh.read().strip() or None
    except (OSError, ValueError):
        return None


def replay_line(tape_path: str, speed: float) -> str:
    """What a replay writes into ``REPLAY_NOTE``: the tape, and what the replay did to time."""
    said = "timestamps moved to the replay's start, time not rescaled" if speed == 1.0 else replay_note(speed)
    return f"REPLAY of the tape {os.path.basename(tape_path)}, not a live run: {said}"


def replay_note(speed: float) -> str:
    """What a replay at ``speed`` changes, in words: timestamps, not what the hook measured."""
    return (
        f"a replay at speed {speed:g} rescales time: the spool's timestamps are the tape's divided by {speed:g}, so "
        f"charts over time are {speed:g} times shorter than the run; step times, step counts and bytes are as recorded"
    )


def replay(
    tape_path: str,
    spool_dir: str,
    speed: float = 1.0,
    on_record: Optional[Callable[[dict[str, Any]], None]] = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Write the tape's documents into ``spool_dir`` with their original pacing divided by
    ``speed``. Times inside the documents are moved so the run looks as if it started now."""
    header, records = read(tape_path)
    for sub in SUBDIRS:
        os.makedirs(os.path.join(spool_dir, sub), exist_ok=True)
    label = replay_line(tape_path, speed) + "\n"
    write_atomic(os.path.join(spool_dir, REPLAY_NOTE), label.encode(), durable=False)
    t0 = clock()
    origin = float(header["start"])
    for rec in records:
        due = t0 + float(rec["t"]) / speed
        delay = due - clock()
        if delay > 0:
            sleep(delay)
        rel = str(rec["path"])
        if ".." in rel.split("/") or rel.split("/")[0] not in (SNAPSHOTS, EVENTS):
            raise TapeError(f"{tape_path}: refusing to write outside the spool: {rel!r}")
        doc = _retime(rec["doc"], lambda t: t0 + (t - origin) / speed)
        write_atomic(os.path.join(spool_dir, rel), json.dumps(doc).encode(), durable=rel.startswith(EVENTS))
        if rel.startswith(SNAPSHOTS) and isinstance(doc.get("process"), dict):
            # the hook appends a timeline row with every snapshot; so does the replay
            SpoolWriter(spool_dir, str(doc["process"].get("id"))).append_timeline(timeline_row(doc))
        if on_record is not None:
            on_record(rec)
    return len(records)


def _retime(doc: Any, move: Callable[[float], float]) -> Any:
    """Shift every known timestamp field (and trend rows) with ``move``."""
    if isinstance(doc, dict):
        out: dict[str, Any] = {}
        for key, value in doc.items():
            if key in _TIME_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool):
                out[key] = move(float(value))
            elif key == "trend" and isinstance(value, list):
                out[key] = [[move(row[0]), *row[1:]] if row else row for row in value]
            else:
                out[key] = _retime(value, move)
        return out
    if isinstance(doc, list):
        return [_retime(v, move) for v in doc]
    return doc
