"""oomsight: see why PyTorch runs out of CUDA memory.

``import oomsight.auto`` starts the hook with settings from ``OOMSIGHT_*``
environment variables; ``oomsight.start(**settings)`` and ``oomsight.stop()``
give explicit control. Importing this package imports nothing heavy: torch is
imported by ``start()``, and only if the program can use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

from oomsight._version import __version__
from oomsight.config.table import signature as _signature
from oomsight.config.variables import HOOK as _HOOK

if TYPE_CHECKING:  # return types for readers and type checkers, not imported at run time
    from oomsight.predict import BatchSearch, Prediction
    from oomsight.tools.remedy import Measurement
    from oomsight.wire.schema import BatchAdvice

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
    """Start the hook (idempotent, never raises); True when it runs.

    Each keyword overrides its ``OOMSIGHT_*`` variable and is read as that variable is; the
    signature shows them all with their defaults, and ``docs/configuration.md`` what each does.
    A value it cannot use is one log line, and the hook stays off. Example::

        oomsight.start(record_history=True, window_seconds=30)
    """
    from oomsight.hook import runtime as hook

    return hook.start(**settings)


start.__signature__ = _signature(_HOOK)  # type: ignore[attr-defined]  # the settings table's keywords
del _signature, _HOOK


# The functions below spell out the parameters of what they call, so that help() and editors show
# them without importing the tools (and, through them, torch) with the package; a test
# (tests/test_cli_first_hour.py) checks that each signature is its implementation's.
def probe_batch_size(
    step_fn: Callable[[int], None],
    start: int = 8,
    points: int = 3,
    margin: float = 0.1,
    max_batch: Optional[int] = None,
    device: int = 0,
) -> BatchAdvice:
    """The largest batch whose peak leaves ``margin`` of the CUDA device free, measured on a few
    small batches without provoking an OOM (``oomsight.tools.probe``, ``docs/profiling.md``).

    ``step_fn(batch_size)`` runs one complete training step (forward, backward, optimizer step,
    zero_grad); ``start`` is the first batch tried (then doubled), ``points`` how many measured
    batches the line is fitted on, ``max_batch`` an upper bound, ``device`` the CUDA index. The
    answer also shows in the running hook's metrics. Without a CUDA device it raises
    ``oomsight.tools.probe.NoCudaDevice`` (``predict_peak`` predicts on the CPU). Example::

        def step(n):
            loss = model(torch.randn(n, 1024, device="cuda")).sum()
            loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)

        advice = oomsight.probe_batch_size(step, start=16, margin=0.05)
        print(advice.max_batch_size)
    """
    from oomsight.tools import probe

    advice = probe.probe_batch_size(step_fn, start, points, margin, max_batch, device)
    probe.publish(advice)
    return advice


def predict_peak(
    model: Callable[[], Any],
    batch: Callable[[int], Any],
    batch_size: int,
    optimizer: Optional[Callable[[Any], Any]] = None,
    step: Optional[Callable[[Any, Any, Any], Any]] = None,
    *,
    autocast: Any = None,
    accumulation: int = 1,
    steps: int = 3,
    capacity: Optional[int] = None,
    expandable_segments: Optional[bool] = None,
    workspace_bytes: Optional[int] = None,
    capability: Optional[tuple[int, int]] = (9, 0),
    keep_outputs: bool = False,
) -> Prediction:
    """A training step's peak CUDA memory, predicted on the CPU without a GPU
    (``oomsight.predict``, ``docs/prediction.md``).

    ``model()`` builds the model (on the meta device: no weights are made); ``batch(n)`` makes
    the inputs of one step of batch ``n``; ``optimizer(params)`` builds the optimizer (default
    AdamW); ``step(model, inputs, optimizer)`` runs one step (default: forward, under
    ``torch.autocast("cuda", autocast)`` when given, backward, ``accumulation`` micro-batches,
    ``optimizer.step()``, ``zero_grad``; ``keep_outputs``: the forward's outputs held until the next
    forward returns, as a hand-written ``outputs = model(**batch)`` loop holds them). ``steps``
    steps are traced; ``capacity`` (bytes) adds whether it fits; ``expandable_segments``,
    ``workspace_bytes`` and ``capability`` describe the GPU (default: an H100/H200, the
    allocator setting of the environment). Example::

        p = oomsight.predict_peak(lambda: MyModel(), lambda n: torch.randn(n, 1024), 32)
        print(p.peak_allocated_bytes, p.by_category_bytes)
    """
    from oomsight.predict import predict_peak as predict

    return predict(
        model,
        batch,
        batch_size,
        optimizer,
        step,
        autocast=autocast,
        accumulation=accumulation,
        steps=steps,
        capacity=capacity,
        expandable_segments=expandable_segments,
        workspace_bytes=workspace_bytes,
        capability=capability,
        keep_outputs=keep_outputs,
    )


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


def largest_batch(
    model: Callable[[], Any],
    batch: Callable[[int], Any],
    capacity: int,
    optimizer: Optional[Callable[[Any], Any]] = None,
    step: Optional[Callable[[Any, Any, Any], Any]] = None,
    *,
    margin: float = 0.10,
    start: int = 1,
    limit: int = 1 << 20,
    judge: str = "allocated",
    **predict: Any,
) -> BatchSearch:
    """The largest batch whose predicted peak allocated fits ``capacity * (1 - margin)`` bytes,
    searched with a few predictions on the CPU (``oomsight.predict``).

    ``model``, ``batch``, ``optimizer`` and ``step`` are those of :func:`predict_peak`, and so
    are the keywords in ``predict`` (``autocast``, ``accumulation``, ``steps``, ...); ``start``
    is the first batch tried, ``limit`` the largest; ``judge="reserved"`` judges the peak reserved
    (what runs out; the CUDA context is outside it) instead of the peak allocated. Example::

        found = oomsight.largest_batch(lambda: MyModel(), lambda n: torch.randn(n, 1024), 80 << 30)
        print(found.max_batch_size)
    """
    from oomsight.predict import largest_batch as search

    return search(
        model, batch, capacity, optimizer, step, margin=margin, start=start, limit=limit, judge=judge, **predict
    )


def measure_remedies(
    variants: dict[str, Callable[[], None]],
    steps: int = 5,
    rounds: int = 2,
    device: int = 0,
) -> list[Measurement]:
    """Peak memory and step time of each variant against the first, the baseline, measured on
    the CUDA device ``device`` (``oomsight.tools.remedy``, ``docs/report.md``).

    ``variants`` maps a name to a function that runs one training step; each runs ``steps``
    steps per round, for ``rounds`` rounds in a rotating order. A variant that runs out of
    memory is reported as such, not raised. Example::

        results = oomsight.measure_remedies({"baseline": step, "bf16": with_autocast(step)})
        for m in results:
            print(m.name, m.peak_change_ratio, m.time_change_ratio)
    """
    from oomsight.tools import remedy

    return remedy.measure_remedies(variants, steps, rounds, device)


def stop() -> None:
    """Stop the hook and write the final snapshot; safe when not started."""
    from oomsight.hook import runtime as hook

    hook.stop()


def __dir__() -> list[str]:
    """``dir(oomsight)``: the public names (``__all__``), not the typing names the signatures use."""
    return sorted(__all__)
