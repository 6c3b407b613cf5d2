"""Rank bodies for tests/test_accounting.py: real torch.distributed over gloo on the CPU, each rank
measuring its own layout and writing what it found beside the ground truth read straight off the
tensors it holds (every storage once)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from oomsight.hook.layout import measure


def storages(tensors: Any) -> int:
    """Bytes of the distinct plain storages behind ``tensors`` (a DTensor by its local shard)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        local = getattr(t, "_local_tensor", t)
        s = local.untyped_storage()
        if s.nbytes():
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))


def sharded(**options: Any) -> nn.Module:
    """``model()`` under FSDP2: each linear layer its own group, the root one more."""
    from torch.distributed.fsdp import fully_shard

    m = model()
    for layer in m:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, **options)
    fully_shard(m, **options)
    return m


class Holder(nn.Module):
    """A user's module around the wrapped model (a LightningModule, a model with a loss head)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def step(m: nn.Module, opt: torch.optim.Optimizer) -> None:
    m(torch.randn(8, 40)).sum().backward()
    opt.step()


def ddp(rank: int, out: str, bucket_view: bool) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    frozen = model().requires_grad_(False)  # a frozen second model beside the trained one
    m = DistributedDataParallel(model(), gradient_as_bucket_view=bucket_view, bucket_cap_mb=0.01)
    opt = torch.optim.AdamW(m.parameters())
    for _ in range(2):  # the reducer rebuilds its buckets after the first iteration
        step(m, opt)
    layout = measure(torch, [m, frozen], [opt], "cpu")
    buckets = sum(b.buffer().numel() * b.buffer().element_size() for b in m.reducer._get_zeros_like_grad_buckets())
    params = [*m.parameters(), *frozen.parameters()]
    grads = storages(p.grad for p in m.parameters())
    state = storages(v for s in opt.state.values() for v in s.values())
    truth = {
        "parameters": storages(params),
        "gradients": grads if bucket_view else grads + buckets,
        "state": state,
        "buckets": 0 if bucket_view else buckets,
        "frozen": storages(frozen.parameters()),
    }
    return {"layout": layout.states(0), "truth": truth, "parallelism": layout.parallelism}


def fsdp2(rank: int, out: str, reshard: bool) -> dict[str, Any]:
    m = sharded(reshard_after_forward=reshard)
    opt = torch.optim.AdamW(m.parameters())
    for _ in range(2):
        step(m, opt)
    during: dict[str, int] = {}

    def look(module: nn.Module, args: Any) -> None:  # FSDP's own pre-forward hook has gathered the layer
        during["unsharded"] = measure(torch, [m], [opt], "cpu").states(0)["unsharded_parameters_bytes"]
        during["layer"] = sum(p.numel() * p.element_size() for p in module.parameters())

    handle = m[2].register_forward_pre_hook(look)
    m(torch.randn(8, 40)).sum().backward()
    handle.remove()
    opt.step()
    layout = measure(torch, [m], [opt], "cpu")
    truth = {
        "parameters": storages(m.parameters()),
        "gradients": storages(p.grad for p in m.parameters()),
        "state": storages(v for s in opt.state.values() for v in s.values()),
        "global_parameters": sum(p.numel() * p.element_size() for p in m.parameters()),
        "unsharded_during_forward": during["unsharded"],
        "gathered_layer": during["layer"],
    }
    return {"layout": layout.states(0), "truth": truth, "parallelism": layout.parallelism}


def fsdp1(rank: int, out: str, orig_params: bool) -> dict[str, Any]:
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    found = {}
    for strategy in (ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP):
        m = FullyShardedDataParallel(
            model(), device_id=torch.device("cpu"), sharding_strategy=strategy, use_orig_params=orig_params
        )
        opt = torch.optim.AdamW(m.parameters())
        for _ in range(2):
            step(m, opt)
        flat = m._handle.flat_param
        layout = measure(torch, [m], [opt], "cpu")
        found[strategy.name] = {
            "layout": layout.states(0),
            "truth": {
                "parameters": storages([flat._local_shard]),  # the views of use_orig_params share it
                "gradients": storages([flat.grad]),
                "state": storages(v for s in opt.state.values() for v in s.values()),
                "global_parameters": sum(p.numel() * p.element_size() for p in model().parameters()),
            },
            "parallelism": layout.parallelism,
        }
    return found


def hooked(rank: int, out: str, reshard: bool) -> dict[str, Any]:
    """The real hook in an FSDP2 job (the CPU's tensors counted as device 0's, the allocator a fake
    whose capacity is this small model's): an OOM inside a forward, recorded and diagnosed."""
    import sys

    from torch.distributed.fsdp import fully_shard

    sys.path.insert(0, os.path.dirname(__file__))
    from oomsight.config import Settings
    from oomsight.hook.runtime import Hook
    from oomsight.wire.spool import SpoolReader

    from fakes import FakeCuda

    kib = 1024
    cuda = FakeCuda(total=64 * kib)
    cuda.set(0, allocated=40 * kib, reserved=48 * kib, peak_allocated=56 * kib, peak_reserved=60 * kib)
    spool = os.path.join(out, f"spool{rank}")
    hook = Hook(Settings().replace(spool_dir=spool, termination_message_path=""), cuda, None, torch)
    assert hook.steps is not None
    hook.steps.device_type = "cpu"
    hook.start()
    hook.sampler.tick()
    m = model()
    for layer in m:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, reshard_after_forward=reshard)
    fully_shard(m, reshard_after_forward=reshard)
    opt = torch.optim.AdamW(m.parameters())
    for _ in range(6):  # the job probe's window (after the third step) sees the model called
        step(m, opt)
    shards = storages(m.parameters())  # between steps every group is resharded: the registered parameters are shards
    m[2].register_forward_pre_hook(lambda module, args: cuda.observer(0, 30 * kib, 64 * kib, 0))
    m(torch.randn(8, 40))
    hook.stop()
    (event,) = SpoolReader(spool).read().events
    return {
        "parallelism": event["job"]["parallelism"],
        "model_states": event["model_states"],
        "truth": {"parameters": shards},
        "diagnosis": event["diagnosis"],
    }


