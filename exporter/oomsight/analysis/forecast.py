"""Time to OOM from the step rows: a central forecast, the earliest plausible time, and the kind
of rise each is made for — or no forecast, with the reason.

Three kinds rise differently and are forecast by what they are:

- a **steady leak**: the between-steps floor rises by about the same every step. A least-squares
  line through the floor is carried forward. The OOM comes at the first step whose peak reaches
  capacity, and near it that is a matter of chance: each step's peak is the line, plus the most
  a step rose above its floor, plus the floor's own noise (normal, its standard deviation about
  the line over the recent rows), or now and then an outlier (a long sample: a new lifetime peak
  further above the line than the noise explains, counted per step where one that high would
  have set a record). The central time is the median time of the first crossing: the step at
  which the chance that one step crossed reaches one half.
- a **stair leak**: the floor rises in jumps (a tensor kept every N steps) and stays flat between
  them. The OOM comes with the jump that lifts the peak past capacity: so many more jumps of the
  usual height, at the usual interval after the last one.
- a **growing demand**: the floor stays, the step's own memory grows with its input (a curriculum
  of longer sequences, a batch-size ramp, padding to the longest sample of a dataset ordered by
  length). The rows' running peak (the allocator's lifetime peak) is the series: a line where it
  rises at most rows, stairs where it rises at a curriculum's stage changes.

The leak is the one leak detector's verdict (:func:`oomsight.analysis.trend.leak_in`); a demand is
a running peak that rose by the same least growth and is still rising. The **earliest** plausible
time comes from the series' own noise: the upper end of the slope's one-sided interval
(``forecast_interval_t`` standard errors), the line's level that far up, the largest excess of a
peak over the line, and the fastest step time seen; for stairs, the tallest jump at the shortest
interval. Stairs are told from noise: each jump stands ``stair_jump_noise`` standard deviations of
the other changes above them (a noisy floor's largest changes are no stairs). No forecast where
the rows are too few (``too_short``), the slope is not told from noise (``too_noisy``), nothing
rises (``no_rise``), or no step time is known (``no_step_time``).

A central time is said only where it can be right: where the chance, by the series' own
randomness, that the OOM comes within ``forecast_central_error`` of it reaches
``forecast_central_share`` (the bar it is judged by, issue 37: p90 of the error at most 50 %).
For a leak that chance sums the first crossing's hazard (above) over the line's own error at the
crossing (its fit, and the floors' scatter about it beyond their step-to-step noise: stairs
too long to see, phases) and the outliers' rate (known to a factor of exp(1/sqrt(seen))); for
stairs, one jump more or fewer and the intervals' jitter; for a growing demand, the running
peak's scatter about its line. Near the OOM the step that first crosses is a first passage of
noise, of a stair's phase or of the next long sample, which no line can time: there the central
time is withheld (``too_noisy``) while the earliest time, which the alert reads, stands.
Pure functions over plain columns (the caller reads them off its rows), no torch.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Callable, Optional

from oomsight.analysis import thresholds as th

STEADY_LEAK, STAIR_LEAK, GROWING_DEMAND = "steady_leak", "stair_leak", "growing_demand"
KINDS = (STEADY_LEAK, STAIR_LEAK, GROWING_DEMAND)
TOO_SHORT, TOO_NOISY, NO_RISE, NO_STEP_TIME = "too_short", "too_noisy", "no_rise", "no_step_time"
REASONS = (TOO_SHORT, TOO_NOISY, NO_RISE, NO_STEP_TIME)


@dataclasses.dataclass(frozen=True)
class Columns:
    """The rows a forecast reads, oldest first, one value per row (past warm-up)."""

    steps: Sequence[float]
    times: Sequence[float]
    floors: Sequence[float]
    peaks: Sequence[float]
    exact: Sequence[bool]
    """The peak is exact (torch's lifetime peak rose since the row before), else a lower bound."""
    reserved: Sequence[float] = ()
    """What the caching allocator reserved at the row (empty: unknown). It keeps what it reserved, so
    this bounds the lifetime peak from above (until ``empty_cache``): a new lifetime peak between
    two rows of a thinned history shows here even where the row that held it was thinned away."""

    def since(self, step: float) -> Columns:
        """The rows from ``step`` on."""
        i = next((k for k, s in enumerate(self.steps) if s >= step), len(self.steps))
        return dataclasses.replace(
            self, steps=self.steps[i:], times=self.times[i:], floors=self.floors[i:], peaks=self.peaks[i:],
            exact=self.exact[i:], reserved=self.reserved[i:],
        )

    def lifetime(self) -> list[float]:
        """The lifetime peak at each row, as high as the rows allow: the highest peak so far, or what
        was reserved where higher."""
        out, top = [], -math.inf
        for i, p in enumerate(self.peaks):
            top = max(top, p, self.reserved[i] if i < len(self.reserved) else p)
            out.append(top)
        return out


@dataclasses.dataclass(frozen=True)
class Forecast:
    kind: str
    """One of :data:`KINDS`, or "" with no forecast."""
    reason: str
    """Why there is no forecast (one of :data:`REASONS`); "" with one."""
    steps: Optional[float] = None
    """Optimizer steps until the peak reaches capacity (central)."""
    seconds: Optional[float] = None
    earliest_seconds: Optional[float] = None
    """The earliest plausible time: at most ``seconds``."""


def none(reason: str) -> Forecast:
    return Forecast("", reason)


@dataclasses.dataclass(frozen=True)
class _Reach:
    """Steps until the series reaches capacity: central and earliest."""

    steps: float
    earliest_steps: float
    within: float = 1.0
    """The chance, by the series' own noise, that the OOM comes within ``forecast_central_error`` of
    ``steps``: below ``forecast_central_share``, no central time is said (``too_noisy``)."""


Detector = Callable[[Columns], bool]
"""The leak detector (``analysis.trend.leak_in``) asked of other rows: True where they rose as a leak does."""


def predict(cols: Columns, capacity: float, leak_from: Optional[float], detect: Detector) -> Forecast:
    """The forecast for the rows ``cols`` against ``capacity`` bytes; ``leak_from`` is the first
    step of the rows the leak detector judged a leak (None: no leak). Over hours the hook's rows
    are dense at the end and ever sparser before (the older half thinned again and again): a slow
    leak hides in the recent rows' noise, so the rows are also judged averaged over equal spans
    of steps (:func:`spans`), by ``detect``."""
    if len(cols.steps) < th.count("min_rows"):
        return none(TOO_SHORT)
    view = cols.since(leak_from) if leak_from is not None else cols
    even = spans(view)
    if leak_from is not None or detect(even):
        kind, reach = _leak(view, even, capacity)
    else:
        kind, reach = _demand(cols, spans(cols), capacity)
    if isinstance(reach, str):
        return none(reach)
    pace = _pace(cols, kind)
    if pace is None:
        return Forecast(kind, NO_STEP_TIME, steps=reach.steps)
    per_step, fastest = pace
    seconds = reach.steps * per_step
    earliest = min(reach.earliest_steps * fastest, seconds)
    if reach.within < th.value("forecast_central_share"):
        return Forecast(kind, TOO_NOISY, earliest_seconds=earliest)  # when is chance: the earliest time stands
    return Forecast(kind, "", reach.steps, seconds, earliest)


def spans(cols: Columns, peak: Callable[[Sequence[float]], float] = max) -> Columns:
    """The rows averaged over ``forecast_spans`` equal spans of steps (empty spans left out): step,
    time and floor their mean, the peak the highest (exact where any is)."""
    count = th.count("forecast_spans")
    if len(cols.steps) <= count:
        return cols
    first, width = cols.steps[0], (cols.steps[-1] - cols.steps[0]) / count or 1.0
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(cols.steps):
        groups.setdefault(min(int((s - first) / width), count - 1), []).append(i)
    rows = [g for _k, g in sorted(groups.items())]
    return Columns(
        steps=[_mean([cols.steps[i] for i in g]) for g in rows],
        times=[_mean([cols.times[i] for i in g]) for g in rows],
        floors=[_mean([cols.floors[i] for i in g]) for g in rows],
        peaks=[peak([cols.peaks[i] for i in g]) for g in rows],
        exact=[any(cols.exact[i] for i in g) for g in rows],
        reserved=[max(cols.reserved[i] for i in g) for g in rows] if cols.reserved else (),
    )


def _leak(cols: Columns, even: Columns, capacity: float) -> tuple[str, _Reach | str]:
    window = 2 * th.count("recent_rows")
    recent = cols.since(cols.steps[-window] if len(cols.steps) > window else 0)
    if _stairs(recent.steps, recent.floors) is not None:
        over, _most = _excess(recent, recent.floors)
        highest = max(over, _record_excess(recent, recent.floors))
        return STAIR_LEAK, _stair_reach(recent, recent.floors, capacity, (over, highest))
    line = _fit(even.steps, even.floors)
    if isinstance(line, str):
        return STEADY_LEAK, line
    if not _told(line):
        return STEADY_LEAK, TOO_NOISY
    on_line = [line.at(x) for x in cols.steps]
    over, _most = _excess(cols, on_line)
    sd = _spread([f - line.at(x) for x, f in zip(recent.steps, recent.floors)])  # the floor's noise
    noise = th.value("forecast_interval_t") * sd
    highest = noise + max(over, _record_excess(cols, on_line))
    reach = _line_reach(line, cols.steps[-1], capacity, (over, highest))
    own = max([p - f for p, f, e in zip(cols.peaks, cols.floors, cols.exact) if e] or [over])
    rare = _outliers(cols, line, own + th.value("forecast_outlier_sd") * sd)
    crossing = _crossing(line, cols.steps[-1], capacity, (own, sd), rare)
    central = crossing.median()
    # the floors' scatter about the line beyond their step-to-step noise (stairs, phases) and the
    # line's own error: where the series will stand at the crossing is known only that well
    scatter = _spread([f - y for f, y in zip(cols.floors, on_line)])
    spread = math.sqrt(line.error(cols.steps[-1] + central) ** 2 + max(scatter**2 - sd**2, 0.0))
    return STEADY_LEAK, _Reach(central, min(reach.earliest_steps, central), crossing.within(central, spread))


@dataclasses.dataclass(frozen=True)
class _Outliers:
    """Steps that needed more than the floor's noise explains: how far each rose above the line, and
    over how many steps they were seen."""

    above: list[float]
    """Sorted."""
    rates: list[float]
    """Per step, of outliers at least as high as each of ``above``."""


def _outliers(cols: Columns, line: _Line, beyond: float) -> _Outliers:
    """The new lifetime peaks more than ``beyond`` above the line (:func:`_record_rise`)."""
    life = cols.lifetime()
    rises = {i: _record_rise(cols, life, line, i) for i in range(1, len(life)) if life[i] > life[i - 1]}
    above = sorted(a for a in rises.values() if a > beyond)
    return _Outliers(above, _Rates(cols, life, line, rises).at(above))


class _Rates:
    """Outliers per step that rose at least ``rise`` above the line, for every rise of a sorted list at
    once (issue 49: one pass over the rows, not one per rise). One shows only where it set a new lifetime
    peak: counted over the steps where one that high would have (the line plus ``rise`` above the lifetime
    peak before), seen where it did. A row ``i`` adds ``steps[i] - start`` where ``start``, the step at which
    the line stood ``rise`` under the lifetime peak before (at least the row before's step), is below its
    step: nothing for the lowest rises, a part of its steps for some, all of them for the highest
    (``start`` falls as ``rise`` grows). Each row's two bounds are found once among the rises; the sum
    is then made for each rise as adding row after row makes it, bit for bit: whole steps are integers,
    whose sums are exact until a sum with a fraction enters a higher power of two, and there alone the
    one rounding that row after row would make is made (:meth:`_whole`). Rows whose steps are not such
    integers, or rises that share so many partly counted rows that this would cost more than
    ``PARTS_PER_ROW`` a row, are summed in one pass with the parts' sum kept as rises grow (equal but for
    the last bits)."""

    PARTS_PER_ROW = 32

    def __init__(self, cols: Columns, life: Sequence[float], line: _Line, rises: dict[int, float]) -> None:
        self.steps, self.life, self.line, self.rises = cols.steps, life, line, rises

    def start(self, i: int, rise: float) -> float:
        """Where row ``i``'s steps would start counting for ``rise`` (before taking the row before's step)."""
        line = self.line
        return line.mean_x + (self.life[i - 1] - rise - line.mean_y) / line.slope

    def at(self, above: Sequence[float]) -> list[float]:
        k, n = len(above), len(self.steps)
        if not k:
            return []
        some, whole = [k] * n, [k] * n  # per row: the first rise that counts some of its steps, all of them
        seen = [0] * (k + 1)
        for i in range(1, n):
            if self.steps[i] <= self.steps[i - 1]:
                continue  # no step in between: counts for no rise
            some[i] = self._first(above, i, self.steps[i], strict=True)
            whole[i] = self._first(above, i, self.steps[i - 1], strict=False)
            if i in self.rises:  # seen for the rises from where it counts up to its own rise
                last = bisect.bisect_right(above, self.rises[i])
                if some[i] < last:
                    seen[some[i]] += 1
                    seen[last] -= 1
        parts = sum(w - s for s, w in zip(some, whole))
        exact = parts <= self.PARTS_PER_ROW * (n + k) and all(
            float(s).is_integer() and abs(s) < 2**50 for s in self.steps
        )
        totals = self._exact(above, some, whole) if exact else self._close(above, some, whole)
        rates, count = [], 0
        for j in range(k):
            count += seen[j]
            rates.append(count / totals[j] if totals[j] > 0 else 0.0)
        return rates

    def _first(self, above: Sequence[float], i: int, step: float, strict: bool) -> int:
        """The first index of ``above`` whose rise puts row ``i``'s start below ``step`` (``strict``) or at
        most at it; every higher rise does too. A guess from the line, corrected by the exact test."""
        line = self.line

        def counts(j: int) -> bool:
            start = self.start(i, above[j])
            return start < step if strict else start <= step

        j = bisect.bisect_left(above, (self.life[i - 1] - line.mean_y) - (step - line.mean_x) * line.slope)
        while j > 0 and counts(j - 1):
            j -= 1
        while j < len(above) and not counts(j):
            j += 1
        return j

    def _events(self, some: Sequence[int], whole: Sequence[int], k: int) -> tuple[list[list[int]], list[list[int]]]:
        """Per rise: the rows counted whole from it on, and the rows counted in part from it on."""
        full: list[list[int]] = [[] for _ in range(k + 1)]
        part: list[list[int]] = [[] for _ in range(k + 1)]
        for i in range(1, len(self.steps)):
            full[whole[i]].append(i)
            if some[i] < whole[i]:
                part[some[i]].append(i)
        return full, part

    def _exact(self, above: Sequence[float], some: Sequence[int], whole: Sequence[int]) -> list[float]:
        k, steps = len(above), self.steps
        full, part = self._events(some, whole, k)
        tree = _Fenwick(len(steps))
        active: set[int] = set()
        totals = []
        for j, rise in enumerate(above):
            for i in full[j]:
                tree.add(i, int(steps[i] - steps[i - 1]))
                active.discard(i)
            active.update(part[j])
            total, at = 0.0, 0
            for i in sorted(active):
                total = self._whole(tree, total, at, i - 1)
                total += steps[i] - self.start(i, rise)
                at = i
            totals.append(self._whole(tree, total, at, len(steps) - 1))
        return totals

    @staticmethod
    def _whole(tree: _Fenwick, total: float, after: int, upto: int) -> float:
        """``total`` plus the whole steps of the rows ``after + 1 .. upto`` counted now, one row after the
        other as floats add them: exact while the sum has no fraction or stays under the next power of
        two, one rounding where it first reaches it."""
        base, end = tree.sum(after), tree.sum(upto)
        while base < end:
            if total.is_integer():
                return total + (end - base)
            _m, power = math.frexp(total)
            row = tree.reaching(base + math.ceil(math.ldexp(1.0, power) - total))
            if row > upto:
                return total + (end - base)
            reached = tree.sum(row)
            total, base = total + (reached - base), reached
        return total

    def _close(self, above: Sequence[float], some: Sequence[int], whole: Sequence[int]) -> list[float]:
        """The sums in one pass: the whole steps added as rows become whole, the parts as a sum of their
        starts at no rise kept as rows enter and leave, plus the rise's share (the start falls by
        ``rise / slope``)."""
        k, steps, line = len(above), self.steps, self.line
        full, part = self._events(some, whole, k)
        wholes = parts = 0.0
        count = 0
        totals = []
        for j, rise in enumerate(above):
            for i in full[j]:
                wholes += steps[i] - steps[i - 1]
                if some[i] < j:
                    parts -= steps[i] - self.start(i, 0.0)
                    count -= 1
            for i in part[j]:
                parts += steps[i] - self.start(i, 0.0)
                count += 1
            totals.append(wholes + parts + count * rise / line.slope)
        return totals


class _Fenwick:
    """Integer sums over rows 1..n-1 by prefix, and the first row where a prefix sum reaches a value."""

    def __init__(self, n: int) -> None:
        self.tree = [0] * (n + 1)
        self.top = 1 << max(n.bit_length() - 1, 0)

    def add(self, i: int, value: int) -> None:
        while i < len(self.tree):
            self.tree[i] += value
            i += i & -i

    def sum(self, i: int) -> int:
        """The sum of rows 1..i."""
        total = 0
        while i > 0:
            total += self.tree[i]
            i -= i & -i
        return total

    def reaching(self, value: int) -> int:
        """The first row whose prefix sum is at least ``value`` (len - 1 + 1 where none)."""
        at, step = 0, self.top
        while step:
            nxt = at + step
            if nxt < len(self.tree) and self.tree[nxt] < value:
                at, value = nxt, value - self.tree[nxt]
            step >>= 1
        return at + 1


def _record_rise(cols: Columns, life: Sequence[float], line: _Line, i: int) -> float:
    """How far the lifetime peak of row ``i`` rose above the line where it came: midway since the row
    before, as likely any step between (a thinned row's peak came while the line stood lower; at its
    own row's step, the rise of every outlier seen in the older rows would be understated)."""
    return life[i] - line.at((cols.steps[i - 1] + cols.steps[i]) / 2)


@dataclasses.dataclass(frozen=True)
class _Crossing:
    """The chance that some step's peak reached capacity as the line rises: each step's peak is the
    line's floor plus ``own`` (the most a step rose above its floor) plus the floor's noise (normal),
    or, as often per step as the rows saw one, an outlier's rise above the line. Near the OOM these,
    not the line, say when: the first of many steps to cross comes before the line reaches the limit.
    Tabulated over ``left``, the bytes by which the line plus ``own`` stands below capacity: the
    hazard summed (in steps) while the line climbs from the top of the band to each (``sums``)."""

    slope: float
    gap: float
    """Where the line plus ``own`` stands below capacity now, bytes."""
    top: float
    """The band's top (``forecast_crossing_sd`` of the noise and the outliers' rise above ``own``),
    bytes; 0 without noise."""
    width: float
    """Bytes a slice: ``forecast_crossing_slices`` a band."""
    sums: list[float]
    """At ``top`` and each slice below it, down to as far below the limit: past it every step crosses."""
    rare: list[float]
    """The outliers' part of ``sums``."""
    seen: int
    """Outliers seen at least as high as a step must rise to cross now (at least one where any was):
    the rate that starts the crossing is known to within a factor of about exp(1 / sqrt(seen))."""

    def hazard(self, left: float, rates: float = 1.0) -> float:
        """The hazard summed from the top of the band down to ``left``, the outliers' rate times
        ``rates`` (inf past the table; without noise, inf from the limit on)."""
        if self.top <= 0:
            return 0.0 if left > 0 else math.inf
        at = (self.top - left) / self.width
        total = _between(self.sums, at)
        return total if math.isinf(total) else total + (rates - 1) * _between(self.rare, at)

    def median(self) -> float:
        """Steps until the chance that some step crossed is one half."""
        goal = self.hazard(self.gap) + math.log(2)
        if self.top <= 0 or math.isinf(goal):
            return max(self.gap, 0.0) / self.slope
        k = bisect.bisect_left(self.sums, goal)
        if k >= len(self.sums):
            return max(self.gap + self.top, 0.0) / self.slope
        at = k - 1 + (goal - self.sums[k - 1]) / (self.sums[k] - self.sums[k - 1])
        return max(self.gap - self.top + at * self.width, 0.0) / self.slope

    def survives(self, steps: float, shift: float, rates: float) -> float:
        """The chance that no step crosses in the next ``steps``, the line ``shift`` bytes lower and
        the outliers ``rates`` times as frequent."""
        now = self.hazard(self.gap + shift, rates)
        if math.isinf(now):
            return 0.0
        return math.exp(now - self.hazard(self.gap + shift - self.slope * steps, rates))

    def within(self, central: float, spread: float) -> float:
        """The chance that the OOM comes within ``forecast_central_error`` of ``central`` steps, the
        line's own error (normal, ``spread`` bytes at the crossing) and the outliers' rate (log-normal,
        from how many were seen) each taken at equal-chance draws."""
        if central <= 0:
            return 0.0
        low, high = _band(central)
        shifts = _draws(spread)
        rates = [math.exp(z) for z in _draws(1 / math.sqrt(self.seen) if self.seen else 0.0)]
        chance = [self.survives(low, d, r) - self.survives(high, d, r) for d in shifts for r in rates]
        return sum(chance) / len(chance)


def _between(sums: Sequence[float], at: float) -> float:
    """``sums`` at the fractional index ``at`` (0 before it, inf past it)."""
    if at <= 0:
        return 0.0
    k = int(at)
    if k + 1 >= len(sums) or math.isinf(sums[k + 1]):
        return math.inf
    return sums[k] + (at - k) * (sums[k + 1] - sums[k])


def _crossing(line: _Line, last: float, capacity: float, own: tuple[float, float], rare: _Outliers) -> _Crossing:
    """The crossing of ``line`` from ``last`` with each step's ``own`` (the most a step rose above its
    floor, the floor's noise) and the ``rare`` outliers."""
    rise, sd = own
    gap = capacity - rise - line.at(last)
    band = th.value("forecast_crossing_sd") * sd + max([a - rise for a in rare.above], default=0.0)
    if band <= 0:
        return _Crossing(line.slope, gap, 0.0, 0.0, [0.0], [0.0], 0)
    slices = th.count("forecast_crossing_slices")
    width = band / slices
    sums, outliers = [0.0], [0.0]
    for k in range(2 * slices):
        left = band - width * (k + 0.5)
        i = bisect.bisect_left(rare.above, left + rise)
        more = (rare.rates[i] if i < len(rare.rates) else 0.0) * width / line.slope
        step = _none_crossed(left / sd if sd > 0 else math.copysign(math.inf, left)) * width / line.slope
        sums.append(sums[-1] + step + more)
        outliers.append(outliers[-1] + more)
    high = len(rare.above) - bisect.bisect_left(rare.above, gap + rise)
    return _Crossing(line.slope, gap, band, width, sums, outliers, max(high, 1) if rare.above else 0)


def _band(central: float) -> tuple[float, float]:
    """The times within ``forecast_central_error`` of ``central``: |central / truth - 1| at most that."""
    error = th.value("forecast_central_error")
    return central / (1 + error), central / (1 - error) if error < 1 else math.inf


def _draws(spread: float) -> list[float]:
    """``forecast_line_draws`` equal-chance values of a normal error of standard deviation ``spread``."""
    count = th.count("forecast_line_draws")
    if spread <= 0:
        return [0.0]
    unit = statistics.NormalDist()
    return [spread * unit.inv_cdf((k + 0.5) / count) for k in range(count)]


def _none_crossed(z: float) -> float:
    """The hazard of one step: -log of the chance that normal noise stays under ``z`` standard deviations."""
    if z >= 0:
        return -math.log1p(-0.5 * math.erfc(z / math.sqrt(2)))
    below = 0.5 * math.erfc(-z / math.sqrt(2))
    return -math.log(below) if below > 0 else math.inf


def _demand(cols: Columns, even: Columns, capacity: float) -> tuple[str, _Reach | str]:
    """A lifetime peak that rose by the least growth, and in the later half of the rows too: the
    line through it (the envelope the steps' own memory climbs along), carried forward from where it
    stands; where it rises in stairs (a curriculum's stages), the next stage may come at the next
    step (:func:`_stair_reach`)."""
    running = even.lifetime()
    least = min(th.value("growth_bytes"), th.value("growth_share") * capacity)
    half = len(running) // 2
    if running[-1] - running[0] < least or running[-1] - running[half] <= 0:
        return "", NO_RISE
    life = cols.lifetime()
    if _rise_share(running) < th.value("growing_share"):
        stairs = _stairs(cols.steps, life)
        if stairs is None or not _still_climbing(cols.steps, stairs):
            return "", NO_RISE  # records of a steady load now and then (an outlier), or a curriculum at its end
    line = _fit(even.steps, running)
    if isinstance(line, str):
        return "", line
    t = th.value("forecast_interval_t")
    if not _told(line):
        return GROWING_DEMAND, TOO_NOISY
    left = max(capacity - life[-1], 0.0)
    central = left / line.slope
    earliest = min(max(left - t * line.resid, 0.0) / _slope_hi(line), central)
    scatter = _spread([y - line.at(x) for x, y in zip(cols.steps, life)])  # the running peak about its line
    spread = math.hypot(scatter, line.error(cols.steps[-1] + central)) / line.slope
    within = _normal_within(central, spread)
    if _stairs(cols.steps, life) is not None:
        climb = _stair_reach(cols, life, capacity, (0.0, 0.0))
        if not isinstance(climb, str):
            earliest = min(earliest, climb.earliest_steps)
            # a curriculum's OOM comes with a stage: one stage more or fewer as its steps vary
            within = min(within, climb.within)
    return GROWING_DEMAND, _Reach(central, earliest, within)


def _normal_within(central: float, spread: float) -> float:
    """The chance that a time ``central`` off by a normal error of ``spread`` (standard deviation)
    is within ``forecast_central_error`` of the truth."""
    return _normal_between(central, spread, *_band(central)) if central > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class _Line:
    slope: float
    mean_x: float
    mean_y: float
    sxx: float
    n: int
    resid: float
    """The residuals' standard deviation."""

    def at(self, x: float) -> float:
        return self.mean_y + self.slope * (x - self.mean_x)

    def error(self, x: float) -> float:
        """The standard error of the line's level at ``x``, bytes (its level and slope fitted)."""
        return self.resid * math.sqrt(1 / self.n + (x - self.mean_x) ** 2 / self.sxx)


def _fit(xs: Sequence[float], ys: Sequence[float]) -> _Line | str:
    """The least-squares line of ``ys`` on ``xs``, or why there is none."""
    n = len(xs)
    if n < th.count("forecast_min_points"):
        return TOO_SHORT
    mx, my = _mean(xs), _mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return TOO_SHORT
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if slope <= 0:
        return NO_RISE
    resid = math.sqrt(sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys)) / max(n - 2, 1))
    return _Line(slope, mx, my, sxx, n, resid)


