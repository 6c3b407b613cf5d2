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
import math
from collections.abc import Sequence
from typing import Optional

from oomsight.wire.schema import DeviceSnapshot, StepTrend

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
CLEAN_T_STAT = 4.0
"""A floor that rose at almost every row must also fit a rising line this many standard errors
above zero: noise alone rises at 4 of 5 rows now and then, never along a line."""
FEW_ROWS_T_STAT = 48.0
"""Added to both thresholds over the rows' degrees of freedom: 16 for 6 rows, 8.8 for 12, 5.2 for 42."""
NOISY_T_STAT = 6.0
"""A floor that does not rise at almost every row (what the loop keeps across the boundary varies
with the input; a leak that grows every few steps) is a leak only when its fitted slope is this
many standard errors above zero and its lower envelope rises through each third of the rows."""
WINDOWS = (12, 24, 48, 96)
"""Recent windows judged besides the whole series: a leak that starts late, or grows in stairs."""
SHORT_MIN_ROWS = 3
SHORT_MIN_GROWTH_SHARE = 0.05
"""At an OOM a short series (an OOM within a few steps) is a leak when the floor rose at every row
by a steady amount, by at least this share of capacity in all, with a flat transient."""


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


def verdict(t: Trend) -> StepTrend:
    """What a snapshot carries of ``t`` (its ``step_trend``): the numbers the sidecar exports.
    A number past float range (rows no hook writes) is 0, a forecast without one is null."""
    return StepTrend(
        points=t.points,
        leak=t.leak,
        floor_slope_bytes=_finite(t.floor_slope) or 0.0,
        floor_growth_bytes=int(_finite(t.floor_growth_bytes) or 0),
        steps_to_oom=_finite(t.steps_to_oom),
        seconds_to_oom=_finite(t.seconds_to_oom),
    )


def device_verdict(d: DeviceSnapshot) -> Optional[StepTrend]:
    """The verdict on a snapshot device's step rows: the hook's own (wire 1.5), or, for an older
    writer, its rows judged here; None when it has no step rows."""
    judged = d.get("step_trend")
    if judged is not None:
        return judged
    rows = d.get("steps_memory")
    if not rows:
        return None
    return verdict(analyse(rows, int(d.get("limit_bytes") or d.get("total_bytes") or 0) or 1))


def _finite(x: Optional[float]) -> Optional[float]:
    return float(x) if x is not None and math.isfinite(x) else None


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
    growth, judged = _leak(usable, capacity_bytes)
    leak = growth is not None
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
        floor_growth_bytes=int(growth if growth is not None else judged[-1][FLOOR] - judged[0][FLOOR]),
        max_peak_bytes=max_peak,
        last_floor_bytes=int(last[FLOOR]),
        last_peak_bytes=int(last[PEAK]),
        seconds_per_step=per_step,
        steps_to_oom=steps,
        seconds_to_oom=steps * per_step if steps is not None and per_step is not None else None,
    )


def _leak(rows: Sequence[Sequence[float]], capacity: int) -> tuple[Optional[float], Sequence[Sequence[float]]]:
    """(the floor's growth, the rows judged) where the floor rose with a flat transient: over the
    whole series (the fullest evidence), or over a recent window (a leak that started late)."""
    windows = [rows] + [rows[-n:] for n in WINDOWS if n < len(rows)]
    for judged in windows:
        growth = _leak_growth(judged, capacity) if len(judged) >= MIN_POINTS else None
        if growth is not None:
            return growth, judged
    return None, rows[-RECENT_POINTS:]


def _leak_growth(rows: Sequence[Sequence[float]], capacity: int) -> Optional[float]:
    """The floor's growth over ``rows`` if they show a leak, else None."""
    floors = [r[FLOOR] for r in rows]
    # few rows fit a line by chance more often (Student's t has heavy tails at few degrees of freedom)
    t = _t_stat([r[STEP] for r in rows], floors) - FEW_ROWS_T_STAT / max(len(rows) - 2, 1)
    if _rise_share(floors) >= RISE_SHARE and t >= CLEAN_T_STAT:
        growth = floors[-1] - floors[0]
    elif _envelope_rises(floors) and t >= NOISY_T_STAT:
        third = len(floors) // 3
        growth = min(floors[-third:]) - min(floors[:third])
    else:
        return None
    if growth <= 0 or growth < min(MIN_GROWTH_BYTES, MIN_GROWTH_SHARE * capacity):
        return None
    return growth if _transient_flat(rows, growth) else None


