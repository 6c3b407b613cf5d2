"""The cheapest change that makes a job fit, and whether it changes what the job computes (issue 51).

When the job as given does not fit its GPU (``--gpu``/``--capacity``), ``oomsight predict`` predicts it again
with one change at a time, cheapest first, and names the first that fits. The two classes of DESIGN.md:
the changes that only move memory come first, and a change of results is said as such.

1. a fused optimizer, ``--optimizer-impl fused``: the same update in one kernel (no cost, often faster);
2. a for-loop optimizer, ``--optimizer-impl for-loop``: the same update a parameter at a time (a slower step);
3. activation checkpointing, ``--checkpointing``: the forward recomputed in the backward (about a third
   more compute);
4. a smaller micro-batch, the same effective batch, ``--batch B/k --accumulation A*k`` (k times the
   micro-steps; BatchNorm statistics aside, results unchanged);
5. a lighter optimizer state, ``--optimizer adamw8bit``: **changes results** (8-bit moments are a
   different optimizer);
6. a smaller batch, ``--batch B/k``, only for a ``--module`` whose own step decides accumulation:
   **changes results** (a different effective batch).

A smaller effective batch never fits where the smaller micro-batch with accumulation does not (the peak
of a micro-step is the same), so it is offered only where the job's own step decides accumulation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

from oomsight.predict import optimizer

MAX_MICRO_BATCHES = 4
"""Smaller micro-batches tried: B/2, B/4, ... and 1, at most this many (each is one prediction)."""


@dataclass(frozen=True)
class Change:
    """One change to the job: the flags that make it, the settings it overrides, whether results change."""

    flags: str
    overrides: dict[str, Any]
    changes_results: bool
    why: str


@dataclass
class Tried:
    """A change and what it was predicted to need."""

    change: Change
    peak_reserved_bytes: int
    fits: bool
    within_capacity: bool = False
    """Within the capacity less the context and NCCL, margin aside: fits with a smaller ``--margin``."""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self.change), "peak_reserved_bytes": self.peak_reserved_bytes, "fits": self.fits,
                "within_capacity": self.within_capacity}  # fmt: skip


@dataclass
class Search:
    """The changes tried in order and the first that fits (None: no single change does)."""

    budget_bytes: int
    tried: list[Tried] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """A change the job could not be predicted with, and why (a model without checkpointing, say)."""

    @property
    def cheapest(self) -> Optional[Tried]:
        return next((t for t in self.tried if t.fits), None)

    def to_dict(self) -> dict[str, Any]:
        cheapest = self.cheapest
        return {"budget_bytes": self.budget_bytes, "cheapest": cheapest.to_dict() if cheapest else None,
                "tried": [t.to_dict() for t in self.tried], "skipped": self.skipped}  # fmt: skip


def candidates(job: dict[str, Any]) -> list[Change]:
    """The changes that apply to ``job`` (the command's settings: ``optimizer``, ``optimizer_impl``,
    ``checkpointing``, ``batch``, ``accumulation``; ``own_optimizer``, ``own_step``, ``config``: what the
    user's spec brings), cheapest first."""
    found: list[Change] = []
    impl = job.get("optimizer_impl")
    if job["optimizer"] in optimizer.TORCH_OPTIMIZERS and not job.get("own_optimizer"):
        if impl != "fused":
            found.append(Change("--optimizer-impl fused", {"optimizer_impl": "fused"}, False,
                                "fused AdamW/SGD: one kernel updates in place, no list-wide temporaries"))  # fmt: skip
        if impl in (None, "foreach"):
            found.append(Change("--optimizer-impl for-loop", {"optimizer_impl": "for-loop"}, False,
                                "the same update one parameter at a time (a slower step)"))  # fmt: skip
    if job.get("config") and not job.get("checkpointing"):
        found.append(Change("--checkpointing", {"checkpointing": True}, False,
                            "activation checkpointing: each block's forward recomputed in the backward "
                            "(about a third more compute)"))  # fmt: skip
    found.extend(_smaller_batches(job))
    together = _together(found)
    if together:
        found.append(together)
    if job["optimizer"] == "adamw" and not job.get("own_optimizer"):
        found.append(Change("--optimizer adamw8bit", {"optimizer": "adamw8bit", "optimizer_impl": None}, True,
                            "8-bit AdamW state (bitsandbytes): a different optimizer, its results differ"))  # fmt: skip
    return found


def _together(found: list[Change]) -> Optional[Change]:
    """The changes that keep results, made at once: the fused optimizer, checkpointing and the smallest
    micro-batch (None where fewer than two of them apply)."""
    keep = [c for c in found if not c.changes_results and c.flags != "--optimizer-impl for-loop"]
    batches = [c for c in keep if "batch" in c.overrides]
    chosen = [c for c in keep if "batch" not in c.overrides] + batches[-1:]
    if len(chosen) < 2:
        return None
    merged = {k: v for c in chosen for k, v in c.overrides.items()}
    return Change(" ".join(c.flags for c in chosen), merged, False, "the changes above that keep results, together")


def _smaller_batches(job: dict[str, Any]) -> list[Change]:
    batch, acc = int(job["batch"]), int(job.get("accumulation") or 1)
    smaller = [batch // 2**k for k in range(1, MAX_MICRO_BATCHES) if batch % 2**k == 0]
    smaller = sorted({*smaller, 1} - {batch}, reverse=True)[:MAX_MICRO_BATCHES]
    found = []
    for micro in smaller:
        if job.get("own_step"):  # the user's step decides accumulation: a smaller batch is a smaller effective one
            found.append(Change(f"--batch {micro}", {"batch": micro}, True,
                                f"a batch of {micro} instead of {batch}: a different effective batch"))  # fmt: skip
            continue
        times = batch // micro if batch % micro == 0 else None
        if times is None:
            continue
        found.append(Change(f"--batch {micro} --accumulation {acc * times}",
                            {"batch": micro, "accumulation": acc * times}, False,
                            f"micro-batches of {micro}, {acc * times} per optimizer step: the same effective batch "
                            f"of {batch * acc} (BatchNorm statistics aside)"))  # fmt: skip
    return found


def search(changes: list[Change], peak_of: Callable[[dict[str, Any]], int], budget: int, usable: int) -> Search:
    """Predict each change in order until one fits ``budget`` (``peak_of(overrides)``: the peak reserved per
    rank of the job with those settings; ``usable``: the capacity before the margin); a change that cannot
    be predicted is skipped, said in ``skipped``."""
    found = Search(budget_bytes=budget)
    for change in changes:
        try:
            peak = int(peak_of(change.overrides))
        except Exception as exc:  # a change the model cannot take (checkpointing): said, not offered
            found.skipped.append(f"{change.flags}: {type(exc).__name__}: {str(exc).strip()[:200]}")
            continue
        found.tried.append(Tried(change, peak, peak <= budget, peak <= usable))
        if peak <= budget:
            break
    return found
