"""One rank of an FSDP2 or DDP job, traced: ``fully_shard`` (or DDP) itself on a fake process group of the job's size.

The way torchtitan estimates a sharded job's memory and torch's own ``FSDPMemTracker`` measures it:
in one process, a process group of the ``fake`` back-end (it hallucinates every collective: no data
moves, no other process exists) gives the ranks' mesh, ``fully_shard`` wraps each block of the model
and the root on the meta device, ``to_empty`` gives this rank its fake local shards, and the user's
step runs under the same fake-tensor trace as one GPU's (``tracing.trace_steps``). So the timeline is
the rank's own: each unit's all-gather buffer and its copy-out into the unsharded parameters (freed by
``UntypedStorage.resize_``, which the trace follows), the prefetched unit, the root kept gathered
between forward and backward, the reduce-scatter input, the sharded gradients, and the optimizer step
on this rank's shards with its own foreach temporaries. Nothing is added up from formulas.

Flags: ``reshard`` (``reshard_after_forward`` of every block; the root keeps FSDP2's default),
``param_dtype`` (``MixedPrecisionPolicy(param_dtype, reduce_dtype=float32)``: fp32 masters gathered in
16 bits), ``offload`` (``CPUOffloadPolicy``: parameter shards, gradients, optimizer state and the
optimizer step on the host; the trace keeps them off the device), ``shard_size`` (HSDP: a 2-D mesh of
replicas x shards). The micro-batch is each rank's.

DDP is traced the same way (``replicated``): ``DistributedDataParallel`` wraps the fake model on the fake
group, and its C++ Reducer allocates its gradient buckets (one flat tensor per bucket, in the parameters'
dtype, made in the constructor and again when it rebuilds them in gradient-ready order before the second
forward) under the trace's fake mode, where the trace sees them born and, with ``gradient_as_bucket_view``,
the gradients made as their views. Three things the fake group cannot do are done otherwise:
``init_sync=False`` (the constructor's shape check reads parameter data); a comm hook that returns the
bucket as reduced (the fake group's work future holds None; NCCL's all-reduce is in place, so no memory
changes); and the rebuild's bucket indices (``Reducer::sync_bucket_indices`` writes and reads int32 host
tensors by accessor) are real tensors, a few bytes per parameter.

FSDP1 is traced the same way too (``flat_sharded``): ``FullyShardedDataParallel`` over the fake model, one
unit per block; its flat shards, the unsharded flat parameter allocated and freed by ``resize_`` per forward
and backward, the prefetched unit, the root kept gathered, each unit's reduce-scatter input and the step on
the shards come from torch's code; only its ``data_ptr()`` comparisons are answered by storage identity.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from collections.abc import Iterator
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from oomsight.predict import parallel, tracing

TRACED = ("ddp", "fsdp", "fsdp2")
"""The layouts traced rank by rank (the others: ``parallel.per_rank``, moment by moment); see ``traced``."""


def traced(layout: parallel.Layout) -> bool:
    """Whether ``layout`` is traced rank by rank. FSDP1 with ``--offload`` stays laid out by ``parallel.per_rank``:
    its ``CPUOffload`` pins the shards (``aten._pin_memory``, which fake tensors do not implement), and it has
    no optimizer-only offload to trace."""
    return layout.parallel in TRACED and not (layout.parallel == "fsdp" and layout.offload)


class ShardingUnavailable(RuntimeError):
    """This process cannot make a fake process group (one is already initialised, or no back-end)."""


@contextlib.contextmanager
def fake_world(layout: parallel.Layout) -> Iterator[Any]:
    """A fake process group of ``layout.world_size`` ranks (this process is rank 0) and its mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_available():
        raise ShardingUnavailable("this torch has no torch.distributed")
    if dist.is_initialized():
        raise ShardingUnavailable("a process group is already initialised in this process")
    streams = sys.stdout, sys.stderr  # init_process_group may wrap them with a "[rank0]:" prefix
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=layout.world_size)
    try:
        if layout.shards < layout.world_size:
            shape = (layout.world_size // layout.shards, layout.shards)
            yield init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
        else:
            yield init_device_mesh("cpu", (layout.world_size,))
    finally:
        dist.destroy_process_group()
        sys.stdout, sys.stderr = streams


def materializer(layout: parallel.Layout, mesh: Any, param_dtype: Optional[torch.dtype] = None) -> Any:
    """``trace_steps``' materializer: the model sharded by ``fully_shard`` on ``mesh``, this rank's shards fake."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)

    def build_sharded(build: Callable[[], nn.Module], recorder: tracing.Recorder) -> nn.Module:
        with unset_fake_temporarily(), torch.device("meta"):
            model = build()
            blocks = [m for _, m in parallel._wrapped_modules(model)]
            for block in reversed(blocks):  # inner first: a block inside another is its own unit
                fully_shard(block, mesh=mesh, reshard_after_forward=layout.reshard, mp_policy=policy)
            fully_shard(model, mesh=mesh, mp_policy=policy)  # the root: FSDP2 keeps it gathered until backward
        model.to_empty(device="cpu")  # under the trace's fake mode: this rank's local shards
        host = tracing.HOST if layout.offload else tracing.PARAMETERS
        recorder.categorize(model.parameters(), host)
        recorder.categorize(model.buffers(), tracing.BUFFERS)
        _see_gathered(model, recorder)
        return model

    return build_sharded


REDUCE_SCATTER = "reduce_scatter_buffers"
"""FSDP1's unsharded gradient of a unit and its padded reduce-scatter input (the output becomes the gradient)."""
USE_ORIG_PARAMS = True
"""FSDP1's ``use_orig_params`` in the trace: what accelerate's ``FullyShardedDataParallelPlugin`` and
transformers' Trainer pass by default (no flag changes it). The flat shard, gradients and AdamW state
hold the same bytes either way (the original parameters are views of this rank's flat shard)."""


def flat_sharded(
    layout: parallel.Layout, mesh: Any, followed: contextlib.ExitStack, param_dtype: Optional[torch.dtype] = None
) -> Any:
    """``trace_steps``' materializer for FSDP1: the fake model wrapped in ``FullyShardedDataParallel`` on the
    fake group, one unit per block (``parallel._wrapped_modules``, as the arithmetic lays out) and the root;
    ``--no-reshard`` is ``SHARD_GRAD_OP``, ``--shard-size`` ``HYBRID_SHARD`` on the 2-D mesh (``--offload``
    is not traced: see ``traced``), ``param_dtype`` ``MixedPrecision(param_dtype, reduce_dtype,
    buffer_dtype)`` all that dtype, as accelerate's FSDP plugin builds it for FSDP1. FSDP1 flattens each
    unit into one padded flat parameter, keeps this rank's shard, and gathers it per forward and backward
    into ``_full_param_padded``, made and freed by ``UntypedStorage.resize_`` (``torch/distributed/utils.py:184,206``,
    which the trace follows).
    ``followed`` holds ``_flat_params_followed`` until the trace ends (FSDP1 compares storages and
    reduce-scatters in its forward and backward hooks too)."""
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

    if layout.shards < layout.world_size:
        strategy = ShardingStrategy.HYBRID_SHARD if layout.reshard else ShardingStrategy._HYBRID_SHARD_ZERO2
    else:
        strategy = ShardingStrategy.FULL_SHARD if layout.reshard else ShardingStrategy.SHARD_GRAD_OP

    def build_flat(build: Callable[[], nn.Module], recorder: tracing.Recorder) -> nn.Module:
        model = tracing.materialize(build, recorder)
        units = {id(m) for _, m in parallel._wrapped_modules(model)}
        policy = functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: id(m) in units)
        followed.enter_context(_flat_params_followed(recorder))
        wrapped = FullyShardedDataParallel(
            model, auto_wrap_policy=policy, device_id=torch.device("cpu"), use_orig_params=USE_ORIG_PARAMS,
            sharding_strategy=strategy, device_mesh=mesh if layout.shards < layout.world_size else None,
            mixed_precision=MixedPrecision(param_dtype, param_dtype, param_dtype) if param_dtype else None,
        )  # fmt: skip
        recorder.categorize((h.flat_param for h in _flat_handles(wrapped)), tracing.PARAMETERS)  # this rank's shards
        return wrapped

    return build_flat


