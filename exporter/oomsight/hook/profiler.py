"""On-demand ``torch.profiler`` windows of N optimizer steps, aligned across ranks by step.

A request is a small JSON file in ``<spool>/requests/`` (written by the sidecar's admin
endpoint or ``oomsight profile``): ``{"kind": "profile_request", "id", "steps",
"start_step", "created_at", "cuda_time"}``. Every process of the pod sees it; each one
starts the profiler right after optimizer step ``start_step`` (or at once if it is
already past it) and stops it N steps later. Outside a window the step hook reads one
attribute. Results (``schema.Profile``) are built in a background thread: top-K
operators by self CUDA memory and by CUDA time (the rest summed as ``other``), the
profiler's own table and the Chrome trace as artifacts.

No CUPTI counters are used (they conflict with DCGM on the same node): only the
default activity tracing of ``torch.profiler``. After a window that traces CUDA time
CUPTI stays attached to the process (Kineto's default) and later steps are slower: +10 %
GPU-bound, +26 % launch-bound on an H200 (``docs/benchmarks.md``). Detaching it
(``TEARDOWN_CUPTI=1``) removes that but hung such a job on torch 2.11, so a process with
that setting is not profiled (``unavailable_reason``). A memory-only window
(``cuda_time`` false; scheduled windows by default) never starts Kineto and leaves
nothing behind (``open_profiler``).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import threading
import time
from typing import Any, Callable, Optional

from oomsight.config import ProfilerSettings
from oomsight.hook.errors import ErrorBook
from oomsight.wire.requests import ProfileRequest, pending_requests
from oomsight.wire.schema import KIND_PROFILE, SCHEMA_VERSION, ProcessInfo, Profile, ProfileOp
from oomsight.wire.spool import PROFILES, SpoolWriter, write_atomic

logger = logging.getLogger(__name__)

TOP_K = 10
TABLE_ROWS = 40
TEARDOWN_CUPTI = "TEARDOWN_CUPTI"
"""Kineto's switch, read when a trace stops: "1" calls cuptiFinalize, which detaches CUPTI."""


