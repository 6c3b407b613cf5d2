"""What a workload can request for its GPU memory: MIG profiles per GPU model, whole GPUs by memory,
and DRA consumable capacity in the units the API takes (``oomsight recommend``).

Sources, read on 2026-12-05 (docs/kubernetes.md, "Right-sizing", keeps the same list):

- MIG profiles and their share of the board's memory: NVIDIA's Multi-Instance GPU User Guide,
  https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html (the A30 and
  A100 tables; the H100 80GB profiles share the A100-80GB names), and the boards with their memory
  sizes: https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-gpus.html. The guide's
  pages for H100 94GB/96GB, H200, B200 and GB200 name the profiles the same way (``<slices>g.<GB>gb``);
  NVIDIA's mig-parted configuration (github.com/NVIDIA/mig-parted,
  ``deployments/systemd/config-default.yaml``, "all-3g.47gb", "all-7g.96gb", ...) lists the same names.
- A profile's memory here is the GB its name states, read as 10^9 bytes: the name rounds the slice down
  (the A100-40GB's 1g.5gb is 4864 MiB, 5.1 x 10^9 bytes, in ``nvidia-smi mig -lgip``), and a test checks
  that the figure never exceeds the profile's share of the board, so a workload that fits it fits the slice.
- Whole GPUs: ``oomsight.predict.gpu.GPUS``, the catalogue ``oomsight predict --gpu`` keeps (not
  copied here).
- DRA: ``resource.k8s.io/v1`` ``ExactDeviceRequest.capacity.requests`` (Kubernetes 1.34+, feature gate
  ``DRAConsumableCapacity``; KEP-5075) takes resource quantities; the sidecar reads the granted share back
  from ``status.allocation.devices.results[].consumedCapacity.memory``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from oomsight.predict import gpu

GB = 10**9
GIB = 1 << 30
SOURCE_DATE = "2026-12-05"
SOURCES = (
    "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html",
    "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-gpus.html",
    "https://github.com/NVIDIA/mig-parted/blob/main/deployments/systemd/config-default.yaml",
)


@dataclass(frozen=True)
class MigProfile:
    name: str
    """As ``nvidia-smi mig -lgip`` and the device plugin's ``nvidia.com/mig-<name>`` resource spell it."""
    eighths: int
    """The share of the board's memory, in eighths (the guide's "Fraction of Memory"; the A30's quarters x 2)."""
    instances: int
    """How many fit on one board (the guide's "Number of Instances Available")."""

    @property
    def memory_bytes(self) -> int:
        """The GB in the name, as 10^9 bytes."""
        return int(self.name.split(".")[1].removesuffix("gb")) * GB


@dataclass(frozen=True)
class MigBoard:
    model: str
    memory_gb: int
    """The board's memory as the guide's supported-GPU table states it (GB)."""
    profiles: tuple[MigProfile, ...]
    whole: Optional[str] = None
    """The same board in ``predict``'s GPU catalogue (``gpu.GPUS``), where it has it."""

    @property
    def memory_bytes(self) -> int:
        """The whole board: ``predict``'s measured total where it has the board, else the guide's GB as GiB
        (the guide's "80GB" is the H100's 81559 MiB: marketing gigabytes are about GiB)."""
        return gpu.GPUS[self.whole].total_bytes if self.whole else self.memory_gb * GIB


def _seven(gb: tuple[int, int, int, int]) -> tuple[MigProfile, ...]:
    """The seven-slice layout shared by A100, H100, H200, B200 and GB200: 1g (1/8, x7), 1g with two
    eighths (x4), 2g (2/8, x3), 3g and 4g (4/8), 7g (the whole board); ``gb``: the names' figures for
    one eighth, two, four and eight."""
    one, two, four, whole = gb
    return (
        MigProfile(f"1g.{one}gb", 1, 7),
        MigProfile(f"1g.{two}gb", 2, 4),
        MigProfile(f"2g.{two}gb", 2, 3),
        MigProfile(f"3g.{four}gb", 4, 2),
        MigProfile(f"4g.{four}gb", 4, 1),
        MigProfile(f"7g.{whole}gb", 8, 1),
    )


MIG: tuple[MigBoard, ...] = (
    MigBoard(
        "A30-24GB",
        24,
        (MigProfile("1g.6gb", 2, 4), MigProfile("2g.12gb", 4, 2), MigProfile("4g.24gb", 8, 1)),
    ),
    MigBoard("A100-40GB", 40, _seven((5, 10, 20, 40)), "a100-40gb"),
    MigBoard("A100-80GB", 80, _seven((10, 20, 40, 80)), "a100-80gb"),
    MigBoard("H100-80GB", 80, _seven((10, 20, 40, 80)), "h100"),
    MigBoard("H100-94GB", 94, _seven((12, 24, 47, 94))),
    MigBoard("H100-96GB (GH200)", 96, _seven((12, 24, 48, 96))),
    MigBoard("H200-141GB", 141, _seven((18, 35, 71, 141)), "h200"),
    MigBoard("B200-180GB", 180, _seven((23, 45, 90, 180)), "b200"),
    MigBoard("GB200-186GB", 186, _seven((23, 47, 93, 186))),
)
"""The A100-40GB's 1g.10gb is the guide's 1g with two eighths; its 1g.5gb+me and the other ``+me`` (media
extension) variants have the memory of their plain profile and are left out."""


def smallest_profile(board: MigBoard, need_bytes: float) -> Optional[MigProfile]:
    """The board's profile with the least memory that holds ``need_bytes``, fewer slices first."""
    fits = [p for p in board.profiles if p.memory_bytes >= need_bytes]
    return min(fits, key=lambda p: (p.memory_bytes, p.name)) if fits else None


def smallest_profiles(need_bytes: float) -> list[tuple[MigBoard, MigProfile]]:
    """Per board, its smallest profile that fits; boards where none fits are left out."""
    found = [(b, smallest_profile(b, need_bytes)) for b in MIG]
    return [(b, p) for b, p in found if p is not None]


def smallest_gpu(need_bytes: float) -> Optional[gpu.Gpu]:
    """The GPU of ``predict``'s catalogue with the least memory that holds ``need_bytes``."""
    fits = [g for g in gpu.GPUS.values() if g.total_bytes >= need_bytes]
    return min(fits, key=lambda g: g.total_bytes) if fits else None


def quantity(size_bytes: float) -> str:
    """``size_bytes`` as a Kubernetes resource quantity for a DRA capacity request, rounded up to whole
    GiB (``Gi``): a device's request policy rounds to its own step anyway, and a request is never below
    the figure."""
    return f"{max(1, math.ceil(size_bytes / GIB))}Gi"
