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
import itertools
import math
from collections.abc import Sequence
from typing import Optional

from oomsight.analysis import forecast as fc
from oomsight.analysis import thresholds as th
from oomsight.wire.schema import DeviceSnapshot, StepTrend

STEP, TIME, FLOOR, PEAK, RESERVED, EXACT = range(6)
ROW_FIELDS = ("step", "time", "floor_bytes", "peak_bytes", "reserved_bytes", "exact")

OUTSIDE = 6
"""The 7th column (wire 1.6): NVML's memory of the process minus reserved at that row (-1: unknown)."""
STATES, INPUT = range(OUTSIDE + 1, OUTSIDE + 3)
"""STATES, the 8th column (wire 1.10): the gradients and optimizer state the job's optimizers hold on the device at
that row (-1: unknown), measured again whenever their count of state entries changed: state that appears
when parameters start to train (progressive unfreezing, a param group added, an expert's first tokens).
INPUT, the 9th column (wire 1.10): the most elements one forward of the outermost model took in since the row
before (its first tensor argument: input ids, images; -1: unknown)."""

Point = tuple[float, float, Optional[float]]
"""One point of a series the leak detector judges: (step, floor bytes, the step's own bytes above
the floor, or None where the series does not know them)."""

_LEGACY_NAMES = {"MIN_POINTS": "min_rows", "WARMUP_STEPS": "warmup_steps", "RECENT_POINTS": "recent_rows"}


def __getattr__(name: str) -> int:
    """The counts older callers read as module constants, from the threshold table."""
    if name in _LEGACY_NAMES:
        return th.count(_LEGACY_NAMES[name])
    raise AttributeError(name)


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
    """Optimizer steps until the peak reaches capacity (``analysis.forecast``, central); None without a forecast."""
    seconds_to_oom: Optional[float]
    earliest_seconds_to_oom: Optional[float] = None
    """The earliest plausible time to OOM, from the series' own noise (at most ``seconds_to_oom``)."""
    forecast_kind: str = ""
    """What the forecast is made for (``analysis.forecast.KINDS``); "" without one."""
    no_forecast_reason: str = fc.TOO_SHORT
    """Why there is no forecast (``analysis.forecast.REASONS``); "" with one."""
    demand: Optional[Demand] = None
    """The step's own memory (peak - floor) rose through the rows while the floor did not explain it
    (:func:`demand_rise`); None: it did not."""


@dataclasses.dataclass(frozen=True)
class Demand:
    """How the step's own memory rose through the step rows, and whether its input rose with it."""

    rise_bytes: int
    """The rise of the step's own memory, the median of the last third of the rows over the first's."""
    first_bytes: int
    last_bytes: int
    input_rose: Optional[bool] = None
    """True: the forwards' input grew with it (a batch ramp, a length curriculum); False: the input stayed
    the same (the model's own buffers grew: routing, data-dependent shapes); None: the rows do not say."""
    first_input: int = -1
    last_input: int = -1


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
        earliest_seconds_to_oom=_finite(t.earliest_seconds_to_oom),
        forecast_kind=t.forecast_kind,
        no_forecast_reason=t.no_forecast_reason,
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
    warm = th.count("warmup_steps")
    usable = [r for r in rows if len(r) >= 5 and r[STEP] > warm]
    if not usable:
        return EMPTY
    max_peak = int(max(r[PEAK] for r in usable))
    last = usable[-1]
    per_step = _seconds_per_step(usable)
    if len(usable) < th.count("min_rows"):
        return dataclasses.replace(
            EMPTY,
            points=len(usable),
            max_peak_bytes=max_peak,
            last_floor_bytes=int(last[FLOOR]),
            last_peak_bytes=int(last[PEAK]),
            seconds_per_step=per_step,
            demand=demand_rise(usable, capacity_bytes),
        )
    growth, judged = leak_in(step_series(usable), capacity_bytes)
    leak = growth is not None
    floor_slope = _slope([p[0] for p in judged], [p[1] for p in judged])
    recent = usable[-th.count("recent_rows") :]
    peak_slope = _slope([r[STEP] for r in recent], [r[PEAK] for r in recent])
    growing = not leak and _growing(recent, capacity_bytes)
    demand = None if leak else demand_rise(usable, capacity_bytes)
    ahead = fc.predict(_columns(usable), capacity_bytes, judged[0][0] if leak else None, _detector(capacity_bytes))
    return Trend(
        points=len(usable),
        leak=leak,
        growing=growing,
        floor_slope=floor_slope,
        peak_slope=peak_slope,
        floor_growth_bytes=int(growth if growth is not None else judged[-1][1] - judged[0][1]),
        max_peak_bytes=max_peak,
        last_floor_bytes=int(last[FLOOR]),
        last_peak_bytes=int(last[PEAK]),
        seconds_per_step=per_step,
        steps_to_oom=ahead.steps,
        seconds_to_oom=ahead.seconds,
        earliest_seconds_to_oom=ahead.earliest_seconds,
        forecast_kind=ahead.kind,
        no_forecast_reason=ahead.reason,
        demand=demand,
    )


