"""Labelled OOM scenarios of the jobs GPU clusters run (issue 24): adapters on a frozen base, a frozen
second model, expert routing, an extension's own allocations, ``cudaMallocAsync``, CUDA graphs and
activation offload. One GPU each; the multi-process ones (DDP, FSDP2, ZeRO) are in ``multigpu.py``.

    python benchmarks/corpus/cluster.py --list                        # name, true cause, remedy key
    python benchmarks/corpus/cluster.py NAME [--remedy]               # on a GPU; prints FITS without an OOM
    python benchmarks/corpus/cluster.py NAME [--remedy] --cpu-smoke   # tiny shapes, two steps, on the CPU
    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/corpus/run.py --script cluster --out DIR

The contract of ``scenarios.py`` (``run.py`` runs either): each scenario is labelled by construction
with its true cause and the remedy key that ``--remedy`` applies. Most are capped with
``set_per_process_memory_fraction`` to behave like a 3-8 GiB GPU, so four run at once on one H200;
``extension_memory_grows`` fills the real device (memory outside the allocator is not counted by a cap)
and runs alone. Each scenario returns the facts of its construction, printed as one ``FACTS {json}``
line: they are what makes its label true, and the CPU test checks them. Sizes and the reasoning behind
each cap are in docs/benchmarks.md ("Corpus scenarios for cluster jobs").
"""

from __future__ import annotations

import os
import sys

ALLOC_CONF = {"async_backend_too_big": "backend:cudaMallocAsync"}
"""Scenario -> PYTORCH_CUDA_ALLOC_CONF. The back-end is chosen when torch's CUDA library loads, so it is
set here, before ``import torch``, whoever launches the scenario."""
if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] in ALLOC_CONF:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ALLOC_CONF[sys.argv[1]]

import contextlib  # noqa: E402 (after the allocator configuration above)
import ctypes  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from typing import Any, Callable, Optional  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scenarios import Blocks  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
Facts = dict[str, Any]
SCENARIOS: dict[str, tuple[str, str, Callable[[bool], Facts]]] = {}
"""name -> (true cause, the remedy key that ``--remedy`` applies, function)."""
PENDING_KEYS = frozenset(
    {
        "reshard_after_forward",
        "full_shard",
        "next_zero_stage",
        "offload_optimizer",
        "bucket_view",
        "frozen_no_grad",
        "quantize_base",
        "graph_pools",
    }
)
"""Remedy keys issue 24 adds for sharded, frozen and graph-pool jobs (not all in REMEDY yet)."""


class _Smoke:
    on = False
    """``--cpu-smoke``: tiny shapes on the CPU."""
    traced = False
    """GPU shapes on the CPU device, for oomsight's peak predictor (fake tensors: nothing is allocated);
    see ``sizing.py``."""
    cap_gib = 0.0
    """The cap the scenario asked for last (kept also where none is set)."""

    @property
    def gpu(self) -> bool:
        return not (self.on or self.traced)


SMOKE = _Smoke()


def scenario(label: str, remedy: str, into: Optional[dict[str, Any]] = None) -> Callable[[Any], Any]:
    """Register a scenario function under its name with its label (in ``into``, else SCENARIOS)."""

    def add(fn: Any) -> Any:
        (SCENARIOS if into is None else into)[fn.__name__] = (label, remedy, fn)
        return fn

    return add


def pick(gpu: Any, cpu: Any) -> Any:
    """The GPU size, or the tiny CPU one under ``--cpu-smoke``."""
    return cpu if SMOKE.on else gpu


def dev() -> torch.device:
    return torch.device("cuda") if SMOKE.gpu else torch.device("cpu")


def cap(gib: float) -> None:
    """Make the caching allocator refuse to reserve more than ``gib`` GiB (no-op on the CPU)."""
    SMOKE.cap_gib = gib
    if SMOKE.gpu:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, gib * GIB / total))


