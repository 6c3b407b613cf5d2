from __future__ import annotations

import os
import sys
from typing import Any, Callable

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from oomsight.config import Settings
from oomsight.hook.nvml import Nvml
from oomsight.hook.runtime import Hook

from fakes import FakeCuda, FakeNvmlModule


@pytest.fixture
def spool(tmp_path: Any) -> str:
    return str(tmp_path / "spool")


@pytest.fixture
def make_hook(spool: str) -> Callable[..., Hook]:
    """Build a real Hook over fakes; stop it after the test."""
    made: list[Hook] = []

    def build(cuda: FakeCuda | None = None, nvml: Any = "fake", **overrides: Any) -> Hook:
        settings = Settings().replace(spool_dir=spool, termination_message_path="").replace(**overrides)
        module = FakeNvmlModule() if nvml == "fake" else nvml
        hook = Hook(settings, cuda or FakeCuda(), Nvml(module) if module is not None else None)
        made.append(hook)
        return hook

    yield build
    for hook in made:
        hook.sampler.stop_thread()


@pytest.fixture
def cpu_hook(spool: str) -> Any:
    """Build a real Hook over the real torch for a model on the CPU (its tensors counted as device 0's),
    its forward rows read at every forward, its sampler thread stopped; stop it after the test."""
    import torch

    made: list[Hook] = []

    def build(cuda: FakeCuda) -> Hook:
        settings = Settings().replace(spool_dir=spool, termination_message_path="")
        hook = Hook(settings, cuda, None, torch=torch)
        hook.forwards.device_type = "cpu"
        assert hook.steps is not None
        hook.steps.device_type = "cpu"
        hook.forwards.min_interval = 0.0
        made.append(hook)
        hook.start()
        hook.sampler.stop_thread()
        return hook

    yield build
    for hook in made:
        hook.stop()
