"""The time-to-OOM forecast (``analysis.forecast``, issue 37): the central time, the earliest
plausible one, the kind of rise, and no forecast where the rows cannot say."""

import random

import memory_series
import pytest

from oomsight.analysis import forecast as fc
from oomsight.analysis import trend
from oomsight.metrics import family

GIB = 1 << 30
MIB = 1 << 20


rows = memory_series.rows


def test_a_steady_leak_gets_an_earliest_time_no_later_than_the_central_one():
    floors = [GIB + i * 128 * MIB for i in range(30)]
    t = trend.analyse(rows(floors, [f + 2 * GIB for f in floors]), 16 * GIB)
    assert t.forecast_kind == fc.STEADY_LEAK and t.no_forecast_reason == ""
    assert 0 < t.earliest_seconds_to_oom <= t.seconds_to_oom
    v = trend.verdict(t)
    assert v["earliest_seconds_to_oom"] == t.earliest_seconds_to_oom and v["forecast_kind"] == "steady_leak"


def test_too_few_rows_give_no_forecast_and_the_snapshot_says_why():
    floors = [GIB + i * 512 * MIB for i in range(4)]
    v = trend.verdict(trend.analyse(rows(floors, [f + GIB for f in floors]), 16 * GIB))
    assert v["seconds_to_oom"] is None and v["earliest_seconds_to_oom"] is None
    assert v["forecast_kind"] == "" and v["no_forecast_reason"] == fc.TOO_SHORT


def test_a_flat_job_gets_no_forecast_because_nothing_rises():
    rng = random.Random(0)
    floors = [4 * GIB + rng.randint(0, 64) * MIB for _ in range(60)]
    t = trend.analyse(rows(floors, [f + 2 * GIB for f in floors]), 16 * GIB)
    assert t.seconds_to_oom is None and t.no_forecast_reason == fc.NO_RISE


def test_a_rise_lost_in_its_noise_gives_no_forecast_and_says_it_is_too_noisy():
    steps = [float(s) for s in range(3, 40)]
    floors = [4 * GIB + s * 20 * MIB + (3 * GIB if s % 2 else -3 * GIB) for s in steps]
    cols = fc.Columns(steps, [s * 0.5 for s in steps], floors, [f + GIB for f in floors], [True] * len(steps))
    found = fc.predict(cols, 80 * GIB, leak_from=steps[0], detect=lambda c: True)
    assert found.seconds is None and found.reason == fc.TOO_NOISY


def test_headroom_inside_the_noise_band_pages_now_instead_of_saying_too_noisy():
    rng = random.Random(1)
    floors = [GIB + i * 64 * MIB + rng.randint(0, 64) * MIB for i in range(60)]
    t = trend.analyse(rows(floors, [f + 2 * GIB for f in floors]), int(floors[-1] + 2 * GIB + 96 * MIB))
    assert t.forecast_kind == fc.STEADY_LEAK and t.earliest_seconds_to_oom is not None
    assert t.earliest_seconds_to_oom < t.seconds_to_oom


def test_a_peak_far_above_the_rest_once_is_taken_as_what_any_step_may_need_again():
    # a leak whose steps needed 3 GiB more once (a long sample): the earliest time allows it again
    floors = [GIB + i * 64 * MIB for i in range(60)]
    peaks = [f + GIB + (3 * GIB if i == 20 else 0) for i, f in enumerate(floors)]
    reserved = [max(peaks[: i + 1]) for i in range(len(peaks))]
    held = [[r[0], r[1], r[2], r[3], res, r[5]] for r, res in zip(rows(floors, peaks), reserved)]
    t = trend.analyse(held, 12 * GIB)
    assert t.forecast_kind == fc.STEADY_LEAK
    left = (12 * GIB - peaks[-1]) / (64 * MIB) * 0.5
    assert t.earliest_seconds_to_oom <= left - 3 * GIB / (64 * MIB) * 0.5 + 1.0