@contextlib.contextmanager
def building(dtype: torch.dtype = torch.float32) -> Iterator[None]:
    """Create parameters directly on the device in ``dtype`` (no CPU copy, no second dtype)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with dev():
            yield
    finally:
        torch.set_default_dtype(before)


def blocks(width: int, depth: int, dtype: torch.dtype = torch.float32, ckpt: bool = False) -> Blocks:
    torch.manual_seed(0)
    with building(dtype):
        return Blocks(width, depth, ckpt)


def nbytes(params: Iterator[nn.Parameter]) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def train(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    """One step: forward, a scalar loss, backward, optimizer step, gradients freed."""
    model(x).float().square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def pace(seconds: float) -> None:
    """Leave the hook a step row now and then (it reads the allocator at most every 40 ms)."""
    if SMOKE.gpu:
        time.sleep(seconds)


# ---------------------------------------------------------------- adapters on a frozen base
class LoRALinear(nn.Module):
    """A frozen Linear plus a trainable low-rank update ``x A^T B^T * alpha / r`` in fp32, as PEFT's LoRA
    layer computes it (written here: the GPU machine has no peft)."""

    def __init__(self, base: nn.Linear, rank: int = 16, alpha: float = 32.0) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        device = base.weight.device
        self.lora_a = nn.Parameter(torch.randn(rank, base.in_features, device=device, dtype=torch.float32) / rank)
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, device=device, dtype=torch.float32))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = (x.to(self.lora_a.dtype) @ self.lora_a.t()) @ self.lora_b.t()
        return self.base(x) + (update * self.scale).to(x.dtype)


def lora_model(width: int, depth: int, base_dtype: torch.dtype, ckpt: bool = False) -> Blocks:
    """``depth`` blocks of frozen Linear + GELU, each Linear wrapped with a LoRA adapter."""
    m = blocks(width, depth, base_dtype, ckpt)
    for blk in m.blocks:
        blk[0] = LoRALinear(blk[0])  # type: ignore[index]
    return m


def lora_facts(m: nn.Module) -> Facts:
    return {
        "frozen_bytes": nbytes(p for p in m.parameters() if not p.requires_grad),
        "trainable_bytes": nbytes(p for p in m.parameters() if p.requires_grad),
        "base_dtype": str(m.blocks[0][0].base.weight.dtype),  # type: ignore[index]
    }


def lora_train(m: nn.Module, batches: list[int], dtype: torch.dtype) -> None:
    opt = torch.optim.AdamW((p for p in m.parameters() if p.requires_grad), lr=1e-4)
    width = m.blocks[0][0].base.in_features  # type: ignore[index]
    for n in batches:
        train(m, opt, torch.randn(n, width, device=dev(), dtype=dtype))
        pace(0.02)


@scenario("model_states", "quantize_base")
def lora_frozen_base_no_room(remedy: bool) -> Facts:
    """LoRA on a 3 GiB fp32 frozen base capped at 3.25 GiB: the weights leave ~0.15 GiB beside the
    adapters' states, less than a 512-token batch needs even with checkpointing. A bf16 base (the
    remedy; a 4-bit one would do more) halves the weights and the batch fits with ~1 GiB to spare."""
    cap(3.25)
    dtype = torch.bfloat16 if remedy else torch.float32
    m = lora_model(pick(4096, 32), pick(48, 2), dtype)
    lora_train(m, [pick(512, 4)] * 4, dtype)
    return lora_facts(m)


@scenario("activations", "checkpointing")
def lora_activations_too_big(remedy: bool) -> Facts:
    """LoRA on a 0.75 GiB bf16 frozen base (already the light base) capped at 6 GiB: 16k tokens save
    ~9 GiB of activations (each layer's input, its fp32 copy for the adapter, the GELU input).
    Checkpointing segments of 4 blocks keeps ~3.5 GiB at the peak."""
    cap(6)
    m = lora_model(pick(4096, 32), pick(24, 8), torch.bfloat16, ckpt=remedy)
    lora_train(m, [pick(16384, 4)] * 3, torch.bfloat16)
    return lora_facts(m)


# ---------------------------------------------------------------- a frozen second model
def kept_bytes(fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Run ``fn``; the bytes its call left allocated (GPU: the allocator's count, output included), or on
    the CPU the bytes autograd saved for a backward meanwhile (counted by a saved-tensor hook, which the
    GPU run does not install: the hook would itself be a fact of the job)."""
    if SMOKE.gpu:
        before = torch.cuda.memory_allocated()
        out = fn()
        return out, torch.cuda.memory_allocated() - before
    seen: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen)