def _ddp_truth(m: Any, opt: torch.optim.Optimizer, views: bool, extra: Any = ()) -> dict[str, int]:
    """What a DDP rank holds: its parameters, gradients (fresh tensors, or views of the buckets), the
    buckets themselves (the reducer's own sizes) and the optimizer state, every storage once."""
    buckets = sum(b.buffer().numel() * b.buffer().element_size() for b in m.reducer._get_zeros_like_grad_buckets())
    grads = storages(p.grad for p in m.parameters())
    return {
        "parameters": storages([*m.parameters(), *extra]),
        "gradients": grads if views else grads + buckets,
        "buckets": 0 if views else buckets,
        "state": storages(v for s in opt.state.values() for v in s.values()),
    }


def compiled_ddp(rank: int, out: str, wrapped: bool) -> dict[str, Any]:
    """``torch.compile(DDP(m))``, or a user's module holding the DDP model: the wrapper is found inside."""
    from torch.nn.parallel import DistributedDataParallel

    # dynamo's DDPOptimizer wants the first bucket no larger than the others: the default caps for it
    ddp = DistributedDataParallel(model(), bucket_cap_mb=0.01 if wrapped else None)
    if wrapped:
        outer: nn.Module = Holder(ddp)
    else:
        outer = torch.compile(ddp, backend="eager")
    opt = torch.optim.AdamW(outer.parameters())
    for _ in range(2):
        step(outer, opt)
    layout = measure(torch, [outer], [opt], "cpu")
    return {"layout": layout.states(0), "truth": _ddp_truth(ddp, opt, False), "parallelism": layout.parallelism}


def compiled_fsdp2(rank: int, out: str, wrapped: bool) -> dict[str, Any]:
    """FSDP2 inside ``torch.compile`` (its ``_orig_mod``) or inside a user's module."""
    m = sharded()
    outer: nn.Module = Holder(m) if wrapped else torch.compile(m, backend="eager")  # type: ignore[assignment]
    opt = torch.optim.AdamW(outer.parameters())
    for _ in range(2):
        step(outer, opt)
    layout = measure(torch, [outer], [opt], "cpu")
    truth = {
        "parameters": storages(m.parameters()),
        "gradients": storages(p.grad for p in m.parameters()),
        "buckets": 0,
        "state": storages(v for s in opt.state.values() for v in s.values()),
    }
    return {"layout": layout.states(0), "truth": truth, "parallelism": layout.parallelism}


def ddp_zero_grad_in_no_sync(rank: int, out: str, views: bool) -> dict[str, Any]:
    """DDP with ``gradient_as_bucket_view``; ``zero_grad()`` (set_to_none) in the middle of a ``no_sync``
    accumulation: the next backwards make fresh gradients beside the buckets, which stay allocated."""
    from torch.nn.parallel import DistributedDataParallel

    m = DistributedDataParallel(model(), gradient_as_bucket_view=views, bucket_cap_mb=0.01)
    opt = torch.optim.AdamW(m.parameters())
    for _ in range(2):  # synced steps: the gradients are views of the rebuilt buckets
        step(m, opt)
    synced = all(p.grad is None or p.grad._is_view() for p in m.parameters())
    with m.no_sync():
        m(torch.randn(8, 40)).sum().backward()
        opt.zero_grad(set_to_none=True)
        m(torch.randn(8, 40)).sum().backward()
    fresh = not any(p.grad._is_view() for p in m.parameters())
    layout = measure(torch, [m], [opt], "cpu")
    truth = _ddp_truth(m, opt, False)  # fresh gradients: the buckets are beside them
    return {"layout": layout.states(0), "truth": truth, "parallelism": layout.parallelism, "synced_views": synced,
            "fresh": fresh}


