import memory_series

from oomsight.analysis import trend

GIB = 1 << 30
MIB = 1 << 20


def rows(floors, peaks, dt=0.02):
    return memory_series.rows(floors, peaks, dt, first=1)


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


def noisy(rng, n, slope, noise):
    floors = [5 * GIB + i * slope + rng.gauss(0, noise) for i in range(n)]
    return floors, [f + 6 * GIB + rng.gauss(0, noise / 2) for f in floors]


def test_a_leak_under_a_floor_made_noisy_by_variable_inputs_is_still_found():
    # what the loop keeps across the boundary (outputs of a variable-length batch) moves the floor
    # by +-400 MiB; a 128 MiB-a-step leak rises at only ~60 % of rows, yet even the lowest floors rise
    import random

    for seed in range(20):
        floors, peaks = noisy(random.Random(seed), 120, 128 * MIB, 400 * MIB)
        first = trend.first_leak_step(rows(floors, peaks), 80 * GIB)
        assert first is not None and first <= 40, seed


def test_noise_alone_never_raises_the_leak_flag_at_any_row():
    import random

    for seed in range(60):
        rng = random.Random(seed)
        floors, peaks = noisy(rng, rng.randint(10, 200), 0, 400 * MIB)
        judged = [trend.analyse(rows(floors[:k], peaks[:k]), 24 * GIB).leak for k in range(6, len(floors) + 1)]
        assert not any(judged), seed


def test_a_leak_that_grows_in_stairs_every_ten_steps_is_found_even_after_a_long_steady_start():
    stairs = [5 * GIB + (i // 10) * GIB for i in range(60)]
    assert trend.first_leak_step(rows(stairs, [f + 4 * GIB for f in stairs]), 80 * GIB) is not None
    late = [5 * GIB] * 150 + stairs
    first = trend.first_leak_step(rows(late, [f + 4 * GIB for f in late]), 80 * GIB)
    assert first is not None and 150 < first <= 200


def test_a_warm_up_that_rises_for_a_few_steps_and_stops_leaves_no_flag_behind():
    floors = [5 * GIB + min(i, 8) * 300 * MIB for i in range(100)]
    assert not trend.analyse(rows(floors, [f + 4 * GIB for f in floors]), 80 * GIB).leak


def test_a_floor_that_jumps_at_every_one_of_a_few_steps_is_a_leak_at_the_oom_but_a_growing_step_is_not():
    leak = [5 * GIB + i * 3 * GIB for i in range(5)]
    # from the second step on: the first row is warm-up
    assert trend.leak_before_oom(rows(leak, [f + 10 * GIB for f in leak]), 80 * GIB) == 9 * GIB
    # the same floors with a step that grows as fast: the input grew, nothing leaked
    assert trend.leak_before_oom(rows(leak, [f + (i + 1) * 4 * GIB for i, f in enumerate(leak)]), 80 * GIB) is None
    # rises far apart in size (a warm-up settling) are not steady
    uneven = [5 * GIB, 9 * GIB, 9.2 * GIB, 9.3 * GIB]
    assert trend.leak_before_oom(rows(uneven, [f + GIB for f in uneven]), 80 * GIB) is None
    assert trend.leak_before_oom(rows(leak[:2], leak[:2]), 80 * GIB) is None


def test_readings_no_sampler_could_write_pile_up_nothing():
    assert trend.piled_up([[1, "x"]] * 40, None, GIB) is None
    assert trend.piled_up([[1e308 * 10, 1]] * 40, None, GIB) is None
    assert trend.piled_up([[i / 10, i * GIB] for i in range(5)], None, 80 * GIB) is None  # too few, too short


def test_one_leak_detector_judges_the_floor_the_legacy_troughs_and_the_outside_memory_alike():
    # the same rising series (a noisy 300 MiB a step) as allocator floors, as legacy window troughs and
    # as memory outside the allocator (the rows' 7th column): the same growth from trend.leak_in
    floors = [20 * GIB + s * 300 * MIB + (s % 3) * 40 * MIB for s in range(3, 23)]
    rows = [[s, float(s), f, f + 4 * GIB, f + 5 * GIB, 1] for s, f in zip(range(3, 23), floors)]
    outside_rows = [[s, float(s), 20 * GIB, 24 * GIB, 25 * GIB, 1, f - 20 * GIB] for s, f in zip(range(3, 23), floors)]
    troughs = [[float(s), f, s] for s, f in zip(range(3, 23), floors)]
    found = trend.analyse(rows, 80 * GIB)
    assert found.leak
    assert trend.legacy_leak(troughs, 80 * GIB) == found.floor_growth_bytes
    assert trend.outside_leak(outside_rows, 80 * GIB) == found.floor_growth_bytes
    assert not trend.analyse(outside_rows, 80 * GIB).leak  # the allocator's own floor is flat


def test_outside_memory_under_the_growth_bar_or_unknown_is_no_leak():
    small = [[s, float(s), GIB, 2 * GIB, 3 * GIB, 1, s * 10 * MIB] for s in range(3, 23)]  # 190 MiB in all
    unknown = [[s, float(s), GIB, 2 * GIB, 3 * GIB, 1, -1] for s in range(3, 23)]
    assert trend.outside_leak(small, 80 * GIB) is None
    assert trend.outside_leak(unknown, 80 * GIB) is None
    assert trend.outside_leak([[3, 0.0, 1, 2, 3, 1, "x"]], 80 * GIB) is None  # no hook writes that: no verdict
