"""Multi-process corpus scenarios (issue 24): DDP, FSDP2 and DeepSpeed ZeRO jobs that run out of memory,
each labelled by construction with its true cause and the remedy that truly fixes it.

    torchrun --standalone --nproc_per_node=N benchmarks/corpus/multigpu.py NAME [--remedy]    # N GPUs, NCCL
    torchrun --standalone --nproc_per_node=2 benchmarks/corpus/multigpu.py --all --cpu-smoke  # gloo, tiny
    torchrun --standalone --nproc_per_node=2 benchmarks/corpus/multigpu.py --all --cpu-measure  # gloo, the
        # needs the caps come from, measured: every storage's bytes at mid-sized shapes (peak_live_bytes)
    python benchmarks/corpus/multigpu.py --list                      # name, true cause, remedy key
    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/corpus/run.py --script multigpu --nproc N --out DIR

On GPUs each rank takes the GPU of its LOCAL_RANK and caps its allocator half-way between what the
layout needs with and without the remedy, from the bytes per rank of the layout (each docstring), so
the label holds at any world size from 2 up; ``--cap-gib`` overrides the cap. The ZeRO scenario is
listed only where ``deepspeed`` imports. Rank 0 prints ``FACTS {json}`` (what makes the label true,
checked by the CPU test) and, once every rank has finished, ``FITS``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import sys
import weakref
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import GIB, SMOKE, Facts, blocks, building, cap, nbytes, pick, scenario
from scenarios import Blocks

MULTI: dict[str, tuple[str, str, Callable[[bool, Group], Facts]]] = {}
"""name -> (true cause, the remedy key that ``--remedy`` applies, function)."""
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


@dataclasses.dataclass(frozen=True)
class Group:
    rank: int
    world: int
    device: torch.device
    cap_gib: Optional[float] = None
    """Set by ``--cap-gib``: replaces the scenario's own cap."""

    def limit(self, need_without: float, need_with: float, activations: float) -> int:
        """Cap this rank half-way between the remedy's need and the plain run's (bytes), plus activations;
        the cap in bytes."""
        gib = self.cap_gib or ((need_without + need_with) / 2 + activations) / GIB
        cap(gib)
        return int(gib * GIB)


class _Measure:
    on = False
    """``--cpu-measure``: gloo on the CPU at shapes between the smoke's and the GPU's, every storage's
    bytes tracked (LiveBytes), so the need each cap is derived from can be checked on a CPU."""


MEASURE = _Measure()


def shape(gpu: tuple[int, ...], measured: tuple[int, ...], smoke: tuple[int, ...]) -> tuple[int, ...]:
    return measured if MEASURE.on else pick(gpu, smoke)  # type: ignore[no-any-return]


