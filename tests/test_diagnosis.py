import pytest

from oomsight.analysis.diagnosis import CAUSES, OomFacts, diagnose, leak_growth

GIB = 1 << 30
MIB = 1 << 20


def facts(**kw):
    base = OomFacts(
        requested_bytes=2 * GIB,
        device_total_bytes=80 * GIB,
        device_free_bytes=GIB // 2,
        physical_free_bytes=GIB // 2,
        allocated_bytes=75 * GIB,
        reserved_bytes=76 * GIB,
        inactive_split_bytes=0,
        nvml=None,
        categories=None,
        trend=[],
        expandable_segments=False,
    )
    base.update(kw)
    if "device_free_bytes" in kw and "physical_free_bytes" not in kw:
        base["physical_free_bytes"] = kw["device_free_bytes"]
    return base


def nvml(used, own=None, visible=False):
    return {
        "total_bytes": 80 * GIB,
        "used_bytes": used,
        "free_bytes": 80 * GIB - used,
        "reserved_bytes": None,
        "utilization_ratio": None,
        "process_used_bytes": own,
        "process_visible": visible,
        "other_processes": 1,
    }


def test_true_exhaustion_with_activations_dominating_advises_checkpointing():
    cats = {
        "parameters_bytes": 5 * GIB,
        "gradients_bytes": 5 * GIB,
        "optimizer_state_bytes": 10 * GIB,
        "activations_bytes": 55 * GIB,
        "basis": "at_oom",
        "measured_at": 0.0,
    }
    d = diagnose(facts(categories=cats))
    assert d["cause"] == "activations"
    assert "checkpoint" in d["remedies"][0]


def test_exhaustion_dominated_by_model_state_advises_sharding():
    cats = {
        "parameters_bytes": 20 * GIB,
        "gradients_bytes": 20 * GIB,
        "optimizer_state_bytes": 30 * GIB,
        "activations_bytes": 5 * GIB,
        "basis": "at_oom",
        "measured_at": 0.0,
    }
    assert "FSDP" in diagnose(facts(categories=cats))["remedies"][0]


def test_one_huge_request_is_oversized():
    d = diagnose(
        facts(requested_bytes=60 * GIB, allocated_bytes=10 * GIB, reserved_bytes=10 * GIB, device_free_bytes=69 * GIB)
    )
    assert d["cause"] == "oversized_request"


def test_enough_bytes_in_pieces_is_fragmentation_and_names_expandable_segments():
    d = diagnose(
        facts(allocated_bytes=60 * GIB, reserved_bytes=78 * GIB, device_free_bytes=GIB, requested_bytes=4 * GIB)
    )
    assert d["cause"] == "fragmentation"
    assert "expandable_segments:True" in d["remedies"][0]


def test_fragmentation_with_expandable_segments_on_suggests_other_settings():
    d = diagnose(
        facts(allocated_bytes=60 * GIB, reserved_bytes=78 * GIB, requested_bytes=4 * GIB, expandable_segments=True)
    )
    assert "already on" in d["remedies"][0]


def test_other_processes_holding_memory_is_named():
    d = diagnose(
        facts(allocated_bytes=40 * GIB, reserved_bytes=41 * GIB, nvml=nvml(used=79 * GIB, own=42 * GIB, visible=True))
    )
    assert d["cause"] == "other_process"


def test_large_memory_outside_the_allocator_is_non_pytorch():
    d = diagnose(
        facts(allocated_bytes=40 * GIB, reserved_bytes=41 * GIB, nvml=nvml(used=79 * GIB, own=79 * GIB, visible=True))
    )
    assert d["cause"] == "non_pytorch_memory" and "NCCL" in d["remedies"][0]


def test_without_pid_visibility_outside_memory_mentions_both_possibilities():
    d = diagnose(facts(allocated_bytes=40 * GIB, reserved_bytes=41 * GIB, nvml=nvml(used=79 * GIB)))
    assert d["cause"] == "non_pytorch_memory" and "other processes" in d["summary"]


def test_steady_growth_between_steps_is_a_leak():
    trend = [[t, (10 + 3 * t) * GIB, 10 * t + 1] for t in range(8)]
    d = diagnose(facts(trend=trend))
    assert d["cause"] == "leak"
    assert any("loss.item()" in r for r in d["remedies"])


