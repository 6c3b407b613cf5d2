"""The labelled OOM scenario corpus (run on a GPU by ``benchmarks/corpus/run.py``).

``python scenarios.py NAME [--remedy]`` runs one scenario; ``--remedy`` applies the remedy
its label calls for. Most run under a per-process cap (``set_per_process_memory_fraction``)
so they behave like a small GPU and end in seconds; ``other_process`` and ``non_pytorch``
fill the real device, since a cap would hide what is outside the allocator.
Each prints ``FITS`` when it ends without an OOM.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import time

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

GIB = 1 << 30
MIB = 1 << 20
SCENARIOS: dict[str, tuple[str, str, object]] = {}
"""name -> (true cause, the remedy key that ``--remedy`` applies, function)."""


def scenario(label: str, remedy: str = "-"):  # type: ignore[no-untyped-def]
    def add(fn):  # type: ignore[no-untyped-def]
        SCENARIOS[fn.__name__] = (label, remedy, fn)
        return fn

    return add


def cap(gib: float) -> None:
    torch.cuda.set_per_process_memory_fraction(gib * GIB / torch.cuda.get_device_properties(0).total_memory)


SEGMENT = 4
"""Checkpointed segments of this many blocks: only segment inputs are kept, the rest recomputed."""


class Blocks(nn.Module):
    """``depth`` blocks of Linear + GELU; ``ckpt`` checkpoints segments of blocks (non-reentrant)."""

    def __init__(self, width: int, depth: int, ckpt: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth))
        self.ckpt = ckpt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blocks = list(self.blocks)
        for i in range(0, len(blocks), SEGMENT):
            segment = nn.Sequential(*blocks[i : i + SEGMENT])
            x = checkpoint(segment, x, use_reentrant=False) if self.ckpt else segment(x)
        return x


def model(width: int = 2048, depth: int = 8, ckpt: bool = False, dtype: torch.dtype = torch.float32) -> Blocks:
    torch.manual_seed(0)
    return Blocks(width, depth, ckpt).to("cuda", dtype)


def train_step(m: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, amp: bool = False) -> torch.Tensor:
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        out = m(x)
    loss = out.float().square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out


def loop(m: nn.Module, batches, amp: bool = False, pace: float = 0.0, keep=None) -> None:  # type: ignore[no-untyped-def]
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    width = m.blocks[0][0].in_features  # type: ignore[index]
    for n in batches:
        x = torch.randn(n, width, device="cuda", dtype=torch.bfloat16 if amp else torch.float32)
        out = train_step(m, opt, x, amp)
        if keep is not None:
            keep(out)
        if pace:
            time.sleep(pace)
    torch.cuda.synchronize()
    print("FITS", flush=True)


# ---------------------------------------------------------------- leaks
@scenario("leak", "leak")
def leak_outputs_fast(remedy: bool) -> None:
    """~128 MiB a step kept with its graph, at ~45 steps/s (the issue's fast leak)."""
    cap(16)
    kept: list[torch.Tensor] = []
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    x = torch.randn(2048, 2048, device="cuda")
    val = torch.randn(1000, 2048, device="cuda")
    for _ in range(200):
        train_step(m, opt, x)
        out = m(val)  # evaluation outside no_grad: its graph is kept with it
        kept.append(out.detach().sum() if remedy else out)
        time.sleep(0.012)
    print("FITS", flush=True)


@scenario("leak", "leak")
def leak_loss_slow(remedy: bool) -> None:
    """Only the loss is kept, but it holds the whole step's graph; ~7 steps/s."""
    cap(6)
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    losses = []
    for _ in range(260):
        x = torch.randn(256, 2048, device="cuda")
        loss = m(x).square().mean()
        loss.backward(retain_graph=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item() if remedy else loss)
        time.sleep(0.12)
    print("FITS", flush=True)


@scenario("leak", "leak")
def leak_detached_cache(remedy: bool) -> None:
    """Detached copies cached every step (no graph): a plain CUDA-tensor leak, fast."""
    cap(4)
    cache: list[torch.Tensor] = []
    loop(model(), [4096] * 160, keep=lambda out: cache.append(out.detach().clone()) if not remedy else None)


# ---------------------------------------------------------------- growing demand
@scenario("growing_demand", "bound_input")
def growing_batch(remedy: bool) -> None:
    """The batch doubles every 3 steps (the issue's growing input)."""
    cap(8)
    sizes = [min(256 * 2 ** (i // 3), 8192 if remedy else 1 << 30) for i in range(30)]
    loop(model(), sizes)


@scenario("growing_demand", "bound_input")
def growing_sequence(remedy: bool) -> None:
    """Tokens per step grow linearly (longer sequences each step)."""
    cap(8)
    sizes = [min(2048 * (i + 1), 24576 if remedy else 1 << 30) for i in range(80)]
    loop(model(), sizes)


@scenario("growing_demand", "bound_input")
def variable_length_outlier(remedy: bool) -> None:
    """Dynamic padding: lengths vary step to step, and one batch is far longer."""
    cap(6)
    gen = torch.Generator().manual_seed(1)
    sizes = [int(2048 + 6144 * torch.rand(1, generator=gen).item()) for _ in range(40)]
    sizes[30] = 16384 if remedy else 65536
    loop(model(), sizes)


# ---------------------------------------------------------------- activations
@scenario("activations", "checkpointing")
def steady_too_big(remedy: bool) -> None:
    """A steady step whose activations do not fit at all (OOM in the first forward)."""
    cap(4)
    loop(model(width=1024, depth=16, ckpt=remedy), [32000] * 4)


@scenario("activations", "checkpointing")
def steady_too_big_autocast(remedy: bool) -> None:
    """The same under bf16 autocast already: advice must not repeat autocast."""
    cap(4)
    loop(model(width=1024, depth=16, ckpt=remedy), [64000] * 4, amp=True)


@scenario("activations", "batch")
def steady_too_big_checkpointed(remedy: bool) -> None:
    """Checkpointing every block already, still too big: a smaller batch with accumulation."""
    cap(3)
    m = model(ckpt=True)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    micro, batch = (4, 64000 // 4) if remedy else (1, 64000)
    for _ in range(3):
        for _ in range(micro):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = m(torch.randn(batch, 2048, device="cuda"))
            (out.float().square().mean() / micro).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    print("FITS", flush=True)


@scenario("activations", "checkpointing")
def recovered_by_user_code(remedy: bool) -> None:
    """User code catches the OOM, halves the batch and carries on (the OOM is recovered)."""
    cap(4)
    m = model(width=1024, depth=16, ckpt=remedy)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    batch = 40000
    done = 0
    while done < 8:
        try:
            train_step(m, opt, torch.randn(batch, 1024, device="cuda"))
            done += 1
        except torch.cuda.OutOfMemoryError:
            opt.zero_grad(set_to_none=True)
            batch //= 2
            print(f"OOM caught; batch now {batch}", flush=True)
    print("FITS", flush=True)


# ---------------------------------------------------------------- model states
@scenario("model_states", "bf16_params")
def optimizer_state_batch1(remedy: bool) -> None:
    """A large fp32 model with AdamW at batch 1 dies in its first optimizer.step()."""
    cap(8)
    dtype = torch.bfloat16 if remedy else torch.float32
    m = model(width=8192, depth=9, dtype=dtype)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    for _ in range(3):
        m(torch.randn(1, 8192, device="cuda", dtype=dtype)).float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    print("FITS", flush=True)


@scenario("model_states", "bf16_params")
def gradients_do_not_fit(remedy: bool) -> None:
    """Parameters fit but their gradients do not: OOM in the first backward."""
    cap(5)
    dtype = torch.bfloat16 if remedy else torch.float32
    m = model(width=8192, depth=11, dtype=dtype)
    opt = torch.optim.SGD(m.parameters(), lr=1e-4) if remedy else torch.optim.AdamW(m.parameters(), lr=1e-4)
    for _ in range(3):
        m(torch.randn(1, 8192, device="cuda", dtype=dtype)).float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    print("FITS", flush=True)


# ---------------------------------------------------------------- fragmentation
def _fragment(block_mb: int, count: int, segment_mb: int, ask_mb: int) -> None:
    big = torch.empty(segment_mb * MIB, dtype=torch.uint8, device="cuda")
    del big  # one large cached segment
    small = [torch.empty(block_mb * MIB, dtype=torch.uint8, device="cuda") for _ in range(count)]
    for i in range(0, count, 2):
        small[i] = None  # every other block freed: holes, not releasable
    x = torch.empty(ask_mb * MIB, dtype=torch.uint8, device="cuda")
    del x
    print("FITS", flush=True)


@scenario("fragmentation", "expandable")
def fragmented_cache(remedy: bool) -> None:
    cap(1050 / 1024)
    _fragment(30, 33, 1000, 100)


@scenario("fragmentation", "expandable")
def fragmented_cache_wide(remedy: bool) -> None:
    cap(2100 / 1024)
    _fragment(60, 33, 2000, 240)


# ---------------------------------------------------------------- one huge request
@scenario("oversized_request", "oversized")
def one_huge_tensor(remedy: bool) -> None:
    """Normal steps, then one product far larger than the rest (logits over a huge vocabulary)."""
    cap(6)
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    vocab = torch.randn(2048, 400_000, device="cuda")  # 3.3 GB of output weights, there from the start
    for _ in range(10):
        train_step(m, opt, torch.randn(2048, 2048, device="cuda"))
    h = torch.randn(4096, 2048, device="cuda")
    if remedy:  # noqa: SIM108 (the two ways read better apart)
        best = torch.stack([(h[i : i + 512] @ vocab).amax(1) for i in range(0, 4096, 512)])
    else:
        best = (h @ vocab).amax(1)  # one 6.5 GB request
    torch.cuda.synchronize()
    del best
    print("FITS", flush=True)


# ---------------------------------------------------------------- outside the allocator
def _filler(keep_free_gib: float) -> int:
    free, _total = torch.cuda.mem_get_info()
    return int(free - keep_free_gib * GIB)


@scenario("other_process", "other_process")
def another_process_holds_memory(remedy: bool) -> None:
    """Another process on the GPU holds all but ~20 GiB; the job needs ~40 GiB."""
    other = None
    if not remedy:
        code = (
            "import torch,sys,time; f,_=torch.cuda.mem_get_info(); "
            "x=torch.empty(int(f-16*2**30),dtype=torch.uint8,device='cuda'); print('held',flush=True); "
            "sys.stdin.read()"
        )
        other = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert other.stdout is not None and other.stdout.readline().strip() == "held"
    try:
        loop(model(), [150000] * 3)
    finally:
        if other is not None:
            other.kill()


@scenario("non_pytorch_memory", "non_pytorch")
def library_cudamalloc(remedy: bool) -> None:
    """A library in the process takes device memory with its own cuMemAlloc (not PyTorch's)."""
    torch.cuda.init()
    torch.empty(1, device="cuda")
    ptr = ctypes.c_uint64(0)
    if not remedy:
        libcuda = ctypes.CDLL("libcuda.so.1")
        size = ctypes.c_size_t(_filler(16))
        assert libcuda.cuMemAlloc_v2(ctypes.byref(ptr), size) == 0, "cuMemAlloc failed"
    loop(model(), [150000] * 3)


# ---------------------------------------------------------------- no OOM: no leak flag
@scenario("none")
def steady_fits(remedy: bool) -> None:
    cap(6)
    loop(model(), [4096] * 120, pace=0.005)


@scenario("none")
def variable_length_fits(remedy: bool) -> None:
    cap(6)
    gen = torch.Generator().manual_seed(2)
    loop(model(), [int(1024 + 7168 * torch.rand(1, generator=gen).item()) for _ in range(150)])


@scenario("none")
def growing_then_steady_fits(remedy: bool) -> None:
    cap(6)
    loop(model(), [min(512 * 2 ** (i // 10), 4096) for i in range(120)])


@scenario("none")
def steady_autocast_accumulation_fits(remedy: bool) -> None:
    """Autocast, checkpointing and 4 micro-batches per step: the job probe must see all three."""
    cap(6)
    m = model(ckpt=True)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    for _ in range(40):
        for _ in range(4):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = m(torch.randn(2048, 2048, device="cuda"))
            out.float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    print("FITS", flush=True)


def main(argv: list[str]) -> int:
    name, remedy = argv[0], "--remedy" in argv
    _label, _key, fn = SCENARIOS[name]
    fn(remedy)  # type: ignore[operator]
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--list":
        for n, (label, key, _fn) in SCENARIOS.items():
            print(n, label, key)
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