class LiveBytes(TorchDispatchMode):
    """The peak over ATen calls of the bytes every storage they returned holds, read at each call: a
    storage freed in place (``resize_(0)``, as FSDP frees unsharded parameters) counts 0 from then on;
    a tensor subclass (DTensor) counts by its inner tensors. CPU only, slow: for ``--cpu-measure``."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self.peak_bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        todo = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        while todo:
            t = todo.pop()
            if is_traceable_wrapper_subclass(t):
                todo.extend(
                    x for x in (getattr(t, a) for a in t.__tensor_flatten__()[0]) if isinstance(x, torch.Tensor)
                )
            else:
                storage = t.untyped_storage()
                self.storages.setdefault(storage._cdata, weakref.ref(storage))
        held = 0
        for key, ref in list(self.storages.items()):
            storage = ref()
            if storage is None:
                del self.storages[key]
            else:
                held += storage.nbytes()
        self.peak_bytes = max(self.peak_bytes, held)
        return out


def setup(cap_gib: Optional[float]) -> Group:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if SMOKE.on:
        device = torch.device("cpu")
    else:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    dist.init_process_group("gloo" if SMOKE.on else "nccl")
    return Group(dist.get_rank(), dist.get_world_size(), device, cap_gib)


def steps(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, count: int, probe: Any = None) -> Any:
    """``count`` training steps; ``probe(stage)`` is called after the last forward and the last backward."""
    seen = None
    for i in range(count):
        loss = model(x).float().square().mean()
        if probe is not None and i == count - 1:
            seen = probe("forward")
        loss.backward()
        if probe is not None and i == count - 1:
            seen = probe("backward") or seen
        opt.step()
        opt.zero_grad(set_to_none=True)
    return seen


# ---------------------------------------------------------------- DDP
@scenario("model_states", "bucket_view", into=MULTI)
def ddp_buckets_no_room(remedy: bool, group: Group) -> Facts:
    """DDP keeps a flat gradient bucket per ~25 MiB of gradients beside ``param.grad``: 2x the gradient
    bytes, unless ``gradient_as_bucket_view=True`` makes the gradients views of the buckets. With fp32
    parameters P (4 GiB here, replicated on every rank) and AdamW (2P): 5P at the first optimizer step
    without, 4P with; the cap sits between (~18.5 GiB a rank, any world size)."""
    width, depth, batch = shape((8192, 16, 512), (512, 16, 16), (32, 2, 8))
    model = blocks(width, depth)
    params = nbytes(model.parameters())
    limit = group.limit(5 * params, 4 * params, 2 * depth * batch * width * 4)
    ids = None if SMOKE.on else [group.device.index]
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=remedy)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4, foreach=False)

    def grads(stage: str) -> Optional[Facts]:
        if stage != "backward":
            return None
        gs = [p.grad for p in ddp.parameters() if p.grad is not None]
        return {"grads": len(gs), "grad_storages": len({g.untyped_storage().data_ptr() for g in gs})}

    facts = steps(ddp, opt, torch.randn(batch, width, device=group.device), pick(3, 2), grads)
    return {**facts, "gradient_as_bucket_view": ddp.gradient_as_bucket_view, "cap_bytes": limit}


# ---------------------------------------------------------------- FSDP2
@scenario("model_states", "reshard_after_forward", into=MULTI)
def fsdp2_unsharded_kept(remedy: bool, group: Group) -> Facts:
    """FSDP2 ``fully_shard`` per block with ``reshard_after_forward=False``: every block's unsharded
    parameters stay from its forward to its backward, so after the forward of step 2 a rank holds the
    whole model (P, fp32, 6 GiB here) beside its shards of parameters and AdamW state (3P/W): 3P/W + P.
    Resharding after forward keeps ~4P/W + a few blocks (the one in flight, the prefetched one, their
    all-gather and reduce-scatter buffers; AdamW per parameter, foreach=False, no group-sized temporaries).
    Built on the meta device and materialised shard by shard."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    width, depth, batch = shape((4096, 96, 256), (256, 64, 16), (32, 4, 8))
    mesh = init_device_mesh(group.device.type, (group.world,))
    with torch.device("meta"):
        model = Blocks(width, depth)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh, reshard_after_forward=remedy)
    fully_shard(model, mesh=mesh, reshard_after_forward=remedy)
    model.to_empty(device=group.device)
    with torch.no_grad():
        for p in model.parameters():
            p.to_local().normal_(0, width**-0.5)  # type: ignore[operator]
    full = width * (width + 1) * depth * 4
    block = full // depth
    limit = group.limit(
        3 * full / group.world + full, 4 * full / group.world + 6 * block, 2 * depth * batch * width * 4
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)

    def unsharded(stage: str) -> Optional[Facts]:
        kept = sum(not isinstance(p, DTensor) for p in model.parameters())
        return {"unsharded_after_forward": kept} if stage == "forward" else None

    facts = steps(model, opt, torch.randn(batch, width, device=group.device), pick(3, 2), unsharded)
    return {**facts, "parameters": len(list(model.parameters())), "cap_bytes": limit}


# ---------------------------------------------------------------- DeepSpeed ZeRO
def zero_config(stage: int, batch: int) -> dict[str, Any]:
    bucket = int(5e7)
    return {
        "train_micro_batch_size_per_gpu": batch,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_optimization": {
            "stage": stage,
            "reduce_bucket_size": bucket,
            "allgather_bucket_size": bucket,
            "stage3_prefetch_bucket_size": bucket,
            "stage3_param_persistence_threshold": int(1e4),
            "overlap_comm": False,
        },
    }


