"""The never-regress scorecard (issue 48): every labelled case ever recorded, re-judged by the current
diagnosis; a verdict the record holds right may never go wrong (``benchmarks/scorecard.py``)."""

from __future__ import annotations

import json

from benchmarks import scorecard


def test_no_verdict_the_scorecard_holds_right_goes_wrong():
    with open(scorecard.RECORD) as fh:
        record = json.load(fh)
    now = scorecard.card()
    assert scorecard.lowered(record, now) == []
    for criterion, t in scorecard.totals(now).items():
        assert t["right"] >= record["totals"][criterion]["right"], criterion


def test_the_scorecard_covers_every_labelled_folder_and_case():
    with open(scorecard.RECORD) as fh:
        record = json.load(fh)
    folders = {case.split("/", 1)[0] for case in record["cases"]}
    assert folders == set(scorecard.folders())
    assert set(scorecard.card()) >= set(record["cases"])


def test_a_lowered_verdict_is_named():
    record = {"cases": {"x/a": {"cause": True, "first_remedy": None, "live_flag": True}}}
    assert scorecard.lowered(record, {"x/a": {"cause": False, "first_remedy": None, "live_flag": True}}) == [
        "x/a: cause"
    ]
    assert scorecard.lowered(record, {}) == ["x/a: cause", "x/a: live_flag"]
