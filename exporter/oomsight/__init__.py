"""oomsight: see why PyTorch runs out of CUDA memory.

``import oomsight.auto`` starts the hook with settings from ``OOMSIGHT_*``
environment variables; ``oomsight.start(**settings)`` and ``oomsight.stop()``
give explicit control. Importing this package imports nothing heavy: torch is
imported by ``start()``, and only if the program can use it.
"""

from __future__ import annotations

from typing import Any, Optional

from oomsight._version import __version__

__all__ = [
    "__version__",
    "largest_batch",
    "measure_remedies",
    "predict_peak",
    "probe_batch_size",
    "record_prediction",
    "start",
    "stop",
]


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


def predict_peak(model: Any, batch: Any, batch_size: int, *args: Any, **kwargs: Any) -> Any:
    """A training step's peak CUDA memory, predicted on the CPU without a GPU (``oomsight.tools.predict``)."""
    from oomsight.tools.predict import predict_peak as predict

    return predict(model, batch, batch_size, *args, **kwargs)


def record_prediction(
    prediction: Any,
    *,
    model: Optional[str] = None,
    batch_size: Optional[int] = None,
    reserved_bytes: Optional[int] = None,
) -> bool:
    """Publish the job's predicted peak next to the measured one (metrics, report, pod dashboard).

    ``prediction``: what :func:`predict_peak` returned, the JSON of ``oomsight predict --json``
    (a dict, or the path of its file), or the predicted peak allocated bytes (an int, or a size
    such as ``"30GiB"``); the keywords add what it does not say. Call it after
    ``import oomsight.auto`` (a call before the hook starts is kept for it). Never raises: a value
    it cannot use is one warning, counted in ``oomsight_hook_errors_total{component="prediction"}``,
    and False."""
    from oomsight.hook import runtime as hook

    return hook.record_prediction(prediction, model=model, batch_size=batch_size, reserved_bytes=reserved_bytes)


def largest_batch(model: Any, batch: Any, capacity: int, *args: Any, **kwargs: Any) -> Any:
    """The largest batch whose predicted step fits ``capacity`` less a margin (``oomsight.tools.predict``)."""
    from oomsight.tools.predict import largest_batch as search

    return search(model, batch, capacity, *args, **kwargs)


def measure_remedies(variants: Any, **kwargs: Any) -> Any:
    """Peak memory and step time of each variant against the first (``oomsight.tools.remedy``)."""
    from oomsight.tools import remedy

    return remedy.measure_remedies(variants, **kwargs)


def stop() -> None:
    """Stop the hook and write the final snapshot; safe when not started."""
    from oomsight.hook import runtime as hook

    hook.stop()
