"""Asking every process of a pod for a profiling window (the admin endpoint and
``oomsight profile`` both use this): plan a start step all ranks can reach, refuse
politely while another window is pending or running."""

from __future__ import annotations

import dataclasses
import math
import secrets
import time
from typing import Any, Optional

from oomsight.analysis.inventory import ProcessView, take_inventory
from oomsight.wire.requests import MAX_STEPS, pending_requests, write_request
from oomsight.wire.spool import SpoolReader, SpoolState

PENDING_SECONDS = 120.0
"""A request nobody has answered within this time no longer blocks a new one."""


@dataclasses.dataclass(frozen=True)
class Submission:
    accepted: bool
    status: int  # HTTP-like: 202 accepted, 400 bad steps, 409 busy or nothing to profile
    body: dict[str, Any]


def submit(spool_dir: str, steps: int, now: Optional[float] = None, cuda_time: bool = True) -> Submission:
    """Ask every live process for a window of ``steps`` steps; ``cuda_time=False``: memory-only."""
    now = time.time() if now is None else now
    if not 1 <= steps <= MAX_STEPS:
        return Submission(False, 400, {"error": f"steps must be between 1 and {MAX_STEPS}"})
    state = SpoolReader(spool_dir).read()
    inv = take_inventory(state, now)
    live = [v for v in inv.processes if v.up]
    if not live:
        return Submission(False, 409, {"error": "no live training process in this spool to profile"})
    able = [v for v in live if v.snapshot["sources"].get("profiler", True)]
    if not able:
        return Submission(
            False,
            409,
            {
                "error": 'no live process can be profiled (oomsight_source_up{source="profiler"} is 0): '
                "the step hook is off, or TEARDOWN_CUPTI=1 is set (docs/benchmarks.md, profiling)"
            },
        )
    busy = _busy(state, live, now)
    if busy:
        return Submission(False, 409, {"error": f"a profile is already pending or running ({busy}); try again later"})
    counts = [v.snapshot["steps"]["count"] for v in live]
    step_seconds = [v.snapshot["steps"].get("last_duration_seconds") or 0.0 for v in live]
    rid = f"{int(now)}-{secrets.token_hex(3)}"
    ages = [max(0.0, now - v.snapshot["time"]) for v in live]
    start = plan_start_step(counts, step_seconds, ages)
    write_request(spool_dir, rid, steps, start, cuda_time)
    body = {"id": rid, "steps": steps, "start_step": start, "processes": len(able), "cuda_time": cuda_time}
    return Submission(True, 202, body)


def _busy(state: SpoolState, live: list[ProcessView], now: float) -> Optional[str]:
    for v in live:
        if v.snapshot.get("profiling"):
            return str(v.snapshot["profiling"])
    done = {p["request_id"] for p in state.profiles}
    for req in pending_requests(state.root, now - PENDING_SECONDS, set()):
        if req.id not in done:
            return req.id
    return None


def plan_start_step(
    step_counts: list[int], step_seconds: list[float], ages: Optional[list[float]] = None, lead_seconds: float = 2.0
) -> int:
    """The step after which every rank starts profiling.

    Each rank's count is read from its last snapshot, ``ages`` seconds old (up to a publish
    interval): it is projected to now at that rank's step time. The start is then
    ``lead_seconds`` of the *fastest* rank's steps ahead of the furthest projected count,
    so that the request reaches every process (they poll once per publish) before the
    fastest one gets there; slower ranks just take longer to reach the same step.
    """
    if not step_counts:
        return 0
    n = len(step_counts)
    seconds = [*step_seconds, *[0.0] * (n - len(step_seconds))]
    old = [*(ages or []), *[0.0] * (n - len(ages or []))]
    projected = [c + (a / s if s > 0 else 0.0) for c, s, a in zip(step_counts, seconds, old)]
    fastest = min((s for s in seconds if s > 0), default=0.0)
    lead = max(3, math.ceil(lead_seconds / fastest)) if fastest else 3
    return int(max(projected)) + lead