def _slope_hi(line: _Line) -> float:
    """The upper end of the slope's one-sided interval (``forecast_interval_t`` standard errors)."""
    return line.slope + th.value("forecast_interval_t") * line.resid / math.sqrt(line.sxx)


def _told(line: _Line) -> bool:
    """The slope is told from noise: at least ``forecast_min_earliest_share`` of its interval's upper
    end (else the rows cannot say within that factor how fast it rises)."""
    return line.slope >= th.value("forecast_min_earliest_share") * _slope_hi(line)


def _line_reach(line: _Line, last: float, capacity: float, excess: tuple[float, float]) -> _Reach:
    """Steps from ``last`` until ``line`` plus ``excess`` (central, highest) reaches ``capacity``; the
    earliest with the slope and the line's level at the upper end of their interval."""
    t = th.value("forecast_interval_t")
    level = line.at(last)
    slope_hi = _slope_hi(line)
    level_hi = level + t * line.error(last)
    central = max(capacity - level - excess[0], 0.0) / line.slope
    earliest = max(capacity - level_hi - excess[1], 0.0) / slope_hi
    return _Reach(central, min(earliest, central))


def _stair_reach(cols: Columns, ys: Sequence[float], capacity: float, excess: tuple[float, float]) -> _Reach | str:
    """Steps until the jump that lifts ``ys`` plus ``excess`` past capacity: the usual height at the
    usual interval after the last jump (central), the tallest at the shortest (earliest)."""
    jumps = _stairs(cols.steps, ys)
    if jumps is None:
        return TOO_SHORT
    heights = sorted(h for _s, h in jumps)
    gaps = sorted(b[0] - a[0] for a, b in zip(jumps, jumps[1:]))
    height, gap = _median(heights), _median(gaps)
    since = cols.steps[-1] - jumps[-1][0]

    def reach(left: float, rise: float, every: float, first: float) -> float:
        if left <= 0:
            return 0.0
        more = math.ceil(left / rise - 1e-9)
        return first + (more - 1) * every

    central = reach(capacity - ys[-1] - excess[0], height, gap, max(gap - since, 1.0))
    earliest = reach(capacity - ys[-1] - excess[1], heights[-1], gaps[0], 1.0)
    jumped = {s for s, _h in jumps}
    between = [ys[i] - ys[i - 1] for i in range(1, len(ys)) if cols.steps[i] not in jumped]
    noise = _spread(between) / math.sqrt(2)  # a change between two levels: sqrt(2) times a level's noise
    jitter = _spread(gaps + ([since] if since > gap else []))  # an interval still open, longer than usual
    stairs = _Stairs(height, gap, max(gap - since, 1.0), noise, jitter)
    return _Reach(central, min(earliest, central), stairs.within(capacity - ys[-1] - excess[0], central))