class Profiler:
    """Runs at most one profiling window at a time inside a process."""

    def __init__(
        self,
        torch: Any,
        writer: SpoolWriter,
        process: ProcessInfo,
        errors: ErrorBook,
        settings: Optional[ProfilerSettings] = None,
    ) -> None:
        self.torch = torch
        self.writer = writer
        self.process = process
        self.errors = errors
        self.settings = settings or ProfilerSettings()
        """When scheduled windows open, how many steps they last, whether they trace CUDA time."""
        self._last_scheduled = time.time()
        self.mark_peak: Callable[[], None] = lambda: None
        self.read_peak: Callable[[], tuple[int, int]] = lambda: (-1, 0)
        """Set by the hook: start tracking / read (device, peak allocated bytes) since the mark."""
        self.handled: set[str] = set()
        self.plan: Optional[ProfileRequest] = None
        """Set by the sampler thread when a request arrives; read by the step hook."""
        self.running: Optional[ProfileRequest] = None
        self.finishing: Optional[ProfileRequest] = None
        """Stopped, its results being built in a background thread."""
        self._prof: Any = None
        self._began_step = 0
        self._began_at = 0.0
        self.last: Optional[Profile] = None

    @property
    def unavailable(self) -> Optional[str]:
        """Why no window may open in this process now (None: they may)."""
        return unavailable_reason()

    @property
    def active_id(self) -> Optional[str]:
        req = self.running or self.finishing or self.plan
        return req.id if req else None

    def poll(self, spool_dir: str) -> None:
        """Sampler thread: pick up one new request (no-op while one is planned or running)."""
        if self.plan is not None or self.running is not None or self.finishing is not None:
            return
        refused = self.unavailable
        for req in pending_requests(spool_dir, self.process["started_at"], self.handled):
            self.handled.add(req.id)
            if refused is not None:
                self.errors.record("profiler", RuntimeError(f"profile request {req.id} refused: {refused}"))
                continue
            self.plan = req
            return
        if refused is not None:
            return
        now = time.time()
        s = self.settings
        if s.every_seconds and now - self._last_scheduled >= s.every_seconds:
            self._last_scheduled = now
            self.plan = ProfileRequest(f"scheduled-{int(now)}", s.steps, 0, now, s.scheduled_cuda_time)

    def on_step(self, step: int) -> None:
        """Step hook, after optimizer step number ``step`` completed."""
        if self.running is not None:
            if step - self._began_step >= self.running.steps:
                self._stop(step)
        elif self.plan is not None and step >= self.plan.start_step:
            self.running, self.plan = self.plan, None
            self._start(step)

    def _start(self, step: int) -> None:
        assert self.running is not None
        self._prof = open_profiler(self.torch, self.running.cuda_time)
        self._prof.__enter__()
        self._began_step, self._began_at = step, time.time()
        self.mark_peak()  # the sampler tracks the window's peak: torch's own peak is never reset

    def _stop(self, step: int) -> None:
        req, prof = self.running, self._prof
        assert req is not None
        self.running, self._prof, self.finishing = None, None, req
        device, peak = self.read_peak()
        try:
            prof.__exit__(None, None, None)
        except Exception as exc:
            self.finishing = None
            self.errors.record("profiler", exc)
            return
        window = (req, self._began_step, self._began_at, time.time(), peak, device)
        threading.Thread(target=self._finish, args=(prof, window), name="oomsight-profile", daemon=True).start()

    def _finish(self, prof: Any, window: tuple[ProfileRequest, int, float, float, int, int]) -> None:
        req, began_step, began_at, ended_at, peak, device = window
        try:
            avgs = prof.key_averages()  # the slow part: once for the document and the table
            doc = build_profile(avgs, self.process, req, began_step, began_at, ended_at, peak, device)
            doc["table_artifact"], doc["trace_artifact"] = self._artifacts(prof, avgs, req)
            path = os.path.join(self.writer.root, PROFILES, f"{self.process['id']}.profile-{req.id}.json")
            write_atomic(path, json.dumps(doc).encode(), durable=False)
            self.last = doc
        except Exception as exc:
            self.errors.record("profiler", exc)
        finally:
            self.finishing = None

    def _artifacts(self, prof: Any, avgs: Any, req: ProfileRequest) -> tuple[Optional[str], Optional[str]]:
        stem = f"{self.process['id']}.profile-{req.id}"
        folder = os.path.dirname(self.writer.artifact_path(0, "x"))
        table = os.path.join(folder, stem + ".txt")
        if not req.cuda_time and self.torch.cuda.is_available():
            for avg in avgs:  # the table shows device memory columns only for events of a device
                avg.use_device = "cuda"
        with open(table, "w", encoding="utf-8") as fh:
            fh.write(avgs.table(sort_by=_memory_sort_key(avgs), row_limit=TABLE_ROWS))
        trace = os.path.join(folder, stem + ".trace.json")
        prof.export_chrome_trace(trace)
        with open(trace, "rb") as src, gzip.open(trace + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.unlink(trace)
        return os.path.basename(table), os.path.basename(trace + ".gz")


def open_profiler(torch: Any, cuda_time: bool) -> Any:
    """The profiler of one window (not yet entered).

    With CUDA time: ``torch.profiler`` (Kineto) tracing CPU and CUDA activity. Kineto
    attaches CUPTI, which stays attached after the window. Memory-only: the autograd
    profiler without Kineto (``torch.autograd.profiler_legacy``), which records the same
    allocator events per operator and never initialises Kineto, hence never CUPTI; a
    Kineto profile of CPU activity alone would still attach CUPTI on a CUDA build.
    """
    if not cuda_time:
        legacy = getattr(getattr(torch, "autograd", None), "profiler_legacy", None)
        if legacy is not None:
            return legacy.profile(profile_memory=True, record_shapes=True, with_stack=True)
    prof = torch.profiler
    activities = [prof.ProfilerActivity.CPU]
    if cuda_time and torch.cuda.is_available():
        activities.append(prof.ProfilerActivity.CUDA)
    return prof.profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True)


