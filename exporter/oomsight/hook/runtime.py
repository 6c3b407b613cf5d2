"""The in-process hook: wires the sampler, the step tracker and the OOM recorder
together and owns their lifecycle.

``start()`` is idempotent (a second call warns once) and never raises: a missing
torch, no CUDA, an old torch or a bad setting each give one log line and a hook
that does nothing. Work that needs CUDA waits until the program itself
initialises CUDA (``torch.cuda._lazy_call``): oomsight never creates a context.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys
import threading
import time
from types import TracebackType
from typing import Any, Optional

from oomsight.analysis import thresholds as th
from oomsight.analysis import trend
from oomsight.analysis.diagnosis import leak_growth
from oomsight.config import ConfigError, Settings
from oomsight.hook import census
from oomsight.hook.cuda import CudaApi, TorchCuda, expandable_segments_enabled
from oomsight.hook.errors import ErrorBook
from oomsight.hook.forwards import ForwardMemory
from oomsight.hook.identity import describe_process
from oomsight.hook.jobsetup import JobProbe, dominant_dtype
from oomsight.hook.leakscan import bounded, scan, with_census
from oomsight.hook.leakscan import message as leak_message
from oomsight.hook.nvml import Nvml
from oomsight.hook.oom import OomContext, OomRecorder, is_oom, unwatch_raised, watch_raised
from oomsight.hook.prediction import EXPECTED, from_setting, from_value
from oomsight.hook.profiler import Profiler
from oomsight.hook.sampler import Sampler
from oomsight.hook.stepmemory import StepMemory
from oomsight.hook.steps import StepTracker, model_states
from oomsight.wire.schema import BatchAdvice, LeakFinding, PeakPrediction
from oomsight.wire.spool import SpoolWriter

LEAK_SCAN_INTERVAL_SECONDS = 300.0
LEAK_CENSUS_BUDGET = census.Budget(seconds=0.5, objects=2_000_000)
"""At most one scan for graph-holding tensors per five minutes (gc.get_objects() is not free)."""

logger = logging.getLogger(__name__)


class Hook:
    """One per process. Build with :func:`start`, or directly in tests with fakes.

    It holds the whole :class:`Settings` and gives each component only its own group."""

    def __init__(self, settings: Settings, cuda: CudaApi, nvml: Optional[Nvml], torch: Any = None) -> None:
        self.settings = settings
        self.cuda = cuda
        self.torch = torch
        self.pid = os.getpid()
        self.errors = nvml.errors if nvml is not None else ErrorBook()
        """One book for every error the hook swallows (NVML's included): oomsight_hook_errors_total."""
        torch_version, cuda_version = cuda.versions()
        self.process = describe_process(
            torch_version, cuda_version, self._guarded("backend", cuda.backend, "native"), expandable_segments_enabled()
        )
        self.writer = SpoolWriter(settings.spool.dir, self.process["id"])
        self.sampler = Sampler(settings.sampling, cuda, nvml, self.writer, self.process, self.errors)
        self.steps: Optional[StepTracker] = None
        if settings.steps.hook:
            self.steps = StepTracker(settings.steps, cuda, self.errors)
            self.steps.peak_devices = lambda: list(self.sampler.devices)
        self.step_memory = StepMemory(cuda, self.sampler, self.errors)
        self.forwards = ForwardMemory(cuda, self.sampler, self.errors, steps=self._steps)
        self.step_memory.held.steps = self.steps  # wire 1.10: the state held at each row, and the input
        self.step_memory.inputs = self.forwards.take_input
        self.job = JobProbe(cuda, self.errors, self.process["expandable_segments"])
        self.oom = OomRecorder(
            settings.oom, cuda, self.writer, self.sampler, self.steps, self.errors, context=_Context(self), torch=torch
        )
        self.profiler: Optional[Profiler] = None
        if torch is not None and self.steps is not None:
            self.profiler = Profiler(torch, self.writer, self.process, self.errors, settings.profiler)
            self.profiler.mark_peak, self.profiler.read_peak = self.sampler.mark_peak, self.sampler.read_peak
        self.sampler.before_publish = self._before_publish
        self.sampler.extra = self._extra
        self.sources = {
            "oom_observer": False,
            "step_hook": False,
            "history": False,
            "profiler": False,  # windows can open: the step hook runs and nothing forbade them at start
        }
        self.uncaught: Optional[BaseException] = None
        self._watching: Optional[int] = None
        """The ``sys.monitoring`` tool id watching raised OOMs, where no observer could be attached."""
        self.leak: Optional[LeakFinding] = None
        self.batch_advice: Optional[BatchAdvice] = None
        self.prediction: Optional[PeakPrediction] = None
        """The job's predicted peak (OOMSIGHT_PREDICTION or oomsight.record_prediction)."""
        if settings.prediction.source:
            hint = f"OOMSIGHT_PREDICTION takes {EXPECTED}"
            self.prediction = self._guarded("prediction", lambda: from_setting(settings.prediction.source), None, hint)
        self._leak_due: Optional[int] = None  # growth that asks for a scan at the next step
        self._leak_device = 0
        self._last_leak_scan = -LEAK_SCAN_INTERVAL_SECONDS
        self._cuda_ready = False
        self._stopped = False

    def _guarded(self, component: str, fn: Any, default: Any, hint: str = "") -> Any:
        """``fn()``, or ``default`` with the error counted and logged once (the hook's one error path)."""
        with self.errors.guard(component, hint):
            return fn()
        return default

    def record_prediction(self, value: Any, **details: Any) -> bool:
        """Publish ``value`` (see :func:`oomsight.hook.prediction.from_value`) as the job's predicted
        peak; a value it cannot use is recorded as an error of ``prediction``, never raised."""
        found = self._guarded("prediction", lambda: from_value(value, **details), None, f"it takes {EXPECTED}")
        if found is None:
            return False
        self.prediction = found
        self.sampler.publish_soon()
        return True

    def _predictions(self) -> dict[int, PeakPrediction]:
        """The prediction on the process's own device: its current device at CUDA init, else its first."""
        devices = self.sampler.devices
        if self.prediction is None or not devices:
            return {}
        main = self.sampler.main_device
        return {main if main in devices else min(devices): self.prediction}

    def start(self) -> None:
        try:
            self.writer.prepare()
        except OSError as exc:
            self.errors.record("spool_write", exc, f"check that {self.settings.spool.dir} is writable")
        if self.steps is not None and self.torch is not None:
            try:
                self.sources["step_hook"] = self.steps.register(self.torch)
                self.steps.on_step = self._on_step
            except Exception as exc:
                self.errors.record("step_hook", exc)
        p = self.profiler  # a TEARDOWN_CUPTI set later is still refused, in Profiler.poll
        refused = p.unavailable if p is not None else None
        self.sources["profiler"] = self.sources["step_hook"] and p is not None and refused is None
        if refused is not None:
            logger.warning("oomsight: no profiling windows in this process: %s", refused)
        elif self.settings.profiler.every_seconds and self.settings.profiler.scheduled_cuda_time:
            logger.warning(
                "oomsight: scheduled profiling windows trace CUDA time: after the first one the job stays "
                "slower until it ends (Kineto keeps CUPTI attached; +10 % to +26 % on an H200, docs/profiling.md)"
            )
        if not self._guarded("cuda_init", lambda: self.cuda.on_init(self.on_cuda_init), False):
            # No lazy-init hook in this torch: the sampler thread polls for initialisation.
            self.sampler.start_thread()

    def on_cuda_init(self) -> None:
        """Runs inside torch's CUDA initialisation (or at once if it already happened)."""
        try:
            if self._cuda_ready or self._stopped:
                return
            self._cuda_ready = True
            self.sampler.main_device = self._guarded("cuda_init", self.cuda.current_device, None)
            if self.settings.oom.observer:
                self.sources["oom_observer"] = self.cuda.attach_oom_observer(self.oom.observe)
                if not self.sources["oom_observer"]:  # another allocator back-end: OOMs as they are raised
                    self._watching = watch_raised(self.oom.observe_exception)
                    self.sources["oom_exceptions"] = self._watching is not None
            if self.torch is not None and self.steps is not None:
                self.forwards.arm(self.torch)
            history = self.settings.history
            if history.record:
                self.sources["history"] = self.oom.history = self.cuda.start_history(history.max_entries, history.mode)
            self.sampler.start_thread()
        except Exception as exc:  # an exception here would surface as DeferredCudaCallError
            self.errors.record("cuda_init", exc)

    def _steps(self) -> int:
        return self.steps.count if self.steps is not None else 0

    def _arm_forwards_in_a_pause(self) -> None:
        """Sampler thread: once a training job's optimizer steps pause for ``pile_step_times`` step times
        (at least ``pile_after_steps_seconds``: the bar the diagnosis reads a pile by; a step time is known
        from the second step), an evaluation phase may run: row its forwards (hook.forwards)."""
        steps = self.steps
        if self.torch is None or steps is None or steps.last_step_wall is None or steps.last_duration is None:
            return  # a step time is known from the second step on: before it, no pause can be told
        pause = max(th.value("pile_after_steps_seconds"), th.value("pile_step_times") * steps.last_duration)
        if time.time() - steps.last_step_wall >= pause:
            self.forwards.arm(self.torch)

    def _on_step(self) -> None:
        """After every optimizer step (inside the step hook's error guard): cheap checks only."""
        if self.oom.pending:
            self.oom.on_step()
        steps = self.steps
        if steps is not None:
            self.step_memory.on_step(steps.count)
            if self.torch is not None and self.job.due(steps.count):
                self.job.on_step(self.torch, steps.count, steps.optimizers, dominant_dtype(steps.param_dtypes))
                if self.job.roots:
                    steps.set_roots(self.job.roots)
                    self.job.roots = []
        if self._leak_due is not None:
            self._scan_leak()
        p = self.profiler
        if p is not None and (p.plan is not None or p.running is not None) and self.steps is not None:
            p.on_step(self.steps.count)

    def _check_leak(self) -> None:
        """Sampler thread, before each publish: schedule a leak scan when the floor rises."""
        if self.torch is None or time.time() - self._last_leak_scan < LEAK_SCAN_INTERVAL_SECONDS:
            return
        for dev in list(self.sampler.devices.values()):
            capacity = dev.limit or dev.total or 1
            t = self.step_memory.judged(dev.index, capacity)
            if t is not None:
                growth = t.floor_growth_bytes if t.leak else None
            else:
                growth = leak_growth(list(dev.trend), capacity)
            if growth is not None:
                self._leak_due, self._leak_device = growth, dev.index
                return

    def _scan_leak(self) -> None:
        growth, self._leak_due = self._leak_due, None
        self._last_leak_scan = time.time()
        sites = self.cuda.allocation_sites if self.oom.history else (lambda ptrs: {})
        found = scan(self.torch, self.steps.count if self.steps else 0, growth, sites)
        # what holds the rise, read from the job's objects (a quarter of the OOM census's time, at most once
        # every LEAK_SCAN_INTERVAL_SECONDS); a census that fails leaves the scan as it was
        taken = self.oom.take_census(self._leak_device, LEAK_CENSUS_BUDGET)
        self.leak = with_census(found, taken)
        logger.warning("%s", leak_message(self.leak))

    def _before_publish(self) -> None:
        if self.oom.unwritten_events:
            self.oom.retry_unwritten()
        if self.profiler is not None:
            self.profiler.poll(self.settings.spool.dir)
        self._guarded("forward_memory", self._arm_forwards_in_a_pause, None)
        self._check_leak()

    def _extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {
            "sources": dict(self.sources),
            "oom_events_unwritten": self.oom.unwritten_total,
            "job": self.job_setup(),
            **self._judged_steps(),
            "profiling": self.profiler.active_id if self.profiler else None,
            "leak": self.leak,
            "batch_advice": self.batch_advice,
            "predictions": self._predictions(),
        }
        if self.steps is not None:
            extra.update(
                steps=self.steps.info(),
                categories=self.steps.categories,
                layout_states=self.steps.layout_states,
                step_peaks=self.steps.step_peaks,
            )
        return extra

    def job_setup(self) -> Optional[dict[str, Any]]:
        """The job's setup: what the job probe saw, and the layout of the last walk (the parallelism
        in use, adapters); None for a process without the step hook."""
        if self.steps is None:
            return None
        setup = self.job.snapshot()
        found = self.steps.layout
        if found is not None:
            setup.update(parallelism=found.parallelism, adapters=found.adapters)
        return setup

    def _judged_steps(self) -> dict[str, dict[int, Any]]:
        """Each device's verdict on its step rows and its last row (the snapshot's ``step_trend``
        and ``steps_memory``): the sidecar reads the verdict instead of judging 256 rows a scrape;
        with no optimizer step, the rise its forward rows show (``forward_pile_bytes``, wire 1.7)."""
        verdicts, last, piles = {}, {}, {}
        for dev in list(self.sampler.devices.values()):
            t = self.step_memory.judged(dev.index, dev.limit or dev.total or 1)
            if t is not None:
                verdicts[dev.index] = trend.verdict(t)
                if t.leak and bounded(self.leak, t.floor_growth_bytes):  # the census saw a buffer with a cap fill
                    verdicts[dev.index]["leak"] = False
                last[dev.index] = self.step_memory.last(dev.index)
            pile = self.forwards.pile(dev.index, dev.limit or dev.total or 1)
            if pile:
                piles[dev.index] = pile
        return {"step_trend": verdicts, "steps_memory": last, "forward_piles": piles}

    def stop(self, reason: str = "stopped") -> None:
        """Stop sampling and write the final snapshot (state ``exited``)."""
        if self._stopped or os.getpid() != self.pid:
            return  # already stopped, or a forked child that inherited our atexit handler
        self._stopped = True
        self.oom.at_exit(self.uncaught if reason != "stopped" else None)
        self.oom.active = False
        if self._watching is not None:
            self._guarded("oom_exceptions", lambda: unwatch_raised(self._watching or 0), None)
            self._watching = None
        if self.steps is not None:
            self._guarded("step_hook", self.steps.unregister, None)
        self._guarded("forward_memory", self.forwards.close, None)
        self._guarded("job_probe", self.job.stop, None)
        self.sampler.stop_thread()
        if self.oom.history:
            self._guarded("history", self.cuda.stop_history, None)
        self.sampler.state = "exited"
        self.sampler.exit_reason = reason
        if self.sampler.devices:
            self.sampler.refresh()
            self.sampler.publish()

    def on_uncaught(self, exc: BaseException) -> None:
        """An exception ends the process: an OOM the allocator's observer could not see (another
        allocator back-end) is recorded from the exception itself, while its frames still hold the
        step's tensors."""
        self.uncaught = exc
        if not self.sources.get("oom_observer") and is_oom(exc):
            self.oom.observe_exception(exc)

    def at_exit(self) -> None:
        if self.uncaught is None:
            self.stop("normal")
        elif is_oom(self.uncaught):
            self.stop("oom")
        else:
            self.stop("exception")


class _Context(OomContext):
    """The OOM recorder's view of the rest of the hook."""

    def __init__(self, hook: Hook) -> None:
        self.hook = hook

    def steps_memory(self, device: int) -> list[list[float]]:
        return self.hook.step_memory.series(device)

    def forwards_memory(self, device: int) -> list[list[float]]:
        return self.hook.forwards.series(device)

    def backwards_memory(self, device: int) -> list[list[float]]:
        return self.hook.forwards.backwards(device)

    def consumption(self) -> dict[str, Optional[int]]:
        return self.hook.forwards.consumption()

    def job(self) -> Optional[dict[str, Any]]:
        return self.hook.job_setup()

    def model_states(self, device: int) -> Optional[dict[str, Any]]:
        steps, torch = self.hook.steps, self.hook.torch
        if steps is None or torch is None:
            return None
        return model_states(steps.optimizers, steps.roots, torch, device, gc, steps.device_type, steps.walked_at_oom)


def _safe(fn: Any, default: Any) -> Any:
    try:
        return fn()
    except Exception:
        return default


# ------------------------------------------------------------------ module API
_lock = threading.Lock()
_hook: Optional[Hook] = None
_warned_twice = False
_pending_prediction: Optional[PeakPrediction] = None


def start(**overrides: Any) -> bool:
    """Start oomsight in this process; keyword arguments override ``OOMSIGHT_*`` settings.

    Returns True when the hook runs. Never raises.
    """
    global _hook, _warned_twice
    with _lock:
        if _hook is not None:
            if not _warned_twice:
                _warned_twice = True
                logger.warning("oomsight: start() called again; the hook is already running")
            return True
        try:
            _hook = _build(overrides)
        except Exception as exc:
            logger.warning("oomsight: not started: unexpected %s: %s", type(exc).__name__, exc)
            _hook = None
        return _hook is not None


def _build(overrides: dict[str, Any]) -> Optional[Hook]:
    try:
        settings = Settings.from_env().replace(**overrides)
    except ConfigError as exc:
        logger.error("oomsight: not started: %s", exc)
        return None
    if settings.disabled:
        logger.info("oomsight: disabled by OOMSIGHT_DISABLED")
        return None
    try:
        import torch
    except ImportError:
        logger.warning("oomsight: idle: torch is not importable in this Python")
        return None
    cuda = TorchCuda(torch)
    reason = _safe(cuda.unavailable_reason, "torch.cuda could not be queried")
    if reason:
        logger.warning("oomsight: idle: %s", reason)
        return None
    hook = Hook(settings, cuda, Nvml() if settings.nvml.enabled else None, torch)
    if _pending_prediction is not None:
        hook.prediction = _pending_prediction  # given to oomsight.record_prediction() before start()
    hook.start()
    atexit.register(hook.at_exit)
    _chain_excepthook(hook)
    return hook


def _chain_excepthook(hook: Hook) -> None:
    previous = sys.excepthook

    def excepthook(tp: type[BaseException], value: BaseException, tb: Optional[TracebackType]) -> None:
        hook.on_uncaught(value)
        previous(tp, value, tb)

    sys.excepthook = excepthook


def stop() -> None:
    """Stop sampling and write the final snapshot. Safe to call when not started."""
    global _hook
    with _lock:
        hook, _hook = _hook, None
    if hook is not None:
        try:
            hook.stop()
        except Exception as exc:
            logger.warning("oomsight: stop failed: %s", exc)


def record_prediction(value: Any, **details: Any) -> bool:
    """The running hook's :meth:`Hook.record_prediction`; before ``start()`` the prediction is
    checked now and kept for the hook that starts later. Never raises."""
    global _pending_prediction
    hook = _hook
    if hook is not None:
        return hook.record_prediction(value, **details)
    try:
        _pending_prediction = from_value(value, **details)
    except Exception as exc:
        logger.warning("oomsight: prediction not recorded (%s: %s); it takes %s", type(exc).__name__, exc, EXPECTED)
        return False
    return True


def current() -> Optional[Hook]:
    """The running hook, if any (for tests and the report)."""
    return _hook


def _after_fork_in_child() -> None:
    global _hook
    _hook = None  # threads do not survive fork; a forked worker must not write as its parent


os.register_at_fork(after_in_child=_after_fork_in_child)