@dataclasses.dataclass(frozen=True)
class _Stairs:
    """Jumps of the usual ``height`` every ``every`` steps, the next in ``first``; the level between
    them has its own noise (``noise``, bytes) and the intervals theirs (``jitter``, steps)."""

    height: float
    every: float
    first: float
    noise: float
    jitter: float

    def within(self, left: float, central: float) -> float:
        """The chance that the jump which lifts the level ``left`` bytes further comes within
        ``forecast_central_error`` of ``central`` steps: one jump more or fewer where the level's
        noise reaches the limit's side of a jump (up to ``forecast_crossing_sd`` of it), each a
        jump's interval later or sooner."""
        if central <= 0:
            return 0.0
        low, high = _band(central)
        band = th.value("forecast_crossing_sd") * self.noise
        fewest = max(math.floor((left - band) / self.height), 0)
        chance, before = 0.0, _normal_above(left - (fewest - 1) * self.height, self.noise) if fewest else 0.0
        for jumps in range(fewest, max(math.ceil((left + band) / self.height), 0) + 1):
            upto = _normal_above(left - jumps * self.height, self.noise)  # no more than ``jumps`` needed
            at = self.first + (jumps - 1) * self.every if jumps else 0.0
            chance += (upto - before) * _normal_between(at, self.jitter * math.sqrt(max(jumps, 1)), low, high)
            before = upto
        return chance


