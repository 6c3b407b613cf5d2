"""Remedies in two classes (docs/diagnosis.md, "Do no harm"): what changes the result says so wherever
it is offered, and is never first for a forward that may train."""

from __future__ import annotations

import glob
import os
import re

import pytest

from oomsight.analysis import remedies

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_result_changing_remedy_is_a_remedy_and_its_text_says_what_it_changes():
    assert set(remedies.CHANGES) <= set(remedies.REMEDY)
    for key, text in zip(remedies.CHANGES, remedies.texts(list(remedies.CHANGES))):
        assert text.endswith(f"This changes the result: {remedies.CHANGES[key]}.")
    moving = [k for k in remedies.REMEDY if k not in remedies.CHANGES]
    assert not any("changes the result" in t for t in remedies.texts(moving))


@pytest.mark.parametrize(
    ("keys", "first"),
    [
        (["no_grad", "leak", "eval_batch"], "leak"),
        (["quantize_base", "offload_frozen"], "offload_frozen"),
        (["eval_batch", "half_precision"], "history"),  # none only moves memory: the history, which changes nothing
        (["bound_input", "checkpointing"], "bound_input"),  # micro-batches and accumulation: the same effective batch
        (["checkpointing", "no_grad"], "checkpointing"),
        ([], None),
    ],
)
def test_a_remedy_that_only_moves_memory_comes_first(keys, first):
    out = remedies.harmless_first(keys)
    assert (out[0] if out else None) == first
    assert set(keys) <= set(out) and len(out) == len(set(out))


@pytest.mark.parametrize(
    ("keys", "shown", "first"),
    [
        (["quantize_base", "offload_frozen"], {"frozen"}, "quantize_base"),  # the weights it changes train nothing
        (["quantize_base", "offload_frozen"], {"routing"}, "offload_frozen"),
        (["expert_capacity", "bound_input"], {"routing"}, "expert_capacity"),  # the growth is the routing itself
        (["expert_capacity", "bound_input"], set(), "bound_input"),
        (["no_grad", "leak"], {"frozen", "routing"}, "leak"),  # no evidence lets no_grad lead a training forward
    ],
)
def test_a_result_changing_remedy_leads_only_where_the_evidence_shows_what_it_changes(keys, shown, first):
    out = remedies.harmless_first(keys, shown)
    assert out[0] == first and sorted(out) == sorted(keys)
    assert set(remedies.LEADS_WHEN) <= set(remedies.CHANGES)


WORDS = re.compile(r"autocast|no_grad|inference_mode|8-bit|lighter optimizer|bf16", re.IGNORECASE)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "docs", "runbooks", "*.md"))))
def test_a_runbook_that_offers_a_result_changing_remedy_says_it_changes_the_result(path):
    with open(path) as fh:
        text = fh.read()
    for paragraph in text.split("\n\n"):
        if WORDS.search(paragraph) and "- " in paragraph[:3] + paragraph:
            offered = [line for line in paragraph.split("\n- ") if WORDS.search(line)]
            for item in offered:
                assert re.search(r"chang\w* the result", " ".join(item.split())), (os.path.basename(path), item)


def test_the_dashboards_short_remedies_lead_with_one_that_moves_memory_and_say_what_changes():
    from dashboards import config

    for cause, text in config.CAUSE_REMEDY.items():
        advice = text.partition(": ")[2] or text
        first = advice.split(",")[0].split(";")[0]
        assert not WORDS.search(first) and "cap the batch" not in first, cause
        if WORDS.search(advice) or "capping" in advice:
            assert "change" in advice, cause
