"""Cost of one allocator sample and of the other calls the hook makes, per call.

PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/bench_sample_cost.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import build, measure, write


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--n", type=int, default=20000)
    args = p.parse_args()
    import torch

    from oomsight.config import Settings
    from oomsight.hook.cuda import TorchCuda
    from oomsight.hook.nvml import Nvml
    from oomsight.hook.runtime import Hook

    _, step = build(2048, 256)
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    cuda = TorchCuda(torch)
    hook = Hook(
        Settings().replace(spool_dir=tempfile.mkdtemp(), publish_interval_seconds=3600, window_seconds=3600),
        cuda,
        Nvml(),
        torch,
    )
    hook.sampler.tick()  # discovers the device, publishes once
    dev = hook.sampler.devices[0]
    results = {
        "oomsight_sample_one_device (TorchCuda.read)": measure(lambda: cuda.read(0), args.n),
        "oomsight_sampler_tick_one_device": measure(hook.sampler.tick, args.n),
        "torch._C._cuda_memoryStats": measure(lambda: torch._C._cuda_memoryStats(0), args.n),
        "torch.cuda.memory_stats": measure(lambda: torch.cuda.memory_stats(0), args.n // 4),
        "torch.cuda.memory_allocated": measure(lambda: torch.cuda.memory_allocated(0), args.n // 4),
        "torch.cuda.mem_get_info": measure(lambda: torch.cuda.mem_get_info(0), args.n // 4),
        "oomsight_nvml_sample (memory, utilization, processes)": measure(
            lambda: hook.sampler.nvml_sample(dev), args.n // 20
        ),
        "oomsight_publish (NVML + JSON + atomic write)": measure(hook.sampler.publish, args.n // 20),
    }
    for k, v in results.items():
        print(f"{k:60s} median {v['median_us']:8.1f} us  p99 {v['p99_us']:8.1f} us")
    write(args.out, "sample_cost.json", {"results": results})


if __name__ == "__main__":
    main()
