"""The labelled OOM corpus recorded on the H200 (``benchmarks/corpus/``), judged on the CPU.

Each tape is one real run under ``oomsight run``; every OOM is diagnosed again from the facts
it recorded, so these tests judge the current rules on the same runs (docs/diagnosis.md).
"""

from __future__ import annotations

import os

import pytest

from benchmarks.corpus import evaluate
from oomsight.analysis import remedies
from oomsight.tools import tape
from oomsight.wire.schema import validate

from fakes import ROOT

CORPUS = os.path.join(ROOT, "tests", "fixtures", "corpus")


@pytest.fixture(scope="module")
def judged():
    return evaluate.evaluate(CORPUS)


def by_name(judged, name):
    return next(r for r in judged["scenarios"] if r["scenario"] == name)


def test_the_corpus_covers_every_cause_with_at_least_twenty_scenarios(judged):
    assert judged["total"] >= 20
    labels = {r["label"] for r in judged["scenarios"]}
    assert labels >= {
        "leak",
        "growing_demand",
        "activations",
        "model_states",
        "fragmentation",
        "oversized_request",
        "other_process",
        "non_pytorch_memory",
        "none",
    }


@pytest.mark.parametrize("name", sorted(evaluate.LABELS))
def test_every_scenario_is_labelled_correctly(judged, name):
    row = by_name(judged, name)
    assert row["cause"] == row["label"], row.get("summary")


def test_the_caught_oom_is_recovered_not_fatal(judged):
    assert by_name(judged, "recovered_by_user_code")["outcome"] == "recovered"


def test_the_fast_leak_is_flagged_within_thirty_steps_of_its_start(judged):
    # the leak starts with the first step; the flag needs the rows after warm-up
    first = by_name(judged, "leak_outputs_fast")["leak_first_step"]
    assert first is not None and first <= 30


def test_no_scenario_but_a_leak_ever_raises_the_leak_flag(judged):
    assert judged["false_leak_flags"] == 0
    for row in judged["scenarios"]:
        if row["label"] == "leak":
            assert row["leak_flag_snapshots"] > 0, row["scenario"]


def test_the_first_remedy_applied_makes_the_job_fit_in_at_least_80_percent(judged):
    verified = judged["remedy_first_verified"]
    assert verified >= 12
    assert judged["remedy_first_and_fits"] >= 0.8 * verified


def test_advice_never_names_a_remedy_the_job_already_uses(judged):
    for row in judged["scenarios"]:
        job = row.get("job") or {}
        for key in row.get("remedies") or []:
            in_use = remedies.IN_USE.get(key)
            assert not (in_use and job and in_use(job)), (row["scenario"], key, job)
    assert "autocast" not in by_name(judged, "steady_too_big_autocast")["remedies"]


@pytest.mark.parametrize("name", sorted(evaluate.LABELS))
def test_every_document_of_the_corpus_validates_against_the_current_schema(name):
    _header, records = tape.read(os.path.join(CORPUS, f"{name}.tape.jsonl.gz"))
    assert records
    for rec in records:
        validate(rec["doc"])


HELDOUT = os.path.join(ROOT, "tests", "fixtures", "heldout")
HELDOUT_WIRE15 = os.path.join(ROOT, "tests", "fixtures", "heldout-wire15")
"""The same workloads run again on the H200 by a wire-1.5 hook (its verdict on the step rows in
every snapshot, the leak flag read off it)."""
HELDOUT_WIRE17 = os.path.join(ROOT, "tests", "fixtures", "heldout-wire17")
"""Again on the H200 (2026-12-05) by a wire-1.7 hook: an OOM event of a process that never stepped
carries the memory left after each forward (``forwards_memory``)."""
KNOWN_HELDOUT_MISS = {"gpt2_eval_forgets_no_grad_accumulates"}
"""Before wire 1.7: a loop of forwards that runs out within a second in a process that never
stepped, between two samples: one forward could not be told from many (docs/diagnosis.md)."""


@pytest.fixture(
    scope="module", params=[HELDOUT, HELDOUT_WIRE15, HELDOUT_WIRE17], ids=["blind-run", "wire-1.5-run", "wire-1.7-run"]
)
def heldout(request):
    return request.param, evaluate.evaluate(request.param)


def test_the_held_out_h200_runs_are_judged_as_labelled_but_the_one_known_limit(heldout):
    """28 workloads written apart from the rules, run on the H200 under oomsight (25/28 when first
    judged; the two rules changed since are general: benchmarks/results/heldout-*.json). The
    wire-1.7 run has no miss: its forward rows tell the evaluation loop's leak."""
    folder, heldout = heldout
    assert heldout["total"] == 28
    wrong = {r["scenario"] for r in heldout["scenarios"] if not r["correct"]}
    assert wrong == (set() if folder == HELDOUT_WIRE17 else KNOWN_HELDOUT_MISS)
    assert heldout["false_leak_flags"] == 0
    for row in heldout["scenarios"]:
        if row["label"] == "leak" and row["scenario"] not in KNOWN_HELDOUT_MISS:
            assert row["cause"] == "leak" and row["first_remedy"] == "leak", row["scenario"]
        if row["scenario"] in KNOWN_HELDOUT_MISS and folder == HELDOUT_WIRE17:  # no optimizer, graphs kept
            assert row["cause"] == "leak" and row["first_remedy"] == "no_grad", row
