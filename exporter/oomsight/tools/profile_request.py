"""``oomsight profile``: ask every live process of a spool for a profiling window, wait
for the answers if told to, and print them.

Prose on stdout by default; with ``--json`` stdout carries only JSON lines (the request,
then one profile document per process). Errors and the progress line always go to
stderr. Exit codes: ``docs/cli.md``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable, TextIO

from oomsight.analysis.profile_plan import submit
from oomsight.analysis.units import format_bytes
from oomsight.tools.exitcode import REFUSED, TIMED_OUT, USAGE
from oomsight.tools.progress import Progress
from oomsight.wire.schema import Profile
from oomsight.wire.spool import SpoolReader

POLL_SECONDS = 0.2


@dataclasses.dataclass(frozen=True)
class ProfileCommand:
    spool: str
    steps: int = 5
    wait_seconds: float = 0.0
    memory_only: bool = False
    json: bool = False


def run(
    cmd: ProfileCommand,
    out: TextIO,
    err: TextIO,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    if not os.path.isdir(cmd.spool):
        err.write(f"oomsight profile: {cmd.spool}: no such spool folder (oomsight run prints the one it uses)\n")
        return USAGE
    result = submit(cmd.spool, cmd.steps, cuda_time=not cmd.memory_only)
    if not result.accepted:  # an error is one line on stderr, with --json too (docs/cli.md)
        err.write(f"oomsight profile: {result.body['error']}\n")
        return REFUSED if result.status != 400 else USAGE
    body = result.body
    out.write(json.dumps(body) + "\n" if cmd.json else _accepted(body, cmd.wait_seconds))
    if not cmd.wait_seconds:
        return 0
    done = _wait(cmd, str(body["id"]), int(body["processes"]), Progress(err, clock=clock), (clock, sleep))
    for p in sorted(done, key=lambda d: d["process"]["rank"]):
        out.write(json.dumps(p) + "\n" if cmd.json else _prose(p))
    if len(done) < int(body["processes"]):
        err.write(
            f"oomsight profile: {len(done)} of {body['processes']} processes answered within "
            f"{cmd.wait_seconds:g} s; later answers land in {os.path.join(cmd.spool, 'profiles')}\n"
        )
        return TIMED_OUT
    return 0


def _accepted(body: dict[str, Any], wait_seconds: float) -> str:
    what = "CUDA time and memory" if body.get("cuda_time", True) else "memory only"
    first, last = body["start_step"] + 1, body["start_step"] + body["steps"]
    then = f"; waiting up to {wait_seconds:g} s" if wait_seconds else "; results land in the spool's profiles/"
    return (
        f"asked {body['processes']} process(es) to profile optimizer steps {first}-{last} ({what}), "
        f"request {body['id']}{then}\n"
    )


def _wait(
    cmd: ProfileCommand,
    rid: str,
    expected: int,
    progress: Progress,
    time_fns: tuple[Callable[[], float], Callable[[float], None]],
) -> list[Profile]:
    clock, sleep = time_fns
    reader = SpoolReader(cmd.spool)
    start = clock()
    done: list[Profile] = []
    while True:
        done = [p for p in reader.read().profiles if p["request_id"] == rid]
        left = cmd.wait_seconds - (clock() - start)
        if len(done) >= expected or left <= 0:
            break
        progress.update(f"waiting for profiles: {len(done)}/{expected} processes done, {left:.0f} s left")
        sleep(POLL_SECONDS)
    progress.done()
    return done


def _prose(p: Profile) -> str:
    first, last = p["start_step"] + 1, p["start_step"] + p["steps"]
    lines = [
        f"rank {p['process']['rank']}: steps {first}-{last}, peak allocated {format_bytes(p['peak_allocated_bytes'])}; "
        "top operators by self CUDA memory:"
    ]
    for op in p["top_by_memory"][:5]:
        lines.append(f"  {op['op']:40s} {format_bytes(op['self_cuda_memory_bytes']):>12s}  {op['calls']:>6d} calls")
    tables = [a for a in (p.get("table_artifact"), p.get("trace_artifact")) if a]
    lines.extend(f"  artifact: {name}" for name in tables)
    return "\n".join(lines) + "\n"
