"""A note whenever a layout pads or replicates (issue 51): where a rank holds more than 1/N, said with
the parameter and the bytes, checked against hand arithmetic."""

from __future__ import annotations

import pytest
import torch

from oomsight.predict import parallel

MIXTRAL = ("mixtral:hidden_size=4096,intermediate_size=14336,num_hidden_layers=32,num_attention_heads=32,"
           "num_key_value_heads=8,num_local_experts=8,num_experts_per_tok=2,vocab_size=32000")  # fmt: skip


def _meta(spec: str) -> torch.nn.Module:
    import transformers

    from oomsight.predict import hfmodel

    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(hfmodel.load_config(spec)).to(torch.bfloat16)


def test_mixtral_over_16_gpus_under_fsdp2_is_told_each_rank_holds_an_eighth_of_the_fused_experts() -> None:
    notes = parallel.layout_notes(_meta(MIXTRAL), parallel.Layout(16, "fsdp2"))
    # dim 0 of the fused experts is their 8 experts: padded to 16 rows, one a rank, half of it padding.
    # Per layer half a row of gate_up_proj (2 x 14336 x 4096), down_proj (4096 x 14336) and the router (4096), bf16:
    per_layer = (2 * 14336 * 4096 + 4096 * 14336 + 4096) * 2 // 2
    assert per_layer * 32 == 5_637_275_648
    assert len(notes) == 1
    assert "each rank holds 1 of its 8 rows, 1/8 of it instead of 1/16" in notes[0]
    assert "gate_up_proj, shape (8, 28672, 4096)" in notes[0] and "5,637,275,648 B per rank over 1/16" in notes[0]


def test_a_flat_buffer_s_few_padding_elements_are_not_noted_but_replication_always_is() -> None:
    model = _meta(MIXTRAL)
    assert parallel.layout_notes(model, parallel.Layout(16, "fsdp")) == []
    assert parallel.layout_notes(model, parallel.Layout(8, "fsdp2")) == []  # 8 experts over 8: no padding
    assert "DDP replicates the model" in parallel.layout_notes(model, parallel.Layout(16, "ddp"))[0]
    assert "ZeRO-1 replicates the 16-bit parameters and the gradients" in parallel.layout_notes(
        model, parallel.Layout(16, "zero1"))[0]  # fmt: skip
    assert "ZeRO-2 replicates the 16-bit parameters" in parallel.layout_notes(model, parallel.Layout(16, "zero2"))[0]
    norms = (2 * 32 + 1) * 4096 * 2 + 32 * 8 * 4096 * 2  # the norms and the routers (8 x 4096 = 32,768 elements)
    zero3 = parallel.layout_notes(model, parallel.Layout(16, "zero3"))
    assert zero3 == [f"ZeRO-3 keeps 97 parameters of at most 100,000 elements whole on every rank "
                     f"(stage3_param_persistence_threshold): {norms:,} B replicated"]  # fmt: skip
    hybrid = parallel.layout_notes(model, parallel.Layout(16, "fsdp2", shard_size=8))
    assert hybrid == ["hybrid sharding replicates over 2 groups: each rank holds 1/8 of the model, not 1/16"]


@pytest.mark.parametrize("world", [3, 5])
def test_fsdp2_padding_of_a_small_model_is_the_sum_of_its_padded_shards_over_1_over_n(world: int) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Linear(5, 3))
    notes = parallel.layout_notes(model, parallel.Layout(world, "fsdp2"))
    held = sum(-(-p.shape[0] // world) * (p.numel() // p.shape[0]) * 4 for p in model.parameters())
    extra = held - sum(p.numel() * 4 for p in model.parameters()) / world
    assert notes and f"{extra:,.0f} B per rank over 1/{world}" in notes[0]