def _detector(capacity: int) -> fc.Detector:
    """:func:`leak_in` asked of the rows the forecast reads (their floors and peaks)."""
    return lambda c: leak_in([(s, f, p - f) for s, f, p in zip(c.steps, c.floors, c.peaks)], capacity)[0] is not None


def _columns(rows: Sequence[Sequence[float]]) -> fc.Columns:
    """The step rows as the forecast reads them (a row without the exact column counts as exact)."""
    return fc.Columns(
        steps=[float(r[STEP]) for r in rows],
        times=[float(r[TIME]) for r in rows],
        floors=[float(r[FLOOR]) for r in rows],
        peaks=[float(r[PEAK]) for r in rows],
        exact=[bool(r[EXACT]) if len(r) > EXACT else True for r in rows],
        reserved=[float(r[RESERVED]) for r in rows],
    )


def step_series(rows: Sequence[Sequence[float]]) -> list[Point]:
    """The allocator's floor along step rows, with each step's own memory (peak - floor). Where every row
    knows the gradients and optimizer state held (:data:`STATES`), the floor is judged without them: state
    that appears as parameters start to train is the model's, not something kept from every step. The most
    held so far is taken off: a measurement may fall (taken while one of a GAN's two optimizers had set its
    gradients to None) while the floor stays, and a fall in what is taken off is no rise of what is kept."""
    known = bool(rows) and all(len(r) > STATES and r[STATES] >= 0 for r in rows)
    held = list(itertools.accumulate((float(r[STATES]) if known else 0.0 for r in rows), max))
    return [(float(r[STEP]), float(r[FLOOR]) - h, float(r[PEAK] - r[FLOOR])) for r, h in zip(rows, held)]


def leak_in(
    series: Sequence[Point], capacity: int, short: bool = False, min_growth: Optional[float] = None
) -> tuple[Optional[float], Sequence[Point]]:
    """The one leak detector: (the growth, the points judged) where ``series`` (oldest first) rose
    as a leak makes it rise, else (None, the recent points). Every leak rule reads it: the
    allocator's floor along the step rows, the memory outside the allocator along them, the legacy
    window troughs, and the floor of an OOM within a few steps (``short``).

    A long series is judged over the whole and over recent windows (a leak that starts late, or
    grows in stairs): its floor rose at almost every point along a line, or (noisy) its lowest
    value rose through each third along a steeper line; by at least ``min_growth`` (default:
    min(``growth_bytes``, ``growth_share`` of capacity)), with the step's own memory flat where
    the series knows it. A ``short`` series is a leak when the floor rose at every point by a steady
    amount, by ``short_growth_share`` of capacity in all."""
    if short:
        return _short_leak(series, capacity), series
    recent = th.count("recent_rows")
    series = since_release(series, capacity)
    if len(series) >= th.count("min_rows"):
        windows = [series] + [series[-recent * k :] for k in (1, 2, 4, 8) if recent * k < len(series)]
        for judged in windows:
            growth = _leak_growth(judged, capacity, min_growth) if len(judged) >= th.count("min_rows") else None
            if growth is not None and not plateaued(judged, growth):
                return growth, judged
    return None, series[-recent:]


