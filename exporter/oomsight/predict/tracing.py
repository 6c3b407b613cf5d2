"""Run training steps on fake tensors and record every tensor storage's birth and death.

``trace_steps`` builds the model on the meta device, gives it fake parameters
(``FakeTensorMode``: shapes, dtypes and lifetimes, no memory), and runs the user's step —
forward, backward, optimizer — ``steps`` times. A ``TorchDispatchMode`` under autograd
sees every ATen call, so it sees each new storage when the call returns it (outputs,
saved activations, gradients, optimizer state, recomputed checkpoint segments) and its
end through a weak reference: the same lifetimes the CUDA caching allocator sees, in the
same order. Kernel-private allocations are invisible to a trace: the one that persists and
counts in ``memory_allocated`` — cuBLAS's workspace, one per thread and stream — is added
where the first matrix product of the forward and of the backward pass would create it, and
the temporaries a CUDA kernel allocates and frees inside one call (``kernels.py``) are added
around that call.

Each allocation gets a category afterwards: parameters and buffers (alive after the model
is built), gradients (``.grad`` after a backward), optimizer state (``optimizer.state``
after a step), activations (alive when a backward begins) and temporaries (the rest).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from oomsight.predict import emulation, kernels

PARAMETERS, BUFFERS, GRADIENTS, OPTIMIZER_STATE, ACTIVATIONS, TEMPORARIES, WORKSPACE = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer_state",
    "activations",
    "temporaries",
    "workspace",
)
GATHERED = "gathered_parameters"
"""A sharded job's parameters gathered for compute (FSDP2's unsharded buffers, made and freed by
``UntypedStorage.resize_``)."""
HOST = "host"
"""Tensors PyTorch keeps in host memory on CUDA too: an optimizer's ``step`` counters (unless
``capturable`` or ``fused``). The trace runs on the CPU device, so it must say which."""
CATEGORIES = (PARAMETERS, BUFFERS, GRADIENTS, OPTIMIZER_STATE, ACTIVATIONS, TEMPORARIES, WORKSPACE)
_aten = torch.ops.aten
BLAS_OPS = frozenset(
    {_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default, _aten.addmv.default}
    | {_aten.mv.default, _aten.addbmm.default, _aten.addr.default, _aten.dot.default}
)


LT_WORKSPACE = 1 << 20
"""cuBLASLt's workspace, made by the first ``addmm`` with a bias (its fused epilogue); seen
once per process in the H200's allocator history, beside the two cuBLAS workspaces."""


@dataclass
class Trace:
    """Allocations in order: ``events`` holds ``(+id, size)`` births and ``(-id, 0)`` deaths."""

    events: list[tuple[int, int]] = field(default_factory=list)
    categories: dict[int, str] = field(default_factory=dict)
    step_ends: list[int] = field(default_factory=list)
    optimizer_windows: list[tuple[int, int]] = field(default_factory=list)
    backward_starts: list[int] = field(default_factory=list)
    """The event index where each backward pass begins."""
    """``(first, end)`` event indices of each ``optimizer.step()``."""
    notes: list[str] = field(default_factory=list)


