"""Configuration: every setting is read once from ``OOMSIGHT_*`` environment variables.

- :mod:`oomsight.config.hook`: the in-process hook's settings, one frozen dataclass per
  component (:class:`Settings` holds them; ``Settings.from_env()``), every variable name a
  constant, and :data:`VARIABLES` (variable, ``oomsight.start()`` keyword, group and field).
- :mod:`oomsight.config.values`: the one parser of values (booleans, seconds, counts, ports)
  that the hook's groups, the sidecar's and the webhook's settings all read through.

Everything is importable from here, as ``oomsight.config``; ``docs/configuration.md`` lists
every variable.
"""

from __future__ import annotations

from oomsight.config.hook import (
    ALL_ENV_VARS,
    ENV_ARTIFACTS_MAX_BYTES,
    ENV_CATEGORIES_INTERVAL,
    ENV_DIR,
    ENV_DISABLED,
    ENV_HISTORY_MAX_ENTRIES,
    ENV_HISTORY_MODE,
    ENV_MAX_OOM_EVENTS,
    ENV_NVML,
    ENV_OOM_OBSERVER,
    ENV_PROFILE_CUDA_TIME,
    ENV_PROFILE_EVERY,
    ENV_PROFILE_STEPS,
    ENV_PUBLISH_INTERVAL,
    ENV_RECORD_HISTORY,
    ENV_SAMPLE_INTERVAL,
    ENV_STEP_HOOK,
    ENV_STEP_PEAKS,
    ENV_TERMINATION_MESSAGE_PATH,
    ENV_WINDOW,
    HISTORY_MODES,
    VARIABLES,
    HistorySettings,
    NvmlSettings,
    OomSettings,
    ProfilerSettings,
    SamplingSettings,
    Settings,
    SpoolSettings,
    StepSettings,
    Variable,
    default_spool_dir,
)
from oomsight.config.values import (
    DEFAULT_METRICS_PORT,
    FALSE_WORDS,
    TRUE_WORDS,
    ConfigError,
    ascii_bool,
    ascii_int,
    env_setting,
    parse_bool,
    parse_count,
    parse_port,
    parse_seconds,
)

__all__ = [
    "ALL_ENV_VARS",
    "DEFAULT_METRICS_PORT",
    "ENV_ARTIFACTS_MAX_BYTES",
    "ENV_CATEGORIES_INTERVAL",
    "ENV_DIR",
    "ENV_DISABLED",
    "ENV_HISTORY_MAX_ENTRIES",
    "ENV_HISTORY_MODE",
    "ENV_MAX_OOM_EVENTS",
    "ENV_NVML",
    "ENV_OOM_OBSERVER",
    "ENV_PROFILE_CUDA_TIME",
    "ENV_PROFILE_EVERY",
    "ENV_PROFILE_STEPS",
    "ENV_PUBLISH_INTERVAL",
    "ENV_RECORD_HISTORY",
    "ENV_SAMPLE_INTERVAL",
    "ENV_STEP_HOOK",
    "ENV_STEP_PEAKS",
    "ENV_TERMINATION_MESSAGE_PATH",
    "ENV_WINDOW",
    "FALSE_WORDS",
    "HISTORY_MODES",
    "TRUE_WORDS",
    "VARIABLES",
    "ConfigError",
    "HistorySettings",
    "NvmlSettings",
    "OomSettings",
    "ProfilerSettings",
    "SamplingSettings",
    "Settings",
    "SpoolSettings",
    "StepSettings",
    "Variable",
    "ascii_bool",
    "ascii_int",
    "default_spool_dir",
    "env_setting",
    "parse_bool",
    "parse_count",
    "parse_port",
    "parse_seconds",
]