def since_release(series: Sequence[Point], capacity: int) -> Sequence[Point]:
    """The points since the series last fell back from one point to the next by ``release_share`` of its range
    before, by ``release_moves`` times its median move and by half a leak's least growth: the job
    released what it held (an epoch's metric buffers, a cache emptied), so what rose before was not kept. A
    rise since then is a leak only beyond what the job released; where it is no larger, none is judged."""
    floors = [p[1] for p in series]
    moves = [abs(b - a) for a, b in zip(floors, floors[1:])]
    least = max(th.value("release_moves") * _median(moves), _min_growth(capacity) / 2)
    cut, released = 0, 0.0
    share = th.value("release_share")
    high, low = max(floors[:2], default=0.0), min(floors[:2], default=0.0)  # of floors[cut:i], kept as i moves
    for i in range(2, len(floors)):
        fall = floors[i - 1] - floors[i]
        if fall >= share * (high - low) and fall >= least:
            cut, released = i, max(released, fall)
            high = low = floors[i]
        else:
            high, low = max(high, floors[i]), min(low, floors[i])
    if not cut:
        return series
    after = series[cut:]
    rise = max(p[1] for p in after) - after[0][1]
    return after if rise > released * (1 + th.value("demand_margin")) else after[:1]


def plateaued(points: Sequence[Point], growth: float) -> bool:
    """The floor stopped rising: no new high (by ``plateau_share`` of its growth over the last one) for
    ``recent_rows`` rows and for twice the longest wait between two of its highs while it rose. A buffer
    that fills to its cap (a replay buffer, a memory bank) rises and stays; a leak in stairs rises again
    within its own period."""
    bar = th.value("plateau_share") * growth
    level, highs = points[0][1], [0]
    for i, p in enumerate(points):
        if p[1] > level + bar:
            level = p[1]
            highs.append(i)
    waits = [b - a for a, b in zip(highs, highs[1:])] or [0]
    flat = len(points) - 1 - highs[-1]
    return flat >= max(th.count("recent_rows"), 2 * max(waits))


def _leak_growth(points: Sequence[Point], capacity: int, min_growth: Optional[float]) -> Optional[float]:
    floors = [p[1] for p in points]
    # few rows fit a line by chance more often (Student's t has heavy tails at few degrees of freedom)
    t = _t_stat([p[0] for p in points], floors) - th.value("few_rows_t") / max(len(points) - 2, 1)
    if _rise_share(floors) >= th.value("rise_share") and t >= th.value("clean_t"):
        growth = floors[-1] - floors[0]
    elif _envelope_rises(floors) and t >= th.value("noisy_t"):
        third = len(floors) // 3
        growth = min(floors[-third:]) - min(floors[:third])
    else:
        return None
    if growth <= 0 or growth < (_min_growth(capacity) if min_growth is None else min_growth):
        return None
    return growth if _transient_flat(points, growth) else None


def _min_growth(capacity: float) -> float:
    return min(th.value("growth_bytes"), th.value("growth_share") * capacity)


