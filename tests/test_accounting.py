"""The accounting of every parameter layout by its local storage (``oomsight.hook.layout``'s walk over
``accounting``, ``parallelism`` and ``discovery``), on the real torch: DDP and FSDP2 over real gloo process
groups (2 and 4 ranks), frozen and adapter parameters, tensor subclasses. The bytes counted must equal
the bytes of the storages each rank really holds."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import layoutworker
import pytest
import torch
from torch import nn

from oomsight.hook.discovery import roots_of
from oomsight.hook.layout import measure


def ranks(tmp_path: Path, world: int, body: str, flag: bool) -> list[dict[str, Any]]:
    torch.multiprocessing.spawn(
        layoutworker.run, args=(world, str(tmp_path), body, flag), nprocs=world, join=True
    )
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize("bucket_view", [False, True])
def test_ddp_gradients_and_buckets_are_counted_as_each_rank_holds_them(tmp_path: Path, bucket_view: bool) -> None:
    for found in ranks(tmp_path, 2, "ddp", bucket_view):
        layout, truth = found["layout"], found["truth"]
        assert layout["parameters_bytes"] == truth["parameters"]
        assert layout["frozen_parameters_bytes"] == truth["frozen"]
        assert layout["gradients_bytes"] == truth["gradients"]
        assert layout["gradient_buckets_bytes"] == truth["buckets"]
        assert layout["optimizer_state_bytes"] == truth["state"]
        assert found["parallelism"]["strategy"] == "ddp"
        assert found["parallelism"]["world_size"] == 2
        assert found["parallelism"]["gradient_as_bucket_view"] is bucket_view
        assert layout["frozen_modules"] == ["Sequential"]
    if not bucket_view:
        assert truth["buckets"] > 0  # the second copy exists and was found


@pytest.mark.parametrize(("world", "reshard"), [(2, True), (4, True), (4, False)])
def test_fsdp2_counts_each_rank_s_shards_not_the_global_parameters(tmp_path: Path, world: int, reshard: bool) -> None:
    for found in ranks(tmp_path, world, "fsdp2", reshard):
        layout, truth = found["layout"], found["truth"]
        assert layout["parameters_bytes"] == truth["parameters"]
        assert layout["gradients_bytes"] == truth["gradients"]
        assert layout["optimizer_state_bytes"] == truth["state"]
        # a shard, padded on dim 0: about 1/world of the global bytes, never the global size
        assert layout["parameters_bytes"] <= truth["global_parameters"] / world * 1.25
        assert layout["unsharded_parameters_bytes"] == 0  # after the step every group is resharded
        # inside a forward the gathered layer is alive (and, unresharded, the layers before it)
        assert truth["unsharded_during_forward"] >= truth["gathered_layer"] > 0
        p = found["parallelism"]
        assert (p["strategy"], p["shard_size"], p["world_size"]) == ("fsdp2", world, world)
        assert p["reshard_after_forward"] is reshard
        assert p["sharding"] == ("FULL_SHARD" if reshard else "SHARD_GRAD_OP")


def test_fsdp2_integer_resharding_counts_the_partial_gathers_as_gathered_and_reports_the_integer(
    tmp_path: Path,
) -> None:
    """Issue 48: ``fully_shard(..., reshard_after_forward=2)`` on 4 ranks: between a forward and its backward the
    parameters gathered over a group of 2 stand for the shards the optimizer holds (never frozen), count as
    gathered, and the setting is reported as the integer."""
    for found in ranks(tmp_path, 4, "fsdp2_partial", False):
        between, after, truth = found["between"], found["after"], found["truth"]
        assert truth["post_forward"] > 0  # torch kept partial gathers: the case is real
        assert between["frozen_parameters_bytes"] == 0 and between["frozen_modules"] == []
        assert between["parameters_bytes"] == truth["parameters"] <= truth["global_parameters"] / 4 * 1.25
        assert between["unsharded_parameters_bytes"] >= truth["post_forward"]
        assert after["frozen_parameters_bytes"] == after["unsharded_parameters_bytes"] == 0
        p = found["parallelism"]
        assert (p["strategy"], p["shard_size"], p["reshard_after_forward"]) == ("fsdp2", 4, 2)
        assert type(p["reshard_after_forward"]) is int


@pytest.mark.parametrize("orig_params", [False, True])
def test_fsdp1_counts_the_flat_local_shard_once(tmp_path: Path, orig_params: bool) -> None:
    for found in ranks(tmp_path, 2, "fsdp1", orig_params):
        for strategy, each in found.items():
            layout, truth = each["layout"], each["truth"]
            assert layout["parameters_bytes"] == truth["parameters"] <= truth["global_parameters"] / 2 + 8
            assert layout["gradients_bytes"] == truth["gradients"]
            assert layout["optimizer_state_bytes"] == truth["state"]
            assert layout["unsharded_parameters_bytes"] == 0  # freed between steps
            p = each["parallelism"]
            assert (p["strategy"], p["sharding"], p["shard_size"]) == ("fsdp", strategy, 2)


def test_zero3_partitions_count_and_a_gathered_parameter_counts_as_unsharded() -> None:
    """Shaped as DeepSpeed ZeRO-3 leaves its parameters (``partition_parameters.py``): ``ds_tensor`` a
    view of this rank's flat partition buffer, ``data`` emptied while partitioned (DeepSpeed does not
    install on this CPU machine; its attributes are what the accounting reads)."""
    status = type("ZeroParamStatus", (), {})
    available, not_available = status(), status()
    available.name, not_available.name = "AVAILABLE", "NOT_AVAILABLE"
    flat = torch.zeros(96)  # the partitions of three parameters of 64 elements each, 2 ranks
    net = nn.Sequential(nn.Linear(8, 8, bias=False), nn.Linear(8, 8, bias=False), nn.Linear(8, 8, bias=False))
    for i, p in enumerate(net.parameters()):
        p.ds_id, p.ds_tensor = i, flat[32 * i : 32 * (i + 1)]
        p.ds_status = not_available
        p.data = torch.empty(0)
    states = measure(torch, [net], [], "cpu").states(0)
    assert states["parameters_bytes"] == 96 * 4 and states["unsharded_parameters_bytes"] == 0
    first = net[0].weight
    first.data, first.ds_status = torch.zeros(8, 8), available  # gathered for its module's forward
    layout = measure(torch, [net], [], "cpu")
    assert layout.states(0)["unsharded_parameters_bytes"] == 64 * 4
    assert layout.parallelism["strategy"] == "zero" and layout.parallelism["zero_stage"] == 3


@pytest.mark.parametrize("reshard", [False, True])
def test_the_real_hook_records_an_fsdp2_job_s_oom_with_its_layout_and_never_says_shard(
    tmp_path: Path, reshard: bool
) -> None:
    for found in ranks(tmp_path, 2, "hooked", reshard):
        p, states, d = found["parallelism"], found["model_states"], found["diagnosis"]
        assert (p["strategy"], p["shard_size"], p["reshard_after_forward"]) == ("fsdp2", 2, reshard)
        assert states["parameters_bytes"] == found["truth"]["parameters"]  # this rank's shards
        assert states["unsharded_parameters_bytes"] > 0  # the layers gathered for the failing forward
        # a gathered parameter stands for its shard, which the optimizer trains: nothing is frozen
        assert (states["frozen_parameters_bytes"], states["frozen_modules"]) == (0, [])
        assert states["param_dtype"] == "float32"
        remedies = d["facts"]["remedies"]
        assert "shard" not in remedies, d["summary"]
        if not reshard:
            assert remedies[0] == "reshard_after_forward", d["summary"]
        else:
            assert "reshard_after_forward" not in remedies, d["summary"]


def test_frozen_base_with_adapters_counts_the_frozen_weights_as_parameters() -> None:
    class Lora(nn.Module):
        def __init__(self, base: nn.Linear, r: int) -> None:
            super().__init__()
            self.base = base.requires_grad_(False)
            self.lora_A = nn.Linear(base.in_features, r, bias=False)
            self.lora_B = nn.Linear(r, base.out_features, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base(x) + self.lora_B(self.lora_A(x))

    net = nn.Sequential(Lora(nn.Linear(256, 256), 4), Lora(nn.Linear(256, 256), 4))
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad])
    net(torch.randn(3, 256)).sum().backward()
    opt.step()
    states = measure(torch, [net], [opt], "cpu").states(0)
    base = 2 * (256 * 256 + 256) * 4
    adapters = 2 * 2 * 4 * 256 * 4
    assert states["parameters_bytes"] == base + adapters
    assert states["frozen_parameters_bytes"] == base
    assert states["adapter_parameters_bytes"] == adapters
    assert states["gradients_bytes"] == adapters
    assert states["optimizer_state_expected_bytes"] == 2 * adapters  # AdamW: two moments of what trains


def test_peft_lora_adapters_are_found_by_their_names() -> None:
    peft = pytest.importorskip("peft")  # in the dev extra: installed in CI
    base = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128))
    net = peft.get_peft_model(base, peft.LoraConfig(r=8, target_modules=["0", "2"]))
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad])
    net(torch.randn(2, 128)).sum().backward()
    opt.step()
    layout = measure(torch, [net], [opt], "cpu")
    states = layout.states(0)
    assert layout.adapters is True
    assert states["frozen_parameters_bytes"] == 2 * (128 * 128 + 128) * 4
    assert states["adapter_parameters_bytes"] == 2 * 2 * 8 * 128 * 4
    assert states["parameters_bytes"] == states["frozen_parameters_bytes"] + states["adapter_parameters_bytes"]


def test_a_wrapper_subclass_counts_its_inner_storages_not_its_logical_size() -> None:
    from torch.testing._internal.two_tensor import TwoTensor

    m = nn.Linear(8, 8, bias=False)
    m.weight = nn.Parameter(TwoTensor(torch.randn(8, 8), torch.randn(8, 8)), requires_grad=False)
    assert m.weight.untyped_storage().nbytes() == 256  # the outer storage says 64 floats
    states = measure(torch, [m], [], "cpu").states(0)
    assert states["parameters_bytes"] == 512  # two inner 64-float storages
    assert states["quantized_parameters_bytes"] == 512


def test_shared_and_viewed_storages_count_once() -> None:
    a = nn.Linear(16, 16)
    b = nn.Linear(16, 16)
    b.weight = a.weight  # tied weights
    flat = torch.zeros(32)
    c = nn.Module()
    c.p = nn.Parameter(flat[:16])
    c.q = nn.Parameter(flat[16:])  # views of one flat buffer
    states = measure(torch, roots_of([a, b, c]), [], "cpu").states(0)
    assert states["parameters_bytes"] == (16 * 16 + 16 + 16) * 4 + 32 * 4


def test_roots_are_the_modules_no_other_module_holds() -> None:
    inner = nn.Linear(2, 2)
    outer = nn.Sequential(inner)
    other = nn.Linear(3, 3)
    assert {id(m) for m in roots_of([inner, outer, other])} == {id(outer), id(other)}


def test_a_teacher_no_optimizer_holds_is_frozen_even_with_requires_grad_on() -> None:
    student, teacher = nn.Linear(16, 16), nn.Linear(16, 256)  # the teacher was never requires_grad_(False)
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    layout = measure(torch, [student, teacher], [opt], "cpu")
    assert layout.states(0)["frozen_parameters_bytes"] == (16 * 256 + 256) * 4
    assert layout.frozen_modules == ["Linear"]
    # without an optimizer holding any model parameter (none yet; ZeRO steps copies) requires_grad decides
    assert measure(torch, [student, teacher], [], "cpu").states(0)["frozen_parameters_bytes"] == 0


def test_the_failing_model_is_frozen_when_no_optimizer_trains_it() -> None:
    from oomsight.hook.oom import _outer_module

    student, teacher = nn.Linear(4, 4), nn.Linear(4, 4)
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    seen = []
    teacher.register_forward_pre_hook(lambda m, a: seen.append(_outer_module([opt], [student, teacher])))
    student.register_forward_pre_hook(lambda m, a: seen.append(_outer_module([opt], [student, teacher])))
    teacher(torch.zeros(1, 4))
    student(torch.zeros(1, 4))
    assert [m.frozen for m in seen] == [True, False]


def test_a_discriminator_frozen_for_the_generator_s_update_is_trained_not_a_frozen_model() -> None:
    """Issue 48: a GAN sets ``D.requires_grad_(False)`` during G's update; D's optimizer holds D's parameters
    and has stepped them, and G's gradient flows through D: neither D's bytes nor the failing forward
    (D's, or the composite's) are a frozen model's. A layer its optimizer holds but never stepped (not yet
    unfrozen) stays frozen."""
    from oomsight.hook.oom import _outer_module

    g, d = nn.Linear(8, 8), nn.Linear(8, 64)
    both = nn.Sequential(g, d)
    opt_g, opt_d = torch.optim.AdamW(g.parameters()), torch.optim.AdamW(d.parameters())
    d(torch.randn(4, 8)).sum().backward()
    opt_d.step()
    opt_d.zero_grad()
    d.requires_grad_(False)  # G's update: G's gradient flows through D
    seen = []
    d.register_forward_pre_hook(lambda m, a: seen.append(_outer_module([opt_g, opt_d], [g, d])))
    d(g(torch.randn(4, 8)))
    both(torch.randn(4, 8)).sum().backward()
    assert [m.frozen for m in seen] == [False, False]
    layout = measure(torch, [g, d], [opt_g, opt_d], "cpu")
    assert (layout.states(0)["frozen_parameters_bytes"], layout.frozen_modules) == (0, [])
    later = nn.Linear(8, 8).requires_grad_(False)  # held, never stepped: frozen
    opt_all = torch.optim.AdamW([*g.parameters(), *later.parameters()])
    assert measure(torch, [g, later], [opt_all], "cpu").states(0)["frozen_parameters_bytes"] == (64 + 8) * 4


def hooked_oom(tmp_path: Path, roots: list[nn.Module], opt: torch.optim.Optimizer, train: Any, fail: Any) -> Any:
    """The real hook over a fake allocator whose capacity is these small models' (the CPU's tensors
    counted as device 0's): six training steps, then an OOM raised where ``fail`` says; the event."""
    from oomsight.config import Settings
    from oomsight.hook.runtime import Hook
    from oomsight.wire.spool import SpoolReader

    from fakes import FakeCuda

    gc.collect()  # other tests' models left in reference cycles are not this job's: the hook walks live modules
    kib = 1024
    cuda = FakeCuda(total=256 * kib)
    cuda.set(0, allocated=200 * kib, reserved=220 * kib, peak_allocated=230 * kib, peak_reserved=240 * kib)
    spool = str(tmp_path / "spool")
    hook = Hook(Settings().replace(spool_dir=spool, termination_message_path=""), cuda, None, torch)
    assert hook.steps is not None
    hook.steps.device_type = "cpu"
    hook.steps.live.clock = lambda: 0.0  # the live-model scan never gives up on a loaded machine's wall clock
    hook.start()
    try:
        hook.sampler.tick()
        for _ in range(6):
            train()
        fail(lambda: cuda.observer(0, 64 * kib, 256 * kib, 0))
    finally:
        hook.stop()
    (event,) = SpoolReader(spool).read().events
    return event


