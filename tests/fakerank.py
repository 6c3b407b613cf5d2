"""A training process as the real hook sees it, over the fakes: one rank on a GPU of its own,
stepped by hand. The scale benchmark builds its spools from these."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from oomsight.config import Settings
from oomsight.hook.nvml import Nvml
from oomsight.hook.runtime import Hook

from fakes import GIB, FakeCuda, FakeNvmlModule, FakeOptimizer

CONTEXT = GIB // 2


@contextmanager
def rank_env(rank: int) -> Iterator[None]:
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class OwnGpu(FakeCuda):
    """A FakeCuda whose device 0 is the GPU with the given UUID."""

    def __init__(self, uuid: str) -> None:
        super().__init__()
        self.uuid = uuid

    def device_identity(self, device: int) -> tuple[str, str, int]:
        return self.uuid, "NVIDIA H200", self.total


class Rank:
    """One training process: the real Hook over a FakeCuda and a fake NVML."""

    def __init__(self, spool: str, rank: int, floor: int) -> None:
        self.cuda = OwnGpu(f"GPU-{rank:08d}-aaaa-bbbb-cccc-dddddddddddd")
        self.nvml = FakeNvmlModule()
        settings = Settings().replace(
            spool_dir=spool,
            termination_message_path="",
            step_peaks=True,
            sample_interval_seconds=0.02,
            publish_interval_seconds=0.2,
            window_seconds=1.2,
        )
        with rank_env(rank):
            self.hook = Hook(settings, self.cuda, Nvml(self.nvml))
        self.floor = self.static = floor
        self.reserved = floor
        self.retries = 0
        self.optimizer = FakeOptimizer()
        self.hook.start()
        self.hook.sampler.stop_thread()  # this module drives the sampler itself

    def step(self, activations: int, inactive_split: int) -> None:
        peak = self.floor + activations
        self.reserved = max(self.reserved, peak + inactive_split)
        stats = dict(reserved=self.reserved, inactive_split=inactive_split, retries=self.retries)
        self.cuda.set(0, allocated=peak, peak_allocated=peak, peak_reserved=self.reserved, **stats)
        self._nvml()
        self.hook.sampler.tick()
        self.cuda.set(0, allocated=self.floor, peak_allocated=peak, peak_reserved=self.reserved, **stats)
        self.hook.sampler.tick()
        assert self.hook.steps is not None
        self.hook.steps.post_step(self.optimizer, (), {})
        s = self.static  # parameters, gradients and optimizer state do not leak; activations do
        self.hook.steps.categories = {0: (3 * s // 8, 3 * s // 8, s // 4, time.time())}

    def _nvml(self) -> None:
        own = self.reserved + CONTEXT  # the only process on its GPU
        self.nvml.used = own
        self.nvml.procs = [(os.getpid(), own)]
