"""The diagnosis of the jobs GPU clusters run (issue 24): DDP, FSDP/FSDP2, ZeRO, adapters on a frozen
base, a frozen second model, save_on_cpu, expandable segments, CUDA-graph pools, memory outside the
allocator that grows, cudaMallocAsync, expert routing.

Each OOM is an event as a wire-1.6 hook records it (``docs/spool-format.md``), re-diagnosed through
``facts_from_event`` as the sidecar and the corpus do. Every test asserts the cause, the first remedy,
and that no remedy the job already uses is offered.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from oomsight.analysis import remedies
from oomsight.analysis.advice import Assumptions, at_oom, autocast, choose, estimate_all, footprint
from oomsight.analysis.diagnosis import diagnose, facts_from_event
from oomsight.analysis.evidence import Evidence
from oomsight.wire.schema import validate

GIB = 1 << 30
MIB = 1 << 20
TOTAL = 80 * GIB


def steady_rows(floor: int, peak: int, steps: int = 12, outside: Any = None) -> list[list[float]]:
    """Step rows of a steady job: ``[step, time, floor, peak, reserved, exact]`` (+ outside bytes)."""
    rows: list[list[float]] = []
    for i, step in enumerate(range(3, 3 + steps)):
        row = [step, 1000.0 + step, floor, peak, peak + GIB, 1]
        if outside is not None:
            row.append(outside(i))
        rows.append(row)
    return rows


def states(params: int, grads: int, state: int, **layout: Any) -> dict[str, Any]:
    return {
        "parameters_bytes": params,
        "gradients_bytes": grads,
        "optimizer_state_bytes": state,
        "optimizer_state_expected_bytes": state,
        "optimizers": 1,
        "param_dtype": "float32",
        **layout,
    }


def event(
    job: dict[str, Any] | None = None,
    model_states: dict[str, Any] | None = None,
    process: dict[str, Any] | None = None,
    **over: Any,
) -> dict[str, Any]:
    """An OOM event as the hook writes it: a 75 GiB step asking 2 GiB more of an 80 GiB GPU."""
    ev: dict[str, Any] = {
        "schema_version": 1,
        "kind": "oom_event",
        "process": {
            "id": "4242-0123abcd",
            "pid": 4242,
            "rank": 0,
            "local_rank": 0,
            "started_at": 1000.0,
            "world_size": 1,
            "expandable_segments": False,
            "allocator_backend": "native",
            **(process or {}),
        },
        "seq": 1,
        "device": 0,
        "gpu_uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "diagnosis": {"cause": "exhaustion", "summary": "as the hook judged it", "remedies": []},
        "outcome": "fatal",
        "time": 2000.0,
        "requested_bytes": 2 * GIB,
        "device_free_bytes": GIB // 2,
        "physical_free_bytes": GIB // 2,
        "device_total_bytes": TOTAL,
        "allocated_bytes": 75 * GIB,
        "reserved_bytes": 76 * GIB,
        "inactive_split_bytes": 0,
        "largest_free_block_bytes": 512 * MIB,
        "phase": "forward",
        "grad_enabled": True,
        "module_training": True,
        "module_frozen": False,
        "captured_by": "observer",
        "steps_memory": steady_rows(20 * GIB, 75 * GIB),
        "job": {"autocast": False, "checkpointing": False, "compiled": False, "set_to_none": True, **(job or {})},
        "model_states": model_states or states(5 * GIB, 5 * GIB, 10 * GIB),
    }
    ev.update(over)
    return ev


def judged(ev: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the diagnosis, its remedy keys); asserts that the event is one the wire format accepts and that
    none of the remedies is already in use."""
    validate(copy.deepcopy(ev))
    facts = facts_from_event(ev)
    d = diagnose(facts)
    keys = d["facts"]["remedies"]
    job = Evidence(facts).job  # the job as the rules see it (a quantised base derived from the states)
    for key in keys:
        check = remedies.IN_USE.get(key)
        assert not (check and check(job)), (key, job)
    assert len(keys) == len(d["remedies"]) and all(isinstance(t, str) and t for t in d["remedies"])
    return dict(d), keys