def _transient_flat(points: Sequence[Point], growth: float) -> bool:
    """The step's own working memory (peak - floor) grew by less than ``transient_share`` of the
    floor's growth (True where the series does not know it)."""
    transients = [p[2] for p in points if p[2] is not None]
    if len(transients) < len(points):
        return True
    third = max(len(points) // 3, 1)
    return _mean(transients[-third:]) - _mean(transients[:third]) < th.value("transient_share") * growth


def _envelope_rises(values: Sequence[float]) -> bool:
    """The minimum of each third of ``values`` is above the one before: even the lowest rise."""
    third = len(values) // 3
    if third < 2:
        return False
    lows = [min(values[:third]), min(values[third:-third]), min(values[-third:])]
    return lows[0] < lows[1] < lows[2]


def leak_before_oom(rows: Sequence[Sequence[float]], capacity_bytes: int) -> Optional[int]:
    """At an OOM that came within a few steps (too few rows for :func:`analyse`): :func:`leak_in`
    on the last rows since the first step, as a short series (None: no leak)."""
    try:
        usable = [r for r in rows if len(r) >= 5 and r[STEP] > 1][-th.count("min_rows") :]
        growth = _short_leak(step_series(usable), capacity_bytes)
        return int(growth) if growth is not None else None
    except (ArithmeticError, TypeError, ValueError):
        return None


def _short_leak(points: Sequence[Point], capacity: int) -> Optional[float]:
    if len(points) < th.count("short_min_rows"):
        return None
    floors = [p[1] for p in points]
    rises = [b - a for a, b in zip(floors, floors[1:])]
    growth = floors[-1] - floors[0]
    steady = min(rises) > 0 and min(rises) >= th.value("short_steady_ratio") * max(rises)
    if not steady or growth < th.value("short_growth_share") * capacity or not _transient_flat(points, growth):
        return None
    return growth


def kept_in_window(rows: Sequence[Sequence[float]], capacity_bytes: int) -> Optional[tuple[int, int]]:
    """Outputs kept through an accumulation window: the memory left after each backward since the last
    optimizer step (an OOM event's ``backwards_memory`` rows, wire 1.10: ``[backward, time, allocated]``)
    rose at every backward by a steady amount (the short-series rule: at least ``short_min_rows`` rows,
    the smallest rise ``short_steady_ratio`` of the largest), by a leak's least growth in all. Each
    micro-batch's backward frees its activations, so what stays is what the loop keeps of each micro-batch
    (its logits in a list for a metric). The first backward of a window may allocate the gradients
    (``zero_grad(set_to_none=True)`` freed them at the step), and a reading that lags shows them a row late: the
    rows are judged from the window's second backward on. Returns (the rise, the backwards judged), or None."""
    try:
        usable = [float(r[2]) for r in rows if len(r) >= 3][1:]
        if len(usable) < th.count("short_min_rows"):
            return None
        rises = [b - a for a, b in zip(usable, usable[1:])]
        growth = usable[-1] - usable[0]
        steady = min(rises) > 0 and min(rises) >= th.value("short_steady_ratio") * max(rises)
        if not steady or growth < _min_growth(capacity_bytes):
            return None
        return int(growth), len(usable)
    except (ArithmeticError, TypeError, ValueError):
        return None


def outside_leak(rows: Sequence[Sequence[float]], capacity_bytes: int) -> Optional[int]:
    """Memory outside the allocator (the rows' 7th column, wire 1.6) that rose along the step rows
    as a leak does, by at least ``outside_growth_bytes``: an extension's own allocations, or a NCCL
    communicator made per step. None without that column or without such a rise."""
    try:
        warm = th.count("warmup_steps")
        series = [(float(r[STEP]), float(r[OUTSIDE]), None) for r in rows if len(r) > OUTSIDE and r[STEP] > warm]
        known = [p for p in series if p[1] >= 0]
        growth, _judged = leak_in(known, capacity_bytes, min_growth=th.value("outside_growth_bytes"))
        return int(growth) if growth is not None else None
    except (ArithmeticError, TypeError, ValueError):
        return None


def legacy_leak(rows: Sequence[Sequence[float]], capacity_bytes: int) -> Optional[int]:
    """Spools without step rows: :func:`leak_in` on the sampled between-steps troughs, rows
    ``[time, window_min_allocated_bytes, steps]`` (oldest first), judged along the steps."""
    try:
        series = [(float(r[2]), float(r[1]), None) for r in rows if len(r) >= 3]
        growth, _judged = leak_in(series, capacity_bytes)
        return int(growth) if growth is not None else None
    except (ArithmeticError, TypeError, ValueError):
        return None


def forward_pile(rows: Sequence[Sequence[float]], capacity_bytes: int) -> Optional[int]:
    """Memory that rose forward after forward in a process with no optimizer step: :func:`leak_in`
    on the memory allocated after each forward that recorded an autograd graph (the OOM event's
    ``forwards_memory`` rows, wire 1.7), the first forward skipped (it may allocate lazily: cuBLAS
    workspaces, caches). A loop that keeps every batch's output keeps its graph: the rows rise by
    about the same each forward, while the forward's own memory (its peak above what it leaves)
    stays flat; a growing input raises that too. Where the rows know what each forward began with (a
    5th column, -1 unknown: what earlier forwards left alive), that is the floor, and the forward's own
    memory is its peak (or what it left) above it: a loop whose input grows, keeping nothing, raises
    what each forward leaves but not what the next begins with, even where the forward frees no
    temporary (its peak is what it leaves). Long series are judged as step rows are, a few rows by the
    short-series rule. None without such a rise."""
    try:
        usable = [r for r in rows if len(r) >= 4 and r[0] > 1]
        began = [r for r in usable if len(r) > 4 and r[4] >= 0]
        series: list[Point]
        if began and len(began) == len(usable):
            series = [(float(r[0]), float(r[4]), float(max(r[2], r[3]) - r[4])) for r in began]
        else:
            series = [(float(r[0]), float(r[2]), float(r[3] - r[2]) if r[3] >= 0 else None) for r in usable]
        growth, _judged = leak_in(series, capacity_bytes, short=len(series) < th.count("min_rows"))
        return int(growth) if growth is not None else None
    except (ArithmeticError, TypeError, ValueError):
        return None


def unconsumed(
    pending: Optional[int],
    most: Optional[int],
    trains: bool,
    training: Optional[bool] = None,
    least: Optional[int] = None,
) -> bool:
    """Whether the forwards that recorded a graph since the last backward (``pending``) go beyond what
    this job's own backwards have consumed: ``most`` is the most forwards whose graphs one backward
    consumed (None: no backward ever ran through the model). A training job (``trains``) whose
    backwards were never seen cannot tell: not beyond. A process that never trained nor ran a backward
    keeps its graphs for nothing. Summed micro-batch losses, a REINFORCE episode, a truncated-BPTT window
    keep graphs until their backward: a pile of them is the step's activations, not a leak, up to
    ``pile_consumed_multiple`` times the most seen together. Beyond that, in a job that trains, a model
    in training mode (``training``, its flag at the forward) is taken at its word: a longer episode or
    window than any before, whose backward is still to come, not an evaluation (which runs in eval mode);
    calling it a leak would advise ``no_grad`` on a forward that trains. That word holds only where the job's
    backwards have shown they keep graphs across forwards (``most`` > 1): a job whose every backward consumed one
    forward keeps no episode or window, so a pile there (a validation in training mode without ``no_grad``, a
    rollout that forgets it) is beyond what it consumes whatever the flag says. Nor where every backward consumed
    the same number (``least`` = ``most``: a fixed window of micro-batches, crops or a BPTT length): such a job has
    shown no longer episode, so a pile beyond the bound is beyond it too. Only backwards of varying size (episodes)
    make a longer one the job's own."""
    if most is None:
        return not trains
    if trains and training is True and most > 1 and (least is None or least < most):
        return False
    return pending is not None and pending > beyond_consumed(most)


def beyond_consumed(most: int) -> float:
    """The pending forwards beyond which they are more than ``most`` consumed together suggests."""
    return th.value("pile_consumed_multiple") * max(most, 1)


def piled_up(
    samples: Sequence[Sequence[float]],
    since: Optional[float],
    capacity_bytes: int,
    min_seconds: Optional[float] = None,
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
        span = th.value("pile_min_seconds") if min_seconds is None else min_seconds
        found = _pile(points[start:], falls and since is None, capacity_bytes, span)
        if found is not None:
            return found
    return None


def _pile(
    points: Sequence[tuple[float, float]], never_stepped: bool, capacity_bytes: int, min_seconds: float
) -> Optional[int]:
    try:
        if len(points) < th.count("pile_min_readings") or points[-1][0] - points[0][0] < min_seconds:
            return None
        if never_stepped and not _falls_back(points):
            return None
        quarter = len(points) // 4
        lows = [min(a for _t, a in points[i * quarter : (i + 1) * quarter]) for i in range(3)]
        lows.append(min(a for _t, a in points[3 * quarter :]))
        growth = lows[-1] - lows[0]
        rising = all(b > a for a, b in zip(lows, lows[1:]))
        if not rising or growth < _min_growth(capacity_bytes):
            return None
        return int(growth)
    except (ArithmeticError, TypeError, ValueError):
        return None


def forwards_peak(samples: Sequence[Sequence[float]], now: float) -> Optional[float]:
    """The most memory the forwards before the failing one needed, in a process that never stepped:
    the readings up to ``forwards_quiet_seconds`` before the OOM (the failing forward's own rise left out), over at
    least ``pile_min_seconds``. Readings of wire 1.5 carry the allocator's lifetime peak and its
    bytes ever allocated: the peak then is exact, and forwards ran when the bytes allocated over the
    last ``pile_min_seconds`` reach ``forwards_churn`` times it. Older readings (time, allocated) give their highest
    value, a lower bound, when they fell back at least three times. None when no loop of forwards
    shows."""
    try:
        span, until = th.value("pile_min_seconds"), now - th.value("forwards_quiet_seconds")
        points = [[float(x) for x in r] for r in samples if float(r[0]) <= until]
        if len(points) < th.count("pile_min_readings") or points[-1][0] - points[0][0] < span:
            return None
        last = points[-1]
        if len(last) >= 4:
            start = next(p for p in points if p[0] >= last[0] - span)
            churn = last[3] - start[3] if len(start) >= 4 else 0.0
            return last[2] if last[2] > 0 and churn >= th.value("forwards_churn") * last[2] else None
        pairs = [(p[0], p[1]) for p in points]
        return max(a for _t, a in pairs) if _falls_back(pairs) else None
    except (ArithmeticError, TypeError, ValueError, IndexError, StopIteration):
        return None


def _falls_back(points: Sequence[tuple[float, float]]) -> bool:
    """Readings that fall by at least 1 % of their whole rise, at least once in each half."""
    values = [a for _t, a in points]
    least = th.value("falls_back_share") * (max(values) - min(values))
    half = len(values) // 2
    falls = [i for i in range(1, len(values)) if values[i - 1] - values[i] > least]
    return any(i < half for i in falls) and any(i >= half for i in falls) and len(falls) >= th.count("falls_back_count")


def demand_rise(rows: Sequence[Sequence[float]], capacity: int) -> Optional[Demand]:
    """The step's own memory (peak - floor) rising through the rows: the medians of their thirds in order,
    the least and the most of the last third above those of the first by ``demand_margin`` (two optimizers
    stepping in turn, a GAN's, give rows of two sizes that both grow), the rise by a leak's least growth and
    by more than the floor rose (inputs of varying size keep their least and most). A batch ramp or a length
    curriculum rises in stairs; a routing that concentrates tokens on one expert too. Where the rows know the
    forwards' input (:data:`INPUT`), whether it rose with it; and where the input rose so in stairs, the most
    the steps needed of their own rising with it is enough (the peak of a step that set no new lifetime peak is
    a sampled lower bound: a slow sampler leaves such steps at their floor)."""
    if len(rows) < 3:
        return None
    third = len(rows) // 3
    own = [float(r[PEAK] - r[FLOOR]) for r in rows]
    floors = [float(r[FLOOR]) for r in rows]
    floor_rise = _median(floors[-third:]) - _median(floors[:third])
    inputs = [float(r[INPUT]) for r in rows if len(r) > INPUT and r[INPUT] > 0]
    known = len(inputs) == len(rows)
    if known and _stairs(inputs, third):
        half = len(rows) // 2
        first, last = max(own[:half]), max(own[half:])
        if last > first * (1 + th.value("demand_margin")) and last - first >= _min_growth(capacity):
            return Demand(int(last - first), int(first), int(last), True, int(inputs[0]), int(inputs[-1]))
    first, last = _median(own[:third]), _median(own[-third:])
    rise = last - first
    if not _stairs(own, third) or rise < _min_growth(capacity) or rise <= floor_rise:
        return None
    if not known:
        return Demand(int(rise), int(first), int(last))
    early, late = _median(inputs[:third]), _median(inputs[-third:])
    rose = late > early * (1 + th.value("demand_margin"))
    return Demand(int(rise), int(first), int(last), rose, int(early), int(late))


def _stairs(values: Sequence[float], third: int) -> bool:
    """The medians of the thirds of ``values`` in order, and the least and the most of the last third above
    those of the first by ``demand_margin``."""
    margin = th.value("demand_margin")
    first, middle, last = _median(values[:third]), _median(values[third:-third]), _median(values[-third:])
    if not (first <= middle * (1 + margin) and middle <= last * (1 + margin)):
        return False
    lows, highs = (min(values[:third]), min(values[-third:])), (max(values[:third]), max(values[-third:]))
    return lows[1] > lows[0] * (1 + margin) and highs[1] > highs[0] * (1 + margin)


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def _growing(rows: Sequence[Sequence[float]], capacity: int) -> bool:
    peaks = [r[PEAK] for r in rows]
    if len(peaks) < th.count("min_rows") or _rise_share(peaks) < th.value("growing_share"):
        return False
    return peaks[-1] - peaks[0] >= _min_growth(capacity)


def first_leak_step(rows: Sequence[Sequence[float]], capacity_bytes: int) -> Optional[int]:
    """The step of the first row at which :func:`analyse` calls the series a leak (None: never)."""
    for end in range(th.count("min_rows"), len(rows) + 1):
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
