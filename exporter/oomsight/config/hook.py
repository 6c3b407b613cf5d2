"""Settings of the in-process hook, read once from ``OOMSIGHT_*`` environment variables.

One frozen dataclass per concern, and each hook component is given only its own group:
:class:`SpoolSettings` (the runtime's spool writer), :class:`SamplingSettings` (the sampler
thread), :class:`NvmlSettings` (whether the runtime opens NVML), :class:`StepSettings` (the
step tracker), :class:`OomSettings` (the OOM recorder), :class:`HistorySettings` (allocation
history, started by the runtime), :class:`ProfilerSettings` (scheduled profiling windows) and
:class:`PredictionSettings` (the job's predicted peak, published with its measured one).
:class:`Settings` holds the groups; ``Settings.from_env()`` reads them all, each group its own
variables, through the one parser of values (:mod:`oomsight.config.values`, shared with the
sidecar and the webhook).

Every variable name is a constant here and a row of :data:`VARIABLES`, which also gives its
``oomsight.start()`` keyword; ``docs/configuration.md`` lists them all. Invalid values raise
:class:`ConfigError` with a message that names the variable; the hook turns that into one log
line and stays off (it never raises into training).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Callable

from oomsight.config.values import ConfigError, parse_bool, parse_count, parse_seconds

ENV_DIR = "OOMSIGHT_DIR"
ENV_DISABLED = "OOMSIGHT_DISABLED"
ENV_SAMPLE_INTERVAL = "OOMSIGHT_SAMPLE_INTERVAL_SECONDS"
ENV_PUBLISH_INTERVAL = "OOMSIGHT_PUBLISH_INTERVAL_SECONDS"
ENV_WINDOW = "OOMSIGHT_WINDOW_SECONDS"
ENV_NVML = "OOMSIGHT_NVML"
ENV_STEP_HOOK = "OOMSIGHT_STEP_HOOK"
ENV_STEP_PEAKS = "OOMSIGHT_STEP_PEAKS"
ENV_CATEGORIES_INTERVAL = "OOMSIGHT_CATEGORIES_INTERVAL_SECONDS"
ENV_OOM_OBSERVER = "OOMSIGHT_OOM_OBSERVER"
ENV_RECORD_HISTORY = "OOMSIGHT_RECORD_HISTORY"
ENV_HISTORY_MAX_ENTRIES = "OOMSIGHT_HISTORY_MAX_ENTRIES"
ENV_HISTORY_MODE = "OOMSIGHT_HISTORY_MODE"
ENV_PROFILE_EVERY = "OOMSIGHT_PROFILE_EVERY_SECONDS"
ENV_PROFILE_STEPS = "OOMSIGHT_PROFILE_STEPS"
ENV_PROFILE_CUDA_TIME = "OOMSIGHT_PROFILE_SCHEDULED_CUDA_TIME"
ENV_ARTIFACTS_MAX_BYTES = "OOMSIGHT_ARTIFACTS_MAX_BYTES"
ENV_MAX_OOM_EVENTS = "OOMSIGHT_MAX_OOM_EVENTS"
ENV_TERMINATION_MESSAGE_PATH = "OOMSIGHT_TERMINATION_MESSAGE_PATH"
ENV_PREDICTION = "OOMSIGHT_PREDICTION"

HISTORY_MODES = ("all", "state")


def default_spool_dir() -> str:
    """Where the hook writes when ``OOMSIGHT_DIR`` is unset: ``$TMPDIR/oomsight``, else ``/tmp/oomsight``.

    Named, not probed: ``tempfile.gettempdir()`` raises where no temporary folder is writable
    (a read-only root filesystem with only the spool mounted, as the injected sidecar runs),
    and this default is computed even when ``OOMSIGHT_DIR`` is set."""
    return os.path.join(os.environ.get("TMPDIR") or "/tmp", "oomsight")


@dataclasses.dataclass(frozen=True)
class SpoolSettings:
    """Where the hook writes: the runtime's spool writer and the profiler's request folder."""

    dir: str = dataclasses.field(default_factory=default_spool_dir)
    """Spool directory shared with the sidecar (an emptyDir in Kubernetes)."""


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """The sampler thread: how often it reads the allocator and publishes the snapshot."""

    interval_seconds: float = 0.1
    """How often the sampler thread reads the allocator counters (about 20 µs a device)."""

    publish_interval_seconds: float = 1.0
    """How often the process snapshot is rewritten in the spool (one small JSON file) and
    NVML is queried."""

    window_seconds: float = 60.0
    """Width of the sliding window whose sampled maximum is exported as the window peak.
    Keep it at or above the Prometheus scrape interval so no sampled peak is missed."""

    def validate(self) -> None:
        if self.publish_interval_seconds < self.interval_seconds:
            raise ConfigError(
                f"{ENV_PUBLISH_INTERVAL}={self.publish_interval_seconds} is shorter than "
                f"{ENV_SAMPLE_INTERVAL}={self.interval_seconds}; publish at most as often as you sample"
            )
        if self.window_seconds < self.publish_interval_seconds:
            raise ConfigError(
                f"{ENV_WINDOW}={self.window_seconds} is shorter than "
                f"{ENV_PUBLISH_INTERVAL}={self.publish_interval_seconds}"
            )


@dataclasses.dataclass(frozen=True)
class NvmlSettings:
    """NVML: read by the runtime, which gives the sampler an NVML reader or none."""

    enabled: bool = True
    """Query NVML for the devices this process uses (device memory, its own usage)."""


@dataclasses.dataclass(frozen=True)
class StepSettings:
    """The global optimizer step hook (the step tracker)."""

    hook: bool = True
    """Register global optimizer step hooks (step count and duration, memory categories).
    Off: no step tracker, hence no step rows, job setup, leak scan or profiling windows."""

    peaks: bool = False
    """Opt-in: read and reset the allocator peak after every optimizer step. This calls
    ``torch.cuda.reset_peak_memory_stats()``, which also resets what
    ``torch.cuda.max_memory_allocated()`` returns to your code or framework."""

    categories_interval_seconds: float = 30.0
    """Minimum time between two walks of the optimizers' tensors (parameters, gradients,
    optimizer state). The walk runs in the training thread right after a step."""


@dataclasses.dataclass(frozen=True)
class OomSettings:
    """OOM capture (the OOM recorder): the observer, the event files and what they leave behind."""

    observer: bool = True
    """Attach the allocator's out-of-memory observer to record every OOM durably."""

    max_events: int = 1000
    """Per process, OOM event files written at most; later OOMs are counted, not written."""

    artifacts_max_bytes: int = 256 * 1024 * 1024
    """Size bound of the spool's artifacts folder; the oldest artifacts are evicted first
    (before an OOM writes its memory-snapshot pickle, down to half of it)."""

    termination_message_path: str = "/dev/termination-log"
    """Where a fatal OOM's diagnosis goes so ``kubectl describe pod`` shows it (only if the
    file exists: the kubelet creates it; empty: never)."""


