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

import contextlib
import logging
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from types import FrameType
from typing import Any, Callable, NamedTuple, Optional, cast

from oomsight.analysis.diagnosis import diagnose, facts_from_event
from oomsight.analysis.units import format_bytes
from oomsight.config import OomSettings
from oomsight.hook import census
from oomsight.hook.accounting import trained_by
from oomsight.hook.cuda import CudaApi, expandable_segments_enabled
from oomsight.hook.discovery import held_parameters
from oomsight.hook.errors import ErrorBook
from oomsight.hook.sampler import Sampler, categories_with_activations
from oomsight.hook.steps import StepTracker
from oomsight.wire.schema import (
    KIND_OOM_EVENT,
    OUTCOME_FATAL,
    OUTCOME_PENDING,
    OUTCOME_RECOVERED,
    SCHEMA_VERSION,
    Categories,
    Diagnosis,
    JobSetup,
    OomEvent,
)
from oomsight.wire.spool import SpoolWriter, artifacts_budget_bytes

logger = logging.getLogger(__name__)

SUMMARY_MAX_CHARS = 8192
STACK_LIMIT = 40
SNAPSHOT_MIN_INTERVAL_SECONDS = 60.0
"""At most one memory-snapshot pickle a minute: an OOM storm must not fill the disk."""
TERMINATION_MESSAGE_MAX_BYTES = 4096  # the kubelet keeps at most this much


