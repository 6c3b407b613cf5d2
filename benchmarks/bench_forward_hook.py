"""The forward hook's own cost per forward (``hook/forwards.py``), on one CPU core, against the same
module without a hook and with an empty forward hook, in interleaved rounds. Each forward records a
graph, so the oomsight variant also puts its pre-hook on the output's ``grad_fn`` (what a backward
consumes, wire 1.8).

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/bench_forward_hook.py --out benchmarks/results

The module is a tiny ``Linear`` (a few µs a call), so the difference is the hook alone: the Python
call torch makes for a module with a forward hook, the checks, and the allocator read at most every
10 ms (here a fake allocator's, which costs nothing: on an H200 one raw read is ~20 µs, i.e. at most
0.2 % of a thread at one read per 10 ms). On the GPU the whole of oomsight on an evaluation loop is
``bench_overhead.py --models eval_launch_bound``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from common import summary, write

VARIANTS = ("no_hook", "empty_hook", "oomsight_forward_rows")


def _forwards(module, x, n: int) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    for _ in range(n):
        module(x)
    return (time.perf_counter() - start) / n


def run(rounds: int, calls: int) -> dict[str, object]:
    import torch

    from oomsight.hook.errors import ErrorBook
    from oomsight.hook.forwards import ForwardMemory

    from fakes import FakeCuda

    torch.set_num_threads(1)
    x = torch.randn(1, 4)

    class Devices:
        devices: dict = {}
        main_device = 0

    modules = {name: torch.nn.Linear(4, 4) for name in VARIANTS}
    modules["empty_hook"].register_forward_hook(lambda *_: None)
    memory = ForwardMemory(FakeCuda(), Devices(), ErrorBook(), steps=lambda: 0)  # type: ignore[arg-type]
    memory.device_type = "cpu"
    memory.arm(torch)
    modules["oomsight_forward_rows"](x)  # found: its hook registered, the global pre-hook gone
    assert memory.root_name == "Linear"
    per_call: dict[str, list[float]] = {name: [] for name in VARIANTS}
    rng = random.Random(0)
    for _ in range(rounds):
        order = list(VARIANTS)
        rng.shuffle(order)
        for name in order:
            per_call[name].append(_forwards(modules[name], x, calls))
    extra = {
        name: [(a - b) * 1e6 for a, b in zip(per_call[name], per_call["no_hook"])] for name in VARIANTS[1:]
    }  # fmt: skip
    return {
        "seconds_per_forward": {name: summary(v) for name, v in per_call.items()},
        "extra_microseconds_per_forward": {name: summary(v) for name, v in extra.items()},
        "reads": len(memory.series(0)),
        "median_extra_us": {name: round(statistics.median(v), 2) for name, v in extra.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--calls", type=int, default=20000)
    args = p.parse_args()
    results = run(args.rounds, args.calls)
    print(results["median_extra_us"], "µs per forward over no hook;", results["reads"], "reads")
    write(args.out, "forward_hook_cpu.json", {"benchmark": "bench_forward_hook", "results": results})


if __name__ == "__main__":
    main()