@dataclasses.dataclass(frozen=True)
class HistorySettings:
    """Allocation history (started by the runtime when CUDA initialises): what OOM snapshots
    and the leak scan's allocation sites are made from."""

    record: bool = False
    """Record allocation history (Python stacks, bounded) so an OOM writes a snapshot
    pickle that https://pytorch.org/memory_viz opens. Costs about 2 µs an allocation."""

    max_entries: int = 10_000
    """Ring size of the allocation history when ``record`` is on."""

    mode: str = "all"
    """``all``: alloc/free events with the allocating Python stack (the memory_viz timeline);
    ``state``: only the stacks of live blocks (who holds memory at the OOM), cheaper."""

    def validate(self) -> None:
        if self.mode not in HISTORY_MODES:
            raise ConfigError(f"{ENV_HISTORY_MODE}={self.mode!r} is not one of {', '.join(HISTORY_MODES)}")


@dataclasses.dataclass(frozen=True)
class ProfilerSettings:
    """Scheduled profiling windows (the profiler); on-demand windows need no setting."""

    every_seconds: float = 0.0
    """Scheduled profiling: every this many seconds profile ``steps`` steps (0: off;
    on demand only, through the sidecar's admin endpoint or ``oomsight profile``)."""

    steps: int = 5
    """Optimizer steps in a scheduled profiling window."""

    scheduled_cuda_time: bool = False
    """Scheduled windows trace CUDA time too. Off: they are memory-only (CPU activity and
    the allocator's events), which never attaches CUPTI; a window that traces CUDA leaves
    CUPTI attached and the job slower until it ends (``docs/benchmarks.md``, profiling)."""