def _normal_above(x: float, sd: float) -> float:
    """The chance that a normal error of standard deviation ``sd`` is at least ``x``."""
    if sd <= 0:
        return 1.0 if x <= 0 else 0.0
    return 1 - statistics.NormalDist(0.0, sd).cdf(x)


def _normal_between(mean: float, sd: float, low: float, high: float) -> float:
    """The chance that a normal value (``mean``, ``sd``) lies between ``low`` and ``high``."""
    if sd <= 0:
        return 1.0 if low <= mean <= high else 0.0
    unit = statistics.NormalDist(mean, sd)
    return unit.cdf(high) - unit.cdf(low)


def _stairs(steps: Sequence[float], ys: Sequence[float]) -> Optional[list[tuple[float, float]]]:
    """The jumps (step, height) of a series that rises in stairs: at least ``stair_min_jumps`` rises
    of at least ``stair_jump_share`` of the largest hold ``stair_rise_share`` of the whole rise, at
    no more than a third of the rows. None where it rises otherwise (at most rows, or not at all)."""
    rises = [(steps[i], ys[i] - ys[i - 1]) for i in range(1, len(ys))]
    total = sum(d for _s, d in rises if d > 0)
    if total <= 0:
        return None
    top = max(d for _s, d in rises)
    jumps = [(s, d) for s, d in rises if d >= th.value("stair_jump_share") * top]
    if len(jumps) < th.count("stair_min_jumps") or len(jumps) > len(rises) // 3:
        return None
    if sum(d for _s, d in jumps) < th.value("stair_rise_share") * total:
        return None
    between = [d for _s, d in rises if d < th.value("stair_jump_share") * top]
    if min(d for _s, d in jumps) < th.value("stair_jump_noise") * _spread(between):
        return None  # the floor's own noise: its largest changes, not stairs
    return jumps


