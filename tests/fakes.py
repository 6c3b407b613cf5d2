"""Stand-ins for torch.cuda and pynvml, fed with numbers shaped like the H200's.

``FakeCuda`` implements ``oomsight.hook.cuda.CudaApi``; ``FakeNvmlModule`` the part of
``pynvml`` that ``oomsight.hook.nvml.Nvml`` uses. Tests set ``.allocated`` and friends and
call the hook's real code paths.
"""

from __future__ import annotations

import json
import os
import types
from typing import Any, Callable, Optional

from oomsight.hook.cuda import Reading, reading_from_nested

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
GIB = 1 << 30
MIB = 1 << 20


def nested_stats(
    allocated: int,
    reserved: int,
    peak_allocated: Optional[int] = None,
    peak_reserved: Optional[int] = None,
    inactive_split: int = 0,
    retries: int = 0,
    ooms: int = 0,
) -> dict[str, Any]:
    """A dict shaped like ``torch._C._cuda_memoryStats(device)``."""

    def fam(current: int, peak: Optional[int] = None) -> dict[str, Any]:
        stat = {"current": current, "peak": peak if peak is not None else current, "allocated": 0, "freed": 0}
        return {"all": dict(stat), "large_pool": dict(stat), "small_pool": {k: 0 for k in stat}}

    return {
        "allocated_bytes": fam(allocated, peak_allocated),
        "reserved_bytes": fam(reserved, peak_reserved),
        "active_bytes": fam(allocated),
        "requested_bytes": fam(allocated - 512),
        "inactive_split_bytes": fam(inactive_split),
        "allocation": fam(10),
        "segment": fam(2),
        "num_alloc_retries": retries,
        "num_ooms": ooms,
        "num_device_alloc": 3 if reserved else 0,
        "num_device_free": 1 if reserved else 0,
        "num_sync_all_streams": 0,
        "max_split_size": -1,
    }


def recorded_stats() -> Optional[dict[str, Any]]:
    """The nested stats dict recorded on the H200, if the fixture exists."""
    path = os.path.join(FIXTURES, "h200", "memory_stats_nested.json")
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return json.load(fh)  # type: ignore[no-any-return]


class FakeCuda:
    def __init__(self, devices: int = 1, total: int = 140 * GIB) -> None:
        self.devices = devices
        self.total = total
        self.initialized = True
        self.stats: dict[int, dict[str, Any]] = {d: nested_stats(0, 0) for d in range(devices)}
        self.init_callbacks: list[Callable[[], None]] = []
        self.observer: Optional[Callable[[int, int, int, int], None]] = None
        self.lazy_call_supported = True
        self.observer_supported = True
        self.history_on = False
        self.read_error: Optional[Exception] = None
        self.resets: list[int] = []
        self.limit: Optional[int] = None
        self.free_block: Optional[int] = None
        self.backward = False
        self.autocast = False
        self.is_compiled = False
        self.grad = True
        self.saved_hooks: Optional[str] = None
        self.pools: Optional[tuple[int, int]] = None

    def set(self, device: int = 0, **kw: Any) -> None:
        self.stats[device] = nested_stats(**kw)

    # CudaApi
    def unavailable_reason(self) -> Optional[str]:
        return None

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return self.devices

    def current_device(self) -> int:
        return 0

    def read(self, device: int) -> Reading:
        if self.read_error is not None:
            raise self.read_error
        return reading_from_nested(self.stats[device])

    def device_identity(self, device: int) -> tuple[str, str, int]:
        return f"GPU-0000000{device}-aaaa-bbbb-cccc-dddddddddddd", "NVIDIA H200", self.total

    def on_init(self, fn: Callable[[], None]) -> bool:
        if not self.lazy_call_supported:
            return False
        if self.initialized:
            fn()
        else:
            self.init_callbacks.append(fn)
        return True

    def initialize(self) -> None:
        self.initialized = True
        for fn in self.init_callbacks:
            fn()

    def attach_oom_observer(self, fn: Callable[[int, int, int, int], None]) -> bool:
        if not self.observer_supported:
            return False
        self.observer = fn
        return True

    def memory_limit(self, device: int) -> Optional[int]:
        return self.limit

    def reset_peak(self, device: int) -> None:
        self.resets.append(device)

    def summary(self, device: int) -> str:
        return "|  fake memory_summary  |"

    def backend(self) -> str:
        return "native"

    def versions(self) -> tuple[str, str]:
        return "2.11.0+cu130", "13.0"

    def start_history(self, max_entries: int, mode: str = "all") -> bool:
        self.history_on = True
        return True

    def stop_history(self) -> None:
        self.history_on = False

    def allocation_sites(self, ptrs: list[int]) -> dict[int, str]:
        return {}

    def dump_snapshot(self, path: str) -> None:
        with open(path, "wb") as fh:
            fh.write(b"fake-pickle")

    def largest_free_block(self, device: int) -> Optional[int]:
        return self.free_block

    def in_backward(self) -> bool:
        return self.backward

    def autocast_enabled(self) -> bool:
        return self.autocast

    def open_contexts(self) -> dict[str, bool]:
        return {"autocast": self.autocast, "checkpointing": False}

    def saved_tensor_hooks(self) -> Optional[str]:
        return self.saved_hooks

    def private_pools(self, device: int) -> Optional[tuple[int, int]]:
        return self.pools

    def compiled(self) -> bool:
        return self.is_compiled

    def grad_enabled(self) -> bool:
        return self.grad


class FakeNvmlModule(types.SimpleNamespace):
    """Enough of ``pynvml`` for oomsight.hook.nvml: one device, a process list."""

    nvmlMemory_v2 = 0x02000028

    def __init__(self, total: int = 140 * GIB, used: int = 10 * GIB, procs: Optional[list[tuple[int, int]]] = None):
        super().__init__()
        self.total = total
        self.used = used
        self.procs = procs if procs is not None else []
        self.fail_init: Optional[Exception] = None
        self.calls = 0

    def nvmlInit(self) -> None:
        if self.fail_init is not None:
            raise self.fail_init

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return f"handle:{uuid}"

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"handle:{index}"

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        self.calls += 1
        return types.SimpleNamespace(total=self.total, used=self.used, free=self.total - self.used, reserved=512 * MIB)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        return types.SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return [types.SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self.procs]


class FakeOptimizer:
    """What the step hook sees of an optimizer: param_groups and state."""

    def __init__(self, params=(), state=None):  # type: ignore[no-untyped-def]
        self.param_groups = [{"params": list(params)}]
        self.state = state or {}