@scenario("activations", "frozen_no_grad")
def distill_teacher_records_graph(remedy: bool) -> Facts:
    """Distillation: a 48-block teacher in eval mode, held by no optimizer, run inside every training
    step. ``eval()`` freezes nothing: its parameters still require grad, so autograd saves the teacher's
    activations (~6 GiB for 16k tokens) as long as its output lives, although the loss detaches it.
    Capped at 4 GiB; with the teacher under torch.no_grad() the step needs ~1 GiB."""
    cap(4)
    width, batch = pick(1024, 16), pick(16384, 4)
    student = blocks(width, pick(4, 2))
    teacher = blocks(width, pick(48, 3)).eval()
    opt = torch.optim.AdamW(student.parameters(), lr=1e-4)
    teacher_kept = 0
    for _ in range(pick(4, 2)):
        x = torch.randn(batch, width, device=dev())
        with torch.no_grad() if remedy else contextlib.nullcontext():
            target, teacher_kept = kept_bytes(lambda x=x: teacher(x))
        loss = F.mse_loss(student(x), target.detach())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        pace(0.02)
    return {"teacher_training": teacher.training, "teacher_kept_bytes": teacher_kept}


# ---------------------------------------------------------------- expert routing
class Experts(nn.Module):
    """Top-1 routed experts computed as one batched matmul over ``[experts, capacity, width]`` (the padded
    dispatch of Switch/GShard-style layers). ``capacity_factor=None``: dropless, capacity = the busiest
    expert's load, so memory follows the routing; else ``ceil(factor * tokens / experts)`` and the
    tokens over it are dropped (they pass through the residual)."""

    def __init__(self, width: int, hidden: int, experts: int, capacity_factor: Optional[float]) -> None:
        super().__init__()
        self.router = nn.Linear(width, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, width, hidden) * width**-0.5)
        self.w2 = nn.Parameter(torch.randn(experts, hidden, width) * hidden**-0.5)
        self.capacity_factor = capacity_factor
        self.last_capacity = 0

    def capacity(self, load: torch.Tensor) -> int:
        if self.capacity_factor is None:
            return int(load.max())
        return max(1, math.ceil(self.capacity_factor * int(load.sum()) / load.numel()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        experts = self.w1.shape[0]
        gate, expert = F.softmax(self.router(x), dim=-1).max(dim=-1)
        load = torch.bincount(expert, minlength=experts)
        cap = self.last_capacity = self.capacity(load)
        order = torch.argsort(expert, stable=True)
        position = torch.arange(x.shape[0], device=x.device) - (torch.cumsum(load, 0) - load)[expert[order]]
        kept = position < cap
        tokens, slots = order[kept], expert[order][kept] * cap + position[kept]
        dispatched = x.new_zeros(experts * cap, x.shape[1]).index_copy(0, slots, x[tokens])
        hidden = F.gelu(torch.bmm(dispatched.view(experts, cap, -1), self.w1))
        y = torch.bmm(hidden, self.w2).reshape(experts * cap, -1)[slots] * gate[tokens].unsqueeze(1)
        return x + x.new_zeros(x.shape).index_copy(0, tokens, y)


@scenario("growing_demand", "bound_input")
def moe_routing_collapse(remedy: bool) -> Facts:
    """A dropless MoE layer (8 experts, 32k tokens a step) whose data drift toward one expert's region
    over 60 steps: the busiest expert's share grows from ~0.13 to ~0.9 (measured on the CPU), the padded
    dispatch with it: the saved activations (measured on the CPU at 4k tokens, scaled) go from ~1.1 to
    ~5 GiB while the batch stays the same. Capped at 4 GiB (0.5 GiB of expert states, ~0.9 of inputs
    and backward transients): the OOM comes once the share passes ~0.4, after ~20 steps that fit. A
    capacity factor of 1.25 keeps the dispatch at the balanced size (~1.1 GiB saved) every step."""
    cap(4)
    width, tokens, steps = pick(1024, 16), pick(32768, 64), pick(60, 2)
    torch.manual_seed(0)
    with building():
        layer = Experts(width, pick(2048, 32), 8, 1.25 if remedy else None)
    toward = F.normalize(layer.router.weight[0].detach(), dim=0) * pick(3, 8)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-5)
    capacities = []
    for i in range(steps):
        x = torch.randn(tokens, width, device=dev()) + toward * (i / max(1, steps - 1))
        train(layer, opt, x)
        capacities.append(layer.last_capacity)
        pace(0.03)
    return {"tokens": tokens, "capacities": capacities}


# ---------------------------------------------------------------- an extension's own allocations
class OutsideMemory:
    """Device memory taken the way a native extension takes it: ``cudaMalloc`` from the libcudart torch
    loaded (the driver's ``cuMemAlloc`` where none is found), called through ctypes, so the caching
    allocator never sees it. On the CPU smoke run, libc's malloc runs the same code."""

    def __init__(self) -> None:
        self.held: list[int] = []
        if not SMOKE.gpu:
            libc = ctypes.CDLL(None)
            libc.malloc.restype = ctypes.c_void_p
            libc.free.argtypes = [ctypes.c_void_p]
            self.api, self._alloc, self._free = "libc", lambda n: libc.malloc(ctypes.c_size_t(n)), libc.free
            return
        torch.empty(1, device="cuda")  # the runtime's context, current on this thread
        found = self._cudart()
        lib = ctypes.CDLL(found or "libcuda.so.1")
        self.api = "cudaMalloc" if found else "cuMemAlloc_v2"
        malloc, free = (lib.cudaMalloc, lib.cudaFree) if found else (lib.cuMemAlloc_v2, lib.cuMemFree_v2)
        free.argtypes = [ctypes.c_void_p]

        def alloc(n: int) -> Optional[int]:
            ptr = ctypes.c_void_p()
            return ptr.value if malloc(ctypes.byref(ptr), ctypes.c_size_t(n)) == 0 else None

        self._alloc, self._free = alloc, free

    @staticmethod
    def _cudart() -> Optional[str]:
        with open("/proc/self/maps") as fh:
            paths = sorted({line.split()[-1] for line in fh if "libcudart.so" in line})
        return paths[0] if paths else None

    def take(self, size: int) -> None:
        ptr = self._alloc(size)
        if not ptr:
            raise MemoryError(f"the extension's {self.api} of {size} bytes failed")
        self.held.append(ptr)

    def release(self) -> None:
        while self.held:
            self._free(self.held.pop())


@scenario("non_pytorch_memory", "outside_leak")
def extension_memory_grows(remedy: bool) -> Facts:
    """A native extension takes a 2 GiB workspace each step with its own cudaMalloc and never frees it:
    memory outside the allocator grows step after step until a step's activations (~6 GiB, re-reserved
    each step: the loop empties PyTorch's cache to leave the library room, as jobs sharing a GPU with
    one do) no longer fit. Uncapped: it fills the real device (~65 steps on an H200) and runs alone.
    The remedy frees each workspace after its step. Each workspace is smaller than a step's need, so
    PyTorch's allocation, not the extension's, is the one that fails."""
    width, batch, steps = pick(2048, 16), pick(49152, 4), pick(200, 2)
    m = blocks(width, 8)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    outside = OutsideMemory()
    for _ in range(steps):
        if SMOKE.gpu:
            torch.cuda.empty_cache()
        outside.take(pick(2 * GIB, MIB))
        train(m, opt, torch.randn(batch, width, device=dev()))
        held = len(outside.held)
        if remedy:
            outside.release()
        pace(0.05)
    outside.release()
    return {"api": outside.api, "held_after_last_step": held}


# ---------------------------------------------------------------- cudaMallocAsync
@scenario("activations", "checkpointing")
def async_backend_too_big(remedy: bool) -> Facts:
    """``steady_too_big`` under ``PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync`` (set before torch
    loads, above): activations that do not fit 4 GiB (16 blocks of 1024 at 32k rows need ~4 GiB of
    saved tensors on top of the states); checkpointing segments of 4 blocks fits. The back-end has no
    OOM observer: the OOM must still be recorded."""
    facts: Facts = {"alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
    if SMOKE.gpu:
        facts["backend"] = torch.cuda.memory.get_allocator_backend()
    cap(4)
    m = blocks(1024, pick(16, 2), ckpt=remedy)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    for _ in range(pick(4, 2)):
        train(m, opt, torch.randn(pick(32000, 4), 1024, device=dev()))
    return facts


# ---------------------------------------------------------------- CUDA graphs
def compiled_steps(mode: str, width: int, depth: int, batch: int) -> int:
    """A few training steps of ``blocks(width, depth)`` compiled with ``mode``; on the GPU, the peak
    reserved bytes, with everything freed and dynamo reset afterwards (0 elsewhere)."""
    m = blocks(width, depth)
    compiled = torch.compile(m, mode=mode) if SMOKE.gpu else torch.compile(m, backend="eager")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=True)
    for _ in range(pick(6, 2)):
        train(compiled, opt, torch.randn(batch, width, device=dev()))
        pace(0.02)
    del compiled, m, opt
    torch._dynamo.reset()
    gc.collect()
    if not SMOKE.gpu:
        return 0
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_reserved()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return peak


@scenario("fragmentation", "graph_pools")
def compiled_graph_pool_holds(remedy: bool) -> Facts:
    """``torch.compile(mode="reduce-overhead")``: forward and backward replay as CUDA graphs whose saved
    activations live in the graphs' private pool, which keeps them reserved between replays and lends
    nothing to eager allocations. The eager foreach AdamW step of 4 GiB of fp32 parameters (4 GiB of
    gradients, 8 of state, ~4 of temporaries) must then find its memory beside the pool, where under
    ``mode="default"`` it reuses the activations' blocks: the difference is about the parameters' size.
    The job first runs the same steps under ``mode="default"`` uncapped and caps itself at that peak
    reserved + 2 GiB (inductor's activation sizes are not known ahead), then trains in its own mode.
    Labelled fragmentation (memory the allocator holds that the failing request cannot use; here it
    sits in a private pool, not in holes), remedy ``graph_pools`` (``mode="default"``): expandable
    segments would not help, private pools never use them. The CPU smoke run compiles with the eager
    back-end."""
    width, depth, batch = pick((8192, 16, 8192), (32, 2, 4))
    default_peak = compiled_steps("default", width, depth, batch)
    # what the measuring run left allocated (compiled code may outlive dynamo's reset) stays beside
    # the second run: the cap counts it (on 2026-12-05 without it both runs ran out in warm-up)
    left = torch.cuda.memory_reserved() if SMOKE.gpu else 0
    cap((default_peak + left) / GIB + 2)
    mode = "default" if remedy else "reduce-overhead"
    compiled_steps(mode, width, depth, batch)
    return {
        "mode": mode, "default_peak_reserved_bytes": default_peak, "left_reserved_bytes": left,
        "cap_gib": round(SMOKE.cap_gib, 2),
    }  # fmt: skip


# ---------------------------------------------------------------- activation offload
class StashingMLP(torch.autograd.Function):
    """Linear -> GELU -> Linear as one op, the way some fused kernels are written: inputs and weights go
    through ``save_for_backward``, but the hidden activation (4x wide) is kept as an attribute of ctx,
    which saved-tensor hooks (``save_on_cpu``, non-reentrant checkpointing) never see."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        hidden = x @ w1.t()
        ctx.save_for_backward(x, w1, w2)
        ctx.hidden = hidden
        return F.gelu(hidden) @ w2.t()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, w1, w2 = ctx.saved_tensors
        hidden = ctx.hidden
        grad_w2 = grad.t() @ F.gelu(hidden)
        grad_hidden = torch.ops.aten.gelu_backward(grad @ w2, hidden)
        return grad_hidden @ w1, grad_hidden.t() @ x, grad_w2


class StashingBlocks(nn.Module):
    """An input projection, then ``depth`` StashingMLP blocks with residuals; ``ckpt`` checkpoints each
    block reentrantly (its forward runs under no_grad, so nothing, ctx attributes included, is kept)."""

    def __init__(self, width: int, depth: int, ckpt: bool) -> None:
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.w1 = nn.ParameterList(nn.Parameter(torch.randn(4 * width, width) * width**-0.5) for _ in range(depth))
        self.w2 = nn.ParameterList(nn.Parameter(torch.randn(width, 4 * width) * width**-0.5) for _ in range(depth))
        self.ckpt = ckpt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for w1, w2 in zip(self.w1, self.w2):
            if self.ckpt:
                x = x + checkpoint(StashingMLP.apply, x, w1, w2, use_reentrant=True)
            else:
                x = x + StashingMLP.apply(x, w1, w2)
        return x


def ctx_kept_bytes(out: torch.Tensor) -> int:
    """Bytes of the ``hidden`` activations that StashingMLP nodes of ``out``'s graph hold."""
    seen, todo, kept = set(), [out.grad_fn], 0
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        hidden = getattr(node, "hidden", None)
        kept += hidden.numel() * hidden.element_size() if isinstance(hidden, torch.Tensor) else 0
        todo.extend(fn for fn, _ in node.next_functions)
    return kept


@scenario("activations", "checkpointing")
def offload_still_too_big(remedy: bool) -> Facts:
    """Activations offloaded with ``torch.autograd.graph.save_on_cpu(pin_memory=True)`` still do not fit:
    what the fused blocks keep as ctx attributes (16 x 256 MiB hidden activations at 32k rows) bypasses
    the hooks and stays on the GPU, over a 3 GiB cap. Reentrant checkpointing of each block keeps none of
    it (~1.6 GiB at the peak); the offload stays on in the remedy run."""
    cap(3)
    width, batch = pick(512, 16), pick(32768, 4)
    torch.manual_seed(0)
    with building():
        m = StashingBlocks(width, pick(16, 2), ckpt=remedy)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    kept = 0
    for _ in range(pick(3, 2)):
        with torch.autograd.graph.save_on_cpu(pin_memory=SMOKE.gpu):
            loss = m(torch.randn(batch, width, device=dev())).float().square().mean()
        kept = ctx_kept_bytes(loss)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"offload": "save_on_cpu", "checkpointing": "reentrant" if remedy else None, "ctx_kept_bytes": kept}


def main(argv: list[str]) -> int:
    if not argv or argv[0] == "--list":
        for name, (label, key, _fn) in SCENARIOS.items():
            print(name, label, key)
        return 0
    name = argv[0]
    if name not in SCENARIOS:
        print(f"unknown scenario {name!r}; --list names them", file=sys.stderr)
        return 2
    SMOKE.on = "--cpu-smoke" in argv
    facts = SCENARIOS[name][2]("--remedy" in argv)
    if not SMOKE.on:
        torch.cuda.synchronize()
        facts["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    print("FACTS " + json.dumps(facts, sort_keys=True), flush=True)
    print("FITS", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