class Recorder(TorchDispatchMode):
    """Record storages as ATen calls return them; their deaths through ``weakref.finalize``."""

    def __init__(self, trace: Trace, workspace_bytes: int) -> None:
        super().__init__()
        self.trace = trace
        self.workspace_bytes = workspace_bytes
        self._ids = itertools.count(1)
        self._live: dict[int, int] = {}  # storage address -> allocation id
        self._watched: set[int] = set()
        self.host = False
        """While True, every new storage is the host's (an offloaded optimizer step)."""
        self._workspaces: set[str] = set()
        self._in_backward = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        backward = torch._C._current_graph_task_id() != -1
        if backward != self._in_backward:
            self._in_backward = backward
            if backward:
                self.trace.backward_starts.append(len(self.trace.events))
                self._mark_activations()
        if func in BLAS_OPS:
            self._workspace("backward" if backward else "forward", self.workspace_bytes)
        if func is _aten.addmm.default and not backward:
            self._workspace("lt", LT_WORKSPACE if self.workspace_bytes else 0)
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.seen(t)
        self._private(kernels.private_bytes(func, args))
        return out

    def seen(self, t: torch.Tensor, category: Optional[str] = None) -> None:
        if is_traceable_wrapper_subclass(t):  # a DTensor holds only its local shard (never the outer size)
            for inner in inner_tensors(t):
                self.seen(inner, category)
            return
        if t.device.type == "meta":  # the model as built, before it gets fake parameters
            return
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._live or not storage.nbytes():
            return
        self._born(storage, int(storage.nbytes()), category)

    def _born(self, storage: Any, size: int, category: Optional[str]) -> None:
        key = storage._cdata
        aid = next(self._ids)
        self._live[key] = aid
        self.trace.events.append((aid, size))
        category = HOST if self.host else category
        if category:
            self.trace.categories[aid] = category
        if key not in self._watched:
            self._watched.add(key)
            weakref.finalize(storage, self._died, key)

    def _died(self, key: int) -> None:
        self._watched.discard(key)
        aid = self._live.pop(key, None)
        if aid is not None:
            self.trace.events.append((-aid, 0))

    def resized(self, storage: Any) -> None:
        """``UntypedStorage.resize_``: FSDP frees a gathered buffer to 0 bytes and makes it again."""
        key = storage._cdata
        aid = self._live.pop(key, None)
        if aid is not None:
            self.trace.events.append((-aid, 0))
        if storage.nbytes():
            self._born(storage, int(storage.nbytes()), GATHERED)

    def allocation_of(self, t: torch.Tensor) -> Optional[int]:
        return self._live.get(t.untyped_storage()._cdata)

    def categorize(self, tensors: Iterable[Any], category: str) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor) and is_traceable_wrapper_subclass(t):
                self.categorize(inner_tensors(t), category)
            elif isinstance(t, torch.Tensor):
                aid = self.allocation_of(t)
                if aid is not None:
                    self.trace.categories.setdefault(aid, category)

    def _workspace(self, name: str, size: int) -> None:
        if name in self._workspaces or size <= 0:
            return
        self._workspaces.add(name)
        aid = next(self._ids)
        self.trace.events.append((aid, size))
        self.trace.categories[aid] = WORKSPACE

    def _private(self, sizes: list[int]) -> None:
        """What the CUDA kernel allocates and frees inside the call (``kernels.py``), while its outputs live."""
        ids = [next(self._ids) for _ in sizes]
        self.trace.events.extend((aid, size) for aid, size in zip(ids, sizes))
        self.trace.events.extend((-aid, 0) for aid in reversed(ids))

    def _mark_activations(self) -> None:
        for aid in self._live.values():
            self.trace.categories.setdefault(aid, ACTIVATIONS)


def inner_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors a wrapper subclass (DTensor, a quantized tensor) holds, recursively."""
    if not is_traceable_wrapper_subclass(t):
        return [t]
    names, _ = t.__tensor_flatten__()
    found: list[torch.Tensor] = []
    for name in names:
        inner = getattr(t, name, None)
        if isinstance(inner, torch.Tensor):
            found.extend(inner_tensors(inner))
    return found


@contextlib.contextmanager
def resizes_seen(recorder: Recorder) -> Iterator[None]:
    """``UntypedStorage.resize_`` reported to ``recorder`` (no dispatch mode sees it; torch's own
    ``MemTracker`` patches it the same way)."""
    plain = torch.UntypedStorage.resize_

    def resize_(storage: Any, size: int) -> Any:
        out = plain(storage, size)
        recorder.resized(storage)
        return out

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = plain  # type: ignore[method-assign]


def materialize(build: Callable[[], torch.nn.Module], recorder: Recorder) -> torch.nn.Module:
    """The model with fake parameters and buffers; a weight shared by two modules stays shared."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # built outside the fake mode: a ``model.to(dtype)`` inside ``build`` then converts meta
    # tensors to meta tensors (under the mode it made fake ones, which cannot be swapped in)
    with unset_fake_temporarily(), torch.device("meta"):
        model = build()
    made: dict[int, torch.Tensor] = {}

    def fake(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            empty = torch.empty(t.shape, dtype=t.dtype, device="cpu")
            made[id(t)] = torch.nn.Parameter(empty, t.requires_grad) if isinstance(t, torch.nn.Parameter) else empty
        return made[id(t)]

    for module in model.modules():
        for group in (module._parameters, module._buffers):
            for name, t in group.items():
                if t is not None:
                    group[name] = fake(t)  # type: ignore[assignment]
    recorder.categorize(model.parameters(), PARAMETERS)
    recorder.categorize(model.buffers(), BUFFERS)
    return model


StepFn = Callable[[torch.nn.Module, Any, Any], Any]


def trace_steps(
    build_model: Callable[[], torch.nn.Module],
    make_batch: Callable[[], Any],
    make_optimizer: Callable[[torch.nn.Module], Any],
    step: StepFn,
    steps: int = 3,
    workspace_bytes: int = 0,
    materializer: Optional[Callable[[Callable[[], torch.nn.Module], Recorder], torch.nn.Module]] = None,
    host_states: bool = False,
) -> Trace:
    """Trace ``steps`` calls of ``step(model, batch, optimizer)`` on fake tensors.

    ``materializer(build_model, recorder)`` gives the model its fake parameters (default
    ``materialize``; ``sharded.py`` shards it first); ``host_states``: gradients, optimizer state
    and the optimizer step live on the host (an offloaded sharded job), so the device never sees them."""
    trace = Trace()
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    recorder = Recorder(trace, workspace_bytes)
    with fake, emulation.cuda_like(), recorder, resizes_seen(recorder):
        model = (materializer or materialize)(build_model, recorder)
        optimizer = make_optimizer(model)
        emulation.prepare_optimizer(optimizer)
        hooks = _optimizer_hooks(optimizer, model, recorder, trace, host_states)
        batch = make_batch()
        for _ in range(steps):
            step(model, batch, optimizer)
            gc.collect()
            if not hooks:
                trace.step_ends.append(len(trace.events))
        for h in hooks:
            h.remove()
        del model, optimizer, batch
    return trace


def _optimizer_hooks(
    optimizer: Any, model: torch.nn.Module, recorder: Recorder, trace: Trace, host_states: bool = False
) -> list[Any]:
    if not isinstance(optimizer, torch.optim.Optimizer):
        return []
    first = [0]

    def before(_opt: Any, _args: Any, _kwargs: Any) -> None:
        recorder.categorize((p.grad for p in model.parameters()), HOST if host_states else GRADIENTS)
        recorder.host = host_states
        first[0] = len(trace.events)

    def after(_opt: Any, _args: Any, _kwargs: Any) -> None:
        recorder.host = False
        recorder.categorize(_host_counters(optimizer), HOST)
        recorder.categorize(
            (t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)),
            HOST if host_states else OPTIMIZER_STATE,
        )
        trace.optimizer_windows.append((first[0], len(trace.events)))
        trace.step_ends.append(len(trace.events))

    return [optimizer.register_step_pre_hook(before), optimizer.register_step_post_hook(after)]