def _flat_handles(model: nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return [m._handle for m in FullyShardedDataParallel.fsdp_modules(model) if m._handle is not None]


@contextlib.contextmanager
def _flat_params_followed(recorder: tracing.Recorder) -> Iterator[None]:
    """FSDP1 under the trace. Its ``_same_storage`` (``torch/distributed/fsdp/_flat_param.py:2825``) compares
    storages by ``data_ptr()``, which a fake tensor does not have (0, with a warning, for every storage): they
    are compared by the storage itself (``_cdata``, the recorder's key), as real pointers would compare; so
    is the flat parameter in ``_catch_all_reshard`` (``_runtime_utils.py:1147``), after every backward, and
    ``_data_ptr_allocated`` (``torch/distributed/utils.py:356``) asks the storage's size. And
    each unit's unsharded gradient and its padded reduce-scatter input (``_get_reduce_scatter_tensors``,
    ``torch/distributed/fsdp/_runtime_utils.py:890``) are named ``REDUCE_SCATTER``; the buffers that
    ``MixedPrecision(buffer_dtype)`` casts in the root's first forward (``_runtime_utils.py:1634``) stay buffers."""
    from torch.distributed.fsdp import _flat_param, _runtime_utils

    scatter_plain = _runtime_utils._get_reduce_scatter_tensors
    cast_plain = _runtime_utils._cast_buffers_to_dtype_and_device

    def cast_buffers(buffers: list[torch.Tensor], *args: Any) -> None:
        cast_plain(buffers, *args)
        recorder.categorize(buffers, tracing.BUFFERS)

    def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
        a, b = (getattr(t, "_local_tensor", t) for t in (a, b))  # DTensors, as the original unwraps them
        return bool(a.untyped_storage()._cdata == b.untyped_storage()._cdata)

    def reduce_scatter_tensors(state: Any, unsharded_grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        padded, sharded = scatter_plain(state, unsharded_grad)
        recorder.categorize((unsharded_grad, padded), REDUCE_SCATTER)  # the output becomes the gradient
        return padded, sharded

    def allocated(t: torch.Tensor) -> bool:  # _flat_param.py:2271 (SHARD_GRAD_OP's kept unsharded flat parameter)
        return t.untyped_storage().nbytes() > 0  # torch/distributed/utils.py:356 asks data_ptr() > 0

    def catch_all_reshard(state: Any) -> None:
        # _runtime_utils.py:1146-1156 with the storages compared, not data_ptr() (0 == 0 on fake tensors,
        # which would call every unit resharded already)
        handle = state._handle
        if handle is None:
            return
        flat, shard = handle.flat_param, handle.flat_param._local_shard
        resharded = same_storage(flat, shard) and flat.storage_offset() == shard.storage_offset()
        if resharded and not handle._skipped_use_sharded_views:
            return
        _runtime_utils._reshard(state, handle, _runtime_utils._should_free_in_backward(state, handle))

    patches = [
        (_flat_param, "_same_storage", same_storage),
        (_runtime_utils, "_get_reduce_scatter_tensors", reduce_scatter_tensors),
        (_runtime_utils, "_catch_all_reshard", catch_all_reshard),
        (_flat_param, "_data_ptr_allocated", allocated),  # imported there from torch.distributed.utils
        (_runtime_utils, "_cast_buffers_to_dtype_and_device", cast_buffers),
    ]
    plain = [(module, name, getattr(module, name)) for module, name, _ in patches]
    for module, name, patched in patches:
        setattr(module, name, patched)
    try:
        yield
    finally:
        for module, name, original in plain:
            setattr(module, name, original)


DDP_BUCKETS = "ddp_buckets"
"""DDP's gradient buckets beside the gradients (``parallel.per_rank``'s part of the same name)."""


def replicated(layout: parallel.Layout) -> Any:
    """``trace_steps``' materializer for DDP: the fake model wrapped in ``DistributedDataParallel`` on the
    fake process group, its buckets as the Reducer makes them (default caps: 25 MiB, the first 1 MiB);
    ``layout.bucket_view``: ``gradient_as_bucket_view=True`` (the buckets are then the gradients)."""

    def build_replicated(build: Callable[[], nn.Module], recorder: tracing.Recorder) -> nn.Module:
        model = tracing.materialize(build, recorder)
        category = tracing.GRADIENTS if layout.bucket_view else DDP_BUCKETS
        with _born_as(recorder, category):  # the constructor's buckets
            ddp = _TracedDDP(model, init_sync=False, gradient_as_bucket_view=layout.bucket_view)
        ddp.recorder, ddp.bucket_category = recorder, category
        ddp.register_comm_hook(None, _reduced_in_place)
        return ddp

    return build_replicated


class _TracedDDP(DistributedDataParallel):
    """DDP whose bucket rebuild (in ``_pre_forward`` of the second forward) the trace can follow."""

    recorder: tracing.Recorder
    bucket_category: str

    def _pre_forward(self, *inputs: Any, **kwargs: Any) -> Any:
        with _born_as(self.recorder, self.bucket_category), _HostIndices():
            return super()._pre_forward(*inputs, **kwargs)


class _HostIndices(TorchDispatchMode):
    """``Reducer::sync_bucket_indices`` fills int32 host tensors by accessor and reads back what rank 0
    broadcast: those tensors are made real, and every call on real tensors alone runs for real."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        indices = func is torch.ops.aten.empty.memory_format and kwargs.get("dtype") == torch.int32
        if indices or (tensors and not any(isinstance(t, FakeTensor) for t in tensors)):
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


def _reduced_in_place(_state: Any, bucket: Any) -> Any:
    """DDP's comm hook: the bucket as the all-reduce leaves it (NCCL's is in place; the fake group's
    work future holds None, which the Reducer's own hook cannot parse)."""
    done: Any = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


_reduced_in_place.__annotations__ = {}  # DDP checks a hook's annotations against its types, not strings


@contextlib.contextmanager
def _born_as(recorder: tracing.Recorder, category: str) -> Iterator[None]:
    """Storages born inside and still alive after it get ``category`` (unless they have one)."""
    first = len(recorder.trace.events)
    yield
    alive = set(recorder._live.values())
    for aid, _ in recorder.trace.events[first:]:
        if aid in alive:
            recorder.trace.categories.setdefault(aid, category)


def _see_gathered(model: nn.Module, recorder: tracing.Recorder) -> None:
    """Name each unit's first gathered buffers (made by ``torch.empty``; later ones come by ``resize_``)."""
    from torch.distributed.fsdp import FSDPModule

    def gathered(module: nn.Module, *_: Any) -> None:
        state = module._get_fsdp_state()  # type: ignore[operator]
        group = getattr(state, "_fsdp_param_group", None)
        for fp in getattr(group, "fsdp_params", ()) or ():
            recorder.categorize(getattr(fp, "all_gather_outputs", ()) or (), tracing.GATHERED)

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.register_forward_pre_hook(gathered)


def predict_rank(
    build: Callable[[], nn.Module],
    batch: Callable[[int], Any],
    batch_size: int,
    layout: parallel.Layout,
    optimizer: Optional[Callable[[Any], Any]] = None,
    step: Optional[Callable[[Any, Any, Any], Any]] = None,
    *,
    param_dtype: Optional[torch.dtype] = None,
    **kwargs: Any,
) -> Any:
    """The ``Prediction`` of rank 0 of ``layout`` (FSDP2, FSDP1 or DDP) at a micro-batch of ``batch_size`` per rank."""
    from oomsight.predict.predictor import predict_peak

    with fake_world(layout) as mesh, contextlib.ExitStack() as followed:
        if layout.parallel == "fsdp":
            made = flat_sharded(layout, mesh, followed, param_dtype)
        else:
            made = replicated(layout) if layout.parallel == "ddp" else materializer(layout, mesh, param_dtype)
        return predict_peak(
            build, batch, batch_size, optimizer, step, materializer=made, host_states=bool(layout.offload), **kwargs
        )


LAYERS_TRACED = (2, 3)
"""Blocks of a transformers configuration traced when it has more: the real shapes, fewer repeats."""


def predict_config_rank(
    config: Any,
    make_build: Callable[[Any], Callable[[], nn.Module]],
    batch: Callable[[int], Any],
    batch_size: int,
    layout: parallel.Layout,
    optimizer: Optional[Callable[[Any], Any]] = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Rank 0's peak for a transformers configuration of many identical blocks: the sharded step traced
    with ``LAYERS_TRACED`` blocks of the real shapes (each its own ``fully_shard`` unit, the root whole),
    and every figure carried to ``num_hidden_layers`` along the line through the two (each block adds
    the same shard, optimizer state and saved activations; the gathered units, the root and the
    communication buffers do not grow). The two traces must peak at the same kind of moment, else the
    whole model is traced. ``make_build(config)`` builds the model of a configuration."""
    import copy

    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    few = [n for n in LAYERS_TRACED if n < layers]
    if len(few) < 2:
        found = predict_rank(make_build(config), batch, batch_size, layout, optimizer, **kwargs).to_dict()
        return {**found, "layers_traced": [layers], "layers": layers}
    traced = []
    for n in few:
        small = copy.deepcopy(config)
        small.num_hidden_layers = n
        if isinstance(getattr(small, "layer_types", None), list):
            small.layer_types = small.layer_types[:n]
        traced.append(predict_rank(make_build(small), batch, batch_size, layout, optimizer, **kwargs).to_dict())
    a, b = traced
    if not a["moments"].get("last_step") or not b["moments"].get("last_step"):
        found = predict_rank(make_build(config), batch, batch_size, layout, optimizer, **kwargs).to_dict()
        return {**found, "layers_traced": [layers], "layers": layers}
    return {**_carried(a, b, few, layers), "layers_traced": few, "layers": layers}


def _carried(a: dict[str, Any], b: dict[str, Any], few: list[int], layers: int) -> dict[str, Any]:
    """Rank 0's figures at ``layers`` blocks, along the line through the traces of ``few`` blocks (``a``, ``b``)."""
    la, lb = a["moments"]["last_step"], b["moments"]["last_step"]
    grow = layers - few[1]
    step = few[1] - few[0]

    def line(x: int, y: int) -> int:
        return int(y + (y - x) * grow / step)

    start = line(la["backward_start_bytes"], lb["backward_start_bytes"])
    # the backward's own additions above its start (the head's gradient, gathered and prefetched units,
    # reduce-scatter buffers) are the same at any depth; the activations only fall from there
    rise = lb["backward_peak_bytes"] - lb["backward_start_bytes"]
    moments = {
        "forward": line(la["forward_peak_bytes"], lb["forward_peak_bytes"]),
        "backward": start + max(0, rise),
        "optimizer_step": line(la["optimizer_peak_bytes"], lb["optimizer_peak_bytes"]),
    }
    moment = max(moments, key=lambda k: moments[k])
    peak = moments[moment]
    ca, cb = la["backward_start_by_category_bytes"], lb["backward_start_by_category_bytes"]
    by_cat = {c: line(ca.get(c, 0), cb.get(c, 0)) for c in sorted(set(ca) | set(cb))}
    by_cat["backward_rise"] = max(0, rise)
    slack = b["peak_reserved_bytes"] - b["peak_allocated_bytes"]  # the allocator's cached surplus
    return {
        **b,
        "peak_allocated_bytes": peak,
        "peak_reserved_bytes": peak + max(0, slack),
        "by_category_bytes": by_cat,
        "moment": moment,
        "moments_bytes": moments,
        "seconds": round(a["seconds"] + b["seconds"], 3),
    }


def gpus_needed(
    peak_of: Callable[[int], tuple[int, int]],
    budget_of: Callable[[int], int],
    layout: parallel.Layout,
    limit: int = 1024,
) -> dict[str, Any]:
    """The fewest ranks (1, 2, 4, then multiples of 8 up to ``limit``) whose traced per-rank peak reserved
    fits ``budget_of(world)``, in a few traces (``peak_of(world)``: allocated and reserved). A sharded
    rank holds a fixed part (activations, gathered units, buffers) and a part divided by the world
    (shards, gradients, state), so two traces give the curve ``a + b / world`` of the allocated peak (plus
    the most the allocator cached above it in those traces); the counts between the one it names and the
    fewest traced to fit are bisected by traces (one, where the curve is right). Hybrid sharding keeps
    its shard size: one trace."""
    if layout.shard_size:
        fits = peak_of(layout.world_size)[1] <= budget_of(layout.world_size)
        return {"gpus_needed": layout.world_size if fits else None, "traces": 1}
    counts = [1, 2, 4, *range(8, limit + 1, 8)]
    tried: dict[int, tuple[int, int]] = {}

    def peak(w: int) -> tuple[int, int]:
        if w not in tried:
            tried[w] = peak_of(w)
        return tried[w]

    w1 = max(2, layout.world_size)
    w2 = w1 * 2 if w1 * 2 <= limit else max(1, w1 // 2)
    b = (peak(w1)[0] - peak(w2)[0]) / (1 / w1 - 1 / w2)
    a = peak(w1)[0] - b / w1
    slack = max(r - p for p, r in tried.values())
    guess = next((w for w in counts if a + b / w + slack <= budget_of(w)), None)
    fitting = [w for w, (_, r) in tried.items() if r <= budget_of(w)]
    found = min(fitting) if fitting else None
    if guess is not None and (not found or guess < found) and peak(guess)[1] <= budget_of(guess):
        found = guess  # the curve was right: the count below it does not fit by the curve
    elif guess is not None:  # bisect the counts between the curve's answer and the fewest known to fit
        lo = counts.index(guess) - 1  # the count below the guess: taken as not fitting (the curve says so)
        hi = counts.index(found) if found else min(len(counts) - 1, counts.index(guess) + 2)
        if not found and peak(counts[hi])[1] <= budget_of(counts[hi]):
            found = counts[hi]
        while found and hi - lo > 1:
            mid = (lo + hi) // 2
            if peak(counts[mid])[1] <= budget_of(counts[mid]):
                hi, found = mid, counts[mid]
            else:
                lo = mid
    return {"gpus_needed": found, "traces": len(tried), "curve_bytes": [int(a), int(b)], "cached_bytes": slack}
