"""Issue 43: causes from what the job itself shows across its steps (wire 1.10), as spaces of series.

Each test composes step rows (or backward rows) from independent axes (sizes, periods, noise, how the
memory is held) and asserts the invariant over all of them:

- state that appears as parameters start to train (the rows' held column) is never a leak, while the same
  floors without the column are (so the column, not a rule that guesses, decides);
- a buffer that fills to its cap, and buffers reset every epoch, are no leak once the series shows it
  (a plateau, a release), while a leak in stairs of any period stays one;
- a step's own memory that rises with its input is growing demand with ``bound_input`` first; one that rises
  at the same input in a model with experts names the capacity factor first; neither is fragmentation;
- frozen weights that fill the GPU name the quantised base first, the adapters still training;
- outputs kept through an accumulation window are a leak whose first remedy is to stop keeping them.
"""

from __future__ import annotations

import itertools
import random

import pytest

from oomsight.analysis import remedies, trend
from oomsight.analysis.diagnosis import OomFacts, diagnose

GIB = 1 << 30
MIB = 1 << 20
CAPACITY = 80 * GIB


def row(step, floor, peak, held=-1, elements=-1):
    """One step row of wire 1.10: [step, time, floor, peak, reserved, exact, outside, held, input]."""
    return [step, 1000.0 + step * 0.5, floor, peak, peak, 1, -1, held, elements]


def facts(**kw):
    base = OomFacts(
        requested_bytes=2 * GIB,
        device_total_bytes=CAPACITY,
        device_free_bytes=GIB // 2,
        physical_free_bytes=GIB // 2,
        allocated_bytes=75 * GIB,
        reserved_bytes=76 * GIB,
        inactive_split_bytes=0,
        nvml=None,
        categories=None,
        trend=[],
        expandable_segments=False,
        phase="forward",
        grad_enabled=True,
        model_states={
            "parameters_bytes": GIB,
            "gradients_bytes": GIB,
            "optimizer_state_bytes": 2 * GIB,
            "optimizer_state_expected_bytes": 2 * GIB,
            "expert_parameters_bytes": 0,
        },
    )
    base.update(kw)
    return base


def leak_at_any_prefix(rows, start):
    """Whether the rows were called a leak at any row from ``start`` on (the live flag, row by row)."""
    return any(trend.analyse(rows[:end], CAPACITY).leak for end in range(start, len(rows) + 1))


# ------------------------------------------------------------------ state that appears as parameters train
UNFREEZE = list(itertools.product((2, 3, 5), (8, 12), (256 * MIB, 2 * GIB), (0.0, 64 * MIB)))


