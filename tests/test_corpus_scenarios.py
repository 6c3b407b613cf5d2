"""The corpus scenarios of cluster jobs (``benchmarks/corpus/cluster.py``, ``multigpu.py``) on the CPU.

No GPU here: every scenario runs in its ``--cpu-smoke`` form (tiny shapes, two steps) with its remedy
and without, and the facts of its construction — what makes its label true — are checked: a frozen
base that halves with its remedy, a teacher whose forward autograd records, routing whose dispatch
follows the data, an extension's allocations that stay, activations that bypass save_on_cpu, DDP
gradients outside or inside the buckets, FSDP2 parameters left unsharded after forward (real gloo,
two processes under torchrun). The GPU runs: docs/benchmarks.md.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from oomsight.analysis import remedies
from oomsight.analysis.diagnosis import CAUSES

from fakes import ROOT

CORPUS = os.path.join(ROOT, "benchmarks", "corpus")


def load(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(f"corpus_{name}", os.path.join(CORPUS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


cluster = load("cluster")


@pytest.fixture(autouse=True)
def cpu_smoke():
    cluster.SMOKE.on = True
    yield
    cluster.SMOKE.on = False


def smoke(name: str, remedy: bool) -> dict:
    torch.manual_seed(0)
    return cluster.SCENARIOS[name][2](remedy)


def test_every_scenario_is_labelled_with_a_known_cause_and_a_remedy_key():
    names = set(cluster.SCENARIOS)
    assert len(names) == 8
    for name, (label, key, _fn) in cluster.SCENARIOS.items():
        assert label in CAUSES, name
        assert key in remedies.REMEDY or key in cluster.PENDING_KEYS, (name, key)
    assert not names & set(load("scenarios").SCENARIOS)  # one tapes folder can hold both sets


@pytest.mark.parametrize("name", sorted(cluster.SCENARIOS))
@pytest.mark.parametrize("remedy", [False, True], ids=["plain", "remedy"])
def test_every_scenario_builds_and_takes_its_steps_on_the_cpu(name, remedy):
    facts = smoke(name, remedy)
    assert isinstance(facts, dict) and json.dumps(facts)


def test_the_frozen_base_is_the_bulk_and_its_remedy_halves_it():
    plain, fixed = smoke("lora_frozen_base_no_room", False), smoke("lora_frozen_base_no_room", True)
    assert plain["base_dtype"] == "torch.float32" and fixed["base_dtype"] == "torch.bfloat16"
    assert fixed["frozen_bytes"] * 2 == plain["frozen_bytes"]
    assert fixed["trainable_bytes"] == plain["trainable_bytes"]  # the adapters stay fp32


def test_the_teacher_in_eval_mode_is_recorded_by_autograd_unless_under_no_grad():
    plain, fixed = smoke("distill_teacher_records_graph", False), smoke("distill_teacher_records_graph", True)
    assert plain["teacher_training"] is False  # eval mode, yet...
    assert plain["teacher_kept_bytes"] > 0  # ... its activations are saved for a backward
    assert fixed["teacher_kept_bytes"] == 0


def test_dropless_routing_pads_to_the_busiest_expert_and_a_capacity_factor_bounds_it():
    plain, fixed = smoke("moe_routing_collapse", False), smoke("moe_routing_collapse", True)
    tokens = plain["tokens"]
    assert plain["capacities"][0] < tokens / 2 and plain["capacities"][-1] == tokens  # the data moved
    assert set(fixed["capacities"]) == {-(-tokens * 5 // 4) // 8}  # ceil(1.25 * tokens / 8) every step


def test_dropless_dispatch_memory_follows_the_routing_not_the_batch():
    def saved(layer, x):
        seen = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t.nbytes) or t, lambda t: t):
            layer(x).sum()
        return sum(seen)

    torch.manual_seed(0)
    dropless = cluster.Experts(16, 64, 8, None)
    bounded = cluster.Experts(16, 64, 8, 1.25)
    bounded.load_state_dict(dropless.state_dict())
    x = torch.randn(512, 16)
    skewed = x + torch.nn.functional.normalize(dropless.router.weight[0].detach(), dim=0) * 50
    assert saved(dropless, skewed) > 4 * saved(dropless, x)  # same batch, ~8x the dispatch
    assert saved(bounded, skewed) <= saved(bounded, x)  # overflow dropped: the collapse costs nothing more


def test_the_extension_keeps_every_step_s_allocation_unless_it_frees_them():
    plain, fixed = smoke("extension_memory_grows", False), smoke("extension_memory_grows", True)
    assert plain["api"] == "libc"
    assert (plain["held_after_last_step"], fixed["held_after_last_step"]) == (2, 1)


def test_save_on_cpu_leaves_the_ctx_activations_and_reentrant_checkpointing_keeps_none():
    plain, fixed = smoke("offload_still_too_big", False), smoke("offload_still_too_big", True)
    assert plain["offload"] == fixed["offload"] == "save_on_cpu"
    assert plain["ctx_kept_bytes"] == 2 * 4 * 64 * 4  # two blocks, 4 rows, 4x16 hidden, fp32
    assert fixed["ctx_kept_bytes"] == 0


def test_the_runner_loads_by_path_without_a_module_as_the_held_out_runner_loads_it():
    spec = importlib.util.spec_from_file_location("corpus_run", os.path.join(CORPUS, "run.py"))
    runner = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(runner)  # type: ignore[union-attr]  (not in sys.modules, as benchmarks/heldout/run.py)
    command = runner.scenario_command(
        "ddp_buckets_no_room", True, runner.Launch("multigpu.py", nproc=2, cpu_smoke=True)
    )
    assert command[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    assert command[5:] == ["multigpu.py", "ddp_buckets_no_room", "--remedy", "--cpu-smoke"]


def test_the_runner_sets_the_async_back_end_before_torch_loads_and_records_facts(tmp_path):
    out = tmp_path / "runs"
    cmd = [sys.executable, os.path.join(CORPUS, "run.py"), "--script", "cluster", "--cpu-smoke", "--bare"]
    cmd += ["--out", str(out), "--only", "async_backend_too_big", "--jobs", "2"]
    env = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120, env=env)
    runs = json.loads((out / "runs.json").read_text())
    assert [(r["remedy"], r["fits"], r["label"]) for r in runs] == [
        (False, True, "activations"),
        (True, True, "activations"),
    ]
    assert {r["facts"]["alloc_conf"] for r in runs} == {"backend:cudaMallocAsync"}
    labels = json.loads((out / "labels.json").read_text())
    assert labels == {n: [label, key] for n, (label, key, _fn) in cluster.SCENARIOS.items()}


@pytest.mark.e2e
def test_on_two_gloo_ranks_ddp_and_fsdp2_need_more_than_their_cap_and_their_remedies_less():
    """``--cpu-measure``: the real DDP and FSDP2 on gloo, every storage's bytes tracked; the caps are
    computed by the same formulas the GPU runs use, from the layout's bytes per rank."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += [os.path.join(CORPUS, "multigpu.py"), "--all", "--cpu-measure"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    facts = {}
    for line in done.stdout.splitlines():
        if line.startswith("FACTS "):
            tag, _, doc = line[len("FACTS ") :].partition(" {")
            facts[tag] = json.loads("{" + doc)
    assert done.stdout.count("FITS") == len(facts) >= 4
    assert "SKIP zero2_full_params: " in done.stdout  # not installed here, and no CPU form anyway
    for name in ("ddp_buckets_no_room", "fsdp2_unsharded_kept"):
        plain, fixed = facts[name], facts[f"{name} remedy"]
        assert plain["peak_live_bytes"] > plain["cap_bytes"] > fixed["peak_live_bytes"], name
    ddp, ddp_fixed = facts["ddp_buckets_no_room"], facts["ddp_buckets_no_room remedy"]
    assert ddp["grad_storages"] == ddp["grads"]  # each gradient its own storage, beside the buckets
    assert ddp_fixed["grad_storages"] < ddp_fixed["grads"]  # gradients are views of the buckets
    fsdp, fsdp_fixed = facts["fsdp2_unsharded_kept"], facts["fsdp2_unsharded_kept remedy"]
    assert fsdp["unsharded_after_forward"] == fsdp["parameters"] > 0
    assert fsdp_fixed["unsharded_after_forward"] == 0


@pytest.mark.parametrize("name", ["distill_teacher_records_graph", "async_backend_too_big"])
def test_at_gpu_shapes_the_plain_run_is_predicted_over_its_cap_and_the_remedy_under(name):
    sizing = load("sizing")
    sizing.cluster.SMOKE.on = False  # the module sizing imports by name: GPU shapes, traced
    row = sizing.size(name)
    assert row["plain_peak_gib"] > row["cap_gib"] > row["remedy_peak_gib"], row
    assert row["holds"]