def test_the_real_hook_counts_a_lora_base_as_frozen_weights_and_never_advises_checkpointing_for_them(
    tmp_path: Path,
) -> None:
    peft = pytest.importorskip("peft")
    base = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128))
    net = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["0", "2"]))
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad])

    def train() -> None:
        net(torch.randn(4, 128)).sum().backward()
        opt.step()

    def fail(oom: Any) -> None:  # inside the model's forward
        handle = net.base_model.model[2].register_forward_pre_hook(lambda m, a: oom())
        net(torch.randn(4, 128))
        handle.remove()

    event = hooked_oom(tmp_path, [net], opt, train, fail)
    ms = event["model_states"]
    assert ms["frozen_parameters_bytes"] == 2 * (128 * 128 + 128) * 4
    assert ms["adapter_parameters_bytes"] == 2 * 2 * 4 * 128 * 4
    assert event["job"]["adapters"] is True
    d = event["diagnosis"]
    assert d["cause"] != "model_states" or d["facts"]["remedies"][0] == "quantize_base", d["summary"]


def test_the_real_hook_tells_a_frozen_teacher_s_forward_from_an_evaluation(tmp_path: Path) -> None:
    student, teacher = nn.Linear(32, 32), nn.Sequential(nn.Linear(32, 512), nn.Linear(512, 32)).eval()
    opt = torch.optim.AdamW(student.parameters())  # the teacher keeps requires_grad on: no optimizer holds it

    def train() -> None:
        x = torch.randn(8, 32)
        (student(x) - teacher(x)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    def fail(oom: Any) -> None:
        handle = teacher[1].register_forward_pre_hook(lambda m, a: oom())
        teacher(torch.randn(8, 32))
        handle.remove()

    event = hooked_oom(tmp_path, [student, teacher], opt, train, fail)
    assert event["module_frozen"] is True and event["module_training"] is False
    assert event["model_states"]["frozen_modules"] == ["Sequential"]
    remedies = event["diagnosis"]["facts"]["remedies"]
    # the teacher took gradients in every step (requires_grad on): freezing it comes first
    assert event["model_states"]["untrained_gradients_bytes"] == (32 * 512 + 512 + 512 * 32 + 32) * 4
    assert remedies[0] == "freeze_untrained" and "eval_batch" not in remedies, event["diagnosis"]["summary"]