@pytest.mark.parametrize(("every", "layers", "layer_state", "noise"), UNFREEZE)
def test_state_appearing_as_layers_unfreeze_is_no_leak_and_would_be_one_without_the_held_column(
    every, layers, layer_state, noise
):
    rng = random.Random(every * 100 + layers)
    out, bare = [], []
    for step in range(1, every * layers + 12):
        held = layer_state * min(1 + step // every, layers)
        floor = 10 * GIB + held + rng.uniform(0, noise)
        out.append(row(step, floor, floor + 20 * GIB, held=held))
        bare.append(row(step, floor, floor + 20 * GIB))
    assert not leak_at_any_prefix(out, 3)
    if layer_state * (layers - 1) >= 256 * MIB * 2:  # large enough for a leak, as the bare floors are
        assert leak_at_any_prefix(bare, 3)


@pytest.mark.parametrize(("every", "layers", "layer_state", "noise"), UNFREEZE[:6])
def test_a_leak_beside_state_appearing_is_still_a_leak(every, layers, layer_state, noise):
    rows, kept = [], 0
    for step in range(1, 40):
        held = layer_state * min(1 + step // every, layers)
        kept += 256 * MIB
        floor = 10 * GIB + held + kept
        rows.append(row(step, floor, floor + 20 * GIB, held=held))
    assert trend.analyse(rows, CAPACITY).leak


# ------------------------------------------------------------------ buffers to a cap, buffers reset each epoch
FILLS = list(itertools.product((6, 12, 30), (64 * MIB, 512 * MIB), (0, 32 * MIB)))
EPOCHS = list(itertools.product((7, 15, 40), (32 * MIB, 256 * MIB), (3, 5)))


@pytest.mark.parametrize(("fill", "per_step", "noise"), FILLS)
def test_a_buffer_filled_to_its_cap_is_no_leak_once_it_stays(fill, per_step, noise):
    rng = random.Random(fill)
    rows = []
    for step in range(1, 3 + fill + 60):
        floor = 8 * GIB + per_step * min(max(step - 2, 0), fill) + rng.uniform(0, noise)
        rows.append(row(step, floor, floor + 16 * GIB))
    flat_for = max(trend.th.count("recent_rows"), 2)  # the plateau rule's least wait
    for end in range(3 + fill + 2 * flat_for + 2, len(rows) + 1):
        assert not trend.analyse(rows[:end], CAPACITY).leak, end


@pytest.mark.parametrize(("period", "per_stair"), list(itertools.product((1, 3, 8, 16), (256 * MIB, GIB))))
def test_a_leak_in_stairs_of_any_period_stays_a_leak_between_its_stairs(period, per_stair):
    rows = []
    for step in range(1, 3 + period * 10):
        floor = 8 * GIB + per_stair * (step // period)
        rows.append(row(step, floor, floor + 16 * GIB))
    first = trend.first_leak_step(rows, CAPACITY)
    assert first is not None
    assert all(trend.analyse(rows[:end], CAPACITY).leak for end in range(first + 1, len(rows) + 1))


@pytest.mark.parametrize(("epoch", "per_step", "epochs"), EPOCHS)
def test_buffers_reset_every_epoch_are_no_leak_after_the_first_reset(epoch, per_step, epochs):
    rows = []
    for step in range(1, 3 + epoch * epochs):
        floor = 8 * GIB + per_step * ((step - 3) % epoch if step >= 3 else 0)
        rows.append(row(step, floor, floor + 16 * GIB))
    assert not any(trend.analyse(rows[:end], CAPACITY).leak for end in range(3 + epoch + 1, len(rows) + 1))


def test_a_leak_that_outgrows_what_the_job_released_is_a_leak_again():
    rows = []
    for step in range(1, 80):
        floor = 8 * GIB + (256 * MIB * (step % 15) if step < 30 else 256 * MIB * (step - 30))
        rows.append(row(step, floor, floor + 16 * GIB))
    assert trend.analyse(rows, CAPACITY).leak


# ------------------------------------------------------------------ the step's own demand
def demand_rows(stages, every, grows_input, base=4 * GIB):
    out = []
    step = 1
    for k in range(stages):
        for _ in range(every):
            out.append(
                row(step, 10 * GIB, 10 * GIB + base * 2**k, held=4 * GIB, elements=4096 * (2**k if grows_input else 1))
            )
            step += 1
    return out


RAMPS = list(itertools.product((3, 4), (2, 3, 5), (True, False)))


@pytest.mark.parametrize(("stages", "every", "grows_input"), RAMPS)
def test_a_steps_own_memory_rising_in_stairs_is_seen_with_whether_its_input_rose(stages, every, grows_input):
    d = trend.analyse(demand_rows(stages, every, grows_input), CAPACITY).demand
    assert d is not None and d.input_rose is grows_input
    assert not trend.analyse(demand_rows(stages, every, grows_input), CAPACITY).leak


@pytest.mark.parametrize(("stages", "every", "grows_input"), RAMPS)
@pytest.mark.parametrize("experts", [0, 6 * GIB])
def test_a_ramp_is_growing_demand_bound_input_first_and_a_routing_growth_names_the_capacity(
    stages, every, grows_input, experts
):
    steps = demand_rows(stages, every, grows_input)
    ms = {**facts()["model_states"], "expert_parameters_bytes": experts}
    # the OOM early in the next stage's step: little allocated yet, a large cache of the last stage's blocks
    f = facts(
        steps_memory=steps,
        model_states=ms,
        allocated_bytes=30 * GIB,
        reserved_bytes=70 * GIB,
        requested_bytes=12 * GIB,
        device_free_bytes=GIB,
        largest_free_block_bytes=8 * GIB,
    )
    d = diagnose(f)
    assert d["cause"] == "growing_demand", d["summary"]
    first = d["facts"]["remedies"][0]
    assert first == ("expert_capacity" if experts and not grows_input else "bound_input"), d["facts"]["remedies"]
    assert "expandable" not in d["facts"]["remedies"]


def test_variable_inputs_with_a_flat_median_raise_no_demand():
    rng = random.Random(5)
    rows = []
    for step in range(1, 60):
        own = rng.choice((2, 4, 8, 16)) * GIB
        rows.append(row(step, 10 * GIB, 10 * GIB + own, elements=int(own // MIB)))
    assert trend.analyse(rows, CAPACITY).demand is None


# ------------------------------------------------------------------ frozen weights, outputs kept in a window
@pytest.mark.parametrize("quantized", [0, 30 * GIB])
@pytest.mark.parametrize("frozen", [56 * GIB, 64 * GIB])
def test_frozen_weights_that_fill_the_gpu_name_the_quantised_base_first_unless_it_is_quantised(frozen, quantized):
    ms = {
        "parameters_bytes": frozen + GIB,
        "gradients_bytes": GIB,
        "optimizer_state_bytes": 2 * GIB,
        "optimizer_state_expected_bytes": 2 * GIB,
        "frozen_parameters_bytes": frozen,
        "adapter_parameters_bytes": GIB,
        "quantized_parameters_bytes": quantized,
    }
    d = diagnose(facts(model_states=ms))
    assert d["cause"] == "model_states"
    keys = d["facts"]["remedies"]
    assert keys[0] == ("offload_frozen" if quantized else "quantize_base"), keys
    assert "This changes the result" in d["remedies"][0] or keys[0] not in remedies.CHANGES


def window(backwards, kept, start=40 * GIB, jitter=0):
    rng = random.Random(backwards)
    return [[100 + k, 1000.0 + k, start + k * kept + rng.randint(0, jitter)] for k in range(backwards)]


@pytest.mark.parametrize(("backwards", "kept"), list(itertools.product((4, 7, 16), (512 * MIB, 2 * GIB))))
def test_outputs_kept_through_an_accumulation_window_are_a_leak_told_to_stop_keeping_them(backwards, kept):
    steady = [row(s, 10 * GIB, 40 * GIB, held=4 * GIB) for s in range(1, 12)]
    d = diagnose(
        facts(
            steps_memory=steady,
            backwards_memory=window(backwards, kept, jitter=int(kept // 10)),
            most_forwards_per_backward=1,
            forwards_since_backward=1,
        )
    )
    assert d["cause"] == "leak" and d["facts"]["remedies"][0] == "kept_outputs", d["summary"]


@pytest.mark.parametrize("shape", ["flat", "first_only", "noisy_flat"])
def test_an_accumulation_window_whose_backwards_free_what_they_made_is_no_leak(shape):
    rows = {
        "flat": window(8, 0),
        "first_only": [[1, 1.0, 30 * GIB]] + [[k, 1.0 + k, 34 * GIB] for k in range(2, 9)],
        "noisy_flat": window(8, 0, jitter=256 * MIB),
    }[shape]
    assert trend.kept_in_window(rows, CAPACITY) is None


def test_every_new_remedy_says_what_it_changes_or_changes_nothing():
    for key in ("bound_input", "kept_outputs", "expert_capacity", "quantize_base"):
        (text,) = remedies.texts([key])
        assert (key in remedies.CHANGES) == ("This changes the result" in text)
    assert "bound_input" not in remedies.CHANGES and "kept_outputs" not in remedies.CHANGES


OUTGREW = [
    (4096, 6 * GIB, "expert_capacity"),
    (16384, 6 * GIB, "bound_input"),
    (4096, 0, "bound_input"),
    (-1, 6 * GIB, "bound_input"),
]


@pytest.mark.parametrize(("now", "experts", "first"), OUTGREW)
def test_a_failing_step_that_outgrew_the_earlier_ones_at_their_input_names_the_routing_in_a_model_with_experts(
    now, experts, first
):
    steady = [row(s, 10 * GIB, 30 * GIB, held=4 * GIB, elements=4096) for s in range(1, 12)]
    ms = {**facts()["model_states"], "expert_parameters_bytes": experts}
    d = diagnose(
        facts(
            steps_memory=steady, model_states=ms, allocated_bytes=70 * GIB, requested_bytes=8 * GIB, input_elements=now
        )
    )
    assert d["cause"] == "growing_demand" and d["facts"]["remedies"][0] == first, d["summary"]


# ---------------------------------------------- found by the job space: the held column, states beside demand
HELD_FALLS = list(itertools.product((6, 12), (False, True), (64 * MIB, GIB), (0.3, 0.7)))


@pytest.mark.parametrize(("fill", "two_sizes", "drop", "at"), HELD_FALLS)
def test_a_fall_of_the_held_state_measured_is_no_rise_of_what_the_job_keeps(fill, two_sizes, drop, at):
    """A GAN (rows of two sizes) training from a replay ring: its held state was measured again once while
    one optimizer had set its gradients to None, the column fell with the floor flat, and the floor minus the
    column rose as a leak does (the job space: told leak). A buffer at its cap stays no leak."""
    rows, held, n = [], 4 * GIB, 3 + fill + 60
    for step in range(1, n):
        if step == int(n * at):
            held -= drop
        floor = 8 * GIB + 4 * GIB + 64 * MIB * min(max(step - 2, 0), fill) + (GIB if two_sizes and step % 2 else 0)
        rows.append(row(step, floor, floor + 16 * GIB, held=held))
    flat_for = max(trend.th.count("recent_rows"), 2)
    for end in range(3 + fill + 2 * flat_for + 2, len(rows) + 1):
        assert not trend.analyse(rows[:end], CAPACITY).leak, end


STATES_HEAVY = list(itertools.product((0.7, 0.85), ("routing", "input", "neither")))


@pytest.mark.parametrize(("share", "grew"), STATES_HEAVY)
def test_states_filling_most_of_the_gpu_are_not_the_cause_when_the_step_outgrew_what_fitted_them(share, grew):
    """A collapsing MoE router whose states took 72 % of the device was told model_states, cpu_offload first
    (the job space): the same states fitted every earlier step; the routing (or the input) grew the step."""
    states = int(share * CAPACITY)
    ms = {
        "parameters_bytes": states // 4,
        "gradients_bytes": states // 4,
        "optimizer_state_bytes": states // 2,
        "optimizer_state_expected_bytes": states // 2,
        "expert_parameters_bytes": GIB if grew == "routing" else 0,
    }
    elements = [4096] * 11 if grew != "input" else [1024] * 4 + [2048] * 4 + [4096] * 3
    floor = states + GIB
    steady = [
        row(s, floor, floor + 3 * GIB * e // 4096, held=states * 3 // 4, elements=e)  # the step's own follows its input
        for s, e in zip(range(1, 12), elements)
    ]
    now = 8192 if grew == "input" else 4096
    d = diagnose(
        facts(
            steps_memory=steady,
            model_states=ms,
            allocated_bytes=floor + 6 * GIB,
            requested_bytes=CAPACITY - floor - 5 * GIB,
            input_elements=now,
        )
    )
    if grew == "neither":  # the step outgrew its earlier ones with nothing the job showed: the states rule
        assert d["cause"] == "model_states", d["summary"]
    else:
        first = "expert_capacity" if grew == "routing" else "bound_input"
        assert d["cause"] == "growing_demand" and d["facts"]["remedies"][0] == first, d["summary"]