def unavailable_reason(environ: Any = os.environ) -> Optional[str]:
    """Why this process must not open a profiling window, or None when it may.

    With Kineto's ``TEARDOWN_CUPTI=1`` CUPTI is detached after every trace. On torch
    2.11 (CUDA 13.0, H200) a job that had an oomsight window under it then hung: in its
    next profiler session (blocked in ``prepare_trace``) or at exit
    (``benchmarks/results/cupti-teardown-h200.log``). Hanging the job is worse than the
    slower steps that an attached CUPTI costs, so oomsight stays out of such a process.
    """
    if environ.get(TEARDOWN_CUPTI) == "1":
        return (
            f"{TEARDOWN_CUPTI}=1 is set: a job profiled with it hung at its next profiler "
            "session or at exit on torch 2.11; oomsight does not profile this process (docs/benchmarks.md)"
        )
    return None


def _attr(avg: Any, *names: str) -> float:
    for name in names:
        value = getattr(avg, name, None)
        if value is not None:
            return float(value)
    return 0.0


def op_row(avg: Any) -> ProfileOp:
    """One operator of ``key_averages()`` (torch >= 2.4 says "device", older "cuda")."""
    return ProfileOp(
        op=str(avg.key),
        calls=int(avg.count),
        self_cuda_memory_bytes=int(_attr(avg, "self_device_memory_usage", "self_cuda_memory_usage")),
        self_cuda_time_us=_attr(avg, "self_device_time_total", "self_cuda_time_total"),
        cuda_time_us=_attr(avg, "device_time_total", "cuda_time_total"),
        cpu_time_us=_attr(avg, "cpu_time_total"),
    )


def top_k(rows: list[ProfileOp], key: str, k: int = TOP_K) -> list[ProfileOp]:
    """The k rows with the largest ``key``, then one ``other`` row summing the rest."""
    ranked = sorted(rows, key=lambda r: r[key], reverse=True)  # type: ignore[literal-required]
    head, tail = ranked[:k], ranked[k:]
    if tail:
        head.append(
            ProfileOp(
                op="other",
                calls=sum(r["calls"] for r in tail),
                self_cuda_memory_bytes=sum(r["self_cuda_memory_bytes"] for r in tail),
                self_cuda_time_us=sum(r["self_cuda_time_us"] for r in tail),
                cuda_time_us=sum(r["cuda_time_us"] for r in tail),
                cpu_time_us=sum(r["cpu_time_us"] for r in tail),
            )
        )
    return head


def build_profile(
    avgs: Any,
    process: ProcessInfo,
    req: ProfileRequest,
    began_step: int,
    began_at: float,
    ended_at: float,
    peak: int,
    device: int,
) -> Profile:
    rows = [op_row(avg) for avg in avgs]
    return Profile(
        schema_version=SCHEMA_VERSION,
        kind=KIND_PROFILE,
        process=process,
        request_id=req.id,
        start_step=began_step,
        steps=req.steps,
        started_at=began_at,
        ended_at=ended_at,
        device=device,
        peak_allocated_bytes=peak,
        top_by_memory=top_k(rows, "self_cuda_memory_bytes"),
        top_by_time=top_k(rows, "self_cuda_time_us") if req.cuda_time else [],  # not measured: not reported
        cuda_time=req.cuda_time,
        table_artifact=None,
        trace_artifact=None,
    )


def _memory_sort_key(avgs: Any) -> str:
    """The profiler's own sort key for self device memory (``self_device_memory_usage`` from torch 2.4)."""
    modern = bool(avgs) and hasattr(avgs[0], "self_device_memory_usage")
    return "self_device_memory_usage" if modern else "self_cuda_memory_usage"