def test_a_leak_after_a_healthy_start_is_still_a_leak():
    # the legacy troughs are judged by the one leak detector, like step rows: over the recent window
    flat = [[t, 10 * GIB, 10 * t] for t in range(20)]
    rising = [[20 + t, (10 + 2 * t) * GIB, 200 + 10 * t] for t in range(1, 11)]
    assert leak_growth(flat + rising, 80 * GIB) == 20 * GIB  # the last 12 troughs: 10 GiB to 30 GiB
    assert leak_growth(flat + rising[:4], 80 * GIB) is None  # 4 rises of 12 troughs: not yet a leak


@pytest.mark.parametrize(
    "trend",
    [
        [[t, 10 * GIB, t] for t in range(8)],  # flat
        [[t, (10 + t % 2) * GIB, t] for t in range(8)],  # sawtooth, no trend
        [[t, (10 + 3 * t) * GIB, 5] for t in range(8)],  # growth but no steps ran
        [[t, (10 + t) * GIB, t] for t in range(3)],  # too few points
    ],
)
def test_no_leak_without_steady_growth_over_steps(trend):
    assert leak_growth(trend, 80 * GIB) is None


def test_a_memory_fraction_cap_is_respected():
    # under set_per_process_memory_fraction the observer reports the cap as total, free is physical
    d = diagnose(
        facts(
            device_total_bytes=8 * GIB,
            allocated_bytes=7 * GIB,
            reserved_bytes=8 * GIB - 1,
            device_free_bytes=1,
            physical_free_bytes=70 * GIB,
            requested_bytes=2 * GIB,
            nvml=nvml(used=60 * GIB),  # other tenants hold memory, but the cap is what refused
        )
    )
    assert d["cause"] == "exhaustion"


def test_causes_are_a_closed_list():
    assert set(CAUSES) == {
        "other_process",
        "non_pytorch_memory",
        "leak",
        "model_states",
        "oversized_request",
        "growing_demand",
        "fragmentation",
        "activations",
        "exhaustion",
    }


def rows(floors, peaks, start=1, dt=0.05):
    """Step rows [step, time, floor, peak, reserved, exact] from floor and peak lists."""
    return [[start + i, 1000.0 + i * dt, f, p, p, 1.0] for i, (f, p) in enumerate(zip(floors, peaks))]


def training(**kw):
    states = {
        "parameters_bytes": GIB,
        "gradients_bytes": GIB,
        "optimizer_state_bytes": 2 * GIB,
        "optimizer_state_expected_bytes": 2 * GIB,
    }
    return facts(model_states=states, **kw)


def test_a_floor_that_rises_with_a_flat_transient_is_a_leak_even_at_the_first_oom():
    floors = [10 * GIB + i * 256 * MIB for i in range(20)]
    d = diagnose(training(steps_memory=rows(floors, [f + 8 * GIB for f in floors])))
    assert d["cause"] == "leak" and d["facts"]["floor_growth_bytes"] > 0


