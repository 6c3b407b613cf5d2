"""Build realistic spools for reader-side tests by running the real hook over fakes."""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from oomsight.config import Settings
from oomsight.hook.nvml import Nvml
from oomsight.hook.runtime import Hook

from fakes import GIB, FakeCuda, FakeNvmlModule, FakeOptimizer


def hooked_process(
    spool: str,
    rank: int = 0,
    allocated: int = 3 * GIB,
    reserved: int = 4 * GIB,
    monkeypatch: Any = None,
    step_peaks: bool = True,
    clock: Optional[Any] = None,
) -> tuple[Hook, FakeCuda]:
    """A hook as rank ``rank`` would run it, with one used device and NVML."""
    if monkeypatch is not None:
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
    cuda = FakeCuda()
    cuda.set(0, allocated=allocated, reserved=reserved, peak_allocated=allocated + GIB, peak_reserved=reserved + GIB)
    nvml = FakeNvmlModule(used=reserved + GIB, procs=[(os.getpid(), reserved + GIB)])
    hook = Hook(
        Settings().replace(spool_dir=spool, termination_message_path="", step_peaks=step_peaks), cuda, Nvml(nvml)
    )
    if clock is not None:
        hook.sampler.clock = clock
        hook.oom.clock = clock
    hook.start()
    hook.sampler.stop_thread()
    hook.sources["profiler"] = True  # a real rank has torch, hence a profiler; this one has fakes
    hook.steps.post_step(FakeOptimizer(), (), {})
    hook.steps.categories = {0: (GIB, GIB, GIB // 2, time.time())}
    hook.sampler.tick()  # discovers the device and publishes
    hook.steps.post_step(FakeOptimizer(), (), {})  # now with a known device: a step peak (opt-in)
    hook.steps.categories = {0: (GIB, GIB, GIB // 2, time.time())}
    hook.sampler.publish()
    return hook, cuda
