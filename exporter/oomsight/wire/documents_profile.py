"""The ``TypedDict`` s of the ``profile`` document and of the objects first nested in it.
GENERATED from ``oomsight.wire.fields`` by ``python -m oomsight.wire.rendering``: edit the
table, not this file. Import them from ``oomsight.wire.documents``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, TypedDict

from oomsight.wire.documents_snapshot import ProcessInfo

if TYPE_CHECKING:
    from typing_extensions import NotRequired

__all__ = [
    "Profile",
    "ProfileOp",
]


class ProfileOp(TypedDict):
    """One operator row of a profiling window."""

    #: operator name ("other" sums the rest)
    op: str
    #: calls in the window
    calls: int
    #: memory the op itself allocated on the device (negative: frees)
    self_cuda_memory_bytes: int
    #: self CUDA time, microseconds
    self_cuda_time_us: float
    #: CUDA time including children, microseconds
    cuda_time_us: float
    #: CPU time, microseconds
    cpu_time_us: float


class Profile(TypedDict):
    """One on-demand torch.profiler window of N optimizer steps in one process."""

    #: 1
    schema_version: int
    #: "profile"
    kind: str
    #: who wrote it
    process: ProcessInfo
    #: the request it answers (scheduled-<unix s> for a scheduled window)
    request_id: str
    #: profiling began after this optimizer step (the same on every rank)
    start_step: int
    #: the window's length in steps
    steps: int
    #: when the window began
    started_at: float
    #: when the window ended
    ended_at: float
    #: the device
    device: int
    #: peak allocated bytes inside the window (from the sampler)
    peak_allocated_bytes: int
    #: top ops by self CUDA memory, then "other"
    top_by_memory: list[ProfileOp]
    #: top ops by self CUDA time; empty for a memory-only window
    top_by_time: list[ProfileOp]
    #: false: a memory-only window, CUDA time not traced
    cuda_time: NotRequired[bool]
    #: the profiler's key_averages() table, in artifacts/
    table_artifact: NotRequired[Optional[str]]
    #: the gzipped Chrome trace, in artifacts/
    trace_artifact: NotRequired[Optional[str]]