class OomRecorder:
    def __init__(
        self,
        settings: OomSettings,
        cuda: CudaApi,
        writer: SpoolWriter,
        sampler: Sampler,
        steps: Optional[StepTracker],
        errors: ErrorBook,
        clock: Callable[[], float] = time.time,
        context: Optional[OomContext] = None,
        torch: Any = None,
    ) -> None:
        self.settings = settings
        self.torch = torch
        """The torch module the census reads the job's objects with (None: no census)."""
        self.cuda = cuda
        self.writer = writer
        self.sampler = sampler
        self.steps = steps
        self.errors = errors
        self.clock = clock
        self.context = context or OomContext()
        self.history = False
        """True while allocation history is recorded (snapshots are written on OOM)."""
        self.census_budget = census.Budget()
        self.active = True
        self.events: dict[int, OomEvent] = {}
        self.pending: list[int] = []
        self.unwritten = 0
        self.unwritten_events: set[int] = set()
        self._seq = 0
        self._last_snapshot = -SNAPSHOT_MIN_INTERVAL_SECONDS
        self._lock = threading.Lock()
        self._excepted: set[int] = set()
        """The exceptions already recorded (one OOM leaves several frames, and reaches the exit hook)."""

    def observe(self, device: int, requested: int, device_total: int, device_free: int) -> None:
        """The allocator's OOM observer. Runs in the failing thread; must never raise."""
        if not self.active:
            return
        try:
            with self._lock:
                event = self._record(int(device), int(requested), int(device_total), int(device_free))
        except Exception as exc:
            self.errors.record("oom_observer", exc)
            return
        if event is not None:
            self._attach_snapshot(event)
        self.sampler.publish_soon()  # the snapshot follows from the sampler thread, not from here

    def observe_exception(self, exc: BaseException) -> None:
        """An OOM seen as the exception on its way out (``cudaMallocAsync`` and pluggable allocators
        have no observer): the same event, from what the message and the allocator say now. Must
        never raise."""
        if not self.active or not is_oom(exc) or id(exc) in self._excepted:
            return
        if len(self._excepted) >= 64:
            self._excepted.clear()  # ids only (a kept exception would keep its frames' tensors alive)
        self._excepted.add(id(exc))
        try:
            text = str(exc)
            device = _device_of(text, self.cuda)
            requested = _bytes_after(text, REQUESTED_MARKS) or 0
            dev = self.sampler.device(device)
            total = dev.total if dev is not None else 0
            free = _bytes_after(text, FREE_MARKS)
            with self._lock:
                self._record(device, requested, total, free if free is not None else 0, "exception")
        except Exception as err:
            self.errors.record("oom_exception", err)
            return
        self.sampler.publish_soon()

    def _record(
        self, device: int, requested: int, total: int, free: int, captured_by: str = "observer"
    ) -> Optional[OomEvent]:
        """Count the OOM, and under the cap gather, diagnose and write its event (durably)."""
        now = self.clock()
        self._seq += 1
        if self._seq > self.settings.max_events:
            self.unwritten += 1
            return None
        dev = self.sampler.device(device)
        trend = list(dev.trend) if dev is not None else []
        event = self._event(now, device, requested, total, free, captured_by)
        # diagnosed from the event itself, as a later oomsight re-diagnoses a recorded one
        facts = facts_from_event(event)
        facts["trend"] = trend
        facts["expandable_segments"] = facts["expandable_segments"] or expandable_segments_enabled()
        event["diagnosis"] = diagnose(facts)
        self.events[self._seq] = event
        self.pending.append(self._seq)
        self._write(event)  # durable before the error is raised, and before any artifact
        return event

    def _event(self, now: float, device: int, requested: int, total: int, free: int, captured_by: str) -> OomEvent:
        """What the allocator, the sampler and the rest of the hook know at the OOM (not diagnosed yet)."""
        r = self.cuda.read(device)
        # Under set_per_process_memory_fraction the total is the cap and free is physical:
        # what this process could still get is the smaller of the two.
        physical_free = free
        free = max(min(free, total - r.reserved_bytes), 0)
        dev = self.sampler.device(device)
        nvml = self.sampler.nvml_sample(dev) if dev is not None else None
        categories = self._categories(device, r.allocated_bytes)
        ctx = self.context
        steps_memory = ctx.steps_memory(device)
        phase = self._phase()
        block = self._guarded("largest_free_block", lambda: self.cuda.largest_free_block(device))
        # first: a process that never walked (no optimizer step) gets its job's parallelism from it
        model_states = self._guarded("model_states", lambda: ctx.model_states(device))
        job = self._job_at_oom(ctx.job(), phase)
        stack = _user_stack()
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
            stack=stack,
            diagnosis=Diagnosis(cause="", summary="", remedies=[], facts={}),
            snapshot_artifact=None,
            outcome=OUTCOME_PENDING,
            outcome_time=None,
            physical_free_bytes=physical_free,
            limit_bytes=dev.limit if dev is not None else None,
            grad_enabled=self._guarded("grad_enabled", self.cuda.grad_enabled),
            sampled_allocated=[list(x) for x in list(dev.recent)] if dev is not None else [],
            last_step_time=self.steps.last_step_wall if self.steps is not None else None,
            steps_memory=steps_memory,
            phase=phase,
            largest_free_block_bytes=block,
            job=cast(Optional[JobSetup], job),
            model_states=model_states,
            captured_by=captured_by,
            **self._layout_at_oom(device),  # type: ignore[typeddict-item]
        )
        self._rows_at_oom(event, device)
        taken = self.take_census(device, self.census_budget)
        if taken is not None:
            event["census"] = taken
        return cast(OomEvent, event)

    def take_census(self, device: int, budget: census.Budget) -> Optional[dict[str, Any]]:
        """What holds the bytes, read from the job's objects (``hook.census``), within ``budget``; a census
        that raises is recorded as failed and the diagnosis reads the counters alone. At an OOM, and in the
        leak scan at a step boundary."""
        steps = self.steps
        device_type = steps.device_type if steps is not None else "cuda"  # tests count a CPU model as device 0
        if self.torch is None or (device_type == "cuda" and not self._guarded("census", self._cuda_initialised)):
            return None  # no torch to read with, or no tensor can be on a device CUDA never initialised
        started = time.perf_counter()
        try:
            dev = self.sampler.device(device)
            nvml = self.sampler.nvml
            procs = nvml.processes(dev.nvml_handle) if nvml is not None and dev is not None else None
            return census.take(
                self.torch,
                device,
                roots=list(steps.roots) if steps is not None else [],
                optimizers=list(steps.optimizers) if steps is not None else [],
                budget=budget,
                device_type=device_type,
                gpu_processes=procs,
            )
        except Exception as exc:
            self.errors.record("census", exc)
            return {"complete": False, "cut_short": "failed", "seconds": round(time.perf_counter() - started, 4)}

    def _cuda_initialised(self) -> bool:
        return bool(self.torch.cuda.is_initialized())

    def _rows_at_oom(self, event: OomEvent, device: int) -> None:
        """The forward rows (wire 1.7: no optimizer step since they began), what the backwards consumed (1.8)
        and the memory after each backward of the accumulation window so far (1.10)."""
        ctx = self.context
        forwards = self._guarded("forward_memory", lambda: ctx.forwards_memory(device))
        if forwards:
            event["forwards_memory"] = forwards
        event.update(self._guarded("forward_memory", ctx.consumption) or {})  # type: ignore[typeddict-item]
        backwards = self._guarded("forward_memory", lambda: ctx.backwards_memory(device))
        if backwards:
            event["backwards_memory"] = backwards

    def _layout_at_oom(self, device: int) -> dict[str, Any]:
        """What the failing model and the private pools say (wire 1.6)."""
        pools = self._guarded("private_pools", lambda: self.cuda.private_pools(device))
        steps = self.steps
        module = self._guarded(
            "module_training", lambda: _outer_module(steps.optimizers, steps.roots) if steps else _outer_module()
        )
        return {
            "module_training": module.training if module is not None else None,
            "module_frozen": module.frozen if module is not None else None,
            "private_pool_bytes": pools[0] if pools else None,
            "private_pool_free_bytes": pools[1] if pools else None,
        }

    def _write(self, event: OomEvent) -> None:
        try:
            self.writer.write_event(event)
        except Exception as exc:
            self.unwritten_events.add(event["seq"])
            self.errors.record("oom_event_write", exc, f"check free space in {self.writer.root}")
        else:
            self.unwritten_events.discard(event["seq"])

    def retry_unwritten(self) -> None:
        """Write again the events whose write failed (full spool); called before each publish."""
        with self._lock:
            for seq in sorted(self.unwritten_events):
                self._write(self.events[seq])

    @property
    def unwritten_total(self) -> int:
        """Events over the per-process cap plus events whose write failed and awaits a retry."""
        return self.unwritten + len(self.unwritten_events)

    def _job_at_oom(self, job: Optional[dict[str, Any]], phase: str) -> Optional[dict[str, Any]]:
        """The job's setup, with what is open at the OOM (one before the first detection window
        still sees autocast and checkpointing, in forward and backward alike)."""
        if job is None:
            return job
        job = dict(job)
        if job.get("compiled") is None:  # before the job probe's first window: dynamo's own counter
            job["compiled"] = self._guarded("compiled", self.cuda.compiled)
        hooks = self._guarded("saved_tensor_hooks", self.cuda.saved_tensor_hooks)
        if phase == "forward" and hooks == "checkpoint":
            job["checkpointing"] = True
        elif hooks == "offload":
            job["activation_offload"] = True
        for key, seen in (self._guarded("open_contexts", self.cuda.open_contexts) or {}).items():
            if seen:
                job[key] = True
        return job

    def _phase(self) -> str:
        if self.steps is not None and self.steps.in_step:
            return "optimizer"
        return "backward" if self._guarded("phase", self.cuda.in_backward) else "forward"

    def _guarded(self, component: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:
            self.errors.record(component, exc)
            return None

    def _attach_snapshot(self, event: OomEvent) -> None:
        """After the event is durable: the memory-snapshot artifact, if history is on."""
        name = self._snapshot(event["time"])
        if name is not None:
            with self._lock:
                event["snapshot_artifact"] = name
                self._write(event)

    def _categories(self, device: int, allocated: int) -> Optional[Categories]:
        if self.steps is None or device not in self.steps.categories:
            return None
        found = categories_with_activations(
            self.steps.categories[device], None, allocated, self.steps.layout_states.get(device)
        )
        if found is not None:
            found["basis"] = "at_oom"
        return found

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
            # room first: evict to half the bound, so the new pickle fits beside what stays; the
            # bound is the setting, lowered to half the spool's filesystem (room kept for events)
            budget = artifacts_budget_bytes(self.writer.root, self.settings.artifacts_max_bytes)
            self.writer.evict_artifacts(budget // 2)
            self.cuda.dump_snapshot(path)
            if not self.writer.settle_artifact(path, budget):  # larger than the artifacts' share alone
                return None
        except Exception as exc:
            self.errors.record("memory_snapshot", exc)
            _remove(path)  # a partial pickle (full disk) must not stay
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
                self._write(event)

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


REQUESTED_MARKS = ("Tried to allocate", "Requested")
FREE_MARKS = ("Free (according to CUDA):", "of which")
_SIZE = re.compile(r"[:\s]*([0-9]+(?:\.[0-9]+)?)\s*(bytes|B|KiB|MiB|GiB|TiB)")
_UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error of CUDA: ``torch.OutOfMemoryError``, or its text in another error (NCCL
    and cuBLAS report theirs as ``RuntimeError``)."""
    if any(cls.__name__ == "OutOfMemoryError" for cls in type(exc).__mro__):
        return True
    text = str(exc)
    return "CUDA out of memory" in text or "CUBLAS_STATUS_ALLOC_FAILED" in text


def _bytes_after(text: str, marks: tuple[str, ...]) -> Optional[int]:
    """The size written after the first of ``marks`` in an OOM message ("2.00 GiB"), in bytes."""
    for mark in marks:
        at = text.find(mark)
        if at < 0:
            continue
        found = _SIZE.match(text, at + len(mark))
        if found is not None:
            return int(float(found.group(1)) * _UNITS[found.group(2)])
    return None


def _device_of(text: str, cuda: CudaApi) -> int:
    found = re.search(r"(?:GPU|on device) (\d+)", text)
    return int(found.group(1)) if found else cuda.current_device()


MONITORING_TOOLS = (4, 3)
"""``sys.monitoring`` tool ids oomsight may take (0-2 and 5 are the debugger's, coverage's, the
profiler's and the optimizer's by convention)."""


def watch_raised(callback: Callable[[BaseException], None]) -> Optional[int]:
    """Call ``callback`` with every CUDA OOM raised in a Python frame, caught later or not (Python
    3.12+: ``sys.monitoring``'s RAISE event, which costs nothing until an exception is raised).
    For allocator back-ends without an OOM observer. The tool id taken, or None where unavailable."""
    monitoring = getattr(sys, "monitoring", None)
    free = [tool for tool in MONITORING_TOOLS if monitoring is not None and monitoring.get_tool(tool) is None]
    if monitoring is None or not free:
        return None

    def on_raise(code: Any, offset: int, exc: BaseException) -> Any:
        if type(exc).__name__ == "OutOfMemoryError":
            callback(exc)
        return None

    monitoring.use_tool_id(free[0], "oomsight")
    monitoring.register_callback(free[0], monitoring.events.RAISE, on_raise)
    monitoring.set_events(free[0], monitoring.events.RAISE)
    return free[0]


def unwatch_raised(tool: int) -> None:
    monitoring = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
    monitoring.set_events(tool, 0)
    monitoring.free_tool_id(tool)


class OomContext:
    """What the rest of the hook knows at an OOM: the step rows, the job's setup, the model states.
    The runtime passes one built from its parts; the default knows nothing."""

    def steps_memory(self, device: int) -> list[list[float]]:
        return []

    def forwards_memory(self, device: int) -> list[list[float]]:
        return []

    def backwards_memory(self, device: int) -> list[list[float]]:
        """Memory after each backward since the last optimizer step (wire 1.10); none where unknown."""
        return []

    def consumption(self) -> dict[str, Optional[int]]:
        """What the job's backwards consumed of its forwards' graphs (wire 1.8); nothing where unknown."""
        return {}

    def job(self) -> Optional[dict[str, Any]]:
        return None

    def model_states(self, device: int) -> Optional[dict[str, Any]]:
        return None


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


_MODULE_CALLS = frozenset(("_call_impl", "_wrapped_call_impl"))


class OuterModule(NamedTuple):
    training: Optional[bool]
    """The module is in training mode (``model.eval()`` makes it False); None: no such flag."""
    frozen: bool
    """None of its parameters trains (``accounting.trained_by``): a frozen teacher, reference or reward model."""


def _outer_module(optimizers: Sequence[Any] = (), models: Sequence[Any] = ()) -> Optional[OuterModule]:
    """The outermost ``nn.Module`` being called on this thread's stack (the model whose forward
    failed): its training flag and whether it is frozen (``models``: the models known, whose parameters
    the optimizers hold); None when no module is being called. Read
    from the frames of ``Module.__call__``, at the OOM only."""
    found = None
    frame: Optional[FrameType] = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name in _MODULE_CALLS and code.co_filename.endswith(_MODULE_FILE):
            module = frame.f_locals.get("self")
            if module is not None:
                found = module
        frame = frame.f_back
    if found is None:
        return None
    training = getattr(found, "training", None)
    trains = trained_by(optimizers, ())
    flags = [trains(p) for p in held_parameters(found)]
    return OuterModule(training if isinstance(training, bool) else None, bool(flags) and not any(flags))


_MODULE_FILE = os.path.join("torch", "nn", "modules", "module.py")


def _user_stack() -> list[str]:
    """The Python stack that led to the failing allocation, without our own frames."""
    frames = traceback.extract_stack(limit=STACK_LIMIT)
    here = os.path.dirname(__file__)
    return [f"{f.filename}:{f.lineno} in {f.name}" for f in frames if not f.filename.startswith(here)]