def _transient_flat(rows: Sequence[Sequence[float]], growth: float) -> bool:
    """The step's own working memory (peak - floor) grew by less than half the floor's growth."""
    transients = [r[PEAK] - r[FLOOR] for r in rows]
    third = max(len(rows) // 3, 1)
    return _mean(transients[-third:]) - _mean(transients[:third]) < TRANSIENT_SHARE * growth


def _envelope_rises(values: Sequence[float]) -> bool:
    """The minimum of each third of ``values`` is above the one before: even the lowest rise."""
    third = len(values) // 3
    if third < 2:
        return False
    lows = [min(values[:third]), min(values[third:-third]), min(values[-third:])]
    return lows[0] < lows[1] < lows[2]


def leak_before_oom(rows: Sequence[Sequence[float]], capacity_bytes: int) -> Optional[int]:
    """At an OOM that came within a few steps (too few rows for :func:`analyse`): the floor's growth
    when it rose at every row since the first step by a steady amount, at least
    ``SHORT_MIN_GROWTH_SHARE`` of capacity, with a flat transient (else None)."""
    try:
        usable = [r for r in rows if len(r) >= 5 and r[STEP] > 1][-MIN_POINTS:]
        if len(usable) < SHORT_MIN_ROWS:
            return None
        floors = [float(r[FLOOR]) for r in usable]
        rises = [b - a for a, b in zip(floors, floors[1:])]
        growth = floors[-1] - floors[0]
        steady = min(rises) > 0 and min(rises) >= 0.3 * max(rises)
        if not steady or growth < SHORT_MIN_GROWTH_SHARE * capacity_bytes or not _transient_flat(usable, growth):
            return None
        return int(growth)
    except (ArithmeticError, TypeError, ValueError):
        return None


PILE_MIN_SAMPLES = 8
PILE_MIN_SECONDS = 3.0
"""Sampled memory that piles up across forwards: at least this many readings over at least this long
in a process that never stepped an optimizer (nothing tells one long forward from many)..."""
PILE_STEP_TIMES = 3.0
PILE_AFTER_STEPS_MIN_SECONDS = 1.0
"""...and after optimizer steps, over at least this many step times and this many seconds: a forward
of the model takes less than a step, so memory that keeps rising for longer spans many forwards."""


def piled_up(
    samples: Sequence[Sequence[float]],
    since: Optional[float],
    capacity_bytes: int,
    min_seconds: float = PILE_MIN_SECONDS,
    falls: bool = True,
) -> Optional[int]:
    """Memory that piled up while no optimizer step came (evaluation, inference, generation):
    ``samples`` are the sampler's ``[time, allocated_bytes]`` readings, ``since`` the time of the
    last optimizer step (None: none ever). Within one forward memory rises for a fraction of a
    second; across many forwards that keep something each, even the lowest reading of each
    quarter of the readings rises, for seconds. Without any step the readings must also fall back
    again and again (forwards freeing their temporaries): loading a model only rises (``falls``
    False: the caller knows no model is loading). The readings may begin before the pile did (a
    model still loading, an idle process): the readings since a quarter, a half and three quarters
    of the way in are judged as well, each under the same bars. Returns the rise, or None."""
    try:
        points = [(float(t), float(a)) for t, a, *_ in samples if since is None or t > since]
    except (TypeError, ValueError):
        return None
    for start in (0, len(points) // 4, len(points) // 2, 3 * len(points) // 4):
        found = _pile(points[start:], falls and since is None, capacity_bytes, min_seconds)
        if found is not None:
            return found
    return None


def _pile(
    points: Sequence[tuple[float, float]], never_stepped: bool, capacity_bytes: int, min_seconds: float
) -> Optional[int]:
    try:
        if len(points) < PILE_MIN_SAMPLES or points[-1][0] - points[0][0] < min_seconds:
            return None
        if never_stepped and not _falls_back(points):
            return None
        quarter = len(points) // 4
        lows = [min(a for _t, a in points[i * quarter : (i + 1) * quarter]) for i in range(3)]
        lows.append(min(a for _t, a in points[3 * quarter :]))
        growth = lows[-1] - lows[0]
        rising = all(b > a for a, b in zip(lows, lows[1:]))
        if not rising or growth < min(MIN_GROWTH_BYTES, MIN_GROWTH_SHARE * capacity_bytes):
            return None
        return int(growth)
    except (ArithmeticError, TypeError, ValueError):
        return None


FORWARDS_CHURN = 2.0
"""Forwards ran before the failing one when the bytes allocated in the 3 s before it add up to at
least twice the lifetime peak: memory was allocated and freed again and again (a model loading
allocates its weights once)."""


def forwards_peak(samples: Sequence[Sequence[float]], now: float, quiet: float = 1.0) -> Optional[float]:
    """The most memory the forwards before the failing one needed, in a process that never stepped:
    the readings up to ``quiet`` s before the OOM (the failing forward's own rise left out), over at
    least ``PILE_MIN_SECONDS``. Readings of wire 1.5 carry the allocator's lifetime peak and its
    bytes ever allocated: the peak then is exact, and forwards ran when the bytes allocated over the
    last 3 s reach ``FORWARDS_CHURN`` times it. Older readings (time, allocated) give their highest
    value, a lower bound, when they fell back at least three times. None when no loop of forwards
    shows."""
    try:
        points = [[float(x) for x in r] for r in samples if float(r[0]) <= now - quiet]
        if len(points) < PILE_MIN_SAMPLES or points[-1][0] - points[0][0] < PILE_MIN_SECONDS:
            return None
        last = points[-1]
        if len(last) >= 4:
            start = next(p for p in points if p[0] >= last[0] - PILE_MIN_SECONDS)
            churn = last[3] - start[3] if len(start) >= 4 else 0.0
            return last[2] if last[2] > 0 and churn >= FORWARDS_CHURN * last[2] else None
        pairs = [(p[0], p[1]) for p in points]
        return max(a for _t, a in pairs) if _falls_back(pairs) else None
    except (ArithmeticError, TypeError, ValueError, IndexError, StopIteration):
        return None


def _falls_back(points: Sequence[tuple[float, float]]) -> bool:
    """Readings that fall by at least 1 % of their whole rise, at least once in each half."""
    values = [a for _t, a in points]
    least = 0.01 * (max(values) - min(values))
    half = len(values) // 2
    falls = [i for i in range(1, len(values)) if values[i - 1] - values[i] > least]
    return any(i < half for i in falls) and any(i >= half for i in falls) and len(falls) >= 3


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


def _fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float, float]:
    """Least squares of ``ys`` on ``xs``: (slope, mean x, mean y, sum of squared x deviations)."""
    mx, my = _mean(xs), _mean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    return slope, mx, my, var


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    return _fit(xs, ys)[0] if len(xs) >= 2 else 0.0


def _t_stat(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of ``ys`` on ``xs`` over its standard error (inf for an exact line)."""
    if len(xs) < 3:
        return 0.0
    slope, mx, my, var = _fit(xs, ys)
    if not var:
        return 0.0
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys)) / (len(xs) - 2)
    if residual <= 0:
        return float("inf") if slope > 0 else 0.0
    return float(slope / (residual / var) ** 0.5)


def _seconds_per_step(rows: Sequence[Sequence[float]]) -> Optional[float]:
    if len(rows) < 2 or rows[-1][STEP] <= rows[0][STEP]:
        return None
    return (rows[-1][TIME] - rows[0][TIME]) / (rows[-1][STEP] - rows[0][STEP])
