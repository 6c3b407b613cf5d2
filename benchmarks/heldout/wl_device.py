"""Memory taken outside this process's PyTorch allocator. These fill the real device (no cap) and run alone.

The training job itself needs ~12 GB and would fit on an empty H200 many times over.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys

import torch
from common import DRY, GIB, dev, fast_fp32, gpt2, pick, tokens, workload

LEAVE_FREE_GIB = 6


def _train_gpt2_medium(steps: int) -> None:
    fast_fp32()
    model = gpt2(24, 1024, 16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=not DRY.on)
    for _step in range(pick(steps, 1)):
        ids = tokens(pick(8, 1), pick(512, 16), model.config.vocab_size)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def hog_main(leave_gib: float) -> None:
    """The other process: takes all but ``leave_gib`` of the GPU, says so, waits for its parent to go."""
    free, _total = torch.cuda.mem_get_info()
    held = torch.empty(int(free - leave_gib * GIB), dtype=torch.uint8, device="cuda")
    print("ready", held.numel(), flush=True)
    sys.stdin.read()  # until the parent closes the pipe


@workload("other_process", "other_process")
def second_process_holds_gpu(remedy: bool) -> None:
    """GPT-2 medium training while another process on the same GPU holds all but 6 GiB of it.

    Models a forgotten notebook kernel / eval server still running on the card: a separate Python process
    allocates (free - 6 GiB) through its own PyTorch and sits on it. This process's ~12 GB training job
    then fails in cudaMalloc although its own allocator holds well under 12 GB. Remedy: the other process
    is not there (stopped before the job starts).
    """
    hog = None
    if not remedy and not DRY.on:
        hog = subprocess.Popen([sys.executable, __file__, "--hog", str(LEAVE_FREE_GIB)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
        assert hog.stdout is not None
        print("other process:", hog.stdout.readline().strip(), flush=True)
    try:
        _train_gpt2_medium(6)
    finally:
        if hog is not None:
            hog.stdin.close()  # type: ignore[union-attr]
            hog.wait(30)


@workload("non_pytorch_memory", "non_pytorch")
def driver_api_workspace(remedy: bool) -> None:
    """A native library in the same process allocates its workspace with ``cuMemAlloc`` (driver API, via ctypes).

    Models a custom CUDA extension / inference engine that sizes its workspace to "all free memory but
    6 GiB" at import time. PyTorch's allocator never sees those bytes; the ~12 GB GPT-2 medium training in
    the same process then fails in cudaMalloc. Remedy: the library is configured with a 1 GiB workspace.
    """
    ptr = ctypes.c_uint64(0)
    lib = None
    if not DRY.on:
        torch.zeros(1, device=dev())  # the runtime makes the primary context current on this thread
        lib = ctypes.CDLL("libcuda.so.1")
        free, _total = torch.cuda.mem_get_info()
        want = 1 * GIB if remedy else int(free - LEAVE_FREE_GIB * GIB)
        rc = lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(want))
        assert rc == 0, f"cuMemAlloc failed: {rc}"
        print(f"library workspace: {want / GIB:.1f} GiB via cuMemAlloc", flush=True)
    try:
        _train_gpt2_medium(6)
    finally:
        if lib is not None:
            lib.cuMemFree_v2(ptr)


if __name__ == "__main__" and sys.argv[1:2] == ["--hog"]:
    hog_main(float(sys.argv[2]))