def _host_counters(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    found = []
    for group in optimizer.param_groups:
        if group.get("capturable") or group.get("fused"):
            continue
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor) and step.numel() == 1:
                found.append(step)
    return found


def default_step(
    accumulation: int = 1, autocast: Optional[torch.dtype] = None, keep_outputs: bool = False
) -> StepFn:
    """Forward, backward, ``optimizer.step()``, ``zero_grad(set_to_none=True)``; ``accumulation``
    micro-batches per step; ``autocast``: the dtype of ``torch.autocast("cuda")`` around the forward,
    its outputs converted to fp32 as accelerate's mixed precision converts them (``outputs_in_fp32``);
    ``keep_outputs``: the loop keeps what the forward returned (``outputs = model(**batch)``) through the
    backward until the next forward returns, as hand-written loops do (transformers'
    ``run_clm_no_trainer.py``): its logits (and cache) live through the backward, the optimizer step and
    the next forward. Without it the step is Trainer's: ``compute_loss`` returns the loss alone, so the
    outputs (the logits the loss no longer needs) are freed before the backward."""
    held: list[Any] = []

    def step(model: torch.nn.Module, batch: Any, optimizer: Any) -> None:
        for _ in range(accumulation):
            if autocast is not None:
                with torch.autocast("cuda", dtype=autocast):
                    out = forward(model, batch)
                out = outputs_in_fp32(out)
            else:
                out = forward(model, batch)
            held.clear()  # the loop's variable is rebound only once the new forward has returned
            loss = loss_of(out)
            if keep_outputs:
                held.append(out)
            del out
            if accumulation > 1:
                loss = loss / accumulation
            loss.backward()
            del loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def outputs_in_fp32(out: Any) -> Any:
    """What accelerate's mixed precision returns from the forward (``Accelerator(mixed_precision=...)`` and
    ``Trainer(bf16=True)`` wrap it in ``convert_outputs_to_fp32``): each fp16/bf16 tensor of the outputs
    (a tensor, a mapping such as transformers' ``ModelOutput``, a list or tuple of them) converted by
    ``.float()`` into a new fp32 tensor, the containers rebuilt as their types. The 16-bit logits are
    freed once nothing holds them; their fp32 copy lives as long as the outputs do."""
    if isinstance(out, torch.Tensor):
        return out.float() if out.dtype in (torch.float16, torch.bfloat16) else out
    if isinstance(out, Mapping):
        return type(out)(**{k: outputs_in_fp32(v) for k, v in out.items()})
    if isinstance(out, (list, tuple)):
        converted = [outputs_in_fp32(v) for v in out]
        return type(out)(*converted) if hasattr(out, "_fields") else type(out)(converted)  # a namedtuple
    return out


def forward(model: torch.nn.Module, batch: Any) -> Any:
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def loss_of(out: Any) -> torch.Tensor:
    """The loss a model returned (``.loss``, ``["loss"]``, a scalar) or the mean of its output."""
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if loss is None:
        first = out if isinstance(out, torch.Tensor) else getattr(out, "logits", None)
        if first is None and isinstance(out, (tuple, list)):
            first = out[0]
        if not isinstance(first, torch.Tensor):
            raise TypeError("the model returned no tensor and no .loss: pass a step function")
        loss = first if first.dim() == 0 else first.float().mean()
    return loss