def zero2_full_params(remedy: bool, group: Group) -> Facts:
    """ZeRO-2 with bf16 parameters (1.6 B here): every rank holds all 16-bit parameters (2P bytes for P
    parameters) beside its partition of fp32 master, fp32 and 16-bit gradients and AdamW state (18P/W,
    DeepSpeed's own estimate_zero2_model_states_mem_needs); ZeRO-3 partitions the parameters too:
    18P/W + 4L for the largest layer L (estimate_zero3_model_states_mem_needs). The cap sits between,
    plus torch AdamW's foreach temporary over the fp32 partition (4P/W) that both stages share."""
    import deepspeed

    stage = 3 if remedy else 2
    width, depth, batch = pick((8192, 24, 256), (32, 2, 8))
    count = width * (width + 1) * depth
    layer = width * (width + 1)
    limit = group.limit(
        2 * count + 18 * count / group.world,
        18 * count / group.world + 4 * layer,
        2 * depth * batch * width * 2 + 4 * count / group.world,
    )
    cfg = zero_config(stage, batch)
    if stage == 3:
        with deepspeed.zero.Init(config_dict_or_path=cfg):
            model = Blocks(width, depth)
    else:
        with building(torch.bfloat16):
            model = Blocks(width, depth)
    engine, _opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    x = torch.randn(batch, width, device=group.device, dtype=torch.bfloat16)
    for _ in range(pick(3, 2)):
        loss = engine(x).float().square().mean()
        engine.backward(loss)
        engine.step()
    return {"zero_stage": engine.zero_optimization_stage(), "cap_bytes": limit}


if HAS_DEEPSPEED:
    scenario("model_states", "next_zero_stage", into=MULTI)(zero2_full_params)


def run(name: str, remedy: bool, group: Group) -> None:
    live = LiveBytes() if MEASURE.on else contextlib.nullcontext()
    with live:
        facts = MULTI[name][2](remedy, group)
    if isinstance(live, LiveBytes):
        facts["peak_live_bytes"] = live.peak_bytes
    if not SMOKE.on:
        torch.cuda.synchronize()
        facts["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    dist.barrier()
    if group.rank == 0:
        print(f"FACTS {name}{' remedy' if remedy else ''} " + json.dumps(facts, sort_keys=True), flush=True)
        print("FITS", flush=True)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("name", nargs="?")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--all", action="store_true", help="every scenario, plain then with its remedy")
    ap.add_argument("--remedy", action="store_true")
    ap.add_argument("--cpu-smoke", action="store_true", help="gloo on the CPU, tiny shapes, two steps")
    ap.add_argument("--cpu-measure", action="store_true", help="gloo, mid-sized, every storage's bytes tracked")
    ap.add_argument("--cap-gib", type=float, default=None, help="cap each rank here instead")
    args = ap.parse_args(argv)
    if args.list or not (args.name or args.all):
        for name, (label, key, _fn) in MULTI.items():
            print(name, label, key)
        if not HAS_DEEPSPEED:
            print("zero2_full_params: not listed, deepspeed is not installed", file=sys.stderr)
        return 0
    if args.name and args.name not in MULTI:
        print(f"unknown scenario {args.name!r}; --list names them", file=sys.stderr)
        return 2
    MEASURE.on = args.cpu_measure
    SMOKE.on = args.cpu_smoke or args.cpu_measure
    group = setup(args.cap_gib)
    skip = "deepspeed is not installed" if not HAS_DEEPSPEED else "it needs a GPU" if SMOKE.on else None
    names = [n for n in MULTI if not (skip and n == "zero2_full_params")]
    todo = [(n, r) for n in names for r in (False, True)] if args.all else [(args.name, args.remedy)]
    if args.all and skip and group.rank == 0:
        print(f"SKIP zero2_full_params: {skip}", flush=True)
    try:
        for name, remedy in todo:
            run(name, remedy, group)
        dist.barrier()  # no rank leaves while another still talks to it
    except BaseException:
        dist.destroy_process_group()
        raise
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without the interpreter's teardown: gloo's threads, destroyed at exit, now and then abort a
    # finished rank ("terminate called without an active exception") after every result was printed.
    os._exit(code)
