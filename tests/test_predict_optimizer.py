"""The optimizer implementation as an input (issue 51): foreach, fused and for-loop AdamW, each with the
temporaries its ``optimizer.step()`` makes, checked against hand arithmetic on a model whose sizes are known."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from oomsight.predict import optimizer, predict_peak, prose
from oomsight.tools import predict_command as command

W1, B1, W2, B2 = 256 * 512, 512, 512 * 128, 128
"""The elements of the two layers' weights and biases."""
PARAM_BYTES = 4 * (W1 + B1 + W2 + B2)


def build() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 128))


def batch(n: int) -> torch.Tensor:
    return torch.randn(n, 256)


def transient(impl: Any, name: str = "adamw") -> int:
    found = predict_peak(build, batch, 4, optimizer.factory(name, impl), steps=2)
    return int(found.moments["optimizer_step_transient_bytes"])


def test_foreach_adamw_makes_one_copy_of_the_whole_parameter_list_and_is_cuda_s_default() -> None:
    assert transient("foreach") == PARAM_BYTES == 788_992  # _foreach_sqrt of every exp_avg_sq at once
    assert transient(None) == PARAM_BYTES  # foreach left unset: CUDA's default


def test_fused_adamw_makes_no_temporary_and_for_loop_two_copies_of_the_largest_parameter() -> None:
    assert transient("fused") == 0
    assert transient("for-loop") == 2 * 4 * W1  # exp_avg_sq.sqrt(), then divided out of place: 1,048,576 B
    assert transient("fused", "sgd") == transient(None, "sgd") == 0  # SGD's momentum is updated in place


def test_the_implementations_change_no_state_and_the_flag_is_refused_where_it_cannot_apply(capsys: Any) -> None:
    states = {impl: predict_peak(build, batch, 4, optimizer.factory("adamw", impl), steps=2).by_category_bytes
              for impl in optimizer.IMPLEMENTATIONS}  # fmt: skip
    assert states["foreach"]["optimizer_state"] == states["for-loop"]["optimizer_state"] == 2 * PARAM_BYTES
    assert states["fused"]["optimizer_state"] == 2 * PARAM_BYTES + 4 * 4  # fused keeps its step counters on the GPU
    assert "applies to torch's optimizers" in str(optimizer.check("adamw8bit", "fused"))
    assert optimizer.check("adamw", "fused") is None
    code = _cli(["--model", "gpt2", "--optimizer", "adamw8bit", "--optimizer-impl", "fused"])
    assert code == 2 and "applies to torch's optimizers" in capsys.readouterr().err


def _cli(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="oomsight")
    command.add(parser.add_subparsers())
    args = parser.parse_args(["predict", *argv])
    return int(args.handler(args))


def _job(argv: list[str]) -> Any:
    import argparse

    from oomsight.predict.job import job_from_args

    parser = argparse.ArgumentParser(prog="oomsight")
    command.add(parser.add_subparsers())
    return job_from_args(parser.parse_args(["predict", *argv]))


@pytest.mark.parametrize("impl", ["fused", "for-loop"])
def test_the_command_passes_the_implementation_to_the_trace(impl: str) -> None:
    from oomsight.predict.orchestration import optimizer_of

    job = _job(["--model", "gpt2", "--optimizer", "adamw", "--optimizer-impl", impl])
    made = optimizer_of(job)([torch.nn.Parameter(torch.zeros(2))])
    assert made.param_groups[0]["fused" if impl == "fused" else "foreach"] is (impl == "fused")


MODULE = """
import torch


def spec():
    return {"build": lambda: torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(3)]),
            "batch": lambda n: torch.randn(n, 2048)}
"""
LINEARS = 3 * (2048 * 2048 + 2048) * 4
"""The three fp32 layers: 50,356,224 B of parameters, as many of gradients, twice as many of AdamW state."""


def _changes(tmp_path: Any, capsys: Any, capacity: int, batch: int = 8) -> dict[str, Any]:
    import json

    path = tmp_path / "mlp.py"
    path.write_text(MODULE)
    code = _cli(
        ["--module", f"{path}:spec", "--batch", str(batch), "--capacity", f"{capacity}B", "--margin", "0", "--json"]
    )
    out = capsys.readouterr().out
    assert code == 0
    return dict(json.loads(out)["changes"])


def test_a_job_the_foreach_temporary_pushes_over_is_told_that_fused_fits_without_changing_results(
    tmp_path: Any, capsys: Any
) -> None:
    """foreach: the states (4 x 50.4 MB), the 64 MiB of cuBLAS workspaces and the step's 50.4 MB copy of
    every parameter reach 320.9 MB reserved; fused makes no copy: 270.5 MB, under 300 MB."""
    found = _changes(tmp_path, capsys, 300_000_000)
    assert found["cheapest"]["flags"] == "--optimizer-impl fused" and found["cheapest"]["changes_results"] is False
    assert found["cheapest"]["peak_reserved_bytes"] < 300_000_000
    assert [t["flags"] for t in found["tried"]] == ["--optimizer-impl fused"]


def test_where_no_implementation_fits_the_lighter_state_is_named_as_changing_results(
    tmp_path: Any, capsys: Any
) -> None:
    found = _changes(tmp_path, capsys, 250_000_000, batch=2)
    flags = [t["flags"] for t in found["tried"]]
    assert flags[:2] == ["--optimizer-impl fused", "--optimizer-impl for-loop"]
    assert "--batch 1 --accumulation 2" in flags  # the same effective batch: tried before any change of results
    assert flags.index("--batch 1 --accumulation 2") < flags.index("--optimizer adamw8bit")
    assert found["cheapest"]["flags"] == "--optimizer adamw8bit" and found["cheapest"]["changes_results"] is True
    assert all(not t["changes_results"] for t in found["tried"][:-1])
    text = prose.change_lines({"changes": found})
    assert text[0].startswith("does not fit") and "--optimizer adamw8bit" in text[0] and "changes results" in text[0]
    assert LINEARS == 50_356_224