def test_a_growing_batch_is_growing_demand_not_fragmentation_even_when_bytes_sat_free():
    # the case: 16 GiB asked with 8 GiB cached-free and 13 GiB free, the step needs twice the last peak
    peaks = [20 * GIB * 2 ** (i // 3) for i in range(12)][:9]
    d = diagnose(
        training(
            device_total_bytes=140 * GIB,
            requested_bytes=16 * GIB,
            allocated_bytes=118 * GIB,
            reserved_bytes=126 * GIB,
            device_free_bytes=13 * GIB,
            steps_memory=rows([5 * GIB] * len(peaks), [min(p, 84 * GIB) for p in peaks]),
        )
    )
    assert d["cause"] == "growing_demand", d["summary"]
    assert "expandable" not in " ".join(d["remedies"])


def test_the_same_request_in_a_step_that_needed_no_more_than_before_is_fragmentation():
    steady = rows([5 * GIB] * 10, [70 * GIB] * 10)
    d = diagnose(training(allocated_bytes=60 * GIB, reserved_bytes=78 * GIB, device_free_bytes=GIB,
                          requested_bytes=4 * GIB, steps_memory=steady, largest_free_block_bytes=2 * GIB))
    assert d["cause"] == "fragmentation"
    # a block large enough existed: not fragmentation
    d = diagnose(training(allocated_bytes=60 * GIB, reserved_bytes=78 * GIB, device_free_bytes=GIB,
                          requested_bytes=4 * GIB, steps_memory=steady, largest_free_block_bytes=5 * GIB))
    assert d["cause"] != "fragmentation"


def test_a_first_step_oom_of_a_training_job_is_not_called_fragmentation():
    d = diagnose(training(allocated_bytes=60 * GIB, reserved_bytes=78 * GIB, device_free_bytes=GIB,
                          requested_bytes=4 * GIB, largest_free_block_bytes=GIB))
    assert d["cause"] == "activations"


def test_model_states_that_fill_the_device_at_batch_one_advise_the_change_that_fits_on_one_gpu():
    states = {
        "parameters_bytes": 36 * GIB,
        "gradients_bytes": 36 * GIB,
        "optimizer_state_bytes": 10 * GIB,
        "optimizer_state_expected_bytes": 72 * GIB,
    }
    d = diagnose(facts(device_total_bytes=140 * GIB, allocated_bytes=82 * GIB, model_states=states, phase="optimizer"))
    assert d["cause"] == "model_states"
    # offloading the state changes nothing the job computes: first; then the change that fits, said as one
    # that changes the result (154/2 = 77 GiB fits; 3 x 36 = 108 GiB does not)
    assert d["facts"]["remedies"][:2] == ["cpu_offload", "bf16_params"]
    assert "This changes the result" in d["remedies"][1] and "bf16_params" in d["facts"]["changes_result"]
    assert not any("batch size" in r for r in d["remedies"])
    d = diagnose(facts(device_total_bytes=140 * GIB, allocated_bytes=82 * GIB, model_states=states, world_size=8))
    assert d["facts"]["remedies"][0] == "shard"


def test_one_huge_request_in_a_normal_step_is_oversized_not_growing_demand():
    steady = rows([5 * GIB] * 10, [12 * GIB] * 10)
    d = diagnose(training(allocated_bytes=11 * GIB, reserved_bytes=12 * GIB, device_free_bytes=60 * GIB,
                          requested_bytes=50 * GIB, steps_memory=steady))
    assert d["cause"] == "oversized_request"


def test_advice_leaves_out_what_the_job_already_does():
    job = {"autocast": True, "checkpointing": True, "param_dtype": "float32"}
    d = diagnose(training(job=job))
    assert d["cause"] == "activations"
    assert d["facts"]["remedies"][0] == "batch" and "autocast" not in d["facts"]["remedies"]
    assert "Already in use: bf16/fp16 autocast, activation checkpointing" in d["summary"]


def test_a_leak_that_runs_out_within_a_few_steps_is_a_leak_not_growing_demand():
    # each step keeps its whole graph (~6 GiB): four rows, then the OOM in the next forward
    floors = [8 * GIB + i * 6 * GIB for i in range(1, 6)]
    d = diagnose(training(allocated_bytes=floors[-1] + 5 * GIB, requested_bytes=2 * GIB, reserved_bytes=78 * GIB,
                          steps_memory=rows(floors, [f + 7 * GIB for f in floors])))
    assert d["cause"] == "leak", d["summary"]
    assert d["facts"]["floor_growth_bytes"] == 18 * GIB  # the first step's row is warm-up


def test_growing_demand_is_judged_on_the_steps_own_memory_so_a_rising_floor_alone_is_not_growth():
    # a leak too noisy to call: floors rise; the failing step needs no more on top of its floor than before
    floors = [10 * GIB, 13 * GIB, 12 * GIB, 16 * GIB, 15 * GIB, 19 * GIB]
    steady = rows(floors, [f + 8 * GIB for f in floors])
    d = diagnose(training(allocated_bytes=24 * GIB, requested_bytes=2 * GIB, reserved_bytes=79 * GIB,
                          device_free_bytes=GIB, steps_memory=steady, largest_free_block_bytes=GIB))
    assert d["cause"] != "growing_demand", d["summary"]
    # the same floors, and a step that needs three times its earlier own memory: the input grew
    d = diagnose(training(allocated_bytes=19 * GIB + 22 * GIB, requested_bytes=2 * GIB, steps_memory=steady))
    assert d["cause"] == "growing_demand"
    assert d["facts"]["step_need_bytes"] == 24 * GIB and d["facts"]["prior_step_transient_bytes"] == 8 * GIB


def test_a_process_with_no_optimizer_that_records_autograd_is_first_told_to_turn_it_off():
    d = diagnose(facts(phase="forward", grad_enabled=True))
    assert d["cause"] == "exhaustion" and d["facts"]["remedies"][0] == "no_grad"
    assert "no optimizer" in d["summary"]


def test_a_forward_without_autograd_gets_inference_advice_never_checkpointing():
    d = diagnose(facts(phase="forward", grad_enabled=False))
    assert d["cause"] == "exhaustion"
    assert d["facts"]["remedies"] == ["eval_batch", "half_precision", "compile"]
    # an evaluation step of a training job, under no_grad: still no checkpointing
    d = diagnose(training(phase="forward", grad_enabled=False))
    assert d["cause"] == "activations" and "checkpointing" not in d["facts"]["remedies"]
    # backward runs with grad mode off in the engine's thread: that is not an inference forward
    d = diagnose(training(phase="backward", grad_enabled=False))
    assert d["facts"]["remedies"][0] == "checkpointing"


def test_a_smaller_tenant_is_still_the_cause_when_the_job_alone_would_fit():
    # 12 GiB of 80 held by another process (15 %): the job's 70 GiB would fit alone
    steady = rows([20 * GIB] * 8, [68 * GIB] * 8)
    d = diagnose(training(allocated_bytes=66 * GIB, reserved_bytes=67 * GIB, requested_bytes=4 * GIB,
                          device_free_bytes=GIB, steps_memory=steady,
                          nvml=nvml(80 * GIB - GIB, own=68 * GIB, visible=True)))
    assert d["cause"] == "other_process" and "would fit the GPU alone" in d["summary"]
    # the same tenant beside a job that needs more than the whole GPU: not the cause
    big = rows([20 * GIB] * 8, [90 * GIB] * 8)
    d = diagnose(training(allocated_bytes=66 * GIB, reserved_bytes=67 * GIB, requested_bytes=4 * GIB,
                          device_free_bytes=GIB, steps_memory=big,
                          nvml=nvml(80 * GIB - GIB, own=68 * GIB, visible=True)))
    assert d["cause"] != "other_process"


def test_in_a_container_several_listed_processes_make_memory_outside_the_allocator_another_tenants():
    seen = nvml(79 * GIB)  # our PID is not visible; NVML lists us and one more
    seen["other_processes"] = 2
    d = diagnose(training(allocated_bytes=60 * GIB, reserved_bytes=61 * GIB, device_free_bytes=GIB, nvml=seen))
    assert d["cause"] == "other_process" and "NVML lists 2 processes" in d["summary"]
    seen["other_processes"] = 1  # only us: our own memory outside the allocator
    d = diagnose(training(allocated_bytes=50 * GIB, reserved_bytes=51 * GIB, device_free_bytes=GIB, nvml=seen))
    assert d["cause"] == "non_pytorch_memory"


def sawtooth(start, seconds, rise_per_second, tooth, t0=2000.0, hz=10):
    """Sampler readings of a loop of forwards: each frees its temporaries (``tooth``) while
    ``rise_per_second`` stays behind."""
    n = int(seconds * hz)
    return [[t0 + i / hz, start + rise_per_second * i / hz + (tooth if i % 3 == 1 else 0)] for i in range(n)]


def evaluation(samples, grad, **kw):
    steady = rows([20 * GIB] * 8, [30 * GIB] * 8, dt=0.1)  # training steps of 0.1 s, the last at 1000.7
    return training(steps_memory=steady, last_step_time=1000.7, time=samples[-1][0] + 0.05, phase="forward",
                    grad_enabled=grad, sampled_allocated=samples, allocated_bytes=int(samples[-1][1]), **kw)


def test_memory_piling_up_over_an_evaluation_loop_long_after_the_last_step_is_a_leak():
    samples = sawtooth(20 * GIB, 12, 4 * GIB, GIB)
    d = diagnose(evaluation(samples, grad=True))
    assert d["cause"] == "leak", d["summary"]
    # a training job: the forward may train, so keeping nothing comes before dropping autograd
    assert d["facts"]["remedies"][:2] == ["leak", "no_grad"] and "autograd graphs" in d["summary"]
    d = diagnose(evaluation(samples, grad=False))
    assert d["cause"] == "leak" and d["facts"]["remedies"][0] == "leak"
    assert "checkpointing" not in d["facts"]["remedies"]


def test_the_same_pile_in_generation_is_the_cache_growing_by_design():
    samples = sawtooth(20 * GIB, 12, 4 * GIB, GIB)
    stack = ["train.py:40 in main", "transformers/generation/utils.py:2400 in generate"]
    d = diagnose(evaluation(samples, grad=False, stack=stack))
    assert d["cause"] == "growing_demand" and d["facts"]["remedies"][0] == "bound_input"


def test_memory_rising_within_a_normal_training_step_or_while_a_model_loads_is_no_pile():
    samples = sawtooth(20 * GIB, 12, 4 * GIB, GIB)
    # the last step only 0.2 s before the OOM: an ordinary step, judged by the step rules
    d = diagnose(evaluation(samples, grad=True) | {"last_step_time": samples[-1][0] - 0.2})
    assert d["cause"] != "leak"
    # no step ever, memory only rising (a model being loaded), then one forward too big
    loading = [[2000.0 + i / 10, 1 * GIB + i * 100 * MIB] for i in range(120)]
    d = diagnose(facts(phase="forward", grad_enabled=False, sampled_allocated=loading, time=2012.0))
    assert d["cause"] == "exhaustion"
    # no step ever, a loop of forwards that keeps its outputs: piles up, falling back after each forward
    d = diagnose(facts(phase="forward", grad_enabled=False, sampled_allocated=samples, time=2012.0))
    assert d["cause"] == "leak"


def test_an_oom_inside_optimizer_step_is_about_model_states_even_below_the_share():
    states = {
        "parameters_bytes": 10 * GIB,
        "gradients_bytes": 10 * GIB,
        "optimizer_state_bytes": 12 * GIB,
        "optimizer_state_expected_bytes": 20 * GIB,
    }
    d = diagnose(facts(allocated_bytes=70 * GIB, requested_bytes=10 * GIB, model_states=states, phase="optimizer"))
    assert d["cause"] == "model_states" and d["facts"]["remedies"][0] == "fused_optimizer"
    assert "inside optimizer.step()" in d["summary"]
    d = diagnose(facts(allocated_bytes=70 * GIB, requested_bytes=10 * GIB, model_states=states, phase="forward"))
    assert d["cause"] != "model_states"


def weights(params, dtype="float32", grads=0):
    return {"parameters_bytes": params, "gradients_bytes": grads, "optimizer_state_bytes": 0,
            "optimizer_state_expected_bytes": 0, "optimizers": 0, "param_dtype": dtype}


def test_an_inference_forward_that_does_not_fit_is_activations_once_the_weights_are_known():
    d = diagnose(facts(phase="forward", grad_enabled=False, model_states=weights(10 * GIB)))
    assert d["cause"] == "activations" and d["facts"]["remedies"][0] == "eval_batch"
    assert "checkpointing" not in d["facts"]["remedies"] and "the weights are 10.00 GiB" in d["summary"]
    d = diagnose(facts(phase="forward", grad_enabled=True, model_states=weights(10 * GIB)))
    assert d["cause"] == "activations" and d["facts"]["remedies"][0] == "no_grad"


def test_weights_that_fill_the_gpu_alone_are_model_states_with_inference_remedies():
    d = diagnose(facts(phase="forward", grad_enabled=False, allocated_bytes=70 * GIB, model_states=weights(70 * GIB)))
    assert d["cause"] == "model_states" and d["facts"]["remedies"][0] == "half_precision"
    d = diagnose(facts(phase="forward", allocated_bytes=70 * GIB, model_states=weights(70 * GIB, "bfloat16")))
    assert d["facts"]["remedies"] == ["shard"]  # already half precision


def test_a_bf16_model_that_runs_out_before_the_job_probe_looked_is_never_told_to_use_bf16():
    states = {
        "parameters_bytes": 10 * GIB,
        "gradients_bytes": 10 * GIB,
        "optimizer_state_bytes": 0,
        "optimizer_state_expected_bytes": 20 * GIB,
        "optimizers": 1,
        "param_dtype": "bfloat16",
    }
    d = diagnose(facts(device_total_bytes=48 * GIB, allocated_bytes=30 * GIB, model_states=states, job={}))
    assert d["cause"] == "model_states"
    assert "bf16_params" not in d["facts"]["remedies"] and "autocast" not in d["facts"]["remedies"]
    assert d["facts"]["remedies"][:2] == ["cpu_offload", "light_optimizer"]  # 2.1 x 10 GiB fits 70 % of 48 GiB


def test_readings_and_times_no_hook_could_write_give_no_pile_and_no_error():
    for bad in ({"last_step_time": "x"}, {"time": float("nan")}, {"sampled_allocated": [[1], ["a", "b"], None]}):
        d = diagnose(facts(phase="forward", **bad))
        assert d["cause"] in CAUSES


def test_after_training_steps_a_pile_of_one_second_spanning_many_step_times_is_enough():
    samples = sawtooth(20 * GIB, 1.2, 8 * GIB, GIB)  # 1.2 s of an evaluation loop keeping every output
    d = diagnose(evaluation(samples, grad=True))
    assert d["cause"] == "leak" and d["facts"]["remedies"][:2] == ["leak", "no_grad"]
    # the same 1.2 s in a process that never stepped: one long forward cannot be told from many
    d = diagnose(facts(phase="forward", grad_enabled=True, sampled_allocated=samples, time=samples[-1][0] + 0.05))
    assert d["cause"] != "leak"


def test_a_pile_that_begins_after_an_idle_or_loading_start_of_the_readings_is_still_seen():
    idle = [[1994.0 + i / 10, 0] for i in range(60)]  # 6 s before the loop: nothing on the GPU yet
    samples = idle + sawtooth(20 * GIB, 6, 4 * GIB, GIB)
    d = diagnose(facts(phase="forward", grad_enabled=False, sampled_allocated=samples, time=2006.0))
    assert d["cause"] == "leak", d["summary"]


def test_generation_whose_cache_rises_between_every_two_readings_is_growing_demand_not_a_forward():
    """A token's forward frees its temporaries between two readings: generation only rises, as a model
    loading would; but no model loads inside ``generate``."""
    load = [[1994.0 + i / 10, min(i, 20) * 100 * MIB] for i in range(60)]
    cache = [[2000.0 + i / 10, 6 * GIB + i * 25 * MIB] for i in range(70)]
    stack = ["serve.py:40 in main", "transformers/generation/utils.py:2802 in generate",
             "torch/nn/modules/module.py:1790 in _call_impl"]
    d = diagnose(facts(phase="forward", grad_enabled=False, sampled_allocated=load + cache, time=2007.0,
                       stack=stack, model_states=weights(2 * GIB, "bfloat16")))
    assert d["cause"] == "growing_demand" and d["facts"]["remedies"][0] == "bound_batch", d["summary"]
    # the same readings outside generation: a model loading then one forward, no pile
    d = diagnose(facts(phase="forward", grad_enabled=False, sampled_allocated=load + cache, time=2007.0,
                       stack=stack[::2], model_states=weights(2 * GIB, "bfloat16")))
    assert d["cause"] == "activations"


def test_one_huge_request_inside_a_models_forward_is_an_activation_that_a_smaller_batch_shrinks():
    inside = ["embed.py:20 in main", "torch/nn/modules/module.py:1790 in _call_impl",
              "transformers/models/bert/modeling_bert.py:408 in forward"]
    huge = dict(requested_bytes=60 * GIB, allocated_bytes=10 * GIB, reserved_bytes=10 * GIB,
                device_free_bytes=69 * GIB, phase="forward")
    d = diagnose(facts(stack=inside, grad_enabled=False, model_states=weights(GIB, "bfloat16"), **huge))
    assert d["cause"] == "activations" and d["facts"]["remedies"][:2] == ["eval_batch", "oversized"]
    d = diagnose(facts(stack=inside, grad_enabled=True, model_states=weights(GIB, "bfloat16"), **huge))
    assert d["facts"]["remedies"][0] == "no_grad"
    # the same request written in user code (one product over whole sets): split that operation
    d = diagnose(facts(stack=inside[:1], grad_enabled=False, model_states=weights(GIB, "bfloat16"), **huge))
    assert d["cause"] == "oversized_request" and d["facts"]["remedies"][0] == "oversized"


def test_grad_mode_off_inside_an_autograd_function_is_not_inference():
    """A compiled graph's forward (and a reentrant checkpoint's) runs inside ``autograd.Function``
    with grad mode off, whatever its caller records: a training step, not inference."""
    compiled = ["train.py:80 in step", "torch/autograd/function.py:596 in apply",
                "torch/_functorch/_aot_autograd/runtime_wrappers.py:2503 in forward"]
    states = {"parameters_bytes": GIB, "gradients_bytes": 0, "optimizer_state_bytes": 0,
              "optimizer_state_expected_bytes": 2 * GIB, "optimizers": 1, "param_dtype": "float32"}
    d = diagnose(facts(phase="forward", grad_enabled=False, stack=compiled, model_states=states))
    assert "checkpointing" in d["facts"]["remedies"] and "eval_batch" not in d["facts"]["remedies"]
    d = diagnose(facts(phase="forward", grad_enabled=False, stack=compiled[:1], model_states=states))
    assert "checkpointing" not in d["facts"]["remedies"]


def test_a_training_jobs_forward_in_eval_mode_is_evaluation_not_a_grown_step():
    """``model.eval()`` marks evaluation: its batch is not a training step's, so growing demand (a
    step that needs more than earlier steps) is no verdict for it; with autograd on, no_grad first."""
    steady = rows([20 * GIB] * 30, [40 * GIB] * 30, dt=0.1)
    big = dict(steps_memory=steady, last_step_time=1002.9, time=1003.5, phase="forward",
               allocated_bytes=70 * GIB, requested_bytes=12 * GIB, reserved_bytes=76 * GIB)
    assert diagnose(training(grad_enabled=True, **big))["cause"] == "growing_demand"  # train mode, or unknown
    d = diagnose(training(grad_enabled=True, module_training=False, **big))
    # eval mode alone does not show that the forward trains nothing (dropout-free fine-tuning runs in it):
    # what keeps the result comes first, then no_grad, said as changing it
    keys = d["facts"]["remedies"]
    assert d["cause"] == "activations" and keys[:3] == ["checkpointing", "no_grad", "eval_batch"], d["summary"]
    assert "eval mode" in d["summary"]
    d = diagnose(training(grad_enabled=False, module_training=False, **big))
    assert d["cause"] == "activations" and d["facts"]["remedies"][0] == "eval_batch"
    # the same in a process that never trains: inference, judged as before
    d = diagnose(facts(phase="forward", grad_enabled=True, module_training=False, model_states=weights(GIB)))
    assert d["cause"] == "activations" and d["facts"]["remedies"][0] == "no_grad"


def test_in_a_process_that_never_trains_a_forward_that_outgrew_seconds_of_earlier_ones_is_growing_demand():
    """An inference loop ran for seconds (readings falling back after every forward), then one input
    needed far more: the input grew. The first forward that does not fit stays ``activations``."""
    loop = sawtooth(20 * GIB, 6, 0, 10 * GIB)  # forwards up to 30 GiB for 6 s, nothing kept
    late = dict(phase="forward", grad_enabled=False, model_states=weights(10 * GIB), time=loop[-1][0] + 1.5,
                sampled_allocated=loop, allocated_bytes=60 * GIB, requested_bytes=30 * GIB)
    d = diagnose(facts(**late))
    assert d["cause"] == "growing_demand" and d["facts"]["remedies"][0] == "bound_batch", d["summary"]
    first = dict(late, sampled_allocated=loop[:5])  # no loop of forwards before it: one batch too big
    assert diagnose(facts(**first))["cause"] == "activations"
    near = dict(late, allocated_bytes=31 * GIB, requested_bytes=4 * GIB)  # within the margin of earlier ones
    assert diagnose(facts(**near))["cause"] != "growing_demand"


def test_with_the_allocators_peak_and_churn_in_the_readings_the_earlier_forwards_are_known_exactly():
    """Wire 1.5 readings carry the lifetime peak and the bytes ever allocated: forwards freed on the
    host at once (an asynchronous loop) leave no trace in allocated, but do in those two."""

    def readings(churn_per_second, peak=12 * GIB, seconds=8):
        return [[2000.0 + i / 10, 10 * GIB, peak, int(churn_per_second * i / 10)] for i in range(seconds * 10)]

    base = dict(phase="forward", grad_enabled=False, model_states=weights(10 * GIB), time=2009.0,
                allocated_bytes=40 * GIB, requested_bytes=30 * GIB)
    d = diagnose(facts(sampled_allocated=readings(20 * GIB), **base))  # forwards churning 20 GiB/s
    assert d["cause"] == "growing_demand", d["summary"]
    assert diagnose(facts(sampled_allocated=readings(0), **base))["cause"] == "activations"  # idle: a first batch
    loading = readings(GIB)  # 3 GiB allocated in 3 s, under a 12 GiB peak: weights arriving, no forwards
    assert diagnose(facts(sampled_allocated=loading, **base))["cause"] == "activations"
    near = dict(base, allocated_bytes=12 * GIB, requested_bytes=2 * GIB)  # within the margin of the peak
    assert diagnose(facts(sampled_allocated=readings(20 * GIB), **near))["cause"] != "growing_demand"
