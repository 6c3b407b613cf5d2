"""oomsight: see why PyTorch runs out of CUDA memory.

``import oomsight.auto`` starts the hook with settings from ``OOMSIGHT_*``
environment variables; ``oomsight.start(**settings)`` and ``oomsight.stop()``
give explicit control. Importing this package imports nothing heavy: torch is
imported by ``start()``, and only if the program can use it.
"""

from __future__ import annotations

from typing import Any

from oomsight._version import __version__

__all__ = ["__version__", "measure_remedies", "probe_batch_size", "start", "stop"]


def start(**settings: Any) -> bool:
    """Start the hook (idempotent, never raises); True when it runs."""
    from oomsight.hook import runtime as hook

    return hook.start(**settings)


def probe_batch_size(step_fn: Any, **kwargs: Any) -> Any:
    """The largest batch that keeps a safety margin, measured without provoking OOMs
    (``oomsight.tools.probe``); the answer also shows in the running hook's metrics."""
    from oomsight.tools import probe

    advice = probe.probe_batch_size(step_fn, **kwargs)
    probe.publish(advice)
    return advice


def measure_remedies(variants: Any, **kwargs: Any) -> Any:
    """Peak memory and step time of each variant against the first (``oomsight.tools.remedy``)."""
    from oomsight.tools import remedy

    return remedy.measure_remedies(variants, **kwargs)


def stop() -> None:
    """Stop the hook and write the final snapshot; safe when not started."""
    from oomsight.hook import runtime as hook

    hook.stop()
