"""Issue 43's fresh workloads (benchmarks/heldout/wl_unseen.py), recorded on an H100 on 2026-12-07 by
``benchmarks/issue43_gpu.sh`` (tree 33ff4f8: 8/8 judged as labelled, each first remedy the one the
workload's remedy run applied and verified to fit, 6/6) and judged here again on the CPU.

Each tape is a job no rule here was written from: a batch doubling every few steps, accumulation that keeps
every micro-batch's logits (for the whole run, or through each window), progressive unfreezing under AdamW,
a DQN replay buffer filling to its cap, epoch-reset metric buffers, a frozen-base LoRA job, an MoE whose
router collapses. What must hold: the cause as labelled, the labelled fix first (and it fitted on the GPU),
a result-changing remedy first only where ``LEADS_WHEN`` lets the evidence make it lead, and the live leak
flag down at the end of every job that keeps nothing (a buffer may raise it while it fills: nothing in
memory tells a filling buffer from a leak that will not stop; it must clear once the buffer stays).
"""

from __future__ import annotations

import json
import os

import pytest

from benchmarks.corpus import evaluate
from oomsight.analysis import remedies

from fakes import ROOT

TAPES = os.path.join(ROOT, "tests", "fixtures", "heldout-issue43")
"""``$OUT/heldout`` of issue43_gpu.sh: labels.json (every held-out workload's), runs.json, the tapes."""
RECORDED = {
    "gpt2_batch_size_doubling",
    "gpt2_accum_keeps_microbatch_logits",
    "gpt2_accum_window_keeps_logits",
    "gpt2_progressive_unfreezing_adamw",
    "dqn_replay_buffer_fills_then_flat",
    "classifier_epoch_metric_buffers_fits",
    "gpt2_frozen_base_lora_no_room",
    "moe_router_collapse_padded_dispatch",
}


@pytest.fixture(scope="module")
def judged():
    return {r["scenario"]: r for r in evaluate.evaluate(TAPES)["scenarios"]}


@pytest.fixture(scope="module")
def runs():
    with open(os.path.join(TAPES, "runs.json")) as fh:
        return json.load(fh)


def test_every_workload_was_recorded_and_ran_as_labelled_on_the_gpu(judged, runs):
    assert set(judged) == RECORDED
    for name, row in judged.items():
        plain = next(r for r in runs if r["scenario"] == name and not r["remedy"])
        assert plain["fits"] is (row["label"] == "none"), plain  # the labelled ones ran out, the others fit
        assert (row["ooms"] >= 1) is (row["label"] != "none"), row


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_each_is_judged_as_labelled(judged, name):
    row = judged[name]
    assert row["cause"] == row["label"], row.get("summary")


@pytest.mark.parametrize("name", sorted(n for n in RECORDED if "fits" not in n and "flat" not in n))
def test_the_first_remedy_is_the_fix_that_fitted_on_the_gpu(judged, runs, name):
    row = judged[name]
    fixed = next(r for r in runs if r["scenario"] == name and r["remedy"])
    assert fixed["fits"], fixed["tail"]
    assert row["first_remedy"] == row["remedy_applied"], (row["first_remedy"], row.get("remedies"))
    if row["first_remedy"] in remedies.CHANGES:  # it may lead only on what the job shows
        assert row["first_remedy"] in remedies.LEADS_WHEN, row


@pytest.mark.parametrize("name", sorted(n for n in RECORDED if n != "gpt2_accum_keeps_microbatch_logits"))
def test_the_live_leak_flag_is_down_at_the_end_of_every_job_that_keeps_nothing_across_steps(judged, name):
    row = judged[name]
    assert row["live_flag_final"] == 0, row
    if name != "dqn_replay_buffer_fills_then_flat":  # the one whose buffer rises for 40 % of the run
        assert row["live_flag_max"] == 0, row


def test_the_leak_across_steps_raises_the_live_flag(judged):
    row = judged["gpt2_accum_keeps_microbatch_logits"]
    assert row["live_flag_max"] == 1 and row["live_flag_final"] == 1, row