def _still_climbing(steps: Sequence[float], jumps: Sequence[tuple[float, float]]) -> bool:
    """The last jump came within ``stair_overdue`` usual intervals: a curriculum that reached its
    last stage (or records of a steady load, ever rarer) stops here."""
    gaps = [b[0] - a[0] for a, b in zip(jumps, jumps[1:])]
    return steps[-1] - jumps[-1][0] <= th.value("stair_overdue") * _median(gaps)


def _excess(cols: Columns, ys: Sequence[float]) -> tuple[float, float]:
    """How far the exact peaks rose above ``ys`` at their row: the most (the OOM comes at the first
    step whose peak crosses, a high one), for the central forecast and the earliest alike."""
    over = [p - y for p, y, e in zip(cols.peaks, ys, cols.exact) if e] or [p - y for p, y in zip(cols.peaks, ys)]
    return max(over), max(over)


def _record_excess(cols: Columns, ys: Sequence[float]) -> float:
    """The highest a new lifetime peak rose above the line, taken at the row before it (the step
    it may have come right after): a step that needs more now and then (a long sample, padding to
    it) may need that much again at any step, seen or thinned away."""
    life = cols.lifetime()
    rose = [life[i] - ys[i - 1] for i in range(1, len(life)) if life[i] > life[i - 1]]
    return max(rose, default=0.0)