@dataclasses.dataclass(frozen=True)
class PredictionSettings:
    """The job's predicted peak (``oomsight predict``), published next to the measured one."""

    source: str = ""
    """The path of the JSON that ``oomsight predict --json`` wrote, or a size such as ``30GiB``
    (the predicted peak allocated bytes); empty: none. Taken as written: the runtime reads it
    when the hook starts, and a value it cannot use is one warning, counted
    (``oomsight_hook_errors_total{component="prediction"}``), never a reason to stay off."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the hook can be told, one group per component; the runtime hands each
    component its group. Defaults keep overhead far below 1 % of a step."""

    disabled: bool = False
    """``OOMSIGHT_DISABLED=1`` turns the hook off entirely (one log line, nothing else)."""

    spool: SpoolSettings = dataclasses.field(default_factory=SpoolSettings)
    """Where the hook writes."""

    sampling: SamplingSettings = dataclasses.field(default_factory=SamplingSettings)
    """The sampler thread."""

    nvml: NvmlSettings = dataclasses.field(default_factory=NvmlSettings)
    """NVML queries."""

    steps: StepSettings = dataclasses.field(default_factory=StepSettings)
    """The optimizer step hook."""

    oom: OomSettings = dataclasses.field(default_factory=OomSettings)
    """OOM capture."""

    history: HistorySettings = dataclasses.field(default_factory=HistorySettings)
    """Allocation history."""

    profiler: ProfilerSettings = dataclasses.field(default_factory=ProfilerSettings)
    """Scheduled profiling windows."""

    prediction: PredictionSettings = dataclasses.field(default_factory=PredictionSettings)
    """The job's predicted peak."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read every ``OOMSIGHT_*`` variable of :data:`VARIABLES`; raise :class:`ConfigError` on a bad value."""
        env = os.environ if environ is None else environ
        top: dict[str, object] = {}
        groups: dict[str, dict[str, object]] = {}
        for v in VARIABLES:
            raw = env.get(v.env)
            if raw is None:
                continue
            value = v.parse(v.env, raw if v.verbatim else raw.strip())
            (groups.setdefault(v.group, {}) if v.group else top)[v.field] = value
        base = cls()
        for group, fields in groups.items():
            top[group] = dataclasses.replace(getattr(base, group), **fields)
        settings = dataclasses.replace(base, **top)  # type: ignore[arg-type]
        settings.validate()
        return settings

    def validate(self) -> None:
        """Reject values and combinations that cannot work, naming the variables involved."""
        self.history.validate()
        self.sampling.validate()

    def replace(self, **changes: object) -> Settings:
        """A copy with ``changes`` applied and validated (used by ``oomsight.start(**kw)``).

        The keywords are the flat names of :data:`VARIABLES` (``record_history=True``), not
        the groups' field names, so ``oomsight.start()`` reads as the documentation's table."""
        unknown = set(changes) - set(_BY_KEYWORD)
        if unknown:
            raise ConfigError(f"unknown oomsight setting(s): {', '.join(sorted(unknown))}")
        top: dict[str, object] = {}
        groups: dict[str, dict[str, object]] = {}
        for keyword, value in changes.items():
            v = _BY_KEYWORD[keyword]
            if v.group:
                groups.setdefault(v.group, {})[v.field] = value
            else:
                top[v.field] = value
        for group, fields in groups.items():
            top[group] = dataclasses.replace(getattr(self, group), **fields)
        new = dataclasses.replace(self, **top)  # type: ignore[arg-type]
        new.validate()
        return new


