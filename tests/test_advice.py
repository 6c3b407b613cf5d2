"""The remedy-savings estimator: every rule with numbers, and the choice of what fits."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from oomsight.analysis import advice
from oomsight.analysis.advice import Assumptions, Footprint
from oomsight.analysis.inventory import take_inventory
from oomsight.tools import report, tape
from oomsight.tools.demo import TAPE
from oomsight.wire.spool import SpoolReader

from fakes import GIB

# parameters 1, gradients 1, optimizer state 2, activations 8, other 0.5 (an allocation in flight): 12.5 GiB
FP = Footprint(GIB, GIB, 2 * GIB, 8 * GIB, 12 * GIB + GIB // 2, 12 * GIB)
A = Assumptions()


def by_remedy(fp: Footprint, a: Assumptions = A) -> dict[str, advice.Estimate]:
    return {e.remedy: e for e in advice.estimate_all(fp, a)}


def test_autocast_halves_fp32_activations_but_adds_a_bf16_copy_of_the_weights():
    e = advice.autocast(FP, A)
    assert e.saving_bytes == 4 * GIB - GIB // 2  # 8 GiB / 2 saved, 1 GiB / 2 of weight copies added
    assert e.peak_bytes == 9 * GIB
    assert "fp32" in e.assumption and "bf16 copy" in e.assumption


def test_autocast_can_raise_the_peak_when_parameters_dominate():
    fp = Footprint(8 * GIB, 8 * GIB, 16 * GIB, 2 * GIB, 34 * GIB, 40 * GIB)
    assert advice.autocast(fp, A).saving_bytes == GIB - 4 * GIB


def test_checkpointing_keeps_one_over_root_n_of_the_activations_for_the_n_it_assumes():
    assert advice.checkpointing(FP, A).saving_bytes == 6 * GIB  # n=16: 1/4 of 8 GiB stays
    four = advice.checkpointing(FP, Assumptions(checkpoint_blocks=4))
    assert four.saving_bytes == 4 * GIB  # n=4: 1/2 stays
    assert "4 equal blocks" in four.assumption and "50%" in four.assumption


def test_accumulation_by_k_divides_the_activations_by_k():
    assert advice.accumulation(FP, A).saving_bytes == 6 * GIB  # k=4: 2 GiB stay
    two = advice.accumulation(FP, Assumptions(accumulation_steps=2))
    assert two.saving_bytes == 4 * GIB and two.peak_bytes == 8 * GIB + GIB // 2
    assert "2 micro-batches" in two.assumption


def test_set_to_none_saves_the_smaller_of_gradients_and_activations():
    assert advice.set_to_none(FP, A).saving_bytes == GIB  # gradients 1 GiB < activations 8 GiB
    small_acts = Footprint(GIB, 4 * GIB, 0, GIB // 2, 6 * GIB, 8 * GIB)
    assert advice.set_to_none(small_acts, A).saving_bytes == GIB // 2
    assert "default since torch 2.0" in advice.set_to_none(FP, A).assumption


def test_a_smaller_batch_shrinks_the_activations_with_it():
    assert advice.smaller_batch(FP, A).saving_bytes == 4 * GIB
    assert advice.smaller_batch(FP, Assumptions(batch_ratio=0.25)).saving_bytes == 6 * GIB


def test_torch_compile_never_claims_a_saving_and_says_measure_it():
    for fp in (FP, Footprint(0, 0, 0, 100 * GIB, 100 * GIB, GIB)):
        e = by_remedy(fp)["compile"]
        assert (e.saving_bytes, e.peak_bytes, e.fits) == (None, None, None)
        assert "measure it" in e.assumption and "122512" in e.assumption


def test_estimates_come_largest_saving_first_with_compile_last():
    order = [e.remedy for e in advice.estimate_all(FP)]
    # checkpointing and accumulation tie at 6 GiB: the less intrusive change comes first
    assert order == ["checkpointing", "accumulation", "smaller_batch", "autocast", "set_to_none", "compile"]


def test_an_estimate_fits_below_the_capacity_minus_the_margin():
    found = by_remedy(FP)  # target: 95 % of 12 GiB = 11.4 GiB
    assert found["checkpointing"].fits is True  # 6.5 GiB
    assert found["set_to_none"].fits is False  # 11.5 GiB
    assert by_remedy(FP, Assumptions(margin_ratio=0.0))["set_to_none"].fits is True  # 11.5 <= 12


def test_choose_lists_the_remedies_that_fit_alone():
    choice = advice.choose(FP, advice.estimate_all(FP))
    assert [e.remedy for e in choice.fitting] == ["checkpointing", "accumulation", "smaller_batch", "autocast"]
    assert choice.excess_bytes == FP.peak_bytes - int(12 * GIB * 0.95)
    assert choice.judged and "estimated to fit alone" in choice.message


def test_choose_names_the_accumulation_steps_when_no_single_remedy_fits():
    a = Assumptions(margin_ratio=0.0)
    fp = Footprint(GIB, GIB, 2 * GIB, 8 * GIB, 12 * GIB + GIB // 2, 5 * GIB + GIB // 2)
    choice = advice.choose(fp, advice.estimate_all(fp, a), a)
    assert choice.fitting == []
    assert choice.accumulation_steps == 8  # room for activations: 5.5 - 4 - 0.5 = 1 GiB; 8 GiB / 8
    assert "accumulating 8 micro-batches" in choice.message


def test_choose_says_shard_when_the_static_memory_alone_does_not_fit():
    fp = Footprint(4 * GIB, 4 * GIB, 8 * GIB, 2 * GIB, 18 * GIB, 16 * GIB)
    choice = advice.choose(fp, advice.estimate_all(fp))
    assert choice.fitting == [] and choice.accumulation_steps is None
    assert "shard" in choice.message


def test_choose_says_nothing_is_needed_when_the_peak_fits():
    fp = Footprint(GIB, GIB, 2 * GIB, 8 * GIB, 12 * GIB, 140 * GIB)
    choice = advice.choose(fp, advice.estimate_all(fp))
    assert choice.fitting == [] and choice.excess_bytes < 0
    assert "nothing needed" in choice.message


def test_choose_does_not_judge_estimates_of_a_leak():
    choice = advice.choose(FP, advice.estimate_all(FP), cause="leak")
    assert choice.fitting == [] and choice.judged is False
    assert "fix the leak first" in choice.message


def test_accumulation_steps_to_fit_is_none_when_no_room_or_too_many():
    a = Assumptions(margin_ratio=0.0)
    assert advice.accumulation_steps_to_fit(Footprint(GIB, GIB, GIB, GIB, 4 * GIB, 3 * GIB), a) is None
    tight = Footprint(0, 0, 0, 100 * GIB, 100 * GIB, GIB)
    assert advice.accumulation_steps_to_fit(tight, a, max_steps=128) == 100
    assert advice.accumulation_steps_to_fit(tight, a) is None  # more than 64 micro-batches


def test_a_footprint_needs_activations_and_covers_at_least_the_categories():
    cat = {"parameters_bytes": GIB, "gradients_bytes": GIB, "optimizer_state_bytes": 2 * GIB}
    assert advice.footprint({**cat, "activations_bytes": None, "basis": "x", "measured_at": 0.0}, GIB) is None
    fp = advice.footprint({**cat, "activations_bytes": 8 * GIB, "basis": "x", "measured_at": 0.0}, 16 * GIB, GIB)
    assert fp is not None and fp.peak_bytes == 12 * GIB and fp.other_bytes == 0


@pytest.fixture(scope="module")
def h200_event(tmp_path_factory):
    spool = str(tmp_path_factory.mktemp("spool"))
    tape.replay(TAPE, spool, speed=1e6, sleep=lambda s: None)
    (event,) = SpoolReader(spool).read().events
    return spool, event


def test_an_oom_footprint_is_the_request_on_top_of_allocated_against_what_was_usable(h200_event):
    _, event = h200_event
    fp = advice.at_oom(event)
    assert fp is not None
    assert fp.peak_bytes == event["allocated_bytes"] + event["requested_bytes"]
    assert fp.capacity_bytes == event["diagnosis"]["facts"]["usable_bytes"] == 7505494016
    no_facts = copy.deepcopy(event)
    del no_facts["diagnosis"]["facts"]
    assert advice.at_oom(no_facts).capacity_bytes == event["device_total_bytes"]


def test_capacity_is_the_cap_else_the_limit_an_oom_reported_else_the_device(h200_event):
    _, event = h200_event
    device = {"total_bytes": 140 * GIB, "limit_bytes": None, "nvml": None}
    assert advice.capacity(device, []) == (140 * GIB, "device capacity")
    assert advice.capacity(device, [event]) == (7505494016, "limit at the OOM")
    assert advice.capacity({**device, "limit_bytes": 8 * GIB}, [event]) == (8 * GIB, "process cap")


def test_the_text_report_names_the_remedies_estimated_to_fit_an_exhaustion_oom(h200_event):
    spool, event = h200_event
    state = SpoolReader(spool).read()
    state.events[0]["diagnosis"]["cause"] = "exhaustion"
    text = report.render(take_inventory(state, event["time"] + 1), spool)
    assert "estimate (peak 6.98 GiB, target 6.64 GiB)" in text
    assert "activation checkpointing: peak about 2.13 GiB" in text
    state.events[0]["diagnosis"]["cause"] = "leak"
    assert "fix the leak first" in report.render(take_inventory(state, event["time"] + 1), spool)


def test_a_job_already_under_autocast_gets_no_autocast_estimate():
    fp = dataclasses.replace(FP, job={"autocast": True, "param_dtype": "float32"})
    assert "autocast" not in [e.remedy for e in advice.estimate_all(fp)]
    assert "autocast" in [e.remedy for e in advice.estimate_all(FP)]


def test_a_job_with_checkpointing_and_compile_gets_neither_estimated():
    fp = dataclasses.replace(FP, job={"checkpointing": True, "compiled": True})
    names = [e.remedy for e in advice.estimate_all(fp)]
    assert "checkpointing" not in names and "compile" not in names and "smaller_batch" in names


def test_an_oom_that_happened_is_never_told_nothing_is_needed():
    small = advice.Footprint(GIB, GIB, 2 * GIB, GIB, 5 * GIB, 80 * GIB)
    assert "nothing needed" in advice.choose(small, advice.estimate_all(small)).message
    oom = dataclasses.replace(small, oom=True)
    choice = advice.choose(oom, advice.estimate_all(oom))
    assert "nothing needed" not in choice.message and "yet this step ran out of memory" in choice.message
    assert not choice.judged
