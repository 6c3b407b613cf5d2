"""Held-out OOM workloads, each labelled with its true cause by construction.

    python benchmarks/heldout/workloads.py --list            # name label remedy_key, one a line
    python benchmarks/heldout/workloads.py NAME [--remedy]   # run one; prints FITS if no uncaught OOM
    python benchmarks/heldout/workloads.py NAME --dry        # tiny shapes on the CPU (import/build check)

Labels: leak, growing_demand, activations, model_states, fragmentation, oversized_request, other_process,
non_pytorch_memory, none. Each workload's docstring says why its label is true. Capped workloads call
``torch.cuda.set_per_process_memory_fraction`` to emulate a 4-16 GiB GPU; the other_process and
non_pytorch_memory ones fill the real device and must run alone.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import wl_activations  # noqa: F401  (registers workloads)
import wl_demand  # noqa: F401
import wl_device  # noqa: F401
import wl_fits  # noqa: F401
import wl_issue48  # noqa: F401
import wl_leaks  # noqa: F401
import wl_memory  # noqa: F401
import wl_piles  # noqa: F401
import wl_unseen  # noqa: F401
from common import DRY, WORKLOADS

FULL_DEVICE_LABELS = ("other_process", "non_pytorch_memory")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("name", nargs="?")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--remedy", action="store_true")
    ap.add_argument("--dry", action="store_true", help="tiny shapes on the CPU")
    args = ap.parse_args()
    if args.list or not args.name:
        for name, (label, remedy, _fn) in WORKLOADS.items():
            print(name, label, remedy)
        return 0
    label, _key, fn = WORKLOADS[args.name]
    DRY.on = args.dry
    import torch

    torch.manual_seed(0)
    fn(args.remedy)
    if not DRY.on:
        torch.cuda.synchronize()
        print(f"peak allocated {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB, "
              f"reserved {torch.cuda.max_memory_reserved() / 2**30:.2f} GiB")
    print("FITS", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
