"""Configuration: every setting is read once from ``OOMSIGHT_*`` environment variables.

- :mod:`oomsight.config.variables`: the settings tables of the hook, the sidecar and the
  webhook's server, one row per setting (its keyword, from which its variable's name derives,
  its group and field, default, parser and meaning).
- :mod:`oomsight.config.hook`: the hook's settings, one frozen dataclass per component
  (:class:`Settings` holds them; ``Settings.from_env()``, ``Settings.replace(**keywords)``),
  GENERATED from its table by :mod:`oomsight.config.rendering`, as are the fields of the
  sidecar's and webhook's settings (:mod:`oomsight.config.sidecar`, :mod:`oomsight.config.webhook`)
  and the tables of ``docs/configuration.md``.
- :mod:`oomsight.config.table`: the vocabulary of a settings table and how one is read.
- :mod:`oomsight.config.values`: the one parser of values (booleans, seconds, counts, ports)
  that every table and the other settings (injection, server limits) read through.
"""

from __future__ import annotations

from oomsight.config.hook import (
    HistorySettings,
    NvmlSettings,
    OomSettings,
    PredictionSettings,
    ProfilerSettings,
    SamplingSettings,
    Settings,
    SpoolSettings,
    StepSettings,
)
from oomsight.config.table import Group, Setting
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
from oomsight.config.variables import BY_KEYWORD, HISTORY_MODES, HOOK, default_spool_dir

# The variables that other components write for the hook (the webhook's pod patches, `oomsight
# run`): their names as the table gives them, not written again.
ENV_DIR = BY_KEYWORD["spool_dir"].variable
ENV_ARTIFACTS_MAX_BYTES = BY_KEYWORD["artifacts_max_bytes"].variable
ENV_PROFILE_EVERY = BY_KEYWORD["profile_every_seconds"].variable
ENV_PROFILE_STEPS = BY_KEYWORD["profile_steps"].variable
ENV_TERMINATION_MESSAGE_PATH = BY_KEYWORD["termination_message_path"].variable
ENV_PREDICTION = BY_KEYWORD["prediction"].variable

__all__ = [
    "BY_KEYWORD",
    "DEFAULT_METRICS_PORT",
    "ENV_ARTIFACTS_MAX_BYTES",
    "ENV_DIR",
    "ENV_PREDICTION",
    "ENV_PROFILE_EVERY",
    "ENV_PROFILE_STEPS",
    "ENV_TERMINATION_MESSAGE_PATH",
    "FALSE_WORDS",
    "HISTORY_MODES",
    "HOOK",
    "TRUE_WORDS",
    "ConfigError",
    "Group",
    "HistorySettings",
    "NvmlSettings",
    "OomSettings",
    "PredictionSettings",
    "ProfilerSettings",
    "SamplingSettings",
    "Setting",
    "Settings",
    "SpoolSettings",
    "StepSettings",
    "ascii_bool",
    "ascii_int",
    "default_spool_dir",
    "env_setting",
    "parse_bool",
    "parse_count",
    "parse_port",
    "parse_seconds",
]
