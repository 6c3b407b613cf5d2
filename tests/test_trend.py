from oomsight.analysis import trend

GIB = 1 << 30
MIB = 1 << 20


def rows(floors, peaks, dt=0.02):
    return [[i + 1, 100.0 + i * dt, f, p, p, 1.0] for i, (f, p) in enumerate(zip(floors, peaks))]


def test_a_steady_leak_is_found_and_forecast_in_steps_and_seconds():
    floors = [GIB + i * 128 * MIB for i in range(30)]
    t = trend.analyse(rows(floors, [f + 2 * GIB for f in floors]), 16 * GIB)
    assert t.leak and not t.growing
    assert abs(t.floor_slope - 128 * MIB) < MIB
    last_peak = floors[-1] + 2 * GIB
    assert abs(t.steps_to_oom - (16 * GIB - last_peak) / (128 * MIB)) < 1
    assert abs(t.seconds_to_oom - t.steps_to_oom * 0.02) < 0.01


def test_longer_sequences_that_raise_the_floor_a_little_are_growing_demand_not_a_leak():
    # the current batch's outputs live across the boundary: the floor rises with the input, the peak far more
    floors = [GIB + i * 16 * MIB for i in range(30)]
    peaks = [GIB + i * 256 * MIB for i in range(30)]
    t = trend.analyse(rows(floors, peaks), 16 * GIB)
    assert not t.leak and t.growing


def test_variable_lengths_and_a_flat_floor_raise_nothing():
    import random

    rng = random.Random(0)
    floors = [GIB + rng.randint(0, 64) * MIB for _ in range(60)]
    peaks = [f + rng.randint(1, 4) * GIB for f in floors]
    t = trend.analyse(rows(floors, peaks), 16 * GIB)
    assert not t.leak and not t.growing and t.steps_to_oom is None


def test_warm_up_steps_do_not_count_and_a_late_leak_is_still_seen():
    floors = [GIB] * 3 + [2 * GIB] * 40 + [2 * GIB + i * 64 * MIB for i in range(12)]
    t = trend.analyse(rows(floors, [f + GIB for f in floors]), 16 * GIB)
    assert t.leak
    assert trend.first_leak_step(rows(floors, [f + GIB for f in floors]), 16 * GIB) > 43


def test_a_small_rise_below_the_growth_threshold_is_not_a_leak():
    floors = [GIB + i * MIB for i in range(30)]
    assert not trend.analyse(rows(floors, [f + GIB for f in floors]), 80 * GIB).leak


def test_rows_no_hook_could_write_judge_as_no_trend_never_an_error():
    huge_steps = [[1e300 * (i + 3), 100.0 + i, GIB + i, 2 * GIB, 0, 1] for i in range(20)]
    assert trend.analyse(huge_steps, 16 * GIB) == trend.EMPTY  # the slope overflows
    huge = [[i + 3, 100.0 + i, (2**63 - 1) * (i % 2), 1e308, 0, 1] for i in range(20)]
    assert not trend.analyse(huge, 16 * GIB).leak
    assert trend.analyse([[1, 2, "x", 4, 5, 1]] * 10, GIB) == trend.EMPTY


def test_a_short_step_row_gives_no_floor_or_peak_series():
    from oomsight.metrics import family

    d = {"steps_memory": [[1, 2.0]], "allocator": {}, "limit_bytes": None, "total_bytes": GIB}
    assert family._row(d, trend.FLOOR) is None and family._row(d, trend.PEAK) is None
