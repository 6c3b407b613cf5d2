"""The outliers' rates of the time-to-OOM forecast in one pass over the rows (issue 49): every rate equal,
bit for bit, to the row-by-row sum the forecast made before (one pass over the rows per outlier, quadratic
in a snapshot's rows), on integer steps; within the last bits on steps that are not integers; and a
snapshot of 14,000 step rows judged in well under a second of CPU."""

import random
import time

import pytest

from oomsight.analysis import forecast as fc
from oomsight.analysis import trend


def rate_row_by_row(cols, life, line, rise):
    """The forecast's rate before issue 49, one pass over the rows for one rise."""
    seen, steps = 0, 0.0
    for i in range(1, len(cols.steps)):
        start = max(cols.steps[i - 1], line.mean_x + (life[i - 1] - rise - line.mean_y) / line.slope)
        steps += max(cols.steps[i] - start, 0.0)
        seen += life[i] > life[i - 1] and fc._record_rise(cols, life, line, i) >= rise and cols.steps[i] > start
    return seen / steps if steps > 0 else 0.0


def series(seed, whole_steps=True):
    """Rows of a leak with noise, outliers and a reserved column; steps thinned, repeated or set back now and then."""
    r = random.Random(seed)
    steps, s = [], r.randint(0, 100)
    for _ in range(r.randint(2, 250)):
        s += r.choice([1, 1, 1, 2, 3, 7, 50]) if r.random() < 0.97 else r.choice([0, -1])
        steps.append(float(s) if whole_steps else s + r.random())
    slope, noise = r.choice([1e3, 123457.3, 1e6, 8388608.0]), r.choice([0, 1e5, 1e6, 1e7])
    floors = [1e9 + slope * x + r.gauss(0, noise) for x in steps]
    peaks = [f + 1e8 + r.gauss(0, noise) + (r.random() < 0.05) * r.random() * 5e8 for f in floors]
    reserved = [p + r.choice([0, 1e7, 5e7]) * r.random() for p in peaks] if r.random() < 0.7 else []
    return fc.Columns(steps, steps, floors, peaks, [True] * len(steps), reserved), r.choice([-1e9, 0, 1e7, 1e8])


def outliers_and_reference(seed, whole_steps=True):
    cols, beyond = series(seed, whole_steps)
    line = fc._fit(cols.steps, cols.floors)
    if isinstance(line, str):
        return None, None
    found = fc._outliers(cols, line, beyond)
    life = cols.lifetime()
    return found, [rate_row_by_row(cols, life, line, g) for g in found.above]


@pytest.mark.parametrize("block", range(4))
def test_every_rate_is_the_row_by_row_sum_bit_for_bit_on_integer_steps(block):
    checked = 0
    for seed in range(block * 60, (block + 1) * 60):
        found, reference = outliers_and_reference(seed)
        if found is not None:
            assert found.rates == reference, seed
            checked += len(reference)
    assert checked > 100


def test_rows_counted_in_part_by_many_rises_are_summed_in_one_pass_within_the_last_bits(monkeypatch):
    monkeypatch.setattr(fc._Rates, "PARTS_PER_ROW", 0)  # every series takes the one-pass sum
    for seed in range(60):
        found, reference = outliers_and_reference(seed)
        if found is not None:
            assert found.rates == pytest.approx(reference, rel=1e-9, abs=1e-300), seed


def test_steps_that_are_not_integers_give_the_same_rates_within_the_last_bits():
    for seed in range(60):
        found, reference = outliers_and_reference(seed, whole_steps=False)
        if found is not None:
            assert found.rates == pytest.approx(reference, rel=1e-9, abs=1e-300), seed


def long_leak(n):
    """A steady leak whose every row sets a new lifetime peak above the line: every row an outlier (the
    forecast's worst case before issue 49: 2,000 rows took 2 s)."""
    rows = []
    for k in range(n):
        floor = 6e8 + 8388608 * k + (k % 3) * 2**20
        peak = floor + 134283264 + (k % 7) * 2**19
        rows.append([k + 10, 1000.0 + 0.03 * k, floor, peak, peak + 10682368 + (k % 5) * 2**20, float(k % 2)])
    return rows


def test_fourteen_thousand_step_rows_are_judged_in_well_under_a_second_of_cpu():
    rows = long_leak(14_000)
    t0 = time.process_time()
    found = trend.analyse(rows, 2**47)
    spent = time.process_time() - t0
    assert found.forecast_kind == fc.STEADY_LEAK and found.seconds_to_oom is not None
    assert spent < 0.6, spent


def test_a_long_series_forecasts_as_the_row_by_row_sum_did():
    rows = long_leak(1_500)
    before = fc._Rates.at

    def row_by_row(self, above):
        return [rate_row_by_row(fc.Columns(self.steps, self.steps, [], [], []), self.life, self.line, g) for g in above]

    now = trend.analyse(rows, 2**47)
    try:
        fc._Rates.at = row_by_row
        then = trend.analyse(rows, 2**47)
    finally:
        fc._Rates.at = before
    assert now == then
