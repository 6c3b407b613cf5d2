"""Capturing CUDA OOMs: the allocator's observer writes a durable event file before
``torch.cuda.OutOfMemoryError`` reaches user code.

An event starts with outcome ``pending``. It becomes ``recovered`` when an
optimizer step completes afterwards (cuDNN's algorithm search, or user code that
catches the error and carries on) or the process exits without an uncaught
exception; ``fatal`` when the process ends with an uncaught exception. A fatal
OOM's diagnosis also goes to the container's termination message, if the file
exists (Kubernetes mounts it at ``/dev/termination-log``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from typing import Callable, Optional

from oomsight.analysis.diagnosis import OomFacts, diagnose
from oomsight.analysis.units import format_bytes
from oomsight.config import Settings
from oomsight.hook.cuda import CudaApi, expandable_segments_enabled
from oomsight.hook.sampler import ErrorBook, Sampler
from oomsight.hook.steps import StepTracker
from oomsight.wire.schema import (
    KIND_OOM_EVENT,
    OUTCOME_FATAL,
    OUTCOME_PENDING,
    OUTCOME_RECOVERED,
    SCHEMA_VERSION,
    Categories,
    OomEvent,
)
from oomsight.wire.spool import SpoolWriter

logger = logging.getLogger(__name__)

SUMMARY_MAX_CHARS = 8192
STACK_LIMIT = 40
SNAPSHOT_MIN_INTERVAL_SECONDS = 60.0
"""At most one memory-snapshot pickle a minute: an OOM storm must not fill the disk."""
TERMINATION_MESSAGE_MAX_BYTES = 4096  # the kubelet keeps at most this much


class OomRecorder:
    def __init__(
        self,
        settings: Settings,
        cuda: CudaApi,
        writer: SpoolWriter,
        sampler: Sampler,
        steps: Optional[StepTracker],
        errors: ErrorBook,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.cuda = cuda
        self.writer = writer
        self.sampler = sampler
        self.steps = steps
        self.errors = errors
        self.clock = clock
        self.history = False
        """True while allocation history is recorded (snapshots are written on OOM)."""
        self.active = True
        self.events: dict[int, OomEvent] = {}
        self.pending: list[int] = []
        self.unwritten = 0
        self._seq = 0
        self._last_snapshot = -SNAPSHOT_MIN_INTERVAL_SECONDS
        self._lock = threading.Lock()

    def observe(self, device: int, requested: int, device_total: int, device_free: int) -> None:
        """The allocator's OOM observer. Runs in the failing thread; must never raise."""
        if not self.active:
            return
        try:
            with self._lock:
                self._record(int(device), int(requested), int(device_total), int(device_free))
        except Exception as exc:
            self.errors.record("oom_observer", exc)

    def _record(self, device: int, requested: int, total: int, free: int) -> None:
        now = self.clock()
        self._seq += 1
        if self._seq > self.settings.max_oom_events:
            self.unwritten += 1
            return
        r = self.cuda.read(device)
        # Under set_per_process_memory_fraction the total is the cap and free is physical:
        # what this process could still get is the smaller of the two.
        physical_free = free
        free = max(min(free, total - r.reserved_bytes), 0)
        dev = self.sampler.device(device)
        nvml = self.sampler.nvml_sample(dev) if dev is not None else None
        categories = self._categories(device, r.allocated_bytes)
        trend = list(dev.trend) if dev is not None else []
        facts = OomFacts(
            requested_bytes=requested,
            device_total_bytes=total,
            device_free_bytes=free,
            physical_free_bytes=physical_free,
            allocated_bytes=r.allocated_bytes,
            reserved_bytes=r.reserved_bytes,
            inactive_split_bytes=r.inactive_split_bytes,
            nvml=nvml,
            categories=categories,
            trend=trend,
            expandable_segments=self.sampler.process["expandable_segments"] or expandable_segments_enabled(),
        )
        event = OomEvent(
            schema_version=SCHEMA_VERSION,
            kind=KIND_OOM_EVENT,
            process=self.sampler.process,
            seq=self._seq,
            time=now,
            device=device,
            gpu_uuid=dev.uuid if dev is not None else "",
            requested_bytes=requested,
            device_free_bytes=free,
            device_total_bytes=total,
            allocated_bytes=r.allocated_bytes,
            reserved_bytes=r.reserved_bytes,
            inactive_split_bytes=r.inactive_split_bytes,
            reserved_unallocated_bytes=max(r.reserved_bytes - r.allocated_bytes, 0),
            step=self.steps.count if self.steps is not None else 0,
            nvml=nvml,
            categories=categories,
            allocator_summary=self._summary(device),
            stack=_user_stack(),
            diagnosis=diagnose(facts),
            snapshot_artifact=self._snapshot(now),
            outcome=OUTCOME_PENDING,
            outcome_time=None,
        )
        self.writer.write_event(event)  # durable before the error is raised
        self.events[self._seq] = event
        self.pending.append(self._seq)
        self.sampler.publish()

    def _categories(self, device: int, allocated: int) -> Optional[Categories]:
        if self.steps is None or device not in self.steps.categories:
            return None
        params, grads, state, measured_at = self.steps.categories[device]
        return Categories(
            parameters_bytes=params,
            gradients_bytes=grads,
            optimizer_state_bytes=state,
            activations_bytes=max(allocated - params - grads - state, 0),
            basis="at_oom",
            measured_at=measured_at,
        )

    def _summary(self, device: int) -> str:
        try:
            return self.cuda.summary(device)[:SUMMARY_MAX_CHARS]
        except Exception as exc:
            self.errors.record("allocator_summary", exc)
            return ""

    def _snapshot(self, now: float) -> Optional[str]:
        if not self.history or now - self._last_snapshot < SNAPSHOT_MIN_INTERVAL_SECONDS:
            return None
        self._last_snapshot = now
        path = self.writer.artifact_path(self._seq, "pickle")
        try:
            self.cuda.dump_snapshot(path)
            self.writer.evict_artifacts(self.settings.artifacts_max_bytes)
        except Exception as exc:
            self.errors.record("memory_snapshot", exc)
            return None
        return os.path.basename(path) if os.path.exists(path) else None

    # ------------------------------------------------------------ outcomes
    def on_step(self) -> None:
        """A step completed: every pending OOM was survived."""
        if self.pending:
            self.settle(OUTCOME_RECOVERED)

    def settle(self, outcome: str) -> None:
        with self._lock:
            pending, self.pending = self.pending, []
            for seq in pending:
                event = self.events[seq]
                event["outcome"] = outcome
                event["outcome_time"] = self.clock()
                try:
                    self.writer.write_event(event)
                except Exception as exc:
                    self.errors.record("spool_write", exc)

    def at_exit(self, uncaught: Optional[BaseException]) -> None:
        """Settle pending events when the process ends; write the termination message."""
        if not self.pending:
            return
        fatal = [self.events[s] for s in self.pending]
        self.settle(OUTCOME_RECOVERED if uncaught is None else OUTCOME_FATAL)
        if uncaught is not None:
            self._termination_message(fatal[-1])

    def _termination_message(self, event: OomEvent) -> None:
        path = self.settings.termination_message_path
        if not path or not os.path.exists(path):
            return  # only where the kubelet created it; never create files elsewhere
        d = event["diagnosis"]
        text = (
            f"CUDA out of memory (oomsight) on rank {event['process']['rank']} device "
            f"{event['device']} {event['gpu_uuid']}: requested {format_bytes(event['requested_bytes'])}, "
            f"free {format_bytes(event['device_free_bytes'])} of {format_bytes(event['device_total_bytes'])}, "
            f"allocated {format_bytes(event['allocated_bytes'])}, reserved "
            f"{format_bytes(event['reserved_bytes'])}. Cause: {d['cause']}. {d['summary']} "
            f"Remedy: {d['remedies'][0] if d['remedies'] else 'n/a'}"
        )
        try:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text.encode()[:TERMINATION_MESSAGE_MAX_BYTES].decode(errors="ignore"))
        except OSError as exc:
            self.errors.record("termination_message", exc)


def _user_stack() -> list[str]:
    """The Python stack that led to the failing allocation, without our own frames."""
    frames = traceback.extract_stack(limit=STACK_LIMIT)
    here = os.path.dirname(__file__)
    return [f"{f.filename}:{f.lineno} in {f.name}" for f in frames if not f.filename.startswith(here)]
