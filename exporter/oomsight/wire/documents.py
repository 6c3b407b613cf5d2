"""The spool documents as ``TypedDict`` s. GENERATED from ``oomsight.wire.fields`` by
``python -m oomsight.wire.rendering``: edit the table, not this file.

The ``TypedDict`` s of each top-level document, and of the objects first nested in it, are
generated into ``documents_<kind>.py``; this module gathers them all. Optional keys are
``NotRequired``: a reader sees the table's default in their place
(``oomsight.wire.schema.validate(doc, fill_defaults=True)``).
"""

from oomsight.wire.documents_oom_event import Diagnosis, ModelStates, OomEvent
from oomsight.wire.documents_profile import Profile, ProfileOp
from oomsight.wire.documents_profile_request import ProfileRequestDocument
from oomsight.wire.documents_snapshot import (
    AllocatorSample,
    BatchAdvice,
    Categories,
    DeviceSnapshot,
    JobSetup,
    LeakFinding,
    NvmlSample,
    Parallelism,
    PeakPrediction,
    ProcessInfo,
    Snapshot,
    StepInfo,
    StepPeak,
    StepTrend,
)

__all__ = [
    "AllocatorSample",
    "BatchAdvice",
    "Categories",
    "DeviceSnapshot",
    "Diagnosis",
    "JobSetup",
    "LeakFinding",
    "ModelStates",
    "NvmlSample",
    "OomEvent",
    "Parallelism",
    "PeakPrediction",
    "ProcessInfo",
    "Profile",
    "ProfileOp",
    "ProfileRequestDocument",
    "Snapshot",
    "StepInfo",
    "StepPeak",
    "StepTrend",
]