def _pace(cols: Columns, kind: str) -> Optional[tuple[float, float]]:
    """Seconds per optimizer step, and the fastest of the rows' quarters. Over all the rows for a
    leak; over their latest quarter for a growing demand, whose steps take longer as their input
    grows (a longer sequence, a larger batch)."""
    def rate(a: int, b: int) -> Optional[float]:
        span = cols.steps[b] - cols.steps[a]
        return (cols.times[b] - cols.times[a]) / span if span > 0 else None

    last = len(cols.steps) - 1
    whole = rate(0, last)
    if whole is None or whole <= 0:
        return None
    quarter = max(last // 4, 1)
    parts = [r for r in (rate(i, min(i + quarter, last)) for i in range(0, last, quarter)) if r is not None]
    latest = rate(last - quarter, last) if kind == GROWING_DEMAND else None
    pace = latest if latest is not None and latest > 0 else whole
    return pace, min([whole, pace, *(r for r in parts if r > 0)])


def _running_max(values: Sequence[float]) -> Sequence[float]:
    out, top = [], -math.inf
    for v in values:
        top = max(top, v)
        out.append(top)
    return out


def _rise_share(values: Sequence[float]) -> float:
    pairs = list(zip(values, values[1:]))
    return sum(1 for a, b in pairs if b > a) / len(pairs) if pairs else 0.0


def _spread(values: Sequence[float]) -> float:
    """The standard deviation of ``values`` (0 for fewer than two)."""
    if len(values) < 2:
        return 0.0
    m = _mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _median(values: Sequence[float]) -> float:
    return _quantile(sorted(values), 0.5)


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted ``ordered`` (nearest rank; 0 for none)."""
    if not ordered:
        return 0.0
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]
