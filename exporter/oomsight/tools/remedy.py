"""``oomsight.measure_remedies``: what a remedy changes, measured on the job itself.

The estimator (``oomsight.analysis.advice``) says what bf16, checkpointing or accumulation should
save; this runs them. You pass step functions — the baseline first, then variants you
build (a checkpointed model, a compiled one, a smaller micro-batch with accumulation;
``with_autocast`` wraps one for you) — and each runs a few warm steps, interleaved over
rounds, while the peak memory and the time per step are recorded. ``torch.compile`` is
measured like any other variant: it can raise the peak (pytorch/pytorch#122512).

Like the probe, it resets the allocator's peak counters while it runs: call it
explicitly, between training phases. An OOM in a variant is recovered and reported.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Callable, Optional

from oomsight.tools.probe import Memory


@dataclasses.dataclass(frozen=True)
class Measurement:
    name: str
    peak_allocated_bytes: Optional[int]
    peak_reserved_bytes: Optional[int]
    seconds_per_step: Optional[float]
    peak_change_ratio: Optional[float]  # vs the baseline: -0.4 means 40 % less peak
    time_change_ratio: Optional[float]
    error: Optional[str] = None  # "out of memory" when the variant did not fit


def measure_remedies(
    variants: dict[str, Callable[[], None]],
    steps: int = 5,
    rounds: int = 2,
    device: int = 0,
    memory: Optional[Any] = None,
) -> list[Measurement]:
    """Measure every variant against the first one (the baseline)."""
    if len(variants) < 2:
        raise ValueError("measure_remedies needs the baseline and at least one variant")
    if memory is None:
        import torch

        memory = Memory(torch, device)
    names = list(variants)
    samples: dict[str, list[tuple[int, int, float]]] = {n: [] for n in names}
    failed: dict[str, str] = {}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate the order each round
            if name in failed:
                continue
            result = _one(memory, variants[name], steps)
            if result is None:
                failed[name] = "out of memory"
            else:
                samples[name].append(result)
    return _compare(names, samples, failed)


def _one(memory: Any, step: Callable[[], None], steps: int) -> Optional[tuple[int, int, float]]:
    memory.release()
    try:
        step()  # warm: optimizer state, caches, compilation
        return memory.measure_window(step, steps)  # type: ignore[no-any-return]
    except Exception as exc:
        if not memory.is_oom(exc):
            raise
    memory.release()
    return None


def _compare(
    names: list[str], samples: dict[str, list[tuple[int, int, float]]], failed: dict[str, str]
) -> list[Measurement]:
    base = samples[names[0]]
    base_peak = max(s[0] for s in base) if base else None
    base_time = statistics.median(s[2] for s in base) if base else None
    out = []
    for name in names:
        got = samples[name]
        if not got:
            out.append(Measurement(name, None, None, None, None, None, failed.get(name, "not measured")))
            continue
        peak = max(s[0] for s in got)
        seconds = statistics.median(s[2] for s in got)
        out.append(
            Measurement(
                name=name,
                peak_allocated_bytes=peak,
                peak_reserved_bytes=max(s[1] for s in got),
                seconds_per_step=seconds,
                peak_change_ratio=peak / base_peak - 1 if base_peak else None,
                time_change_ratio=seconds / base_time - 1 if base_time else None,
            )
        )
    return out


def with_autocast(step: Callable[[], None], dtype: Any = None) -> Callable[[], None]:
    """``step`` run under ``torch.autocast("cuda", dtype=bfloat16)``."""
    import torch

    def autocast_step() -> None:
        with torch.autocast("cuda", dtype=dtype or torch.bfloat16):
            step()

    return autocast_step
