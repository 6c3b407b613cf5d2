"""Accounting that composes (issue 33, part 3): wrappers found anywhere in the module tree, DDP's bucket
views told by storage identity, every live model counted (an EMA copy never called), optimizers that wrap
another (ZeRO-1), parameters replaced after the optimizer was made, experts that never get a gradient,
and the mixed-precision policy of a sharded job. In each case the bytes counted equal the storage truth
per category (each storage the rank holds, once), on the CPU with the real torch (gloo, 2 ranks, where
distributed)."""

from __future__ import annotations

import copy
import gc
from pathlib import Path
from typing import Any

import pytest
import torch
from test_accounting import hooked_oom, ranks
from torch import nn

from oomsight.hook import discovery
from oomsight.hook.discovery import LiveModels
from oomsight.hook.layout import measure

CATEGORIES = {
    "parameters": "parameters_bytes",
    "gradients": "gradients_bytes",
    "state": "optimizer_state_bytes",
    "buckets": "gradient_buckets_bytes",
}


def counted_vs_truth(states: dict[str, Any], truth: dict[str, int]) -> dict[str, tuple[int, int]]:
    return {name: (states[key], truth[name]) for name, key in CATEGORIES.items()}


def assert_truth(states: dict[str, Any], truth: dict[str, int]) -> None:
    found = counted_vs_truth(states, truth)
    assert all(counted == real for counted, real in found.values()), found


def storages(tensors: Any) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None and t.untyped_storage().nbytes():
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def state_of(opt: torch.optim.Optimizer, moments_only: bool = False) -> int:
    return storages(v for s in opt.state.values() for k, v in s.items() if not (moments_only and k == "step"))


@pytest.mark.parametrize("wrapped", [False, True], ids=["torch_compile", "user_module"])
def test_ddp_inside_torch_compile_or_a_user_module_counts_its_buckets(tmp_path: Path, wrapped: bool) -> None:
    for found in ranks(tmp_path, 2, "compiled_ddp", wrapped):
        assert_truth(found["layout"], found["truth"])
        assert found["truth"]["buckets"] > 0
        assert found["parallelism"]["strategy"] == "ddp"


@pytest.mark.parametrize("wrapped", [False, True], ids=["torch_compile", "user_module"])
def test_fsdp2_inside_torch_compile_or_a_user_module_is_judged_on_its_own_root(tmp_path: Path, wrapped: bool) -> None:
    for found in ranks(tmp_path, 2, "compiled_fsdp2", wrapped):
        assert_truth(found["layout"], found["truth"])
        p = found["parallelism"]
        assert (p["strategy"], p["shard_size"], p["reshard_after_forward"]) == ("fsdp2", 2, True)


@pytest.mark.parametrize("views", [False, True])
def test_zero_grad_inside_no_sync_leaves_fresh_gradients_beside_ddp_s_buckets(tmp_path: Path, views: bool) -> None:
    for found in ranks(tmp_path, 2, "ddp_zero_grad_in_no_sync", views):
        assert found["fresh"] and found["synced_views"] is views  # the state the case is about
        assert_truth(found["layout"], found["truth"])
        assert found["layout"]["gradient_buckets_bytes"] > 0


@pytest.mark.parametrize("views", [False, True])
def test_zero_redundancy_optimizer_is_counted_through_its_local_optimizer(tmp_path: Path, views: bool) -> None:
    for found in ranks(tmp_path, 2, "zero_redundancy", views):
        states, truth = found["layout"], found["truth"]
        assert_truth(states, truth)
        # each rank expects the state of its own partition: AdamW's two moments of it
        assert states["optimizer_state_expected_bytes"] == truth["expected_state"] == truth["moments"]
        assert found["parallelism"]["zero_stage"] == 1 and found["parallelism"]["strategy"] == "ddp"
    assert found["local_parameters"] < found["truth"]["parameters"]  # a partition, not the model