@dataclasses.dataclass(frozen=True)
class Variable:
    """One setting of the hook: its environment variable and ``oomsight.start()`` keyword,
    and where its value lives (``Settings.<group>.<field>``; no group: ``Settings.<field>``)."""

    env: str
    """The environment variable (``OOMSIGHT_*``)."""

    keyword: str
    """The keyword of ``oomsight.start()`` and ``Settings.replace()``: the name before the groups."""

    group: str
    """The field of :class:`Settings` that holds the group; empty for ``Settings``' own fields."""

    field: str
    """The field inside that group."""

    parse: Callable[[str, str], object]
    """``parse(name, raw)``: the value, or :class:`ConfigError` naming the variable."""

    verbatim: bool = False
    """Paths are taken as written; other values are stripped of surrounding blanks first."""


def _choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        if raw not in choices:
            raise ConfigError(f"{name}={raw!r} is not one of {', '.join(choices)}")
        return raw

    return parse


def _seconds_or_off(name: str, raw: str) -> float:
    return 0.0 if raw in ("0", "0.0", "") else parse_seconds(name, raw)


def _verbatim(_name: str, raw: str) -> str:
    return raw


def _spool_dir(_name: str, raw: str) -> str:
    return raw or default_spool_dir()


VARIABLES = (
    Variable(ENV_DIR, "spool_dir", "spool", "dir", _spool_dir, verbatim=True),
    Variable(ENV_DISABLED, "disabled", "", "disabled", parse_bool),
    Variable(ENV_SAMPLE_INTERVAL, "sample_interval_seconds", "sampling", "interval_seconds", parse_seconds),
    Variable(ENV_PUBLISH_INTERVAL, "publish_interval_seconds", "sampling", "publish_interval_seconds", parse_seconds),
    Variable(ENV_WINDOW, "window_seconds", "sampling", "window_seconds", parse_seconds),
    Variable(ENV_NVML, "nvml", "nvml", "enabled", parse_bool),
    Variable(ENV_STEP_HOOK, "step_hook", "steps", "hook", parse_bool),
    Variable(ENV_STEP_PEAKS, "step_peaks", "steps", "peaks", parse_bool),
    Variable(
        ENV_CATEGORIES_INTERVAL, "categories_interval_seconds", "steps", "categories_interval_seconds", parse_seconds
    ),
    Variable(ENV_OOM_OBSERVER, "oom_observer", "oom", "observer", parse_bool),
    Variable(ENV_RECORD_HISTORY, "record_history", "history", "record", parse_bool),
    Variable(ENV_HISTORY_MAX_ENTRIES, "history_max_entries", "history", "max_entries", parse_count),
    Variable(ENV_HISTORY_MODE, "history_mode", "history", "mode", _choice(HISTORY_MODES)),
    Variable(ENV_PROFILE_EVERY, "profile_every_seconds", "profiler", "every_seconds", _seconds_or_off),
    Variable(ENV_PROFILE_STEPS, "profile_steps", "profiler", "steps", parse_count),
    Variable(ENV_PROFILE_CUDA_TIME, "profile_scheduled_cuda_time", "profiler", "scheduled_cuda_time", parse_bool),
    Variable(ENV_ARTIFACTS_MAX_BYTES, "artifacts_max_bytes", "oom", "artifacts_max_bytes", parse_count),
    Variable(ENV_MAX_OOM_EVENTS, "max_oom_events", "oom", "max_events", parse_count),
    Variable(
        ENV_TERMINATION_MESSAGE_PATH,
        "termination_message_path",
        "oom",
        "termination_message_path",
        _verbatim,
        verbatim=True,
    ),
    Variable(ENV_PREDICTION, "prediction", "prediction", "source", _verbatim, verbatim=True),
)
"""Every variable of the hook, in the order of ``docs/configuration.md``."""

ALL_ENV_VARS = tuple(v.env for v in VARIABLES)
_BY_KEYWORD = {v.keyword: v for v in VARIABLES}
