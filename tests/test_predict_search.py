"""Issue 34, steps 2-4: the verdict on what runs out (peak reserved, the CUDA context outside it), searches in
at most four traces where memory is affine in the batch, and bad inputs refused in one line."""

from __future__ import annotations

import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from oomsight.predict import parallel, tracing  # noqa: E402
from oomsight.predict.predictor import affine_search  # noqa: E402
from oomsight.tools import cli  # noqa: E402

LLAMA_7B = ("llama:hidden_size=4096,intermediate_size=11008,num_hidden_layers=32,num_attention_heads=32,"
            "num_key_value_heads=32,vocab_size=32000,max_position_embeddings=4096")  # fmt: skip


def test_largest_batch_of_a_7b_config_takes_at_most_four_traces_and_is_judged_on_reserved(
    capsys: Any, monkeypatch: Any
) -> None:
    pytest.importorskip("transformers")
    traces = []
    plain = tracing.trace_steps

    def counted(*args: Any, **kwargs: Any) -> Any:
        traces.append(1)
        return plain(*args, **kwargs)

    monkeypatch.setattr(tracing, "trace_steps", counted)
    argv = ["predict", "--model", LLAMA_7B, "--seq-len", "512", "--batch", "16", "--dtype", "bf16", "--gpu", "H100",
            "--largest-batch", "--steps", "2", "--json"]  # fmt: skip
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    search = out["largest_batch"]
    changes = out.get("changes") or {"tried": []}  # batch 16 does not fit: one trace per change tried (issue 51)
    assert len(traces) - len(changes["tried"]) <= 4, search["tried"]
    tried = dict((b, ok) for b, ok in search["tried"])
    best = search["max_batch_size"]
    assert tried[best] is True and tried.get(best + 1) is False
    assert search["capacity_bytes"] == out["gpu"]["usable_bytes"]  # the GPU less the CUDA context


@pytest.mark.parametrize("noise", [0, 3 * 10**6])
@pytest.mark.parametrize("start", [1, 8, 50])
def test_an_affine_peak_is_searched_in_four_traces_and_the_answer_is_the_last_that_fits(noise: int, start: int) -> None:
    calls: list[int] = []

    def peaks(b: int) -> tuple[int, int]:
        line = 2 * 10**9 + 3 * 10**8 * b
        return line, line + 10**8 + (noise if b % 2 else 0)

    def measure(b: int) -> tuple[int, int]:
        calls.append(b)
        return peaks(b)

    budget = 70 * 10**9
    best, _ = affine_search(measure, budget, start)
    assert best == max(b for b in range(1, 1000) if peaks(b)[1] <= budget)
    assert len(set(calls)) <= 4


def test_a_peak_that_is_not_affine_falls_back_to_bisection_and_still_answers_right() -> None:
    def peak_of(b: int) -> int:
        return 5_000 + 300 * b + (b * b) // 5

    found = parallel.largest_batch(peak_of, 40_000, start=4)
    assert found["max_batch_size"] == max(b for b in range(1, 1000) if peak_of(b) <= 40_000)
