"""Settings of the in-process hook, read once from ``OOMSIGHT_*`` environment variables.

Every variable name is a constant here; ``docs/configuration.md`` lists them all.
Invalid values raise :class:`ConfigError` with a message that names the variable;
the hook turns that into one log line and stays off (it never raises into training).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Callable, Optional, TypeVar

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

ALL_ENV_VARS = (
    ENV_DIR,
    ENV_DISABLED,
    ENV_SAMPLE_INTERVAL,
    ENV_PUBLISH_INTERVAL,
    ENV_WINDOW,
    ENV_NVML,
    ENV_STEP_HOOK,
    ENV_STEP_PEAKS,
    ENV_CATEGORIES_INTERVAL,
    ENV_OOM_OBSERVER,
    ENV_RECORD_HISTORY,
    ENV_HISTORY_MAX_ENTRIES,
    ENV_HISTORY_MODE,
    ENV_PROFILE_EVERY,
    ENV_PROFILE_STEPS,
    ENV_PROFILE_CUDA_TIME,
    ENV_ARTIFACTS_MAX_BYTES,
    ENV_MAX_OOM_EVENTS,
    ENV_TERMINATION_MESSAGE_PATH,
)

HISTORY_MODES = ("all", "state")

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting has a value the hook cannot use; the message names the variable."""


