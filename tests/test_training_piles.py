"""Training jobs that keep several forwards' graphs until one backward (benchmarks/heldout/wl_piles.py),
recorded on an H100 on 2026-12-05 by a wire-1.8 hook (h200_session.sh stage ``piles``, 5/5 judged as
labelled, the 3 first remedies verified to fit) and judged on the CPU.

Four of them keep their graphs on purpose (summed micro-batch losses after a checkpoint save, in train
and in eval mode; a longer REINFORCE episode; truncated BPTT after a no_grad validation) and run out
because the job's schedule grew what one backward consumes: they must not be called a leak, and the
first remedy must not change what the job learns. The fifth (a validation loop inside a training job
that keeps its outputs' graphs) is the leak.
"""

from __future__ import annotations

import os

import pytest

from benchmarks.corpus import evaluate
from oomsight.analysis import remedies

from fakes import ROOT

PILES = os.path.join(ROOT, "tests", "fixtures", "heldout-wire18")
"""``$R/piles`` of the GPU stage ``piles``: labels.json, runs.json and one tape per workload."""
LEGITIMATE = {
    "gpt2_summed_microbatches_after_checkpoint_save",
    "gpt2_eval_mode_summed_microbatches_after_checkpoint_save",
    "reinforce_long_episode",
    "lstm_tbptt_after_no_grad_validation",
}
LEAKS = {"gpt2_validation_keeps_graphs_in_training_job"}


@pytest.fixture(scope="module")
def judged():
    return evaluate.evaluate(PILES)


def by_name(judged, name):
    return next(r for r in judged["scenarios"] if r["scenario"] == name)


def test_every_pile_workload_was_recorded(judged):
    assert {r["scenario"] for r in judged["scenarios"]} >= LEGITIMATE | LEAKS


@pytest.mark.parametrize("name", sorted(LEGITIMATE | LEAKS))
def test_each_is_judged_as_labelled(judged, name):
    row = by_name(judged, name)
    assert row["ooms"] >= 1, row
    assert row["cause"] == row["label"], row.get("summary")


@pytest.mark.parametrize("name", sorted(LEGITIMATE))
def test_a_pile_its_backward_consumes_is_no_leak_and_its_first_remedy_keeps_the_result(judged, name):
    row = by_name(judged, name)
    assert row["label"] != "leak"
    assert row["cause"] != "leak", row.get("summary")
    assert row["first_remedy"] not in remedies.CHANGES, (row["first_remedy"], row.get("remedies"))
    assert row["leak_flag_snapshots"] == 0, row


def test_the_validation_that_keeps_graphs_is_a_leak_with_the_leak_remedy_offered(judged):
    for name in LEAKS:
        row = by_name(judged, name)
        # a training job: keeping nothing first; no_grad may follow, said as changing the result
        assert row["cause"] == "leak" and row["first_remedy"] == "leak", row


def test_no_false_leak_flags(judged):
    assert judged["false_leak_flags"] == 0
