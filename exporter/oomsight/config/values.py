"""The one parser of settings values (``docs/configuration.md``, "Values").

Every component's ``from_env`` (the hook's groups in :mod:`oomsight.config.hook`, the
sidecar's and the webhook's own) reads booleans, durations, counts and ports through these
functions, so ``OOMSIGHT_X=yes`` means the same everywhere and a bad value names its variable.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from typing import Callable, Optional, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting has a value the component cannot use; the message names the variable."""


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


def port_number(text: str) -> int:
    """``--port`` of every command (``run``, ``sidecar``, ``webhook``): a TCP port, 0 to 65535
    (0 picks a free one); argparse's usage error otherwise."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (0 to 65535; 0 picks a free one)")
    return port