@pytest.mark.parametrize("fsdp1", [False, True], ids=["fsdp2", "fsdp1"])
def test_a_sharded_job_s_mixed_precision_policy_is_recorded(tmp_path: Path, fsdp1: bool) -> None:
    for found in ranks(tmp_path, 2, "fsdp_mixed_precision", fsdp1):
        assert_truth(found["layout"], found["truth"])
        assert found["parallelism"]["mixed_precision"] == "bfloat16"
        assert found["parallelism"]["strategy"] == ("fsdp" if fsdp1 else "fsdp2")


def test_a_mixed_precision_policy_counts_as_bf16_in_use_for_the_remedies() -> None:
    from oomsight.analysis.remedies import in_use, pick

    par = {"strategy": "fsdp2", "mixed_precision": "bfloat16"}
    job = {"autocast": False, "param_dtype": "float32", "parallelism": par}
    assert pick(["autocast", "half_precision", "checkpointing"], job) == ["checkpointing"]
    assert "bf16/fp16 autocast" in in_use(job)
    assert pick(["autocast"], {**job, "parallelism": {"strategy": "fsdp2", "mixed_precision": None}}) == ["autocast"]


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))


def ema_job() -> tuple[nn.Module, nn.Module, torch.optim.Optimizer]:
    net = model()
    ema = copy.deepcopy(net).requires_grad_(False)
    opt = torch.optim.AdamW(net.parameters())
    for _ in range(2):
        net(torch.randn(4, 32)).sum().backward()
        opt.step()
        with torch.no_grad():
            for e, p in zip(ema.parameters(), net.parameters()):
                e.lerp_(p, 0.01)
    return net, ema, opt


def test_an_ema_copy_never_called_is_found_by_the_live_model_scan_and_counted_as_frozen() -> None:
    net, ema, opt = ema_job()
    # a clock that stands still: the scan's wall-clock deadline (SCAN_MAX_SECONDS, kept in production) never
    # passes, so a loaded machine cannot make it give up; the deadline has its own test below
    live = LiveModels(clock=lambda: 0.0)
    roots = live.scan(gc, nn.Module)
    assert any(m is ema for m in roots) and any(m is net for m in roots)
    states = measure(torch, [net, *roots], [opt], "cpu").states(0)
    truth = {
        "parameters": storages([*net.parameters(), *ema.parameters()]),
        "gradients": storages(p.grad for p in net.parameters()),
        "state": state_of(opt),
        "buckets": 0,
    }
    # other tests' models still alive in this process are counted too: the EMA's bytes are within
    assert states["frozen_parameters_bytes"] >= storages(ema.parameters())
    only = measure(torch, [net, ema], [opt], "cpu").states(0)
    assert_truth(only, truth)
    assert only["frozen_parameters_bytes"] == storages(ema.parameters())


def test_the_real_hook_counts_an_ema_copy_at_an_oom(tmp_path: Path) -> None:
    net = model()
    ema = copy.deepcopy(net).requires_grad_(False)
    opt = torch.optim.AdamW(net.parameters())

    def train() -> None:
        net(torch.randn(4, 32)).sum().backward()
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            for e, p in zip(ema.parameters(), net.parameters()):
                e.lerp_(p, 0.01)

    def fail(oom: Any) -> None:
        handle = net[2].register_forward_pre_hook(lambda m, a: oom())
        net(torch.randn(4, 32))
        handle.remove()

    event = hooked_oom(tmp_path, [net], opt, train, fail)
    ms = event["model_states"]
    assert ms["frozen_parameters_bytes"] >= storages(ema.parameters())  # the EMA's weights are not activations
    assert ms["parameters_bytes"] >= storages([*net.parameters(), *ema.parameters()])


