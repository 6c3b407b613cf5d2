"""NVML (through ``nvidia-ml-py``): device memory truth for the devices this process uses.

Every call goes through :meth:`Nvml._call`, which initialises NVML lazily under a
lock and turns any failure into ``None`` plus a counted error; nothing here raises.
Units: bytes and ratios in 0..1.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Optional, TypeVar

from oomsight.hook.errors import ErrorBook
from oomsight.wire.schema import NvmlSample

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Nvml:
    """Lazy NVML access. ``module`` is the ``pynvml`` module, or a fake in tests."""

    def __init__(self, module: Any = None, errors: Optional[ErrorBook] = None) -> None:
        self._module = module
        self._lock = threading.Lock()
        self._ready: Optional[bool] = None
        self.reason: Optional[str] = None
        """Why NVML is unavailable, for the one log line and the report."""
        self.errors = errors or ErrorBook()
        """Failed NVML calls are counted here (component ``nvml``); the hook shares this book."""
        self._handles: dict[tuple[str, int], Any] = {}

    @property
    def available(self) -> bool:
        return self._init()

    def _init(self) -> bool:
        if self._ready is not None:
            return self._ready
        with self._lock:
            if self._ready is None:
                self._ready = self._try_init()
        return self._ready

    def _try_init(self) -> bool:
        try:
            if self._module is None:
                import pynvml  # provided by nvidia-ml-py

                self._module = pynvml
            self._module.nvmlInit()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver mismatch ...
            self.reason = (
                f"NVML unavailable ({type(exc).__name__}: {exc}); device-level metrics are off. "
                "Install nvidia-ml-py and make the NVIDIA driver library visible to this container."
            )
            logger.warning("oomsight: %s", self.reason)
            return False
        return True

    def _call(self, fn: Callable[[], T]) -> Optional[T]:
        if not self._init():
            return None
        try:
            return fn()
        except Exception as exc:
            self.errors.record("nvml", exc)
            return None

    def handle(self, uuid: str, index: int) -> Any:
        """The NVML handle of a CUDA device, by UUID, else through ``CUDA_VISIBLE_DEVICES``."""
        key = (uuid, index)
        if key not in self._handles:
            found = self._call(lambda: self._lookup(uuid, index))
            if found is None:
                return None
            self._handles[key] = found
        return self._handles[key]

    def _lookup(self, uuid: str, index: int) -> Any:
        m = self._module
        if uuid:
            try:
                return m.nvmlDeviceGetHandleByUUID(uuid)
            except Exception:
                pass
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        if index < len(visible):
            entry = visible[index]
            if entry.startswith(("GPU-", "MIG-")):
                return m.nvmlDeviceGetHandleByUUID(entry)
            return m.nvmlDeviceGetHandleByIndex(int(entry))
        return m.nvmlDeviceGetHandleByIndex(index)

    def sample(self, handle: Any, pid: int) -> Optional[NvmlSample]:
        """Device memory, utilisation and this process's own usage; None if NVML fails."""
        if handle is None:
            return None
        memory = self._call(lambda: self._memory(handle))
        if memory is None:
            return None
        total, used, free, reserved = memory
        util = self._call(lambda: self._module.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
        procs = self._call(lambda: self._module.nvmlDeviceGetComputeRunningProcesses(handle))
        own: Optional[int] = None
        visible = False
        others: Optional[int] = None
        if procs is not None:
            others = 0
            for proc in procs:
                if proc.pid == pid:
                    visible = True
                    own = proc.usedGpuMemory  # None where the driver withholds it
                else:
                    others += 1
        return NvmlSample(
            total_bytes=int(total),
            used_bytes=int(used),
            free_bytes=int(free),
            reserved_bytes=None if reserved is None else int(reserved),
            utilization_ratio=util,
            process_used_bytes=None if own is None else int(own),
            process_visible=visible,
            other_processes=others,
        )

    def processes(self, handle: Any) -> Optional[list[tuple[int, Optional[int]]]]:
        """(pid, used bytes or None where withheld) of the device's compute processes; None if NVML fails."""
        if handle is None:
            return None
        procs = self._call(lambda: self._module.nvmlDeviceGetComputeRunningProcesses(handle))
        if procs is None:
            return None
        return [(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory)) for p in procs]

    def _memory(self, handle: Any) -> tuple[int, int, int, Optional[int]]:
        m = self._module
        v2 = getattr(m, "nvmlMemory_v2", None)
        if v2 is not None:
            try:
                info = m.nvmlDeviceGetMemoryInfo(handle, version=v2)
                return info.total, info.used, info.free, info.reserved
            except Exception:
                pass  # old driver: fall back to v1, which has no reserved field
        info = m.nvmlDeviceGetMemoryInfo(handle)
        return info.total, info.used, info.free, None
