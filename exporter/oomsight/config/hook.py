"""Settings of the in-process hook: one frozen dataclass per component, a docstring per field.

GENERATED from the tables of ``oomsight.config.variables`` by ``python -m
oomsight.config.rendering``: edit the table, not this file. Each field's docstring names its
variable and ``oomsight.start()`` keyword. :class:`Settings` holds the groups; the runtime gives
each component only its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Optional

from oomsight.config import table
from oomsight.config.variables import HOOK, check, default_spool_dir


@dataclasses.dataclass(frozen=True)
class SpoolSettings:
    """Where the hook writes: the spool writer and the profiler's request folder."""

    dir: str = dataclasses.field(default_factory=default_spool_dir)
    """Spool directory shared with the sidecar (``emptyDir`` in a pod; a temporary folder under ``oomsight run``)
    (``OOMSIGHT_DIR``; ``start(spool_dir=...)``)."""


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """The sampler thread: how often it reads the allocator and publishes."""

    interval_seconds: float = 0.1
    """How often the sampler thread reads the allocator counters (≈20 µs per device)
    (``OOMSIGHT_SAMPLE_INTERVAL_SECONDS``; ``start(sample_interval_seconds=...)``)."""

    publish_interval_seconds: float = 1.0
    """How often the process snapshot is rewritten in the spool (and NVML queried); at least the sample interval
    (``OOMSIGHT_PUBLISH_INTERVAL_SECONDS``; ``start(publish_interval_seconds=...)``)."""

    window_seconds: float = 60.0
    """Sliding window of the exported window peak/minimum; keep it ≥ the scrape interval (and ≥ the publish
    interval). The leak trend takes a point every window/6 (``OOMSIGHT_WINDOW_SECONDS``;
    ``start(window_seconds=...)``)."""


@dataclasses.dataclass(frozen=True)
class NvmlSettings:
    """NVML: read by the runtime, which gives the sampler an NVML reader or none."""

    enabled: bool = True
    """Query NVML for the devices the process uses (``OOMSIGHT_NVML``; ``start(nvml=...)``)."""


@dataclasses.dataclass(frozen=True)
class StepSettings:
    """The global optimizer step hook (the step tracker)."""

    hook: bool = True
    """Register the global optimizer step hooks (steps, step time, memory by category), and before the first step a
    forward hook on the outermost model (forward rows). Off: no step or forward rows, job setup, leak scan or
    scheduled profiling windows (``OOMSIGHT_STEP_HOOK``; ``start(step_hook=...)``)."""

    peaks: bool = False
    """**opt-in**: read and reset the allocator peak after each optimizer step. This calls
    ``torch.cuda.reset_peak_memory_stats()``, which also resets what ``torch.cuda.max_memory_allocated()`` returns
    to your code, Lightning or torchtune (``OOMSIGHT_STEP_PEAKS``; ``start(step_peaks=...)``)."""

    categories_interval_seconds: float = 30.0
    """Minimum time between two walks of the optimizers' tensors (parameters, gradients, optimizer state), made in
    the training thread right after a step (``OOMSIGHT_CATEGORIES_INTERVAL_SECONDS``;
    ``start(categories_interval_seconds=...)``)."""


@dataclasses.dataclass(frozen=True)
class OomSettings:
    """OOM capture (the OOM recorder): the observer, the event files and what they leave."""

    observer: bool = True
    """Attach the allocator's OOM observer (private API ``torch._C._cuda_attach_out_of_memory_observer``, feature-
    detected) to record every OOM durably (``OOMSIGHT_OOM_OBSERVER``; ``start(oom_observer=...)``)."""

    artifacts_max_bytes: int = 268_435_456
    """Size bound of the spool's ``artifacts/`` folder; oldest artifacts are evicted first (before an OOM writes its
    memory-snapshot pickle, down to half of it). Lowered to half the spool's filesystem, and set by the webhook to
    half the spool's ``sizeLimit`` (``docs/spool-format.md``, writing rules) (``OOMSIGHT_ARTIFACTS_MAX_BYTES``;
    ``start(artifacts_max_bytes=...)``)."""

    max_events: int = 1000
    """Per process, OOM event files written at most; later OOMs are counted (``oomsight_oom_events_unwritten_total``)
    (``OOMSIGHT_MAX_OOM_EVENTS``; ``start(max_oom_events=...)``)."""

    termination_message_path: str = "/dev/termination-log"
    """Where a fatal OOM's diagnosis is written so ``kubectl describe pod`` shows it — only if the file already
    exists (Kubernetes creates it); empty: never (``OOMSIGHT_TERMINATION_MESSAGE_PATH``;
    ``start(termination_message_path=...)``)."""


