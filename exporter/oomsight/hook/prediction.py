"""The job's predicted peak (``docs/prediction.md``, "Predicted vs measured on the fleet").

A job carries what ``oomsight predict`` said about its training step, either as
``OOMSIGHT_PREDICTION`` (the path of the JSON that ``oomsight predict --json`` wrote, or a size
such as ``30GiB``) or by calling ``oomsight.record_prediction(...)``. This module turns either
into the snapshot's ``prediction`` document; anything it cannot use raises
:class:`PredictionError` with a message that says what it expected, which the runtime records
through its one error guard (one warning, counted), never into the training process.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from typing import Any, Callable, Optional

from oomsight.wire.schema import PeakPrediction

MAX_FILE_BYTES = 1 << 20
"""A prediction file larger than this is not ``oomsight predict``'s output."""
MAX_BYTES = 2**63 - 1
UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
UNITS.update({"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12})
_SIZE = re.compile(r"([0-9]{1,18}(?:\.[0-9]{1,18})?(?:[eE][+]?[0-9]{1,2})?)\s*([a-zA-Z]{0,3})")
EXPECTED = "the path of `oomsight predict --json` output, or a size such as 30GiB"


class PredictionError(ValueError):
    """A prediction the hook cannot use; the message says what was expected."""


def parse_size(text: str) -> Optional[int]:
    """``30GiB``, ``40 GB``, ``1e9`` → bytes; None when ``text`` is not written as a size."""
    m = _SIZE.fullmatch(text.strip())
    if not m or m.group(2).lower() not in UNITS:
        return None
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def from_setting(raw: str, clock: Callable[[], float] = time.time) -> PeakPrediction:
    """``OOMSIGHT_PREDICTION``'s value: a size, else a file of ``oomsight predict --json``."""
    return _from_text(raw, "env", clock)


def from_value(
    value: Any,
    model: Optional[str] = None,
    batch_size: Optional[int] = None,
    reserved_bytes: Optional[int] = None,
    clock: Callable[[], float] = time.time,
) -> PeakPrediction:
    """What ``oomsight.record_prediction`` was given: bytes (an int), a size or a path (a str),
    the dict of ``oomsight predict --json`` or of ``Prediction.to_dict()``, or a ``Prediction``
    (anything with ``to_dict()``); the keywords fill in or override what it does not say."""
    if hasattr(value, "to_dict") and callable(value.to_dict):
        value = value.to_dict()
    if isinstance(value, str):
        found = _from_text(value, "api", clock)
    elif isinstance(value, Mapping):
        found = from_document(value, "api", clock)
    elif isinstance(value, int) and not isinstance(value, bool):
        found = _made(value, None, "api", clock)
    else:
        raise PredictionError(f"a prediction is bytes, a size, a path or oomsight predict's output, not {value!r:.80}")
    if reserved_bytes is not None:
        found["peak_reserved_bytes"] = _bytes("reserved_bytes", reserved_bytes)
    if model is not None:
        found["model"] = str(model)[:200]
    if batch_size is not None:
        found["batch_size"] = _bytes("batch_size", batch_size)
    return found


def from_document(doc: Mapping[str, Any], source: str, clock: Callable[[], float] = time.time) -> PeakPrediction:
    """The ``--json`` output (``{"prediction": {...}, ...}``) or a bare ``Prediction.to_dict()``."""
    inner = doc.get("prediction", doc)
    if not isinstance(inner, Mapping) or "peak_allocated_bytes" not in inner:
        raise PredictionError(f"no peak_allocated_bytes in it; expected {EXPECTED}")
    reserved = inner.get("peak_reserved_bytes")
    found = _made(inner["peak_allocated_bytes"], reserved, source, clock)
    model = doc.get("model", inner.get("model"))
    if isinstance(model, str) and model:
        found["model"] = model[:200]
    batch = inner.get("batch_size")
    if batch is not None:
        found["batch_size"] = _bytes("batch_size", batch)
    return found


def _from_text(raw: str, source: str, clock: Callable[[], float]) -> PeakPrediction:
    size = parse_size(raw)
    if size is not None:
        return _made(size, None, source, clock)
    if not raw.strip():
        raise PredictionError(f"it is empty; expected {EXPECTED}")
    return from_document(_read_json(raw), source, clock)


def _read_json(path: str) -> Mapping[str, Any]:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise PredictionError(
            f"{path!r:.200} is neither a size nor a readable file ({reason}); expected {EXPECTED}"
        ) from None
    if len(data) > MAX_FILE_BYTES:
        raise PredictionError(f"{path!r:.200} is larger than {MAX_FILE_BYTES} bytes: not oomsight predict's output")
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise PredictionError(f"{os.path.basename(path)!r:.200} is not JSON ({exc}); expected {EXPECTED}") from None
    if not isinstance(doc, dict):
        raise PredictionError(f"{os.path.basename(path)!r:.200} holds no JSON object; expected {EXPECTED}")
    return doc


def _made(allocated: Any, reserved: Any, source: str, clock: Callable[[], float]) -> PeakPrediction:
    return PeakPrediction(
        peak_allocated_bytes=_bytes("peak allocated bytes", allocated),
        peak_reserved_bytes=None if reserved is None else _bytes("peak reserved bytes", reserved),
        source=source,
        model=None,
        batch_size=None,
        recorded_at=clock(),
    )


def _bytes(what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BYTES:
        raise PredictionError(f"{what} must be a whole number from 1 to 2**63-1, not {value!r:.80}")
    return value