def ddp(world: int = 2, bucket_view: bool = False) -> dict[str, Any]:
    return {"world_size": world, "strategy": "ddp", "gradient_as_bucket_view": bucket_view, "offload": False}


def fsdp2(world: int = 4, reshard: bool = True, offload: bool = False) -> dict[str, Any]:
    return {
        "world_size": world,
        "strategy": "fsdp2",
        "sharding": "FULL_SHARD" if reshard else "SHARD_GRAD_OP",
        "shard_size": world,
        "reshard_after_forward": reshard,
        "offload": offload,
    }


def zero(stage: int, world: int = 4, offload: bool = False) -> dict[str, Any]:
    return {"world_size": world, "strategy": "zero", "zero_stage": stage, "shard_size": world, "offload": offload}


def laid_out(par: dict[str, Any], ms: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The default OOM of a job laid out as ``par`` (its world size in the process too), with states ``ms``."""
    return judged(event(job={"parallelism": par}, model_states=ms, process={"world_size": par["world_size"]}))


# --- data parallel: DDP ------------------------------------------------------------------------


def test_ddp_whose_bucket_copies_tip_the_model_states_is_told_gradient_as_bucket_view_first():
    # 3 B fp32 parameters on 2 ranks: 12 GiB parameters, 12 GiB gradients + 12 GiB bucket copies, 24 GiB Adam
    ms = states(12 * GIB, 24 * GIB, 24 * GIB, gradient_buckets_bytes=12 * GIB)
    d, keys = laid_out(ddp(), ms)
    assert d["cause"] == "model_states"
    assert keys[0] == "bucket_view" and "shard" in keys  # without the copies 48 GiB < 56 GiB: it fits


def test_ddp_with_bucket_views_already_is_told_to_shard_and_never_bucket_views():
    ms = states(16 * GIB, 16 * GIB, 32 * GIB)
    d, keys = laid_out(ddp(bucket_view=True), ms)
    assert d["cause"] == "model_states"
    assert keys[0] == "shard" and "bucket_view" not in keys
    assert "ddp over 2 ranks" in d["summary"]


# --- sharded: FSDP2, FSDP1, ZeRO -----------------------------------------------------------------


def test_fsdp2_keeping_gathered_parameters_until_backward_is_told_to_reshard_after_forward():
    ms = states(3 * GIB, 3 * GIB, 6 * GIB, unsharded_parameters_bytes=24 * GIB)
    d, keys = laid_out(fsdp2(reshard=False), ms)
    assert d["cause"] == "activations"
    assert keys[0] == "reshard_after_forward" and "shard" not in keys
    assert "all-gathered parameters 24.00 GiB" in d["summary"]


def test_fsdp2_whose_gathered_parameters_fill_the_gpu_is_a_model_states_job_told_to_reshard_first():
    # 40 GiB of fp32 parameters on 4 ranks: 10 GiB shards, 10 gradients, 20 AdamW; 30 GiB gathered by
    # the forward of step 2 and kept (reshard_after_forward=False)
    ms = states(10 * GIB, 10 * GIB, 20 * GIB, unsharded_parameters_bytes=30 * GIB)
    d, keys = laid_out(fsdp2(reshard=False), ms)
    assert d["cause"] == "model_states" and keys[0] == "reshard_after_forward" and "shard" not in keys
    assert "30.00 GiB of them all-gathered parameters" in d["summary"]


def test_fsdp2_whose_shards_fill_the_gpu_is_never_told_to_shard_but_to_offload_the_optimizer_state():
    ms = states(15 * GIB, 15 * GIB, 30 * GIB)
    d, keys = laid_out(fsdp2(), ms)
    assert d["cause"] == "model_states"
    assert keys[0] == "cpu_offload"
    assert not {"shard", "reshard_after_forward", "full_shard"} & set(keys)


def test_fsdp2_with_offload_on_is_told_a_lighter_state_or_more_ranks():
    ms = states(15 * GIB, 15 * GIB, 30 * GIB)
    d, keys = laid_out(fsdp2(offload=True), ms)
    # more ranks only move memory; a lighter optimizer state changes the update rule: second, said so
    assert d["cause"] == "model_states" and keys[:2] == ["more_ranks", "light_optimizer"]
    assert "cpu_offload" not in keys


def test_fsdp1_shard_grad_op_is_told_full_shard_first():
    par = {"world_size": 8, "strategy": "fsdp", "sharding": "SHARD_GRAD_OP", "shard_size": 8, "offload": False}
    ms = states(2 * GIB, 2 * GIB, 4 * GIB, unsharded_parameters_bytes=16 * GIB)
    d, keys = laid_out(par, ms)
    assert d["cause"] == "activations" and keys[0] == "full_shard"
    assert "shard" not in keys and "checkpointing" in keys


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_stage_one_or_two_is_told_the_next_stage(stage):
    ms = states(16 * GIB, 16 * GIB, 30 * GIB)
    d, keys = laid_out(zero(stage), ms)
    assert d["cause"] == "model_states"
    assert keys[0] == "next_zero_stage" and "shard" not in keys


def test_zero_stage_three_with_offload_is_never_told_to_shard_offload_or_move_a_stage():
    ms = states(15 * GIB, 15 * GIB, 30 * GIB)
    d, keys = laid_out(zero(3, offload=True), ms)
    assert d["cause"] == "model_states"
    assert not {"shard", "next_zero_stage", "cpu_offload"} & set(keys)
    assert keys[:2] == ["more_ranks", "light_optimizer"]
    assert "ZeRO stage 3 over 4 ranks (offload)" in d["summary"]


def test_a_sharded_steady_step_gets_per_block_checkpointing_first_never_sharding():
    ms = states(3 * GIB, 3 * GIB, 6 * GIB)
    d, keys = laid_out(fsdp2(), ms)
    assert d["cause"] == "activations" and keys[0] == "checkpointing" and "shard" not in keys


# --- frozen weights: LoRA, QLoRA, a frozen second model ------------------------------------------


def lora(frozen: int, quantized: int = 0) -> dict[str, Any]:
    adapters = 60 * MIB
    return states(
        frozen + adapters,
        adapters,
        2 * adapters,
        frozen_parameters_bytes=frozen,
        quantized_parameters_bytes=quantized,
        adapter_parameters_bytes=adapters,
        frozen_modules=["base_model"],
    )


def test_lora_whose_frozen_base_leaves_no_room_is_told_to_move_or_quantise_the_base_never_checkpointing():
    d, keys = judged(event(job={"adapters": True}, model_states=lora(60 * GIB)))
    assert d["cause"] == "model_states"
    # the walk shows no optimizer trains the base: quantising it (the fix that makes room without the
    # slowdown of offloading) changes only weights that train nothing, so it leads, and says what it changes
    assert keys[:2] == ["quantize_base", "offload_frozen"] and d["facts"]["changes_result"][0] == "quantize_base"
    assert "This changes the result: the frozen weights themselves" in d["remedies"][0]
    assert "checkpointing" not in keys
    assert "Frozen weights (base_model) take 60.00 GiB" in d["summary"]


def test_qlora_whose_quantised_base_leaves_no_room_is_not_told_to_quantise_again():
    d, keys = judged(event(job={"adapters": True}, model_states=lora(60 * GIB, quantized=60 * GIB)))
    assert d["cause"] == "model_states" and keys[0] == "offload_frozen"
    assert "quantize_base" not in keys and "quantised weights" in d["summary"]


def test_lora_with_room_for_its_base_is_an_activation_problem_told_apart_from_the_weights():
    d, keys = judged(event(job={"adapters": True}, model_states=lora(30 * GIB)))
    assert d["cause"] == "activations" and keys[0] == "checkpointing"
    assert "30.00 GiB of the parameters are frozen (base_model)" in d["summary"]


def test_the_advice_counts_frozen_weights_as_static_bytes_not_activations():
    ev = event(job={"adapters": True}, model_states=lora(30 * GIB))
    ev.update(categories=None, diagnosis={"facts": {"usable_bytes": 76 * GIB + GIB // 2}})
    fp = at_oom(ev)  # type: ignore[arg-type]
    assert fp is not None
    assert fp.frozen_bytes == 30 * GIB
    assert fp.activations_bytes == 75 * GIB - (30 * GIB + 60 * MIB) - 60 * MIB - 120 * MIB
    check = next(e for e in estimate_all(fp) if e.remedy == "checkpointing")
    assert check.saving_bytes is not None and check.saving_bytes < fp.activations_bytes  # never the weights
    # autocast keeps bf16 copies of trainable fp32 weights only: the frozen base costs nothing there
    assert autocast(fp, Assumptions()).saving_bytes == round(fp.activations_bytes * 0.5) - round(60 * MIB * 0.5)


def test_static_bytes_that_are_mostly_frozen_are_told_to_quantise_or_offload_them():
    cats = {
        "parameters_bytes": 75 * GIB,
        "gradients_bytes": GIB,
        "optimizer_state_bytes": 2 * GIB,
        "activations_bytes": 5 * GIB,
        "basis": "at_oom",
        "frozen_parameters_bytes": 74 * GIB,
    }
    fp = footprint(cats, TOTAL)  # type: ignore[arg-type]
    assert fp is not None
    msg = choose(fp, estimate_all(fp)).message
    assert "frozen weights" in msg and "quantised" in msg and "shard" not in msg


def test_static_bytes_of_a_sharded_job_that_leave_no_room_are_never_told_to_shard():
    cats = {
        "parameters_bytes": 20 * GIB,
        "gradients_bytes": 20 * GIB,
        "optimizer_state_bytes": 40 * GIB,
        "activations_bytes": 5 * GIB,
        "basis": "at_oom",
    }
    fp = footprint(cats, TOTAL)  # type: ignore[arg-type]
    assert fp is not None
    sharded = dataclasses.replace(fp, job={"parallelism": fsdp2()})
    msg = choose(sharded, estimate_all(sharded)).message
    assert "sharded already" in msg and "offload the optimizer state" in msg and "(FSDP/ZeRO)" not in msg
    assert "shard them (FSDP/ZeRO)" in choose(fp, estimate_all(fp)).message


def test_a_frozen_teachers_forward_in_a_training_step_is_not_an_evaluation():
    ms = states(4 * GIB, 2 * GIB, 4 * GIB, frozen_parameters_bytes=2 * GIB, frozen_modules=["teacher"])
    ev = event(model_states=ms, module_training=False, module_frozen=True)
    d, keys = judged(ev)
    assert d["cause"] == "activations"
    assert keys[0] == "frozen_no_grad" and "no_grad" not in keys and "eval_batch" in keys
    assert "frozen model" in d["summary"] and "Frozen weights (teacher): 2.00 GiB" in d["summary"]


def test_a_frozen_model_already_under_no_grad_is_told_to_precompute_its_outputs():
    ms = states(4 * GIB, 2 * GIB, 4 * GIB, frozen_parameters_bytes=2 * GIB, frozen_modules=["ref_model"])
    d, keys = judged(event(model_states=ms, module_training=False, module_frozen=True, grad_enabled=False))
    assert d["cause"] == "activations" and keys[0] == "precompute_frozen"
    assert "frozen_no_grad" not in keys


def test_the_trained_model_in_eval_mode_is_still_an_evaluation_forward():
    d, keys = judged(event(module_training=False, module_frozen=False))
    # eval mode alone does not show the forward trains nothing: no_grad after what keeps the result
    assert d["cause"] == "activations" and keys[:2] == ["checkpointing", "no_grad"]


# --- what the job does with saved activations and the allocator ----------------------------------


def test_save_on_cpu_is_not_checkpointing_which_stays_in_the_advice():
    d, keys = judged(event(job={"activation_offload": True, "checkpointing": False}))
    assert d["cause"] == "activations" and keys[0] == "checkpointing"
    assert "save_on_cpu" in d["summary"]


def fragmented(**over: Any) -> dict[str, Any]:
    """Enough bytes cached (10 GiB) for a 4 GiB request, no block of that size, a steady step."""
    base = {"allocated_bytes": 60 * GIB, "reserved_bytes": 70 * GIB, "requested_bytes": 4 * GIB}
    base["largest_free_block_bytes"] = GIB
    base.update(over)
    return event(**base)


def test_fragmentation_under_expandable_segments_never_offers_a_split_size():
    ev = fragmented(job={"expandable_segments": True}, process={"expandable_segments": True})
    d, keys = judged(ev)
    assert d["cause"] == "fragmentation" and keys[0] == "split"
    assert "garbage_collection_threshold" in d["remedies"][0]
    assert not any("max_split_size_mb" in text for text in d["remedies"])


def test_fragmentation_without_expandable_segments_offers_them_first():
    d, keys = judged(fragmented(job={"expandable_segments": False}))
    assert d["cause"] == "fragmentation" and keys[0] == "expandable"


def test_bytes_stranded_in_cuda_graph_pools_are_told_apart_from_holes_in_the_default_pool():
    # 7 GiB unallocated in the graphs' pool; the default pool's 3 GiB cached + 0.5 GiB free cannot serve 4 GiB
    ev = fragmented(private_pool_bytes=12 * GIB, private_pool_free_bytes=7 * GIB, job={"compiled": True})
    d, keys = judged(ev)
    assert d["cause"] == "fragmentation" and keys[0] == "graph_pools"
    assert "private pools" in d["summary"] and not {"expandable", "split", "compile"} & set(keys)


def test_an_eager_optimizer_step_beside_a_graph_pool_is_not_told_its_states_do_not_fit():
    ms = states(8 * GIB, 8 * GIB, 16 * GIB)
    ev = fragmented(private_pool_bytes=20 * GIB, private_pool_free_bytes=10 * GIB, phase="optimizer", model_states=ms)
    d, keys = judged(ev)
    assert d["cause"] == "fragmentation" and keys[:2] == ["graph_pools", "fused_optimizer"]


def test_an_optimizer_step_beside_graph_pools_that_keep_activations_is_not_told_its_states_do_not_fit():
    # inside optimizer.step() activations are normally freed; a graph pool keeps its graphs' between replays
    ms = states(6 * GIB, 6 * GIB, 12 * GIB)
    d, keys = judged(event(private_pool_bytes=30 * GIB, private_pool_free_bytes=0, phase="optimizer", model_states=ms))
    assert d["cause"] == "activations" and keys[0] == "graph_pools"
    assert judged(event(phase="optimizer", model_states=ms))[0]["cause"] == "model_states"  # without the pool


def test_graph_pools_that_hold_their_bytes_allocated_are_the_graphs_working_memory():
    ev = event(private_pool_bytes=12 * GIB, private_pool_free_bytes=0, job={"compiled": True})
    d, keys = judged(ev)
    assert d["cause"] == "activations" and keys[0] == "graph_pools"


def test_cudamallocasync_gives_no_fragmentation_evidence_and_says_so():
    ev = fragmented(
        process={"allocator_backend": "cudaMallocAsync"},
        captured_by="exception",
        largest_free_block_bytes=None,
        inactive_split_bytes=0,
    )
    d, keys = judged(ev)
    assert d["cause"] == "activations" and keys[0] == "checkpointing"
    assert "cudaMallocAsync allocator gives no block sizes" in d["summary"]
    assert d["facts"]["allocator_backend"] == "cudaMallocAsync"


# --- memory outside the allocator ----------------------------------------------------------------


def test_outside_memory_growing_a_communicator_a_step_is_a_leak_of_its_own_well_below_a_quarter_of_the_gpu():
    # a NCCL communicator per step (~544 MB): the allocator's floor is flat, NVML's process grows
    rows = steady_rows(20 * GIB, 50 * GIB, outside=lambda i: 600 * MIB + i * 544 * 1000 * 1000)
    own = 70 * GIB + 6 * GIB  # reserved + what NVML sees outside it: 6 GiB, under 8 % of the GPU
    nv = {"total_bytes": TOTAL, "used_bytes": own, "free_bytes": 0, "process_used_bytes": own, "process_visible": True}
    d, keys = judged(event(steps_memory=rows, nvml=nv, allocated_bytes=69 * GIB, reserved_bytes=70 * GIB))
    assert d["cause"] == "non_pytorch_memory" and keys[0] == "outside_leak"
    assert "a leak outside the allocator" in d["summary"]
    assert d["facts"]["outside_growth_bytes"] == 11 * 544 * 1000 * 1000


def test_outside_memory_that_only_jitters_is_no_leak():
    rows = steady_rows(20 * GIB, 75 * GIB, outside=lambda i: 900 * MIB + (i % 3) * 40 * MIB)
    d, _keys = judged(event(steps_memory=rows))
    assert d["cause"] == "activations" and d["facts"]["outside_growth_bytes"] is None


def test_rows_without_the_outside_column_or_with_it_unknown_judge_as_before():
    rows = steady_rows(20 * GIB, 75 * GIB, outside=lambda i: -1)
    assert judged(event(steps_memory=rows))[0]["cause"] == "activations"


def outside_of(outside: int, allocated: int = 69 * GIB) -> dict[str, Any]:
    """A steady job whose process holds ``outside`` bytes beyond its 70 GiB reserved, flat over the steps."""
    own = 70 * GIB + outside
    nv = {"total_bytes": TOTAL, "used_bytes": own, "free_bytes": 0, "process_used_bytes": own, "process_visible": True}
    rows = steady_rows(20 * GIB, 60 * GIB, outside=lambda i: outside)
    return event(steps_memory=rows, nvml=nv, allocated_bytes=allocated, reserved_bytes=70 * GIB)


def test_several_communicators_outside_the_allocator_decide_an_oom_well_below_a_quarter_of_the_gpu():
    d, keys = judged(outside_of(6 * GIB))  # 7.5 % of the GPU; the job's 71 GiB would fit beside a context
    assert d["cause"] == "non_pytorch_memory" and keys[0] == "non_pytorch"


def test_a_context_and_one_communicator_outside_the_allocator_are_not_the_cause():
    assert judged(outside_of(1536 * MIB))[0]["cause"] != "non_pytorch_memory"


def test_outside_memory_is_not_the_cause_when_the_job_would_not_fit_beside_a_context_anyway():
    assert judged(outside_of(6 * GIB, allocated=78 * GIB))[0]["cause"] != "non_pytorch_memory"


# --- demand that depends on the data --------------------------------------------------------------


def test_a_step_that_outgrew_the_earlier_ones_names_expert_routing_as_well_as_the_input():
    # routed tokens per expert vary step to step; the rows cannot show a step needing less (known limit)
    rows = steady_rows(20 * GIB, 50 * GIB)
    for i, row in enumerate(rows):
        row[3] = 20 * GIB + (30 + (7 * i) % 11) * GIB
    d, keys = judged(event(steps_memory=rows))
    assert d["cause"] == "growing_demand"
    # bounding the input (micro-batches of what fitted, accumulated: the same effective batch) first; an older
    # writer cannot say whether the model has experts, so the capacity factor, which changes the routing, last
    assert keys[:2] == ["bound_input", "checkpointing"] and keys[-1] == "expert_capacity"
    assert "mixture-of-experts" in d["summary"] and "cannot tell the two apart" in d["summary"]


# --- older events -------------------------------------------------------------------------------


def test_an_event_of_an_older_hook_without_the_layout_reads_as_none():
    ev = event()
    for key in ("module_frozen", "captured_by"):
        del ev[key]
    del ev["process"]["allocator_backend"]
    f = facts_from_event(ev)
    assert f["module_frozen"] is None and f["private_pool_bytes"] is None and f["captured_by"] == "observer"
    e = Evidence(f)
    assert (e.frozen, e.unsharded, e.buckets, e.private, e.strategy) == (0, 0, 0, 0, "none")
    assert not e.no_allocator_detail


# --- the labelled cluster scenarios of the corpus (benchmarks/corpus/cluster.py, multigpu.py) -------


def growing_rows(start: int, step: int) -> list[list[float]]:
    rows = steady_rows(GIB, start)
    for i, row in enumerate(rows):
        row[3] = start + i * step
    return rows


H200 = 141 * GIB
AS_RECORDED: dict[str, Any] = {
    "lora_frozen_base_no_room": lambda: event(
        job={"adapters": True}, model_states=lora(3 * GIB), device_total_bytes=3 * GIB + GIB // 4,
        allocated_bytes=3 * GIB, reserved_bytes=3 * GIB + 100 * MIB, requested_bytes=256 * MIB, steps_memory=[],
    ),
    "lora_activations_too_big": lambda: event(job={"adapters": True}, model_states=lora(30 * GIB)),
    "distill_teacher_records_graph": lambda: event(module_training=False, module_frozen=True),
    "moe_routing_collapse": lambda: event(steps_memory=growing_rows(40 * GIB, GIB)),
    "extension_memory_grows": lambda: event(
        device_total_bytes=H200, steps_memory=steady_rows(20 * GIB, 26 * GIB, outside=lambda i: (i + 1) * 2 * GIB),
        allocated_bytes=20 * GIB, reserved_bytes=21 * GIB, requested_bytes=6 * GIB,
        nvml={"total_bytes": H200, "used_bytes": H200, "free_bytes": 0, "process_used_bytes": H200,
              "process_visible": True},
    ),
    "async_backend_too_big": lambda: fragmented(
        process={"allocator_backend": "cudaMallocAsync"}, captured_by="exception", steps_memory=[],
        largest_free_block_bytes=None,
    ),
    "compiled_graph_pool_holds": lambda: fragmented(
        private_pool_bytes=20 * GIB, private_pool_free_bytes=10 * GIB, phase="optimizer", job={"compiled": True},
    ),
    "offload_still_too_big": lambda: event(job={"activation_offload": True}),
    "ddp_buckets_no_room": lambda: event(
        job={"parallelism": ddp()}, process={"world_size": 2}, phase="optimizer",
        model_states=states(4 * GIB, 8 * GIB, 8 * GIB, gradient_buckets_bytes=4 * GIB),
        device_total_bytes=19 * GIB, allocated_bytes=18 * GIB, reserved_bytes=18 * GIB + GIB // 2, steps_memory=[],
    ),
    "fsdp2_unsharded_kept": lambda: event(
        job={"parallelism": fsdp2(reshard=False)}, process={"world_size": 4},
        model_states=states(2 * GIB, 2 * GIB, 4 * GIB, unsharded_parameters_bytes=6 * GIB),
        device_total_bytes=16 * GIB, allocated_bytes=15 * GIB, reserved_bytes=15 * GIB + GIB // 2, steps_memory=[],
    ),
}
"""Each labelled scenario's OOM as a wire-1.6 hook should record it (the layout its docstring describes)."""


@pytest.fixture(scope="module")
def cluster_labels() -> dict[str, tuple[str, str]]:
    from benchmarks.corpus import cluster, multigpu  # torch: imported by this fixture only

    tables = (cluster.SCENARIOS, multigpu.MULTI)
    return {name: (label, key) for table in tables for name, (label, key, _fn) in table.items()}


def test_every_labelled_cluster_scenario_has_its_facts_here_and_a_remedy_the_rules_can_name(cluster_labels):
    assert set(cluster_labels) == set(AS_RECORDED)
    assert all(key in remedies.REMEDY for _label, key in cluster_labels.values())


@pytest.mark.parametrize("name", sorted(AS_RECORDED))
def test_each_labelled_cluster_scenario_as_recorded_is_judged_as_labelled(cluster_labels, name):
    label, key = cluster_labels[name]
    d, keys = judged(AS_RECORDED[name]())
    assert d["cause"] == label, d["summary"]
    # the scenario's remedy leads, or, where it changes what the job computes, follows the first that does not
    assert keys[0] == key or (key in remedies.CHANGES and keys[1] == key and keys[0] not in remedies.CHANGES), keys
