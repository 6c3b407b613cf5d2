"""Human-readable units for reports and diagnoses (metrics stay in base units)."""

from __future__ import annotations

from typing import Optional

_STEPS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_bytes(value: Optional[float]) -> str:
    """``1610612736`` → ``"1.50 GiB"``; ``None`` → ``"n/a"``."""
    if value is None:
        return "n/a"
    sign = "-" if value < 0 else ""
    value = abs(value)
    for suffix, size in _STEPS:
        if value >= size:
            return f"{sign}{value / size:.2f} {suffix}"
    return f"{sign}{int(value)} B"


def format_ratio(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{100.0 * value:.1f} %"