def zero_redundancy(rank: int, out: str, views: bool) -> dict[str, Any]:
    """``ZeroRedundancyOptimizer`` (ZeRO-1) over DDP: each rank holds the state of its own partition."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    m = DistributedDataParallel(model(), gradient_as_bucket_view=views, bucket_cap_mb=0.01)
    opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.AdamW)
    for _ in range(2):
        step(m, opt)
    layout = measure(torch, [m], [opt], "cpu")  # the wrapper only: counted through its .optim
    truth = _ddp_truth(m, opt.optim, views)
    local = [p for g in opt.optim.param_groups for p in g["params"]]
    truth["expected_state"] = 2 * storages(local)
    truth["moments"] = storages(v for s in opt.optim.state.values() for k, v in s.items() if k != "step")
    return {"layout": layout.states(0), "truth": truth, "parallelism": layout.parallelism,
            "local_parameters": storages(local)}


def fsdp_mixed_precision(rank: int, out: str, fsdp1: bool) -> dict[str, Any]:
    """FSDP2 with ``MixedPrecisionPolicy(param_dtype=bfloat16)``, or FSDP1 with ``MixedPrecision``: the
    policy is recorded; the shards stay float32."""
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, MixedPrecisionPolicy

    if fsdp1:
        policy = MixedPrecision(param_dtype=torch.bfloat16)
        m: nn.Module = FullyShardedDataParallel(model(), device_id=torch.device("cpu"), mixed_precision=policy)
    else:
        m = sharded(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    opt = torch.optim.AdamW(m.parameters())
    for _ in range(2):
        step(m, opt)
    layout = measure(torch, [m], [opt], "cpu")
    params = [m._handle.flat_param._local_shard] if fsdp1 else list(m.parameters())  # type: ignore[union-attr]
    grads = [m._handle.flat_param.grad] if fsdp1 else [p.grad for p in m.parameters()]  # type: ignore[union-attr]
    truth = {
        "parameters": storages(params),
        "gradients": storages(grads),
        "buckets": 0,
        "state": storages(v for s in opt.state.values() for v in s.values()),
    }
    return {"layout": layout.states(0), "truth": truth, "parallelism": layout.parallelism}


def fsdp2_partial(rank: int, out: str, flag: bool) -> dict[str, Any]:
    """FSDP2 with ``reshard_after_forward=2`` on 4 ranks (on 2, torch takes 2 for True): after a forward each
    layer keeps its parameters gathered over a group of 2 until its backward; measured between the forward
    and the backward (the last layer, whose backward runs first, gathered still; ``flag``: inside the
    backward of the first layer), and after the step."""
    m = sharded(reshard_after_forward=2)
    opt = torch.optim.AdamW(m.parameters())
    for _ in range(2):
        step(m, opt)
    loss = m(torch.randn(8, 40)).sum()
    between = measure(torch, [m], [opt], "cpu")
    posts = [fp._sharded_post_forward_param_data for layer in m if isinstance(layer, nn.Linear)
             for fp in layer._get_fsdp_state()._fsdp_param_group.fsdp_params]
    truth = {
        "parameters": storages(fp.sharded_param for layer in m for fp in _fsdp_params_of(layer)),
        "post_forward": storages(posts),
        "global_parameters": sum(p.numel() * p.element_size() for p in model().parameters()),
    }
    loss.backward()
    opt.step()
    after = measure(torch, [m], [opt], "cpu")
    return {"between": between.states(0), "after": after.states(0), "truth": truth,
            "parallelism": between.parallelism}


def _fsdp_params_of(layer: nn.Module) -> list[Any]:
    get_state = getattr(layer, "_get_fsdp_state", None)
    group = getattr(get_state(), "_fsdp_param_group", None) if get_state is not None else None
    return list(getattr(group, "fsdp_params", None) or [])


BODIES = {
    "fsdp2_partial": fsdp2_partial,
    "ddp": ddp, "fsdp2": fsdp2, "fsdp1": fsdp1, "hooked": hooked, "compiled_ddp": compiled_ddp,
    "compiled_fsdp2": compiled_fsdp2, "ddp_zero_grad_in_no_sync": ddp_zero_grad_in_no_sync,
    "zero_redundancy": zero_redundancy, "fsdp_mixed_precision": fsdp_mixed_precision,
}


def run(rank: int, world: int, out: str, body: str, flag: bool) -> None:
    # a file store: no TCP port to race for with other tests running beside this one
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=world)
    try:
        found = BODIES[body](rank, out, flag)
        dist.barrier()  # no rank leaves while another still talks to it
    except BaseException:
        dist.destroy_process_group()
        raise
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump(found, fh)
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without the interpreter's teardown: gloo's threads, destroyed at exit, now and then abort
    # the process ("terminate called without an active exception", seen in 2 of ~10 loaded runs),
    # after every number here was measured and written.
    os._exit(0)
