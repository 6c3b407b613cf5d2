"""What the step-resolved memory series says: a leak, growing demand, and time to OOM.

The hook records, at optimizer-step boundaries, one row per read::

    [step, time, floor_bytes, peak_bytes, reserved_bytes, exact]

``floor`` is what is allocated right after ``optimizer.step()`` returns: what survives
between steps. ``peak`` is the highest allocation since the previous row (exact when
torch's lifetime peak rose in between, else the sampler's maximum, a lower bound).

The two signals follow from how a training step uses memory. A *leak* keeps something
from every step alive: the floor rises step after step while the step's own working
memory (peak minus floor, the transient) stays the same. *Growing demand* (larger
batches, longer sequences) raises the transient: the peak grows faster than the floor,
which may rise a little too (the current batch's inputs and outputs live across the
boundary). Warm-up (gradients and optimizer state allocated by the first steps) is
skipped. Pure functions, no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Optional

STEP, TIME, FLOOR, PEAK, RESERVED, EXACT = range(6)
ROW_FIELDS = ("step", "time", "floor_bytes", "peak_bytes", "reserved_bytes", "exact")

WARMUP_STEPS = 2
"""Rows of the first steps are skipped: the first ``optimizer.step()`` allocates its state."""
MIN_POINTS = 6
"""A trend needs at least this many rows after warm-up."""
RECENT_POINTS = 12
"""The recent window judged for a leak (a leak that starts late is still seen)."""
RISE_SHARE = 0.8
"""At least this share of consecutive rows must rise for a steady rise."""
MIN_GROWTH_SHARE = 0.02
"""A leak must have grown by at least this share of capacity (or MIN_GROWTH_BYTES)."""
MIN_GROWTH_BYTES = 256 * 1024 * 1024
TRANSIENT_SHARE = 0.5
"""For a leak the transient (peak - floor) grows by less than this share of the floor's growth."""
GROWING_SHARE = 0.6


@dataclasses.dataclass(frozen=True)
class Trend:
    """The verdict on a series of step rows (all bytes, per step)."""

    points: int
    leak: bool
    growing: bool
    floor_slope: float
    """Bytes per optimizer step the floor rose, least squares over the judged rows (0 if unknown)."""
    peak_slope: float
    floor_growth_bytes: int
    """Growth of the floor over the judged rows."""
    max_peak_bytes: int
    """The highest step peak of the series (0 when none)."""
    last_floor_bytes: int
    last_peak_bytes: int
    seconds_per_step: Optional[float]
    steps_to_oom: Optional[float]
    """At the current slope, optimizer steps until the peak reaches capacity; None without a rise."""
    seconds_to_oom: Optional[float]


EMPTY = Trend(0, False, False, 0.0, 0.0, 0, 0, 0, 0, None, None, None)


def analyse(rows: Sequence[Sequence[float]], capacity_bytes: int) -> Trend:
    """Judge the rows (oldest first) against a device of ``capacity_bytes``. Rows no hook could
    have written (numbers past float range, wrong types) judge as no trend, never an error."""
    try:
        return _analyse(rows, capacity_bytes)
    except (ArithmeticError, TypeError, ValueError):
        return EMPTY


def _analyse(rows: Sequence[Sequence[float]], capacity_bytes: int) -> Trend:
    usable = [r for r in rows if len(r) >= 5 and r[STEP] > WARMUP_STEPS]
    if not usable:
        return EMPTY
    max_peak = int(max(r[PEAK] for r in usable))
    last = usable[-1]
    per_step = _seconds_per_step(usable)
    if len(usable) < MIN_POINTS:
        return dataclasses.replace(
            EMPTY,
            points=len(usable),
            max_peak_bytes=max_peak,
            last_floor_bytes=int(last[FLOOR]),
            last_peak_bytes=int(last[PEAK]),
            seconds_per_step=per_step,
        )
    leak, judged = _leak(usable, capacity_bytes)
    floor_slope = _slope([r[STEP] for r in judged], [r[FLOOR] for r in judged])
    recent = usable[-RECENT_POINTS:]
    peak_slope = _slope([r[STEP] for r in recent], [r[PEAK] for r in recent])
    growing = not leak and _growing(recent, capacity_bytes)
    slope = floor_slope if leak else peak_slope if growing else 0.0
    steps = (capacity_bytes - last[PEAK]) / slope if slope > 0 and capacity_bytes > last[PEAK] else None
    if slope > 0 and capacity_bytes <= last[PEAK]:
        steps = 0.0
    return Trend(
        points=len(usable),
        leak=leak,
        growing=growing,
        floor_slope=floor_slope,
        peak_slope=peak_slope,
        floor_growth_bytes=int(judged[-1][FLOOR] - judged[0][FLOOR]),
        max_peak_bytes=max_peak,
        last_floor_bytes=int(last[FLOOR]),
        last_peak_bytes=int(last[PEAK]),
        seconds_per_step=per_step,
        steps_to_oom=steps,
        seconds_to_oom=steps * per_step if steps is not None and per_step is not None else None,
    )


def _leak(rows: Sequence[Sequence[float]], capacity: int) -> tuple[bool, Sequence[Sequence[float]]]:
    """A steady floor rise with a flat transient over the whole series (the fullest evidence), or in
    the recent window (a leak that started late)."""
    recent = rows[-RECENT_POINTS:]
    for judged in (rows, recent):
        if len(judged) >= MIN_POINTS and _is_leak(judged, capacity):
            return True, judged
    return False, recent


def _is_leak(rows: Sequence[Sequence[float]], capacity: int) -> bool:
    floors = [r[FLOOR] for r in rows]
    if _rise_share(floors) < RISE_SHARE:
        return False
    growth = floors[-1] - floors[0]
    if growth < min(MIN_GROWTH_BYTES, MIN_GROWTH_SHARE * capacity) or growth <= 0:
        return False
    transients = [r[PEAK] - r[FLOOR] for r in rows]
    half = max(len(rows) // 3, 1)
    transient_growth = _mean(transients[-half:]) - _mean(transients[:half])
    return transient_growth < TRANSIENT_SHARE * growth


def _growing(rows: Sequence[Sequence[float]], capacity: int) -> bool:
    peaks = [r[PEAK] for r in rows]
    if len(peaks) < MIN_POINTS or _rise_share(peaks) < GROWING_SHARE:
        return False
    return peaks[-1] - peaks[0] >= min(MIN_GROWTH_BYTES, MIN_GROWTH_SHARE * capacity)


def first_leak_step(rows: Sequence[Sequence[float]], capacity_bytes: int) -> Optional[int]:
    """The step of the first row at which :func:`analyse` calls the series a leak (None: never)."""
    for end in range(MIN_POINTS, len(rows) + 1):
        if analyse(rows[:end], capacity_bytes).leak:
            return int(rows[end - 1][STEP])
    return None


def _rise_share(values: Sequence[float]) -> float:
    pairs = list(zip(values, values[1:]))
    return sum(1 for a, b in pairs if b > a) / len(pairs) if pairs else 0.0


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = _mean(xs), _mean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0


def _seconds_per_step(rows: Sequence[Sequence[float]]) -> Optional[float]:
    if len(rows) < 2 or rows[-1][STEP] <= rows[0][STEP]:
        return None
    return (rows[-1][TIME] - rows[0][TIME]) / (rows[-1][STEP] - rows[0][STEP])