@dataclasses.dataclass(frozen=True)
class HistorySettings:
    """Allocation history, started by the runtime when CUDA initialises."""

    record: bool = False
    """Record allocation history with Python stacks (bounded ring) so an OOM writes a snapshot pickle for
    https://pytorch.org/memory_viz (about 2 µs an allocation). Skipped when you already record history yourself
    (``OOMSIGHT_RECORD_HISTORY``; ``start(record_history=...)``)."""

    max_entries: int = 10_000
    """Ring size of that history (each entry is a few KB of host memory) (``OOMSIGHT_HISTORY_MAX_ENTRIES``;
    ``start(history_max_entries=...)``)."""

    mode: str = "all"
    """``all``: alloc/free events with the allocating Python stack (memory_viz's timeline); ``state``: only the
    stacks of live blocks — who holds memory at the OOM — at lower cost (``benchmarks/results/``)
    (``OOMSIGHT_HISTORY_MODE``; ``start(history_mode=...)``)."""


@dataclasses.dataclass(frozen=True)
class ProfilerSettings:
    """Scheduled profiling windows (the profiler); on-demand ones need none."""

    every_seconds: float = 0.0
    """Scheduled profiling: every this many seconds, profile ``OOMSIGHT_PROFILE_STEPS`` optimizer steps with
    ``torch.profiler``; ``0``: off (on-demand profiling works without it: ``oomsight profile``, or the sidecar's
    admin endpoint) (``OOMSIGHT_PROFILE_EVERY_SECONDS``; ``start(profile_every_seconds=...)``)."""

    steps: int = 5
    """Steps in a scheduled profiling window (``OOMSIGHT_PROFILE_STEPS``; ``start(profile_steps=...)``)."""

    scheduled_cuda_time: bool = False
    """Scheduled windows trace CUDA time too. Off, they are memory-only: the top operators by self CUDA memory, no
    CUDA time, CUPTI never attached and no slowdown after the window (below)
    (``OOMSIGHT_PROFILE_SCHEDULED_CUDA_TIME``; ``start(profile_scheduled_cuda_time=...)``)."""


@dataclasses.dataclass(frozen=True)
class PredictionSettings:
    """The job's predicted peak, published next to the measured one."""

    source: str = ""
    """The job's predicted peak, published next to the measured one (``oomsight_predicted_peak_allocated_bytes``, the
    report, the pod dashboard): the path of the JSON that ``oomsight predict --json`` wrote, or a size such as
    ``30GiB`` (peak allocated bytes). Read when the hook starts; a value that cannot be used is one warning and
    ``oomsight_hook_errors_total{component="prediction"}``, never a reason for the hook to stay off. From code:
    ``oomsight.record_prediction(...)`` (``docs/prediction.md``) (``OOMSIGHT_PREDICTION``;
    ``start(prediction=...)``)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the hook can be told, one group per component; defaults keep its overhead far below 1 %."""

    disabled: bool = False
    """``1`` turns the hook off entirely (one log line, no more) (``OOMSIGHT_DISABLED``; ``start(disabled=...)``)."""

    spool: SpoolSettings = dataclasses.field(default_factory=SpoolSettings)
    """Where the hook writes: the spool writer and the profiler's request folder."""

    sampling: SamplingSettings = dataclasses.field(default_factory=SamplingSettings)
    """The sampler thread: how often it reads the allocator and publishes."""

    nvml: NvmlSettings = dataclasses.field(default_factory=NvmlSettings)
    """NVML: read by the runtime, which gives the sampler an NVML reader or none."""

    steps: StepSettings = dataclasses.field(default_factory=StepSettings)
    """The global optimizer step hook (the step tracker)."""

    oom: OomSettings = dataclasses.field(default_factory=OomSettings)
    """OOM capture (the OOM recorder): the observer, the event files and what they leave."""

    history: HistorySettings = dataclasses.field(default_factory=HistorySettings)
    """Allocation history, started by the runtime when CUDA initialises."""

    profiler: ProfilerSettings = dataclasses.field(default_factory=ProfilerSettings)
    """Scheduled profiling windows (the profiler); on-demand ones need none."""

    prediction: PredictionSettings = dataclasses.field(default_factory=PredictionSettings)
    """The job's predicted peak, published next to the measured one."""

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> Settings:
        """Every variable of the table that ``environ`` (default ``os.environ``) sets; a bad value
        or combination raises :class:`~oomsight.config.values.ConfigError` naming the variable."""
        settings = table.from_env(cls, HOOK, environ)
        check(settings)
        return settings

    def replace(self, **keywords: object) -> Settings:
        """A copy with ``oomsight.start()``'s ``keywords`` set, each parsed and checked as its variable."""
        settings = table.apply(self, table.read_keywords(HOOK, keywords))
        check(settings)
        return settings
