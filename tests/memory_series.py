"""Long step-row series of jobs that run out of memory, made to measure the time-to-OOM forecast
(``analysis.forecast``) at horizons of minutes to hours: ``tests/test_forecast.py`` and
``benchmarks/bench_forecast.py`` both draw from here.

A run is simulated step by step: the floor (what survives a step), the step's true peak, and the
time. It ends at the first step whose true peak reaches capacity: the OOM, the truth. The rows are
what the hook keeps (``hook.stepmemory``): ``[step, time, floor, peak, reserved, exact]``, the peak
exact where it set a new lifetime peak, else what a 10 Hz sampler caught (a lower bound), at most
``MAX_ROWS`` rows in the hook's own ``RowBook``. Kinds:

- ``noisy_leak``: the floor rises by the same each step under noise of what the loop keeps;
- ``stair_leak``: the floor jumps every N steps (a tensor kept every N steps) and stays between;
- ``growing_demand``: the floor stays, the step's own memory grows with its input (a batch ramp);
- ``curriculum``: the step's own memory rises in stages (sequence length raised every N steps),
  each batch padded to its own longest sample below the stage's cap;
- ``outliers``: a steady leak whose steps need more now and then (a long sample, data-dependent).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterator

from oomsight.hook.stepmemory import MAX_ROWS, RowBook

GIB = 1 << 30
MIB = 1 << 20
KINDS = ("noisy_leak", "stair_leak", "growing_demand", "curriculum", "outliers")


@dataclasses.dataclass(frozen=True)
class Shape:
    """One run's parameters: capacity, where it starts, when the trend alone reaches capacity."""

    kind: str
    capacity: float
    seconds_per_step: float
    steps_to_oom: int
    """Steps until the trend (without noise) reaches capacity."""
    base: float
    transient: float
    noise: float
    """Standard deviation of what the loop keeps across a boundary, bytes."""
    period: int
    """Steps between stairs (stair leaks, curricula)."""


def shape(kind: str, rng: random.Random, hours: float = 8.0) -> Shape:
    """A run of ``kind`` whose trend reaches capacity after about ``hours``."""
    per_step = rng.uniform(0.3, 3.0)
    capacity = rng.choice([24, 40, 80, 141]) * GIB
    return Shape(
        kind=kind,
        capacity=capacity,
        seconds_per_step=per_step,
        steps_to_oom=int(hours * 3600 / per_step),
        base=capacity * rng.uniform(0.2, 0.35),
        transient=capacity * rng.uniform(0.15, 0.3),
        noise=capacity * rng.uniform(0.0, 0.01),
        period=rng.randint(20, 400),
    )


def _true_step(s: Shape, step: int, rng: random.Random) -> tuple[float, float]:
    """(floor, true peak) at ``step``."""
    room = s.capacity - s.base - s.transient
    share = step / s.steps_to_oom
    kept = rng.gauss(0, s.noise)
    if s.kind in ("noisy_leak", "outliers"):
        floor = s.base + room * share + kept
        extra = 0.0
        if s.kind == "outliers" and rng.random() < 0.005:
            extra = rng.uniform(0.02, 0.08) * s.capacity
        return floor, floor + s.transient * rng.uniform(0.97, 1.0) + extra
    if s.kind == "stair_leak":
        stairs = max(s.steps_to_oom // s.period, 1)
        floor = s.base + room * min(step // s.period, stairs + 1) / stairs + kept
        return floor, floor + s.transient * rng.uniform(0.97, 1.0)
    floor = s.base + abs(kept)
    if s.kind == "growing_demand":
        return floor, floor + s.transient + room * share * rng.uniform(0.97, 1.0)
    stages = max(s.steps_to_oom // s.period, 1)
    cap = s.transient + room * min(step // s.period, stages + 1) / stages
    return floor, floor + cap * rng.uniform(0.9, 1.0)


@dataclasses.dataclass
class Run:
    shape: Shape
    oom_time: float
    """Seconds from the start to the OOM (the step whose true peak reached capacity)."""
    views: list[tuple[float, list[list[float]]]]
    """(time, the rows the hook held then), at the times asked for."""


def run(kind: str, seed: int, ahead: list[float], hours: float = 8.0) -> Run:
    """Simulate one run of ``kind``; ``ahead`` are the times before the OOM (seconds) at which the
    rows the hook held are kept (those past the start are left out)."""
    rng = random.Random(f"{kind}-{seed}")
    s = shape(kind, rng, hours)
    steps = list(_steps(s, rng))
    oom = steps[-1][1]
    wanted = sorted((oom - a for a in ahead if oom - a > 0), reverse=True)
    views: list[tuple[float, list[list[float]]]] = []
    book = RowBook(MAX_ROWS, even=True)
    top = 0.0
    for step, t, floor, peak in steps[:-1]:
        exact = peak > top
        top = max(top, peak)
        seen = peak if exact else max(floor, floor + (peak - floor) * rng.uniform(0.0, 1.0))
        book.append(0, [step, t, floor, seen, top, int(exact)])
        while wanted and steps[step][1] > wanted[-1] >= t:
            views.append((t, book.series(0)))
            wanted.pop()
    return Run(s, oom, views)


def _steps(s: Shape, rng: random.Random) -> Iterator[tuple[int, float, float, float]]:
    """(step, time, floor, true peak) from step 1 to the OOM's step (the last)."""
    t = 0.0
    for step in range(1, 4 * s.steps_to_oom):
        t += s.seconds_per_step * rng.uniform(0.9, 1.1)
        floor, peak = _true_step(s, step, rng)
        yield step, t, floor, peak
        if peak >= s.capacity:
            return


def rows(floors: list[float], peaks: list[float], dt: float = 0.5, first: int = 3) -> list[list[float]]:
    """Hand-made step rows ``[step, time, floor, peak, reserved, exact]`` from ``first`` on, ``dt``
    seconds apart, every peak exact and reserved at the peak (``tests/test_trend.py`` and
    ``tests/test_forecast.py``)."""
    return [[i + first, 100.0 + i * dt, f, p, p, 1.0] for i, (f, p) in enumerate(zip(floors, peaks))]


def horizons(first: float = 60.0, last: float = 6 * 3600.0, count: int = 24) -> list[float]:
    """``count`` times before an OOM, evenly spaced on a log scale from ``first`` to ``last`` seconds."""
    ratio = math.log(last / first) / (count - 1)
    return [first * math.exp(ratio * i) for i in range(count)]
