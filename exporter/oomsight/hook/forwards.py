"""Forward-resolved memory where no optimizer step comes (evaluation, inference, a training job
before its first step, and a training job's pause: a validation phase): memory allocated right
after each forward of the outermost model that recorded an autograd graph, and as it began.

Such a forward keeps its activations for as long as its output lives. An evaluation loop that
forgets ``torch.no_grad()`` and keeps the outputs (``preds.append(model(x))``) keeps a whole graph
per batch: the memory after each forward then rises by the same amount, forward after forward, and
can fill the GPU within a second, faster than the sampler reads. The step rows cannot see it (no
optimizer steps); these rows can, at any speed (``analysis.trend.forward_pile``). A loop whose input
grows (batches sorted by length, a longer sequence each time) raises the memory after each forward
too, but not the memory each forward begins with: what earlier forwards left alive. So a rowed forward
is read as it begins as well (a forward pre-hook on the model, the same raw call).

So can a training step that keeps its graphs until one backward: losses summed over micro-batches,
a REINFORCE episode, truncated BPTT. The rows cannot tell the two apart; what the job itself does
can. For the whole life of the process the hook watches what its backwards consume: each forward
that records a graph (the 1st, 2nd, 4th... since the last consumption) puts a pre-hook on its
output's ``grad_fn`` (1.5 µs), which fires when a backward runs through it. ``pending`` counts the
forwards recording a graph since a backward last consumed one, ``most_consumed`` the most forwards
whose graphs one backward consumed (None: no backward ever did). A pile is a leak only beyond what
this job's own backwards have consumed (``analysis.trend.unconsumed``): the OOM event carries both
numbers (wire 1.8) and the live flag obeys the same rule.

How the model is found without a global module hook on every call: at CUDA's initialisation one
global forward pre-hook is registered; the first module with state on the device called after it
with autograd recording (eagerly, not while ``torch.compile`` traces) is the outermost model of
that call (under ``no_grad`` nothing is rowed, so an inference process never hooks its model).
The pre-hook then removes itself and a forward hook (and a pre-hook) are registered on that module
alone. The forward hook counts the forward, watches its output's consumption, and while no
optimizer step has come since the arming and autograd records, reads the allocator (one raw
call, ~20 µs on an H200; the pre-hook as well, as such a forward begins, from the second forward on)
at most every ``min_interval_seconds``. An optimizer step ends the rows (training has its step rows), not the
hook; after ``IDLE_FORWARDS`` forwards in a row without autograd in a process that never stepped
nor ran a backward through the model (inference) the hook removes itself. Once a training job's
steps pause (``pile_step_times`` step times, ``pile_after_steps_seconds`` at least: the runtime
looks at each publish) the rows are armed again, once per pause, with the rows of before dropped.
It costs about 3 µs a forward on a CPU core, 0.85 µs of which torch spends on calling any forward
hook (``benchmarks/bench_forward_hook.py``); ``overhead-eval.json`` measures the whole of oomsight
on an evaluation loop on the H200.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Optional

from oomsight.analysis import trend
from oomsight.hook.cuda import CudaApi
from oomsight.hook.errors import ErrorBook
from oomsight.hook.sampler import Sampler
from oomsight.hook.stepmemory import RowBook, RowTaker

MAX_ROWS = 128
FIND_CALLS = 4096
"""Module calls the finding pre-hook looks at before it gives up (a program whose modules never hold
state on the device pays for no global hook after these)."""
IDLE_FORWARDS = 64
"""Forwards in a row without autograd recording after which the hook removes itself: an inference
process under ``no_grad``/``inference_mode`` has nothing to row and pays for no hook after these."""
BACKWARD_ROWS = 64
"""Rows kept of the memory after each backward since the last optimizer step (the latest)."""
MIN_INTERVAL_SECONDS = 0.01
"""At most 100 reads a second: 0.2 % of the thread's time at 20 µs a read, in the worst case of
forwards faster than that."""


class ForwardMemory(RowTaker):
    def __init__(
        self,
        cuda: CudaApi,
        sampler: Sampler,
        errors: ErrorBook,
        steps: Callable[[], int],
        min_interval_seconds: float = MIN_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.perf_counter,
        wall: Callable[[], float] = time.time,
    ) -> None:
        book = RowBook(MAX_ROWS)
        super().__init__(cuda, sampler, errors, book, min_interval_seconds=min_interval_seconds, clock=clock, wall=wall)
        self.steps = steps
        """Optimizer steps so far: one since the arming ends the rows."""
        self.count = 0
        """Forwards of the outermost model seen (read or not)."""
        self.pending = 0
        """Forwards of the model that recorded a graph since a backward last consumed one."""
        self.most_consumed: Optional[int] = None
        self.least_consumed: Optional[int] = None
        """The fewest forwards one backward consumed (each backward's count once it ends; wire 1.11): equal to
        ``most_consumed`` where the job's windows are fixed (micro-batches, crops), less where they vary (episodes)."""
        """The most forwards whose graphs one backward consumed; None: no backward ever ran through one."""
        self.training: Optional[bool] = None
        """The model's training flag at its last forward (``model.eval()`` makes it False)."""
        self.root_name: Optional[str] = None
        self.device_type = "cuda"
        """The device type of the model to find (tests find a CPU one)."""
        self._torch: Any = None
        self._finder: Any = None
        self._root: Any = None
        self._idle = 0
        self._looked = 0
        self._armed_steps: Optional[int] = None
        self._task: Any = None
        self._engine: Optional[tuple[Any, ...]] = None
        """(torch, its graph task id call, its engine's callback queue), looked up at the first consumption."""
        self._window = 0
        """The forwards pending when the running backward began."""
        self._run = 0
        self._beyond = 0.0
        """The pending forwards beyond which they are more than the job's backwards consume."""
        self._forwarded = True
        """A forward came since the last consumption (without graph task ids: a new backward next)."""
        self._began: tuple[int, Optional[dict[int, int]]] = (-1, None)
        """The forward (its number) whose pre-hook ran last, and the bytes allocated as it began, by
        device (None: it is not read, as the interval or no rows decide)."""
        self.input_max = -1
        """The most elements one forward recording a graph took in since the last step row took it."""
        self._backwards: dict[int, list[list[float]]] = {}
        """Per device: rows [backward, time, allocated] since the last optimizer step (wire 1.10)."""
        self._backward_steps = -1
        self._backward_count = 0
        self._backward_read = -float("inf")
        self._lock = threading.Lock()

    def take_input(self) -> int:
        """The most elements one forward took in since the last call (-1: none seen), for a step row."""
        found, self.input_max = self.input_max, -1
        return found

    def backwards(self, index: int) -> list[list[float]]:
        """The device's rows after each backward since the last optimizer step, oldest first (copies)."""
        if self.steps() != self._backward_steps:
            return []
        return [list(r) for r in list(self._backwards.get(index, []))]

    def stepped(self) -> bool:
        """An optimizer step came since the arming (then the rows are done)."""
        return self._armed_steps is None or self.steps() != self._armed_steps

    def arm(self, torch: Any) -> bool:
        """Start the rows: at CUDA's initialisation, and again (from the sampler thread) once a training
        job's steps pause (an evaluation phase), at most once per step count. Rows of an earlier arming
        are dropped. Until the model is found, one global pre-hook looks for it."""
        with self._lock:
            steps = self.steps()
            if steps == self._armed_steps or (self._finder is not None):
                return False
            self._torch = torch
            self._armed_steps = steps
            self.book = RowBook(MAX_ROWS)
            self._idle = 0
            self._last_read = -float("inf")
            if self._root is None:
                self._looked = 0
                self._finder = torch.nn.modules.module.register_module_forward_pre_hook(self._find)
            return True

    def _start_rows(self) -> None:
        """Row the forwards from now on, as an arming does: their graphs pile beyond what the job's
        backwards have consumed together (an evaluation that forgets no_grad right after the last
        step, faster than the pause bar), so the rows must show whether their memory piles too."""
        with self._lock:
            self._armed_steps = self.steps()
            self.book = RowBook(MAX_ROWS)
            self._last_read = -float("inf")

    def close(self) -> None:
        """Remove every hook; the rows stay for an OOM to report."""
        self._stop_finding()
        with self._lock:
            root, self._root = self._root, None
        for handle in root or ():
            handle.remove()

    def _stop_finding(self) -> None:
        with self._lock:
            finder, self._finder = self._finder, None
        if finder is not None:
            finder.remove()

    def _find(self, module: Any, _args: Any) -> None:
        try:
            compiler = getattr(self._torch, "compiler", None)
            if compiler is not None and compiler.is_compiling():
                return  # traced into a compiled graph: never act there
            self._looked += 1
            if self._root is not None or self.stepped() or self._looked > FIND_CALLS:
                self._stop_finding()
                return
            if not self.cuda.grad_enabled():
                return  # nothing to row: under no_grad the model gets no hook (inference, export)
            state = next(module.parameters(), None)
            if state is None:
                state = next(module.buffers(), None)
            if state is None or state.device.type != self.device_type:
                return  # a transform or container without state, or a model elsewhere: not this one
            self._stop_finding()
            self.root_name = type(module).__name__
            handles = (
                module.register_forward_pre_hook(BeforeForward(self, module), with_kwargs=True),
                module.register_forward_hook(AfterForward(self, module)),
            )
            with self._lock:
                self._root = handles
        except Exception as exc:
            self.errors.record("forward_memory", exc)
            self.close()

    def _rowed(self, pending: int) -> bool:
        """Whether a forward that recorded a graph, the ``pending``-th since the last consumption, is
        rowed: no optimizer step since the arming, or beyond what this job's backwards consume."""
        return not self.stepped() or (self.most_consumed is not None and pending > self._beyond)

    def before(self, elements: int = -1) -> None:
        """As a forward of the model begins (its pre-hook, :class:`BeforeForward`): the elements it takes in
        (``elements``), and where it will be rowed (and read), the memory it begins with, which earlier
        forwards left alive."""
        try:
            self._began = (self.count + 1, None)
            if not self.cuda.grad_enabled():
                return
            if elements > self.input_max:
                self.input_max = elements
            if not self._rowed(self.pending + 1):
                return
            if not self._due():
                return  # nor does the forward hook read it
            self._began = (self.count + 1, {i: r.allocated_bytes for i, r in self._reads()})
        except Exception as exc:
            self.errors.record("forward_memory", exc)
            self.close()

    def after(self, output: Any) -> None:
        """After a forward of the model (its hook, :class:`AfterForward`)."""
        try:
            self.count += 1
            if not self.cuda.grad_enabled():
                self._idle += 1
                if self._idle >= IDLE_FORWARDS and self.most_consumed is None and self.steps() == 0:
                    self.close()  # an inference process: nothing to watch
                return
            self._idle = 0
            self.pending += 1
            self._forwarded = True
            if self.pending & (self.pending - 1) == 0:  # the oldest pending forward, and at each doubling
                self._watch(output, self.pending)
            if self.stepped():
                if not self._rowed(self.pending):
                    return  # rows only where no optimizer step came since the arming
                self._start_rows()  # forwards beyond what this job's backwards consume: row them now
            forward, began = self._began
            if forward == self.count:  # its pre-hook ran: it decided, so every row knows its start
                if began is None:
                    return
            elif not self._due():
                return
            self._read()
        except Exception as exc:
            self.errors.record("forward_memory", exc)
            self.close()

    def _watch(self, output: Any, index: int) -> None:
        """Put a pre-hook on the ``grad_fn`` of the forward's output: it fires when a backward consumes
        the forward's graph (a graph never consumed is freed with its hook). Only the 1st, 2nd, 4th,
        8th... forward since the last consumption is watched: a backward that consumes the k-th consumed
        the forwards after it too (their losses were summed after it), so the oldest watched one it
        reaches tells how many it took to within a factor of two, at log2(n) hooks for n forwards."""
        node = _grad_fn(output)
        if node is not None:
            node.register_prehook(Consumed(self, index))

    def consumed(self, index: int) -> None:
        """A backward ran through the ``index``-th forward since the last consumption (autograd's
        thread): it consumed that forward and the ones after it. One backward is one graph task (or,
        where torch has no task ids, the consumptions with no forward between)."""
        try:
            engine = self._engine
            if engine is None or engine[0] is not self._torch:
                self._engine = engine = (self._torch, *_engine_calls(self._torch))
            task = engine[1]() if engine[1] is not None else None
            if task != self._task or (task is None and self._forwarded):
                self._task, self._window, self._run = task, self.pending, 0
                self.pending = 0
                if engine[2] is not None:
                    engine[2](self._after_backward)
            self._forwarded = False
            self._run = max(self._run, self._window - index + 1)
            if self.most_consumed is None or self._run > self.most_consumed:
                self.most_consumed = self._run
                self._beyond = trend.beyond_consumed(self._run)
        except Exception as exc:
            self.errors.record("forward_memory", exc)

    def _after_backward(self) -> None:
        """As a backward that consumed the model's graph ends (autograd's callback): the memory it left,
        for the rows of this accumulation window (a new window after each optimizer step). One allocator
        read, at most every ``min_interval_seconds`` (20-60 us on an H100/H200)."""
        try:
            steps = self.steps()
            if steps != self._backward_steps:
                self._backward_steps, self._backwards = steps, {}
            self._backward_count += 1
            if self._run > 0 and (self.least_consumed is None or self._run < self.least_consumed):
                self.least_consumed = self._run
            now = self.clock()
            if now - self._backward_read < self.min_interval:
                return  # at most every min_interval_seconds, as the forward rows: a steady rise stays steady
            self._backward_read = now
            stamp = round(self.wall(), 3)
            for index, r in self._reads():
                rows = self._backwards.setdefault(index, [])
                rows.append([self._backward_count, stamp, r.allocated_bytes])
                if len(rows) > BACKWARD_ROWS:
                    del rows[0]
        except Exception as exc:
            self.errors.record("forward_memory", exc)

    def consumption(self) -> dict[str, Optional[int]]:
        """What the job's backwards consumed, for an OOM event (wire 1.8), and the most one forward took in since
        the last step row: the failing step's forwards so far (wire 1.10)."""
        return {
            "forwards_since_backward": self.pending,
            "most_forwards_per_backward": self.most_consumed,
            "least_forwards_per_backward": self.least_consumed,
            "input_elements": self.input_max,
        }

    def _reads(self) -> list[tuple[int, Any]]:
        main = self.sampler.main_device  # before the sampler's first tick knows the devices
        return [(i, self.cuda.read(i)) for i in list(self.sampler.devices) or ([main] if main is not None else [])]

    def _read(self) -> None:
        stamp = round(self.wall(), 3)
        forward, began = self._began
        for index, r in self._reads():
            # the forward's own peak is known only where it set a new lifetime peak
            peak = r.peak_allocated_bytes if self.book.new_peak(index, r.peak_allocated_bytes) else -1
            start = began.get(index, -1) if forward == self.count and began is not None else -1
            self.book.append(index, [self.count, stamp, r.allocated_bytes, peak, start])

    def series(self, index: int) -> list[list[float]]:
        """The device's rows ``[forward, time, allocated_bytes, peak_bytes or -1, start_bytes or -1]``
        (start: allocated as the forward began), oldest first; none once an optimizer step came (then
        the step rows tell)."""
        return [] if self.stepped() else self.book.series(index)

    def pile(self, index: int, capacity_bytes: int) -> Optional[int]:
        """The device's rows judged (``trend.forward_pile``, sampler thread): the rise where the memory
        left after each forward climbs as a leak does and the forwards piling go beyond what this job's
        backwards consumed (``trend.unconsumed``), else None; the rows judged again only after a new row."""
        if self.stepped():  # the rows of before a step are stale, whatever was judged of them
            return None
        if not trend.unconsumed(
            self.pending, self.most_consumed, self.steps() > 0, self.training, self.least_consumed
        ):
            return None
        return self.book.judged(index, capacity_bytes, lambda rows: trend.forward_pile(rows, capacity_bytes))


OUTPUT_ITEMS = 8
"""Items of a tuple, list or mapping output looked at for a tensor with a ``grad_fn``."""


def _grad_fn(output: Any) -> Any:
    """The ``grad_fn`` of the forward's output: a tensor, or the first of a few items of a tuple, list
    or mapping (a ``transformers`` ``ModelOutput``) that has one."""
    node = getattr(output, "grad_fn", None)
    if node is not None:
        return node
    items = output.values() if isinstance(output, Mapping) else output if isinstance(output, (tuple, list)) else ()
    for item in itertools.islice(items, OUTPUT_ITEMS):
        node = getattr(item, "grad_fn", None)
        if node is not None:
            return node
    return None


def _engine_calls(torch: Any) -> tuple[Optional[Callable[[], int]], Optional[Callable[[Callable[[], None]], None]]]:
    """torch's running backward's graph task id (torch 2.1+) and the engine's queue of callbacks run as the
    backward ends, looked up once (None where torch has neither)."""
    engine = getattr(getattr(getattr(torch, "autograd", None), "Variable", None), "_execution_engine", None)
    return getattr(getattr(torch, "_C", None), "_current_graph_task_id", None), getattr(engine, "queue_callback", None)


def input_elements(args: Any, kwargs: Any) -> int:
    """The elements of what a forward takes in first: its first positional argument, else its first keyword
    argument (``input_ids``, ``pixel_values``); -1 where that is no tensor. One look: this runs every forward."""
    first = args[0] if args else next(iter(kwargs.values()), None) if kwargs else None
    numel = getattr(first, "numel", None)
    return int(numel()) if numel is not None and hasattr(first, "shape") else -1


class Consumed:
    """The pre-hook on a watched forward's ``grad_fn`` (see :meth:`ForwardMemory.consumed`)."""

    __slots__ = ("index", "memory")

    def __init__(self, memory: ForwardMemory, index: int) -> None:
        self.memory = memory
        self.index = index

    def __call__(self, _grad_outputs: Any) -> None:
        self.memory.consumed(self.index)


class RootHook:
    """A hook on the model (:class:`AfterForward`, :class:`BeforeForward`). It acts for that module only
    and never while ``torch.compile`` or ``torch.export`` traces. A ``copy.deepcopy`` of the model (an
    EMA copy, a teacher) shares it, and it ignores the copy; a pickled model (``torch.save(model)``)
    carries a no-op of the standard library in its place (``Logger.debug`` of a logger of its own), so
    loading needs no oomsight. ``torch.jit.script`` compiles a module's hooks and cannot compile this
    one: its error names ``oomsight_forward_rows``; script a model built or loaded anew (a ``deepcopy``
    shares the hook), or set ``OOMSIGHT_STEP_HOOK=0`` (docs/diagnosis.md)."""

    __name__ = "oomsight_forward_rows"

    def __init__(self, memory: ForwardMemory, root: Any) -> None:
        self.memory = memory
        self.root = weakref.ref(root)
        self._compiling = getattr(getattr(memory._torch, "compiler", None), "is_compiling", None)
        """Looked up once: this runs at every forward."""

    def _ours(self, module: Any) -> bool:
        return module is self.root() and not (self._compiling is not None and self._compiling())

    @property
    def __globals__(self) -> dict[str, Any]:
        """Read by ``torch.jit.script`` alone, compiling the module's hooks: say what to do instead."""
        raise RuntimeError(
            "oomsight_forward_rows: TorchScript cannot compile oomsight's forward hook on this model (it watches "
            "what the backwards consume of each forward's graph); script a model built or loaded anew, or set "
            "OOMSIGHT_STEP_HOOK=0"
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> RootHook:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return getattr, (logging.getLogger("oomsight.dropped_forward_hook"), "debug")


class AfterForward(RootHook):
    """The forward hook on the model: counts the forward, rows it (:meth:`ForwardMemory.after`)."""

    def __call__(self, module: Any, _args: Any, _output: Any) -> None:
        if self._ours(module):
            training = getattr(module, "training", None)
            self.memory.training = training if isinstance(training, bool) else None
            self.memory.after(_output)


class BeforeForward(RootHook):
    """The forward pre-hook on the model: what a forward takes in, the memory a rowed forward begins with."""

    def __call__(self, module: Any, args: Any, kwargs: Any = None) -> None:
        if self._ours(module):
            self.memory.before(input_elements(args, kwargs))