def test_a_floor_that_jumps_every_ten_steps_is_forecast_as_stairs_at_the_jump_that_runs_out():
    floors = [2 * GIB + (i // 10) * GIB for i in range(60)]
    t = trend.analyse(rows(floors, [f + GIB for f in floors], dt=1.0), 12 * GIB)
    assert t.leak and t.forecast_kind == fc.STAIR_LEAK
    # at 7 GiB + 1 GiB of step memory, three more jumps (8, 9, 10 GiB floors) reach 12 GiB: the third comes in 30 steps
    assert abs(t.seconds_to_oom - 30.0) <= 2.0
    assert t.earliest_seconds_to_oom <= t.seconds_to_oom


def test_a_growing_sequence_with_a_flat_floor_is_forecast_as_growing_demand():
    floors = [GIB + i * 16 * MIB for i in range(30)]
    peaks = [GIB + i * 256 * MIB for i in range(30)]
    t = trend.analyse(rows(floors, peaks), 16 * GIB)
    assert t.forecast_kind == fc.GROWING_DEMAND
    assert abs(t.steps_to_oom - (16 * GIB - peaks[-1]) / (256 * MIB)) < 2


@pytest.mark.parametrize("kind", memory_series.KINDS)
def test_on_generated_series_of_each_kind_the_earliest_time_is_not_after_the_truth(kind):
    later = total = 0
    for seed in range(2):
        r = memory_series.run(kind, seed, memory_series.horizons(120, 6 * 3600, 6), hours=7.0)
        for when, held in r.views:
            t = trend.analyse(held, int(r.shape.capacity))
            if t.earliest_seconds_to_oom is not None:
                total += 1
                later += t.earliest_seconds_to_oom > r.oom_time - when
    assert total >= 8 and later == 0, (later, total)


def test_an_older_writers_verdict_gives_no_earliest_sample_and_a_new_one_without_a_forecast_gives_inf():
    old = {"points": 20, "leak": True, "floor_slope_bytes": 1.0, "floor_growth_bytes": GIB,
           "steps_to_oom": 100.0, "seconds_to_oom": 50.0}
    earliest = next(f for f in family.FAMILIES if f.name == "oomsight_oom_forecast_earliest_seconds")
    assert earliest.value({"step_trend": old}) is None
    new = {**old, "steps_to_oom": None, "seconds_to_oom": None, "earliest_seconds_to_oom": None,
           "forecast_kind": "", "no_forecast_reason": "too_noisy"}
    assert earliest.value({"step_trend": new}) == float("inf")


def test_a_noisy_floor_is_not_taken_for_stairs_and_never_says_the_oom_is_now():
    # a floor whose per-step rise is far below its noise: its largest changes are noise, not the
    # jumps of a stair (they once were, and the forecast said a few seconds with hours left)
    for seed in range(40):
        rng = random.Random(seed)
        floors = [8 * GIB + i * 4 * MIB + rng.gauss(0, 100 * MIB) for i in range(200)]
        t = trend.analyse(rows(floors, [f + 4 * GIB for f in floors]), 24 * GIB)
        assert t.leak and t.forecast_kind == fc.STEADY_LEAK, seed
        line = (24 * GIB - 4 * GIB - (8 * GIB + 199 * 4 * MIB)) / (4 * MIB) * 0.5  # the line alone, in seconds
        assert t.seconds_to_oom > 0.5 * line, (seed, t.seconds_to_oom, line)


def test_a_noisier_floor_runs_out_sooner_than_a_calm_one_on_the_same_line():
    # the central time is the median of the first step to cross: the noisier the floor, the sooner
    # one of its steps reaches capacity before the line itself does
    rng = random.Random(3)
    noise = [rng.gauss(0, 1) for _ in range(120)]
    times = {}
    for sd in (0, 64 * MIB, 256 * MIB):
        floors = [4 * GIB + i * 8 * MIB + sd * n for i, n in enumerate(noise)]
        steps = [float(i) for i in range(120)]
        cols = fc.Columns(steps, [s * 0.5 for s in steps], floors, [f + GIB for f in floors], [True] * 120)
        times[sd] = fc.predict(cols, 12 * GIB, leak_from=0.0, detect=lambda c: True).steps
    assert times[0] > times[64 * MIB] > times[256 * MIB] > 0, times


def test_a_leak_whose_steps_need_more_now_and_then_runs_out_before_its_line_says():
    # generated leaks with data-dependent outliers: the central time counts the outliers the
    # lifetime peak showed (was: the line plus an ordinary step, hours late near the OOM)
    errors = []
    for seed in range(3):
        r = memory_series.run("outliers", seed, memory_series.horizons(3600, 6 * 3600, 4))
        for when, held in r.views:
            t = trend.analyse(held, int(r.shape.capacity))
            if t.seconds_to_oom is not None:
                errors.append(abs(t.seconds_to_oom / (r.oom_time - when) - 1))
    errors.sort()
    assert len(errors) >= 10 and errors[len(errors) // 2] <= 0.2, errors


def test_a_growing_demand_whose_steps_slow_as_they_grow_is_timed_at_its_latest_pace():
    # the sequence grows and each step takes longer (corpus/growing_sequence: 0.11 s a step at
    # first, 0.36 s at the end): the steps left take the latest pace, not the run's average
    steps = [float(s) for s in range(3, 23)]
    times, t = [], 0.0
    for s in steps:
        t += 0.1 + 0.015 * s
        times.append(t)
    floors = [GIB + s * 16 * MIB for s in steps]
    peaks = [GIB + s * 256 * MIB for s in steps]
    cols = fc.Columns(steps, times, floors, peaks, [True] * len(steps))
    found = fc.predict(cols, 16 * GIB, leak_from=None, detect=lambda c: False)
    assert found.kind == fc.GROWING_DEMAND and found.steps is not None
    latest = (times[-1] - times[-5]) / (steps[-1] - steps[-5])
    assert abs(found.seconds - found.steps * latest) < 1e-6 * found.seconds
    assert found.seconds > found.steps * (times[-1] - times[0]) / (steps[-1] - steps[0])


def _leak_near_its_limit(noise_bytes, seed=5):
    """A leak of 4 MiB a step, 0.5 s a step, its line 100 steps (50 s) short of the limit, the
    floor's noise ``noise_bytes`` (standard deviation)."""
    rng = random.Random(seed)
    floors = [8 * GIB + i * 4 * MIB + rng.gauss(0, noise_bytes) for i in range(240)]
    line_end = 8 * GIB + 239 * 4 * MIB
    return rows(floors, [f + 4 * GIB for f in floors]), int(line_end + 4 * GIB + 100 * 4 * MIB)


def test_a_leak_whose_noise_is_wide_against_the_drift_left_says_too_noisy_and_still_gives_its_earliest_time():
    # the noise (200 MiB) spans 50 steps of drift each way: which step first crosses, with the line
    # 100 steps of drift from the limit, is chance beyond the bar; the alert still has the earliest time
    held, capacity = _leak_near_its_limit(200 * MIB)
    t = trend.analyse(held, capacity)
    assert t.leak and t.forecast_kind == fc.STEADY_LEAK and t.no_forecast_reason == fc.TOO_NOISY
    assert t.seconds_to_oom is None and t.steps_to_oom is None
    assert t.earliest_seconds_to_oom is not None and 0 <= t.earliest_seconds_to_oom < 50
    v = trend.verdict(t)
    assert v["seconds_to_oom"] is None and v["no_forecast_reason"] == "too_noisy"
    assert v["earliest_seconds_to_oom"] == t.earliest_seconds_to_oom


def test_the_same_leak_with_a_calm_floor_still_gets_its_central_time():
    held, capacity = _leak_near_its_limit(4 * MIB)
    t = trend.analyse(held, capacity)
    assert t.forecast_kind == fc.STEADY_LEAK and t.no_forecast_reason == ""
    assert abs(t.seconds_to_oom - 50) <= 0.2 * 50
    assert t.earliest_seconds_to_oom <= t.seconds_to_oom


def test_a_too_noisy_verdict_exports_no_central_time_but_its_earliest_one():
    held, capacity = _leak_near_its_limit(200 * MIB)
    verdict = trend.verdict(trend.analyse(held, capacity))
    central = next(f for f in family.FAMILIES if f.name == "oomsight_oom_forecast_seconds")
    earliest = next(f for f in family.FAMILIES if f.name == "oomsight_oom_forecast_earliest_seconds")
    assert central.value({"step_trend": verdict}) == float("inf")
    assert earliest.value({"step_trend": verdict}) == verdict["earliest_seconds_to_oom"] < 50


def test_a_leak_that_runs_out_with_its_outliers_gives_no_central_time_near_the_oom():
    # generated leaks whose steps need 2-8 % of the GPU more now and then: within minutes of the OOM
    # which outlier crosses first is chance; the earliest time stays and is not after the truth
    said = 0
    for seed in range(3):
        r = memory_series.run("outliers", seed, memory_series.horizons(300, 900, 3))
        for when, held in r.views:
            t = trend.analyse(held, int(r.shape.capacity))
            said += t.seconds_to_oom is not None
            assert t.earliest_seconds_to_oom is not None and t.earliest_seconds_to_oom <= r.oom_time - when
    assert said <= 1, said


@pytest.mark.parametrize("kind", memory_series.KINDS)
def test_hours_before_the_oom_every_kind_still_gets_a_central_time(kind):
    for seed in range(2):
        r = memory_series.run(kind, seed, [2 * 3600.0, 4 * 3600.0])
        for when, held in r.views:
            t = trend.analyse(held, int(r.shape.capacity))
            truth = r.oom_time - when
            assert t.seconds_to_oom is not None, (seed, truth, t.no_forecast_reason)
            assert abs(t.seconds_to_oom / truth - 1) <= 0.5, (seed, truth, t.seconds_to_oom)


def levels(gaps, start):
    """Steps (from 3) and a level that starts at ``start`` and rises by 1 GiB after each of ``gaps`` steps."""
    steps, ys, level = [], [], start
    for gap in gaps:
        for _ in range(gap):
            steps.append(float(len(steps) + 3))
            ys.append(level)
        level += GIB
    return steps, ys


def test_stairs_whose_jumps_come_at_uneven_intervals_give_no_central_time_but_regular_ones_do():
    # a floor that jumps by 1 GiB every 10 steps on average: regular, the jump that runs out is
    # timed to the step; at intervals of 3 to 17 steps, when the next two come is chance
    for gaps, said in (([10] * 6, True), ([3, 17, 4, 16, 3, 17], False)):
        steps, floors = levels(gaps, 2 * GIB)
        cols = fc.Columns(steps, [s * 0.5 for s in steps], floors, [f + GIB for f in floors], [True] * len(steps))
        found = fc.predict(cols, floors[-1] + 3 * GIB, leak_from=steps[0], detect=lambda c: True)
        assert found.kind == fc.STAIR_LEAK, gaps
        assert (found.seconds is not None) == said and (found.reason == "") == said, (gaps, found)
        assert found.earliest_seconds is not None


def test_a_curriculum_whose_stages_come_at_uneven_intervals_gives_no_central_time_but_an_even_one_does():
    # the steps' own memory rises by 1 GiB a stage over a flat floor; 2.5 GiB left is three stages:
    # every 10 steps it comes with the third; at 3 to 17 steps, a stage's interval more or less is chance
    for gaps, said in (([10] * 6, True), ([3, 17, 4, 16, 3, 17], False), ([5, 15] * 4, False)):
        steps, peaks = levels(gaps, 4 * GIB)
        floors = [2 * GIB] * len(steps)
        cols = fc.Columns(steps, [s * 0.5 for s in steps], floors, peaks, [True] * len(steps))
        found = fc.predict(cols, peaks[-1] + 2.5 * GIB, leak_from=None, detect=lambda c: False)
        assert found.kind == fc.GROWING_DEMAND, gaps
        assert (found.seconds is not None) == said and (found.reason == "") == (said), (gaps, found)
        assert found.earliest_seconds is not None and found.earliest_seconds <= 10 * 0.5 * 3, (gaps, found)