def test_the_live_model_scan_keeps_its_time_share_and_gives_up_past_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ticks = iter(range(0, 10_000))
    live = LiveModels(clock=lambda: float(next(ticks)) * 0.001)  # every look at the clock: 1 ms later
    net = model()
    assert any(m is net for m in live.scan(gc, nn.Module))
    took = live.last_seconds
    assert took is not None
    again = live.scan(gc, nn.Module)  # within the time share: the last scan's models, no new scan
    assert live.last_seconds == took and any(m is net for m in again)
    monkeypatch.setattr(discovery, "SCAN_MAX_SECONDS", 0.0)
    monkeypatch.setattr(discovery, "SCAN_CHECK_EVERY", 1)
    live._next = 0.0
    assert any(m is net for m in live.scan(gc, nn.Module))  # given up: the previous result stands
    assert live.abandoned == 1


def test_parameters_replaced_after_the_optimizer_was_made_count_both_sets_and_train_nothing() -> None:
    net = model()
    opt = torch.optim.AdamW(net.parameters())
    net(torch.randn(4, 32)).sum().backward()
    opt.step()
    stale = [p for g in opt.param_groups for p in g["params"]]
    fresh_sd = {k: torch.randn_like(v) for k, v in net.state_dict().items()}
    net.load_state_dict(fresh_sd, assign=True)  # the optimizer still holds the old tensors
    opt.zero_grad()
    net(torch.randn(4, 32)).sum().backward()
    states = measure(torch, [net], [opt], "cpu").states(0)
    truth = {
        "parameters": storages([*net.parameters(), *stale]),
        "gradients": storages(p.grad for p in [*net.parameters(), *stale]),
        "state": state_of(opt),
        "buckets": 0,
    }
    assert_truth(states, truth)
    # no optimizer trains the model's parameters: frozen, and their gradients are waste
    assert states["frozen_parameters_bytes"] == storages(net.parameters())
    assert states["untrained_gradients_bytes"] == storages(p.grad for p in net.parameters())
    assert states["optimizer_state_expected_bytes"] == state_of(opt, moments_only=True)


class Experts(nn.Module):
    """A mixture of experts whose router only ever picks the first two of four."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(16, 16)
        self.experts = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.shared(x)
        return self.experts[0](h[: len(h) // 2]).sum() + self.experts[1](h[len(h) // 2 :]).sum()


def test_experts_that_never_get_a_gradient_are_not_expected_to_hold_optimizer_state() -> None:
    net = Experts()
    opt = torch.optim.AdamW(net.parameters())
    before = measure(torch, [net], [opt], "cpu").states(0)["optimizer_state_expected_bytes"]
    assert before == 2 * storages(net.parameters())  # nothing ran yet: every expert may get state
    for _ in range(3):
        net(torch.randn(8, 16)).backward()
        opt.step()
        opt.zero_grad()  # set_to_none: an expert no token reached has no gradient
    states = measure(torch, [net], [opt], "cpu").states(0)
    truth = {"parameters": storages(net.parameters()), "gradients": 0, "state": state_of(opt), "buckets": 0}
    assert_truth(states, truth)
    assert states["optimizer_state_expected_bytes"] == state_of(opt, moments_only=True)
    assert states["frozen_parameters_bytes"] == 0  # idle experts are trainable, merely idle


def test_a_wrapping_optimizer_is_counted_through_the_one_it_delegates_to() -> None:
    class Wrapper:  # Accelerate's AcceleratedOptimizer, Lightning's LightningOptimizer, SAM: shaped alike
        def __init__(self, optimizer: torch.optim.Optimizer) -> None:
            self.optimizer = optimizer
            self.param_groups = optimizer.param_groups
            self.state: dict[Any, Any] = {}

        def step(self) -> None:
            self.optimizer.step()

    net = model()
    inner = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    opt = Wrapper(inner)
    net(torch.randn(4, 32)).sum().backward()
    opt.step()
    states = measure(torch, [net], [opt], "cpu").states(0)
    truth = {
        "parameters": storages(net.parameters()),
        "gradients": storages(p.grad for p in net.parameters()),
        "state": state_of(inner),
        "buckets": 0,
    }
    assert_truth(states, truth)
    assert states["optimizer_state_expected_bytes"] == state_of(inner)  # SGD momentum: 1x
    assert discovery.delegates(opt) == [opt, inner]