def default_spool_dir() -> str:
    """Where the hook writes when ``OOMSIGHT_DIR`` is unset: ``$TMPDIR/oomsight``, else ``/tmp/oomsight``.

    Named, not probed: ``tempfile.gettempdir()`` raises where no temporary folder is writable
    (a read-only root filesystem with only the spool mounted, as the injected sidecar runs),
    and this default is computed even when ``OOMSIGHT_DIR`` is set."""
    return os.path.join(os.environ.get("TMPDIR") or "/tmp", "oomsight")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the hook can be told. Defaults keep overhead far below 1 % of a step."""

    spool_dir: str = dataclasses.field(default_factory=default_spool_dir)
    """Spool directory shared with the sidecar (an emptyDir in Kubernetes)."""

    disabled: bool = False
    """``OOMSIGHT_DISABLED=1`` turns the hook off entirely (one log line, nothing else)."""

    sample_interval_seconds: float = 0.1
    """How often the sampler thread reads the allocator counters (about 20 µs a device)."""

    publish_interval_seconds: float = 1.0
    """How often the process snapshot is rewritten in the spool (one small JSON file)."""

    window_seconds: float = 60.0
    """Width of the sliding window whose sampled maximum is exported as the window peak.
    Keep it at or above the Prometheus scrape interval so no sampled peak is missed."""

    nvml: bool = True
    """Query NVML for the devices this process uses (device memory, its own usage)."""

    step_hook: bool = True
    """Register global optimizer step hooks (step count and duration, memory categories)."""

    step_peaks: bool = False
    """Opt-in: read and reset the allocator peak after every optimizer step. This calls
    ``torch.cuda.reset_peak_memory_stats()``, which also resets what
    ``torch.cuda.max_memory_allocated()`` returns to your code or framework."""

    categories_interval_seconds: float = 30.0
    """Minimum time between two walks of the optimizers' tensors (parameters, gradients,
    optimizer state). The walk runs in the training thread right after a step."""

    oom_observer: bool = True
    """Attach the allocator's out-of-memory observer to record every OOM durably."""

    record_history: bool = False
    """Record allocation history (Python stacks, bounded) so an OOM writes a snapshot
    pickle that https://pytorch.org/memory_viz opens. Costs about 2 µs an allocation."""

    history_max_entries: int = 10_000
    """Ring size of the allocation history when ``record_history`` is on."""

    history_mode: str = "all"
    """``all``: alloc/free events with the allocating Python stack (the memory_viz timeline);
    ``state``: only the stacks of live blocks (who holds memory at the OOM), cheaper."""

    profile_every_seconds: float = 0.0
    """Scheduled profiling: every this many seconds profile ``profile_steps`` steps (0: off;
    on demand only, through the sidecar's admin endpoint or ``oomsight profile``)."""

    profile_steps: int = 5
    """Optimizer steps in a scheduled profiling window."""

    profile_scheduled_cuda_time: bool = False
    """Scheduled windows trace CUDA time too. Off: they are memory-only (CPU activity and
    the allocator's events), which never attaches CUPTI; a window that traces CUDA leaves
    CUPTI attached and the job slower until it ends (``docs/benchmarks.md``, profiling)."""

    artifacts_max_bytes: int = 256 * 1024 * 1024
    """Size bound of the spool's artifacts folder; the oldest artifacts are evicted first."""

    max_oom_events: int = 1000
    """Per process, OOM event files written at most; later OOMs are counted, not written."""

    termination_message_path: str = "/dev/termination-log"
    """Where a fatal OOM's diagnosis goes so ``kubectl describe pod`` shows it."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read every ``OOMSIGHT_*`` variable; raise :class:`ConfigError` on a bad value."""
        env = os.environ if environ is None else environ
        d = cls()
        settings = cls(
            spool_dir=env.get(ENV_DIR) or d.spool_dir,
            disabled=_read(env, ENV_DISABLED, parse_bool, d.disabled),
            sample_interval_seconds=_read(env, ENV_SAMPLE_INTERVAL, parse_seconds, d.sample_interval_seconds),
            publish_interval_seconds=_read(env, ENV_PUBLISH_INTERVAL, parse_seconds, d.publish_interval_seconds),
            window_seconds=_read(env, ENV_WINDOW, parse_seconds, d.window_seconds),
            nvml=_read(env, ENV_NVML, parse_bool, d.nvml),
            step_hook=_read(env, ENV_STEP_HOOK, parse_bool, d.step_hook),
            step_peaks=_read(env, ENV_STEP_PEAKS, parse_bool, d.step_peaks),
            categories_interval_seconds=_read(
                env, ENV_CATEGORIES_INTERVAL, parse_seconds, d.categories_interval_seconds
            ),
            oom_observer=_read(env, ENV_OOM_OBSERVER, parse_bool, d.oom_observer),
            record_history=_read(env, ENV_RECORD_HISTORY, parse_bool, d.record_history),
            history_max_entries=_read(env, ENV_HISTORY_MAX_ENTRIES, parse_count, d.history_max_entries),
            history_mode=_read(env, ENV_HISTORY_MODE, _choice(HISTORY_MODES), d.history_mode),
            profile_every_seconds=_read(env, ENV_PROFILE_EVERY, _seconds_or_off, d.profile_every_seconds),
            profile_steps=_read(env, ENV_PROFILE_STEPS, parse_count, d.profile_steps),
            profile_scheduled_cuda_time=_read(env, ENV_PROFILE_CUDA_TIME, parse_bool, d.profile_scheduled_cuda_time),
            artifacts_max_bytes=_read(env, ENV_ARTIFACTS_MAX_BYTES, parse_count, d.artifacts_max_bytes),
            max_oom_events=_read(env, ENV_MAX_OOM_EVENTS, parse_count, d.max_oom_events),
            termination_message_path=env.get(ENV_TERMINATION_MESSAGE_PATH, d.termination_message_path),
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        """Reject combinations that cannot work, naming the variables involved."""
        if self.history_mode not in HISTORY_MODES:
            raise ConfigError(f"{ENV_HISTORY_MODE}={self.history_mode!r} is not one of {', '.join(HISTORY_MODES)}")
        if self.publish_interval_seconds < self.sample_interval_seconds:
            raise ConfigError(
                f"{ENV_PUBLISH_INTERVAL}={self.publish_interval_seconds} is shorter than "
                f"{ENV_SAMPLE_INTERVAL}={self.sample_interval_seconds}; publish at most as often as you sample"
            )
        if self.window_seconds < self.publish_interval_seconds:
            raise ConfigError(
                f"{ENV_WINDOW}={self.window_seconds} is shorter than "
                f"{ENV_PUBLISH_INTERVAL}={self.publish_interval_seconds}"
            )

    def replace(self, **changes: object) -> Settings:
        """A copy with ``changes`` applied and validated (used by ``oomsight.start(**kw)``)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown oomsight setting(s): {', '.join(sorted(unknown))}")
        new = dataclasses.replace(self, **changes)  # type: ignore[arg-type]
        new.validate()
        return new


def _read(env: Mapping[str, str], name: str, parse: Callable[[str, str], T], default: T) -> T:
    raw = env.get(name)
    if raw is None:
        return default
    return parse(name, raw.strip())


def _choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        if raw not in choices:
            raise ConfigError(f"{name}={raw!r} is not one of {', '.join(choices)}")
        return raw

    return parse


def _seconds_or_off(name: str, raw: str) -> float:
    return 0.0 if raw in ("0", "0.0", "") else parse_seconds(name, raw)


# The one parser of settings (docs/configuration.md, "Values"): every component's
# ``from_env`` reads booleans, durations, counts and ports through these functions, so
# ``OOMSIGHT_X=yes`` means the same everywhere and a bad value names its variable.

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
DEFAULT_METRICS_PORT = 21400
"""The sidecar's (and ``oomsight run``'s) metrics port, outside the 9100-9999 exporter range."""
_INTEGER = re.compile(r"[+-]?[0-9]{1,18}")
_DECIMAL = re.compile(r"[+-]?([0-9]{1,18}(\.[0-9]{0,18})?|\.[0-9]{1,18})([eE][+-]?[0-9]{1,3})?")


def ascii_int(raw: str) -> Optional[int]:
    """A whole number written in ASCII digits (at most 18), else None.

    ``str.isdigit()`` and ``int()`` accept ``²``, ``①`` or Arabic-Indic digits and
    thousands of digits; settings and annotations accept only what a person types."""
    return int(raw) if _INTEGER.fullmatch(raw) else None


def ascii_bool(raw: str) -> Optional[bool]:
    """``1/true/yes/on`` -> True, ``0/false/no/off`` -> False (any case), else None."""
    low = raw.strip().lower()
    return True if low in TRUE_WORDS else False if low in FALSE_WORDS else None


def parse_bool(name: str, raw: str) -> bool:
    """A boolean setting; the empty string is false (``OOMSIGHT_X=`` switches X off)."""
    value = ascii_bool(raw) if raw.strip() else False
    if value is None:
        raise ConfigError(f"{name}={raw!r} is not a boolean; use 1 or 0")
    return value


def parse_seconds(name: str, raw: str, minimum: float = 0.001, maximum: float = 86_400.0) -> float:
    """A duration in seconds (a decimal number) between ``minimum`` and ``maximum``."""
    if not _DECIMAL.fullmatch(raw.strip()):
        raise ConfigError(f"{name}={raw!r} is not a number of seconds")
    value = float(raw)
    if not minimum <= value <= maximum:
        raise ConfigError(f"{name}={raw!r} must be between {minimum:g} and {maximum:g} seconds")
    return value


def parse_count(name: str, raw: str, minimum: int = 1, maximum: Optional[int] = None) -> int:
    """A whole number (ASCII digits) of at least ``minimum`` and at most ``maximum``."""
    value = ascii_int(raw.strip())
    if value is None:
        raise ConfigError(f"{name}={raw!r} is not a whole number")
    if value < minimum:
        raise ConfigError(f"{name}={raw!r} must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name}={raw!r} must be at most {maximum}")
    return value


def parse_port(name: str, raw: str) -> int:
    """A TCP port, 0 to 65535 (0: off, or "let the system pick", as the setting says)."""
    value = ascii_int(raw.strip())
    if value is None or not 0 <= value <= 65535:
        raise ConfigError(f"{name}={raw!r} is not a TCP port (0 to 65535)")
    return value


def env_setting(env: Mapping[str, str], name: str, parse: Callable[[str, str], T], default: T) -> T:
    """``parse(name, value)`` of ``env[name]``; ``default`` when it is unset or blank.

    ``parse`` is one of the ``parse_*`` functions (or a ``functools.partial`` of one with
    its limits); it raises :class:`ConfigError` naming ``name``."""
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    return parse(name, raw.strip())
