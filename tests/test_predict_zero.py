"""ZeRO-1/2/3 laid out rank by rank from DeepSpeed's own buffers (issue 51), against hand arithmetic.

DeepSpeed cannot be installed here, so a rank is the one-GPU trace's activations and temporaries at the
moment the layout's own rank peaks, plus DeepSpeed's buffers at their defaults (``parallel.ZeroBuffers``,
``deepspeed/runtime/zero/config.py``), each term named."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from oomsight.predict import parallel, predict_peak

GB = 10**9
LLAMA3_70B = ("llama:hidden_size=8192,intermediate_size=28672,num_hidden_layers=80,num_attention_heads=64,"
              "num_key_value_heads=8,vocab_size=128256,max_position_embeddings=8192,rope_theta=500000")  # fmt: skip
ACTIVATIONS_70B, TEMPORARIES_70B = 15_481_339_912, 8_405_385_216
"""The one-GPU trace of the 70B shape, seq 8192, bf16, checkpointing, at the loss backward (``predict
--json``'s ``moments.outside_states.rest``, 2026-12-07): every layer's input kept by checkpointing and the
logits', and the logits' fp32 gradients (2 x 8192 x 128256 x 4 B)."""


def _meta(spec: str) -> torch.nn.Module:
    import transformers

    from oomsight.predict import hfmodel

    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(hfmodel.load_config(spec)).to(torch.bfloat16)


def _one_gpu(params: int, rest: dict[str, int], late: dict[str, int], largest_gradient: int) -> dict[str, Any]:
    """A one-GPU prediction of bf16 parameters with AdamW: ``rest`` alive at the loss backward (no gradient
    yet), ``late`` the smaller rest late in the backward beside every gradient."""
    states = {"parameters": params, "optimizer_state": 2 * params}
    early = {**rest, **states}
    at_late = {**late, **states, "gradients": params}
    return {
        "peak_allocated_bytes": sum(at_late.values()) + params,
        "by_category_bytes": {**at_late},
        "moments": {
            "optimizer_step_transient_bytes": params,
            "forward_backward": {"peak_allocated_bytes": sum(at_late.values()), "by_category_bytes": at_late},
            "outside_states": {
                "largest_gradient_bytes": largest_gradient,
                "rest": {"rest_bytes": sum(rest.values()), "gradients_bytes": 0, "by_category_bytes": early},
                "rest_and_one_gradient": {"rest_bytes": sum(rest.values()), "gradients_bytes": 0,
                                          "by_category_bytes": early},
                "rest_and_gradients": (  # the argmax of rest + gradients, as the replay takes it
                    {"rest_bytes": sum(late.values()), "gradients_bytes": params, "by_category_bytes": at_late}
                    if sum(late.values()) + params > sum(rest.values())
                    else {"rest_bytes": sum(rest.values()), "gradients_bytes": 0, "by_category_bytes": early}
                ),
            },
        },
    }  # fmt: skip


def test_llama3_70b_zero3_over_32_h100s_is_the_hand_arithmetic_at_the_loss_backward() -> None:
    """The issue's job: 55.3 GB predicted before (activations from late in the backward, FSDP-style gathered
    units beside DeepSpeed's buffers, a 2 B/param term labelled fp32 gradients); ~62.3 GB by hand."""
    model = _meta(LLAMA3_70B)
    numel = sum(p.numel() for p in model.parameters())
    assert numel == 70_553_706_496
    rest = {"activations": ACTIVATIONS_70B, "temporaries": TEMPORARIES_70B, "workspace": 2 * 32 * 2**20}
    late = {"activations": 138_543_112, "temporaries": 4_330_684_432, "workspace": 2 * 32 * 2**20}
    head = 128256 * 8192  # lm_head: the largest module, fetched whole, and the largest gradient
    laid = parallel.per_rank(_one_gpu(2 * numel, rest, late, 2 * head), parallel.units(model, 32),
                             parallel.Layout(32, "zero3"))  # fmt: skip
    parts, part = laid["parts_bytes"], math.ceil(numel / 32)
    norms = (2 * 80 + 1) * 8192 * 2  # parameters under stage3_param_persistence_threshold: whole on every rank
    hand = {
        "activations": ACTIVATIONS_70B,  # 15.48 GB at the loss backward (4.5 GB late in the backward)
        "temporaries": TEMPORARIES_70B,  # 8.41 GB: the logits' fp32 gradient and its softmax
        "workspace": 2 * 32 * 2**20,
        "parameters": pytest.approx(2 * part + norms - norms // 32, rel=1e-6),  # 4.41 GB: the 16-bit partition
        "gradient_partition": 2 * part,  # 4.41 GB: grad_partitions_flat_buffer, 16 bits (not fp32 gradients)
        "fp32_master": 4 * part,  # 8.82 GB
        "optimizer_state": 8 * part,  # 17.64 GB: Adam's two fp32 moments
        "reduce_bucket": 2 * 500_000_000,  # 1.0 GB: reduce_bucket_size elements of bf16
        "gathered_parameters": 2 * head,  # 2.10 GB: the head (1.05e9 elements) past max_live_parameters (1e9)
        "prefetch_bucket": 2 * 50_000_000,  # 0.1 GB: stage3_prefetch_bucket_size
        "gradient_in_flight": 0,  # no gradient yet at the loss backward
    }
    assert laid["moment"] == "forward_backward"
    assert {k: parts.get(k) for k in hand} == hand
    assert set(parts) - set(hand) <= {"buffers"}  # every term named, nothing else
    assert 62.3 * GB < laid["per_rank_peak_allocated_bytes"] < 62.5 * GB  # 62.43 GB; was 55.34 GB
    step = laid["moment_parts_bytes"]["optimizer_step"]
    assert step["fp32_gradients"] == 4 * 10**9  # one sub-group's (sub_group_size 1e9 of the 2.2e9 partition)


def test_the_fp32_gradients_of_a_zero3_step_are_one_sub_group_s() -> None:
    model = _meta(LLAMA3_70B)
    laid = parallel.per_rank(_one_gpu(10**9, {"activations": 1}, {"activations": 1}, 1), parallel.units(model, 8),
                             parallel.Layout(8, "zero3"))  # fmt: skip
    step = laid["moment_parts_bytes"]["optimizer_step"]
    assert step["fp32_gradients"] == 4 * 1_000_000_000  # sub_group_size elements, not the 8.8e9 of the partition


def test_each_stage_takes_its_own_moment_zero1_keeps_every_gradient_zero2_and_3_the_loss_backward() -> None:
    model = _meta("llama:hidden_size=256,intermediate_size=688,num_hidden_layers=2,num_attention_heads=4,"
                  "num_key_value_heads=4,vocab_size=1000")  # fmt: skip
    params = 2 * sum(p.numel() for p in model.parameters())
    rest, late = {"activations": 50 * params}, {"activations": params // 10}
    single = _one_gpu(params, rest, late, params // 4)
    units = parallel.units(model, 4)
    z1 = parallel.per_rank(single, units, parallel.Layout(4, "zero1"))["moment_parts_bytes"]["forward_backward"]
    assert z1["activations"] == 50 * params and z1["gradients"] == 0  # rest + every gradient: the loss backward
    late_single = _one_gpu(params, {"activations": params // 10}, {"activations": params // 10}, params // 4)
    z1_late = parallel.per_rank(late_single, units, parallel.Layout(4, "zero1"))["moment_parts_bytes"]
    assert z1_late["forward_backward"]["gradients"] == params  # stage 1: full gradients until the epilogue
    for kind in ("zero2", "zero3"):
        fb = parallel.per_rank(single, units, parallel.Layout(4, kind))["moment_parts_bytes"]["forward_backward"]
        assert fb["activations"] == 50 * params and "gradients" not in fb
        assert fb["reduce_bucket"] == 500_000_000 * 2  # the full IPG buffer, whatever the model's size


def test_a_traced_step_names_the_loss_backward_apart_from_the_one_gpu_peak() -> None:
    """The trace itself: the moment with the most activations and temporaries (the loss backward) holds more
    of them than the one-GPU forward/backward peak, which falls later, where gradients pile up."""

    def build() -> torch.nn.Module:
        return torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(6)], torch.nn.Linear(512, 4096))

    found = predict_peak(build, lambda n: torch.randn(n, 512), 64, steps=2).to_dict()
    held = found["moments"]["outside_states"]
    states = ("parameters", "gradients", "optimizer_state")
    fb = found["moments"]["forward_backward"]
    rest_at_fb = fb["peak_allocated_bytes"] - sum(fb["by_category_bytes"].get(k, 0) for k in states)
    assert held["rest"]["rest_bytes"] >= rest_at_fb
    assert held["rest_and_gradients"]["rest_bytes"] + held["rest_and_gradients"]["gradients_bytes"] >= rest_at_fb
    assert held["largest_gradient_bytes"] == 4 * 512 * 4096  # the head's weight gradient
