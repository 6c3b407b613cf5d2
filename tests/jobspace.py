"""A space of training jobs composed from independent axes, each run through the real hook to an OOM,
with the invariants every job must keep (issue 33, item 4).

A job is one value per axis of :data:`AXES` (``valid`` says which combinations torch runs). ``run(job)``
builds it on the CPU with the real torch and the real :class:`~oomsight.hook.runtime.Hook`, over a
fake allocator (:class:`LiveCuda`) whose counters are fed from the truth: the bytes of the storages
alive in this process, tracked as they are made (:class:`Storages`, a dispatch mode). The device is
this process's memory as it is (factor 1: the hook's own walk reads the same tensors' real bytes, so
a scaled allocator would disagree with the model states it measures). The capacity is chosen by a dry
run of the same job without the hook: between the most the warm-up needed and what the failing phase
needs, so the OOM comes where the job's construction puts it: in the escalated step of a training
job (a larger batch, a longer episode or sequence) or of an inference job (a larger batch), in the
evaluation that forgets ``no_grad`` and keeps its outputs, or in a later step of the loop that keeps its
losses with their graphs. The OOM is raised in the forward pre-hook of the leaf module whose output would
cross the capacity, after calling the hook's OOM observer there, as the allocator would.

Pauses are told the way the runtime tells them: the last step's wall time moves back, and the
sampler's own ``publish`` arms the forward rows; every step and every evaluation forward publishes.

Invariants (:func:`violations`), on every job:

``bytes``       the model states the OOM event counts equal the storage truth per category
                (parameters, frozen parameters, gradients, optimizer state, DDP buckets), exactly
``cause``       the cause is one the job's construction allows (``leak`` only for the true leaks: the
                evaluation that keeps its outputs, the loop that keeps its losses with their graphs, the
                window that keeps its micro-batches' outputs; ``growing_demand`` alone for the ramp and
                the MoE's collapsing routing)
``first_remedy`` no remedy that changes the result first on a forward that may train (only the
                evaluation and the inference job train nothing), unless the job's construction shows what it
                changes (``remedies.LEADS_WHEN``): a frozen teacher's weights (a quantised base), the MoE's
                collapsing routing (a capacity), a failing forward run without autograd (its own remedies)
``first_fix``   the shape's fix first: ``bound_input`` for the ramp, ``kept_outputs`` for the kept outputs,
                ``expert_capacity`` for the collapsing routing
``leak_fix``    a leak's diagnosis names its fix (``leak``: keep nothing alive; for kept outputs, or
                ``kept_outputs``) among its first two remedies
``live_flag``   the live leak flags: the forward pile (the snapshot's ``forward_pile_bytes``: forwards
                piling with no backward to consume them) down on every job that piles none, up before the
                OOM of the evaluation that keeps its outputs; the step rows' flag (a device's
                ``step_trend.leak``) never up on a job that keeps nothing, and on one whose buffer fills
                and stays (a replay ring, an epoch's metric, a memory bank) down over its last publishes
``in_use``      no remedy the job already uses (autocast under a bf16 policy, sharding under FSDP,
                checkpointing under checkpoint, ...)

Issue 48, item 5 (:func:`issue48_violations`; the axes' values in :data:`AXES`' docstring):

``first_fix``    the evaluation left in training mode and the rollout that keeps its logits (true leaks, their
                forwards in training mode) name first what keeps nothing alive (``LEAK_FIRST``: ``leak``,
                ``kept_outputs``, ``detach_kept``), never ``no_grad`` unless ``LEADS_WHEN`` allows it on the evidence
                (``first_remedy`` holds for them too: they are not ``trains_nothing``); cause ``leak``, and the live
                flag up before their OOM
``bounded``      a bounded buffer (the MoCo queue, the bank, the replay ring, the epoch's metric) is never told
                ``leak`` ("drop what you keep") first, which changes the method
``kept``         logits kept by a framework (the Trainer-like loop's container) or probabilities kept by a module
                attribute: never ``growing_demand``, never ``bound_input`` first (the input never grew)
``frozen_phase`` a discriminator frozen for the generator's update, held by its optimizer: the failing forward
                never ``module_frozen``, ``frozen_no_grad`` never first (it would cut the generator's gradient)
``no_optimizer`` a generation with no optimizer gets no remedy whose text is about accumulating gradients or
                ``optimizer.step()`` (:data:`NO_OPTIMIZER_CHECKED`)

Not here: worker processes that open CUDA (the hook learns of other processes from NVML's process list, which on
this CPU the fake would have to invent, PIDs and bytes: that tests the fake, not the job; the GPU script's), and
FSDP2's integer ``reshard_after_forward`` (on 2 ranks torch takes 2 for True and 1 for False: the integer case
needs 4 ranks; ``tests/test_accounting.py`` runs it there through the layout).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import io
import itertools
import json
import os
import random
import re
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterator
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

from fakes import FakeCuda

AXES: dict[str, tuple[str, ...]] = {
    "wrapper": (
        "none",
        "ddp",
        "ddp_bucket_view",
        "fsdp1",
        "fsdp2",
        "compile",
        "compile_ddp",
        "ddp_compile",
        "checkpointed",
    ),
    "accumulation": ("single", "each", "summed", "no_sync"),
    "models": ("one", "ema", "teacher", "gan", "gan_frozen"),
    "optimizer": ("adamw_fused", "adamw_foreach", "sgd", "zero", "adam8bit"),
    "precision": ("fp32", "autocast_bf16", "bf16_params", "mixed_policy"),
    "phase": (
        "train",
        "checkpoint_pause",
        "no_grad_validation",
        "eval_leak",
        "inference_only",
        "eval_train_mode",
        "trainer_eval",
        "generate",
    ),
    "shape": (
        "batches",
        "rl",
        "tbptt",
        "growing",
        "loss_history_leak",
        "memory_bank",
        "ramped",
        "kept_outputs",
        "unfreezing",
        "replay_buffer",
        "metric_reset",
        "moe_collapse",
        "actor_critic",
        "moco_queue",
        "attn_attribute",
    ),
}
"""Each axis and its values. ``wrapper``: compile_ddp is torch.compile(DDP(m)), ddp_compile is
DDP(torch.compile(m)) (backend "eager": what is compiled matters to the accounting, not the kernels);
checkpointed runs each Linear+ReLU block under ``torch.utils.checkpoint`` (``use_reentrant=False``), so
the backward recomputes its forwards.
``accumulation``: one micro-batch a step; four, each with its backward; four whose losses are summed
before one backward; four under ``no_sync`` (FSDP2: ``set_requires_gradient_sync``). ``models``: an
EMA copy updated under ``no_grad`` and never called; a frozen teacher run under ``no_grad``; a GAN
pair with two optimizers. ``phase``: the failing step right after the warm-up, after a pause for a
checkpoint save, after a ``no_grad`` validation; or an evaluation that forgets ``no_grad`` and keeps
its outputs (a leak); or an inference job: no optimizer, no backward, forwards that forget ``no_grad``
(the model in eval mode) until a larger batch runs out (here ``no_grad`` may come first: the forward
trains nothing). ``shape``: a micro-batch is a batch, a REINFORCE episode (one forward per step of the
episode, one loss), a truncated-BPTT window of 4 forwards, a sequence that grows step by step, a batch
whose loss the loop keeps in a history with its graph (``backward(retain_graph=True)``: the training
leak, whose fix, ``.item()`` on what is kept, changes nothing computed), or a batch contrasted against a
memory bank of earlier batches' detached embeddings that grows to ``BANK_ROWS`` and then stays (issue 43,
item 3:) or a batch that doubles every 2 steps (``RAMP``), failing at the next doubling; a gradient
accumulation that keeps every micro-batch's output as returned (with its ``grad_fn``, for a metric) until
the optimizer step, failing in a window of more micro-batches (the training leak of kept outputs); a
deeper model unfrozen layer by layer from the last (``UNFREEZE_EVERY``) under an optimizer built over all
its parameters, so its state comes in stairs; a DQN-like loop training on batches drawn from a ring
buffer of detached transitions (``REPLAY_CAP`` entries: it fills, then stays); a metric's buffer of
detached outputs cleared every ``EPOCH`` steps; or a mixture-of-experts layer whose dispatch pads every
expert to the most-loaded one's tokens while its routing collapses onto one expert at a constant batch,
failing at full collapse.

Issue 48, item 5: ``models`` gan_frozen is the GAN whose discriminator is frozen (``requires_grad_(False)``)
for the generator's update, its optimizer holding it all along and the generator's gradient flowing through
it (the discriminator steps at the warm-up's batch, the generator's update escalates). ``phase``
eval_train_mode is the evaluation that forgets ``no_grad`` and keeps every batch's logits with the model
left in training mode (a leak); trainer_eval an evaluation loop object that keeps every batch's logits,
detached, on the device in a container attribute until its metric (transformers' ``EvalLoopContainer``
without ``eval_accumulation_steps``), under ``no_grad``, until it runs out; generate a beam-search-like
loop under ``inference_mode`` with no optimizer (the sequence grows a token a forward, the beams
reordered; the failing generation has more beams). ``shape`` actor_critic is a loop whose rollouts act
under ``no_grad`` (``ROLLOUT`` forwards) and whose update recomputes the rollout in one forward, until a
rollout forgets ``no_grad`` and keeps its logits and values (a leak, in training mode); moco_queue a batch
contrasted against a MoCo-style queue of detached keys bounded twice: a ``deque(maxlen=QUEUE_BATCHES)`` and a
module attribute tensor truncated to ``BANK_ROWS`` rows (it fills, then stays); attn_attribute a model
whose attention module keeps its probabilities, graph and all, as module attributes for a plot (the last
as ``self.last_attn``, every call's in ``self.attn_maps``), its training steps going on at the same batch
until they run out (a leak held by a module, not by the loop). Kept only as ``self.last_attn`` (one
forward's graph), the attribute alone makes no OOM at a constant input: an evaluation forward's graph kept
through the next forward needs about what a training step's backward does (measured: 1.04 times the
warm-up's most, 1.0 under checkpointing or with a GAN)."""

DISTRIBUTED_WRAPPERS = frozenset(("ddp", "ddp_bucket_view", "fsdp1", "fsdp2", "compile_ddp", "ddp_compile"))
DDP_WRAPPERS = frozenset(("ddp", "ddp_bucket_view", "compile_ddp", "ddp_compile"))
COMPILED = frozenset(("compile", "compile_ddp", "ddp_compile"))
SHARDED = frozenset(("fsdp1", "fsdp2"))
WORLD = 2

MICRO = 4
"""Micro-batches a step for the accumulating values."""
WINDOW = 4
"""Forwards per truncated-BPTT window."""
WARMUP_STEPS = 6
"""Optimizer steps before the failing phase: the job probe's window opens at the third and the
model states are walked from the fifth."""
ESCALATIONS = (3, 8, 24)
"""The failing step's size (batch, episode, sequence) against the warm-up's largest: the first that
needs more than the warm-up did (a job whose states dominate needs a larger step to run out)."""
BANK_ROWS = 64
"""The memory bank's cap, in embeddings (4 single-batch steps' worth): it fills during the warm-up."""
LEAK_MULTIPLE = 8
"""The leak keeps at least this many times the forwards one backward of the job consumes (plus 16)
before it runs out: a pile no larger cannot be told from the job's own steps by anyone."""
D, H = 32, 192
RAMP = (1, 1, 2, 2, 4, 4, 8, 8, 16, 16)
"""ramped: the warm-up's batch sizes (8 step rows after the hook's 2 warm-up steps); the failing step is
the next doubling (``RAMP_ESCALATIONS`` of the largest)."""
RAMP_ESCALATIONS = {3: 2, 8: 4, 24: 8}
UNFREEZE_DEPTH = 5
"""unfreezing: the Linear layers of its model (the last trains from the start)."""
UNFREEZE_EVERY = 2
"""unfreezing: steps between two layers unfrozen (all trained from step ``2 * (UNFREEZE_DEPTH - 1)``)."""
UNFREEZE_STEPS = 12
REPLAY_CAP, REPLAY_ROWS = 8, 64
"""replay_buffer: the ring's entries (one a step) and the transitions of each (observations, next ones)."""
REPLAY_STEPS = 28
"""replay_buffer: the warm-up: the ring fills over its first ``REPLAY_CAP`` steps and stays for the rest (20
steps: the plateau rule clears a flag raised while it filled after ``recent_rows`` flat rows, 12 steps of a job
with one optimizer, 6 of a GAN's two; the last 8 publishes then have it down)."""
EPOCH, EPOCHS = 5, 3
"""metric_reset: steps an epoch (the metric's buffer cleared after each) and the epochs before the failing step."""
CLASSES, KEPT_BATCH = 512, 64
"""kept_outputs: its model's classes and a micro-batch's samples (the logits kept: 64 x 512 a micro-batch)."""
KEPT_ROOM = 1.3
"""kept_outputs: the failing window keeps outputs of at least 30% of the warm-up's peak: a pile of kept
outputs no larger is a few micro-batches' worth of the job's own steps."""
EXPERTS, TOKENS = 4, 64
"""moe_collapse: the experts (each an ``nn.Linear(H, H)``) and the tokens of a sequence (4 sequences a batch)."""
MOE_STEPS = 6
TILT = 0.04
"""moe_collapse: the router's bias towards expert 0 grows by this much a step; the failing step routes
every token there."""

ROLLOUT = 8
"""actor_critic: the environment steps of a rollout (a forward of 16 observations each)."""
QUEUE_BATCHES = 4
"""moco_queue: the deque's ``maxlen`` (batches of keys); its module attribute queue keeps ``BANK_ROWS`` rows."""
ATTN_TOKENS = 32
"""attn_attribute: the tokens of a sequence (4 sequences a batch)."""
BEAMS, PROMPT, NEW_TOKENS = 4, 2, 8
"""generate: the beams (times the size), the prompt's tokens and the tokens generated."""
EVAL_LEAKS = frozenset(("eval_leak", "eval_train_mode"))
"""Evaluations that forget ``no_grad`` and keep every batch's output with its graph."""
KEEPING_PHASES = EVAL_LEAKS | {"trainer_eval"}
"""Evaluations that keep every batch's output (the failing part: until it runs out)."""
INFERENCE_PHASES = frozenset(("inference_only", "generate"))
"""Jobs with no optimizer and no backward."""
PILING_SHAPES = frozenset(("loss_history_leak", "actor_critic", "attn_attribute"))
"""Shapes whose failing part is what they keep piling up until it runs out (no escalated step)."""
TRAINING_LEAKS = PILING_SHAPES | {"kept_outputs"}
"""Training shapes that keep what they made with its graph (true leaks)."""

CHANGES_FALLBACK = frozenset(
    (
        "no_grad",
        "frozen_no_grad",
        "freeze_untrained",
        "eval_batch",
        "half_precision",
        "bf16_params",
        "autocast",
        "bound_input",
        "quantize_base",
        "frozen_half",
        "smaller_base",
        "light_optimizer",
        "expert_capacity",
    )
)


def result_changing() -> frozenset[str]:
    """The remedies that change what the job computes: ``remedies.CHANGES`` where it exists, else ours."""
    from oomsight.analysis import remedies

    found = getattr(remedies, "CHANGES", None)
    return frozenset(found) if found else CHANGES_FALLBACK


@functools.cache
def bitsandbytes_importable() -> bool:
    try:
        import bitsandbytes  # noqa: F401
    except Exception:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class Job:
    wrapper: str
    accumulation: str
    models: str
    optimizer: str
    precision: str
    phase: str
    shape: str

    @property
    def id(self) -> str:
        return "-".join(getattr(self, axis) for axis in AXES)

    @classmethod
    def parse(cls, text: str) -> Job:
        return cls(*text.split("-"))

    @property
    def distributed(self) -> bool:
        return self.wrapper in DISTRIBUTED_WRAPPERS or self.optimizer == "zero"

    @property
    def values(self) -> frozenset[str]:
        return frozenset(getattr(self, axis) for axis in AXES)

    @property
    def leaks(self) -> bool:
        """A true leak: kept with its graph (the evaluations that forget ``no_grad``, the loop that keeps its
        losses, the rollout that keeps its logits, the window that keeps its micro-batches' outputs)."""
        return self.phase in EVAL_LEAKS or self.shape in TRAINING_LEAKS

    @property
    def piles_to_oom(self) -> bool:
        """What it keeps runs on until it runs out (the evaluations that keep their outputs, the loop that
        keeps its losses, the rollout that keeps its logits): no escalated step."""
        return self.phase in KEEPING_PHASES or self.shape in PILING_SHAPES

    @property
    def graph_piles(self) -> bool:
        """Forwards pile with their graphs and no backward to consume them: the live flag must rise."""
        return self.phase in EVAL_LEAKS or self.shape == "actor_critic"

    @property
    def trains_nothing(self) -> bool:
        """The failing forward trains nothing and the evidence shows it (model.eval() and a pile of
        forwards no backward consumes; or no autograd; or no optimizer): a result-changing remedy
        (``no_grad``) may come first. Not the evaluation left in training mode: its forwards look like
        a training step's until the evidence says otherwise."""
        return self.phase in ("eval_leak", "trainer_eval") or self.phase in INFERENCE_PHASES


def invalid(job: Job) -> Optional[str]:
    """Why torch (or this machine) cannot run ``job``; None when it can."""
    w = job.wrapper
    if job.optimizer == "adam8bit" and not bitsandbytes_importable():
        return "bitsandbytes is not importable"
    if job.optimizer == "zero" and w not in DDP_WRAPPERS:
        return "ZeroRedundancyOptimizer goes with DDP"
    if job.accumulation == "no_sync" and w not in DISTRIBUTED_WRAPPERS:
        return "no_sync needs a data-parallel wrapper"
    if job.precision == "mixed_policy" and w not in SHARDED:
        return "a mixed-precision policy is FSDP's"
    if job.models in ("ema", "gan", "gan_frozen") and w in SHARDED:
        return "an EMA copy or a GAN pair of sharded models is built otherwise"
    if w == "fsdp1" and (job.accumulation == "summed" or job.shape in ("rl", "tbptt")):
        return "FSDP1 reshards after each forward and takes one backward per forward"
    if job.precision == "bf16_params" and job.optimizer == "adamw_fused" and w in SHARDED:
        return "fused AdamW over bf16 DTensor shards is not supported on the CPU"
    if job.phase == "inference_only" and (
        job.accumulation != "single"
        or job.models not in ("one", "teacher")
        or job.optimizer != "sgd"
        or job.shape not in ("batches", "growing")
    ):
        return "an inference job has no optimizer step: one value stands for each training-only axis"
    if job.phase == "generate" and (
        job.accumulation != "single"
        or job.models != "one"
        or job.optimizer != "sgd"
        or job.shape != "batches"
        or w not in ("none", "compile", "checkpointed")
    ):
        return "a generation has no optimizer step and grows its own sequence: one value stands for the other axes"
    if job.phase in KEEPING_PHASES and job.shape in TRAINING_LEAKS:
        return "one leak a job"
    if job.models == "gan_frozen" and (job.distributed or job.shape == "moe_collapse"):
        return "DDP reduces all its parameters each backward: a D frozen for a phase needs find_unused_parameters"
    if job.shape == "actor_critic" and (job.accumulation != "single" or w == "fsdp1"):
        return "the actor-critic update is one forward over its rollout, one backward"
    if job.shape == "loss_history_leak" and w in SHARDED:
        return "FSDP frees the gathered parameters a retained graph saved: a second backward fails"
    if job.shape == "kept_outputs" and job.accumulation not in ("each", "no_sync"):
        return "kept outputs are a window's of micro-batches, each with its own backward"
    if job.shape == "ramped" and job.phase in KEEPING_PHASES:
        return "a single-batch evaluation's leak takes too long to outgrow a ramp's largest batch"
    if job.shape == "unfreezing" and job.optimizer not in ("adamw_fused", "adamw_foreach", "sgd"):
        return "progressive unfreezing here steps an AdamW or SGD-momentum optimizer built over every parameter"
    if job.phase == "trainer_eval" and job.shape in ("moe_collapse", "replay_buffer", "unfreezing", "ramped", "tbptt"):
        return "the Trainer-like evaluation keeps a classifier's logits: no MoE, DQN, unfreezing or recurrent model"
    if job.shape == "moe_collapse" and job.models in ("gan", "gan_frozen"):
        return "a GAN's discriminator over every token needs more than the collapsing experts: no OOM of theirs"
    if job.shape == "unfreezing" and job.distributed:
        return "DDP and FSDP fix the parameters they reduce at construction: unfreezing later is not theirs"
    return None


def space() -> list[Job]:
    """Every valid job (a new list each call; the space is built once a process)."""
    return list(_space())


@functools.cache
def _space() -> tuple[Job, ...]:
    return tuple(j for j in (Job(*values) for values in itertools.product(*AXES.values())) if invalid(j) is None)


SLOW_SHAPES = frozenset(
    ("ramped", "kept_outputs", "unfreezing", "replay_buffer", "metric_reset", "moe_collapse", "attn_attribute")
)
"""Shapes of longer warm-ups (10 to 20 steps: a ramp, stairs, a ring that fills and stays, epochs) or
heavier steps (a window of many micro-batches, an MoE dispatch): a second or two each."""


def sample(
    count: int,
    seed: int,
    distributed: bool,
    compiled_at_most: Optional[int] = None,
    history_leaks_at_most: Optional[int] = None,
    slow_at_most: Optional[int] = None,
    without: frozenset[str] = frozenset(),
    only: frozenset[str] = frozenset(),
) -> list[Job]:
    """``count`` valid jobs, single-process or distributed, deterministic for ``seed``: each value of
    every axis first (where the kind of job allows it), then jobs drawn at random; at most
    ``compiled_at_most`` of them compiled (a compiled job takes seconds), ``history_leaks_at_most``
    of them the loop that keeps its losses (tens of steps before it runs out: seconds too), and
    ``slow_at_most`` of each of the ``SLOW_SHAPES``; none with a value (of any axis) in ``without``, and, where
    ``only`` names values, each with one of them."""
    rng = random.Random(seed)
    pool = [
        j
        for j in space()
        if j.distributed == distributed and not j.values & without and (not only or j.values & only)
    ]
    rng.shuffle(pool)
    picked: dict[str, Job] = {}

    def room(job: Job) -> bool:
        compiled = sum(j.wrapper in COMPILED for j in picked.values())
        leaks = sum(j.shape == "loss_history_leak" for j in picked.values())
        slow = sum(j.shape == job.shape for j in picked.values()) if job.shape in SLOW_SHAPES else 0
        return (
            job.id not in picked
            and (compiled_at_most is None or job.wrapper not in COMPILED or compiled < compiled_at_most)
            and (history_leaks_at_most is None or job.shape != "loss_history_leak" or leaks < history_leaks_at_most)
            and (slow_at_most is None or job.shape not in SLOW_SHAPES or slow < slow_at_most)
        )

    for axis, values in AXES.items():
        for value in values:
            if any(getattr(j, axis) == value for j in picked.values()):
                continue
            first = next((j for j in pool if getattr(j, axis) == value and room(j)), None)
            if first is not None and len(picked) < count:
                picked[first.id] = first
    for job in pool:
        if len(picked) >= count:
            break
        if room(job):
            picked[job.id] = job
    return sorted(picked.values(), key=lambda j: j.id)


# ------------------------------------------------------------------ the memory truth
class Storages(TorchDispatchMode):
    """Every storage made while it is on (the outputs of every op, through tensor subclasses to their
    inner tensors), weakly, so a storage freed leaves the count: the bytes this process holds now."""

    @classmethod
    def is_infra_mode(cls) -> bool:
        return True  # torch.compile still compiles under it (a user mode makes dynamo step aside)

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, weakref.ref[Any]] = {}

    def add(self, t: Any, depth: int = 0) -> None:
        if depth > 3 or not isinstance(t, torch.Tensor):
            return
        if is_traceable_wrapper_subclass(t):
            for name in t.__tensor_flatten__()[0]:
                self.add(getattr(t, name), depth + 1)
            return
        if t.device.type != "cpu" or type(t).__name__ == "FakeTensor":
            return
        s = t.untyped_storage()
        if id(s) not in self.live:
            key = id(s)
            self.live[key] = weakref.ref(s, lambda _r, key=key: self.live.pop(key, None))

    def bytes(self) -> int:
        total, seen = 0, set()
        for ref in list(self.live.values()):
            s = ref()
            if s is not None and s.nbytes() and s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                total += s.nbytes()
        return total

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            self.add(t)
        return out


def _local(t: Any) -> Any:
    return getattr(t, "_local_tensor", t)


def _add(found: dict[int, int], t: Any) -> None:
    if t is None:
        return
    s = _local(t).untyped_storage()
    if s.nbytes():
        found[s.data_ptr()] = s.nbytes()


class Truth:
    """The storages of each category, read off the job's own objects: the parameters by their storages
    between steps (a shard, for a sharded wrapper; recorded after every optimizer step), every
    gradient the rank holds (also those FSDP keeps aside), the optimizers' state (ZeRO: its local
    optimizer's), and DDP's buckets as its communication hook saw them."""

    def __init__(self) -> None:
        self.models: list[nn.Module] = []
        self.optimizers: list[Any] = []
        self.params: list[Any] = []
        self.trained: set[int] = set()
        self.buckets: dict[tuple[int, int], weakref.ref[Any]] = {}
        """(the DDP module, its bucket's index) -> the bucket's storage, as its last all-reduce saw it
        (negative indices: the storages its construction left alive, the buckets it allocated)."""
        self.fsdp1: list[Any] = []
        self.fsdp2: list[Any] = []

    def settle(self) -> None:
        """Between steps (everything resharded): the parameters as they are held."""
        self.params = list({id(p): p for m in self.models for p in m.parameters()}.values())
        held = {id(p) for o in self.optimizers for g in o.param_groups for p in g["params"]}
        stepped = {id(p) for o in self.optimizers for i in (o, getattr(o, "optim", None)) for p, v in
                   getattr(i, "state", {}).items() if v}
        # no optimizer at all (an inference job): requires_grad alone tells, as the hook reads it; one frozen
        # for a phase (a GAN's discriminator during the generator's update) that its optimizer has stepped trains
        self.trained = {
            id(p) for p in self.params
            if ((p.requires_grad or id(p) in stepped) and id(p) in held) or (p.requires_grad and not held)
        }
        self.fsdp1 = [m._handle.flat_param for m in self._modules() if getattr(m, "_handle", None) is not None]
        self.fsdp2 = [fp for m in self._modules() for fp in _fsdp2_params(m)]

    def _modules(self) -> Iterator[nn.Module]:
        for m in self.models:
            yield from m.modules()

    def bucket_hook(self, owner: int, state: Any, bucket: Any) -> Any:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        buffer = bucket.buffer()
        self.buckets[(owner, bucket.index())] = weakref.ref(buffer.untyped_storage())
        return allreduce_hook(state, bucket)

    def now(self) -> dict[str, int]:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # .grad of a gathered (non-leaf) parameter: None, as wanted
            return self._now()

    def _now(self) -> dict[str, int]:
        params: dict[int, int] = {}
        frozen: dict[int, int] = {}
        grads: dict[int, int] = {}
        for p in self.params:
            _add(params, p)
            if id(p) not in self.trained:
                _add(frozen, p)
        for p in [*self.params, *(q for m in self.models for q in m.parameters()), *self.fsdp1]:
            _add(grads, p.grad)
        for flat in self.fsdp1:
            _add(grads, getattr(flat, "_saved_grad_shard", None))
        for fp in self.fsdp2:
            _add(grads, getattr(getattr(fp, "_unsharded_param", None), "grad", None))
            _add(grads, getattr(fp, "unsharded_accumulated_grad", None))  # reduce dtype, without sync
        state: dict[int, int] = {}
        for o in self.optimizers:
            for inner in (o, getattr(o, "optim", None)):
                for s in getattr(inner, "state", {}).values():
                    for v in s.values():
                        if isinstance(v, torch.Tensor):
                            _add(state, v)
        buckets: dict[int, int] = {}
        for ref in self.buckets.values():
            s = ref()
            if s is not None and s.nbytes() and s.data_ptr() not in grads:
                buckets[s.data_ptr()] = s.nbytes()
        return {
            "parameters_bytes": sum(params.values()),
            "frozen_parameters_bytes": sum(frozen.values()),
            "gradients_bytes": sum({**grads, **buckets}.values()),
            "optimizer_state_bytes": sum(state.values()),
            "gradient_buckets_bytes": sum(buckets.values()),
        }


CATEGORIES = (
    "parameters_bytes",
    "frozen_parameters_bytes",
    "gradients_bytes",
    "optimizer_state_bytes",
    "gradient_buckets_bytes",
)


def _fsdp2_params(module: nn.Module) -> list[Any]:
    get_state = getattr(module, "_get_fsdp_state", None)
    if get_state is None:
        return []
    group = getattr(get_state(), "_fsdp_param_group", None)
    return list(getattr(group, "fsdp_params", None) or [])


# ------------------------------------------------------------------ the fake device, fed from the truth
class LiveCuda(FakeCuda):
    """The fake allocator, whose contexts are this thread's real ones (autograd recording, a backward
    running, CPU autocast, dynamo's graphs), as the real ``TorchCuda`` reads CUDA's."""

    def __init__(self, total: int) -> None:
        super().__init__(total=total)
        from oomsight.hook.cuda import TorchCuda

        self.real = TorchCuda(torch)

    def grad_enabled(self) -> bool:
        return self.real.grad_enabled()

    def in_backward(self) -> bool:
        return self.real.in_backward()

    def autocast_enabled(self) -> bool:
        return bool(torch.is_autocast_enabled("cpu"))

    def open_contexts(self) -> dict[str, bool]:
        return {"autocast": self.autocast_enabled(), "checkpointing": False}

    def compiled(self) -> bool:
        return self.real.compiled()


class Oom(Exception):
    """The harness's stand-in for ``torch.OutOfMemoryError`` (caught where the job runs)."""


class Device:
    """One rank's memory: the truth, the allocator's counters fed from it, and the OOM when a leaf
    module's output would cross the capacity (``capacity`` None: a dry run, which only records)."""

    def __init__(self, storages: Storages, truth: Truth, capacity: Optional[int], group: Any) -> None:
        self.storages = storages
        self.truth = truth
        self.capacity = capacity
        self.group = group
        self.cuda: Optional[LiveCuda] = None
        self.peak = 0
        self.reserved = 0
        self.needs: list[int] = []
        self.at_oom: Optional[dict[str, Any]] = None
        self.armed = False
        """Only the failing part may run out (the dry run chose the capacity so)."""
        self.warm = 0
        """The most the job needed before its failing part."""
        self.armed_at = 0
        self.marks: list[int] = []
        """The most needed in each evaluation forward of the leak."""

        self._marked = 0

    def arm(self) -> None:
        # the most the warm-up needed: in a forward, or where it held most (a backward, an optimizer step)
        self.armed, self.warm = True, max(max(self.needs, default=0), self.peak)
        self.armed_at = self._marked = len(self.needs)

    def mark(self) -> None:
        self.marks.append(max(self.needs[self._marked :], default=0))
        self._marked = len(self.needs)

    @property
    def failing(self) -> list[int]:
        return self.needs[self.armed_at :]

    def feed(self) -> int:
        live = self.storages.bytes()
        self.peak = max(self.peak, live)
        self.reserved = max(self.reserved, live)
        if self.cuda is not None:
            self.cuda.set(
                0, allocated=live, reserved=self.reserved, peak_allocated=self.peak, peak_reserved=self.reserved
            )
        return live

    def before(self, module: nn.Module, args: Any) -> None:
        live = self.feed()
        requested = _output_bytes(module, args)
        self.needs.append(live + requested)
        crossed = self.armed and self.capacity is not None and live + requested > self.capacity
        if self.group is not None and self.capacity is not None:
            flag = torch.tensor([1 if crossed else 0])
            with torch.utils._python_dispatch._disable_current_modes():
                torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self.group)
            ran_out_here, crossed = crossed, bool(flag.item())
        else:
            ran_out_here = crossed
        if not crossed:
            return
        assert self.capacity is not None
        self.at_oom = {
            "truth": self.truth.now(),
            "crossed": ran_out_here,
            "module": type(module).__name__,
            "live": live,
            "requested": requested,
        }
        if self.cuda is not None and self.cuda.observer is not None:
            self.cuda.observer(0, requested, self.capacity, max(self.capacity - self.reserved, 0))
        raise Oom(f"CUDA out of memory. Tried to allocate {requested} bytes")

    def after(self, module: nn.Module, args: Any, output: Any) -> None:
        self.feed()


def _output_bytes(module: nn.Module, args: Any) -> int:
    x = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if x is None:
        return 0
    width = getattr(module, "out_features", x.shape[-1] if x.dim() else 1)
    size = torch.finfo(x.dtype).bits // 8 if x.is_floating_point() else 4
    return int(x.numel() // max(x.shape[-1], 1) * width * size) if x.dim() else size


# ------------------------------------------------------------------ the job's program
class Checkpointed(nn.Module):
    """Each Linear+ReLU block of an ``mlp`` under ``torch.utils.checkpoint`` (non-reentrant), the last
    Linear as it is: the parameters stay the inner model's."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        layers = list(self.inner)
        for k in range(0, len(layers) - 1, 2):
            x = checkpoint(nn.Sequential(*layers[k : k + 2]), x, use_reentrant=False)
        return layers[-1](x)


def mlp(d_in: int, d_out: int, hidden: int = H, depth: int = 3) -> nn.Module:
    """``depth`` Linear layers, a ReLU between two."""
    layers: list[nn.Module] = [nn.Linear(d_in, hidden)]
    for _ in range(depth - 2):
        layers += [nn.ReLU(), nn.Linear(hidden, hidden)]
    return nn.Sequential(*layers, nn.ReLU(), nn.Linear(hidden, d_out))


class MoE(nn.Module):
    """A mixture-of-experts layer as simple implementations write it: a router picks one expert a
    token (top-1, its probability the gate), and the dispatch pads every expert to the most-loaded
    expert's token count (one ``[experts, max_load, width]`` buffer through the experts). ``tilt`` is the
    router's bias towards expert 0 (its collapse, set by the loop)."""

    def __init__(self, width: int, experts: int) -> None:
        super().__init__()
        self.router = nn.Linear(width, experts)
        self.experts = nn.ModuleList(nn.Linear(width, width) for _ in range(experts))
        self.tilt = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        logits = self.router(tokens).float()
        logits = torch.cat([logits[:, :1] + self.tilt, logits[:, 1:]], dim=1)
        gate, chosen = logits.softmax(-1).max(-1)
        count = len(self.experts)
        picks = nn.functional.one_hot(chosen, count)
        slot = (picks.cumsum(0) - 1).gather(1, chosen[:, None]).squeeze(1)  # a token's place in its expert
        most = int(picks.sum(0).max())
        buffer = tokens.new_zeros(count, most, tokens.shape[-1])
        buffer[chosen, slot] = tokens
        y = torch.stack([expert(buffer[e]) for e, expert in enumerate(self.experts)])[chosen, slot]
        return (y * gate.to(y.dtype)[:, None]).reshape(x.shape)


class Attention(nn.Module):
    """Single-head self-attention that keeps its probabilities, graph and all, as module attributes (to plot
    them later), as visualisation code does: the last call's as ``self.last_attn``, every call's in
    ``self.attn_maps``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.last_attn: Optional[torch.Tensor] = None
        self.attn_maps: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, -1)
        probs = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).softmax(-1)
        self.last_attn = probs
        self.attn_maps.append(probs)
        return self.out(probs @ v)


class EvalLoopContainer:
    """What transformers' ``EvalLoopContainer`` does without ``eval_accumulation_steps``: every batch's logits
    concatenated on the device until the metric reads them."""

    def __init__(self) -> None:
        self.tensors: Optional[torch.Tensor] = None

    def add(self, logits: torch.Tensor) -> None:
        self.tensors = logits if self.tensors is None else torch.cat([self.tensors, logits])


class EvalLoop:
    """A Trainer-like evaluation loop object: its predictions in a container attribute."""

    def __init__(self) -> None:
        self.preds = EvalLoopContainer()


def classifier(job: Job) -> bool:
    """The jobs whose metric keeps logits: kept outputs, the Trainer-like evaluation."""
    return job.shape == "kept_outputs" or job.phase == "trainer_eval"


def model_of(job: Job) -> nn.Module:
    """The trained model: an ``mlp``; deeper for progressive unfreezing (its Linear layers frozen but
    the last); its middle Linear a mixture of experts for the MoE job."""
    if job.shape == "unfreezing":
        model = mlp(D, D, depth=UNFREEZE_DEPTH)
        for layer in [c for c in model.children() if isinstance(c, nn.Linear)][:-1]:
            layer.requires_grad_(False)
        return model
    if job.shape == "moe_collapse":
        return nn.Sequential(nn.Linear(D, H), nn.ReLU(), MoE(H, EXPERTS), nn.ReLU(), nn.Linear(H, D))
    if classifier(job):
        return mlp(D, CLASSES)  # a classifier: its logits, the largest output, are what the metric keeps
    if job.shape == "attn_attribute":
        return nn.Sequential(nn.Linear(D, H), nn.ReLU(), Attention(H), nn.ReLU(), nn.Linear(H, D))
    return mlp(D, D)


class Program:
    """The job's models, optimizers and loop, built under the truth's dispatch mode."""

    def __init__(self, job: Job, device: Device, group: Any) -> None:
        self.job = job
        self.device = device
        self.group = group
        self.dtype = torch.bfloat16 if job.precision == "bf16_params" else torch.float32
        torch.manual_seed(0)
        self.raw = model_of(job)
        self.second: Optional[nn.Module] = None  # the GAN's discriminator
        self.teacher: Optional[nn.Module] = None
        self.ema: Optional[nn.Module] = None
        width = CLASSES if classifier(job) else D  # the trained model's output
        if job.models in ("gan", "gan_frozen"):
            self.second = mlp(width, 1)
        if job.models == "teacher":
            self.teacher = mlp(D, width, 2 * H).requires_grad_(False).eval()
        for m in (self.raw, self.second, self.teacher):
            if m is not None:
                m.to(self.dtype)
        if job.models == "ema":
            import copy

            self.ema = copy.deepcopy(self.raw).requires_grad_(False).eval()
        self.model = self.wrap(self.raw)
        self.critic = self.wrap(self.second) if self.second is not None else None
        trained = [self.model] + ([self.critic] if self.critic is not None else [])
        self.optimizers = [] if job.phase in INFERENCE_PHASES else [self.optimizer(m) for m in trained]
        device.truth.models = [m for m in (self.model, self.critic, self.teacher, self.ema) if m is not None]
        device.truth.optimizers = self.optimizers
        device.truth.settle()
        self.hidden: Optional[torch.Tensor] = None
        self.step_count = 0
        self.history: list[torch.Tensor] = []
        """loss_history_leak: every loss, kept with its graph."""
        self.bank: list[torch.Tensor] = []
        """memory_bank: earlier batches' detached embeddings, at most ``BANK_ROWS``."""
        self.kept: list[torch.Tensor] = []
        """kept_outputs: this window's outputs, as returned (with their ``grad_fn``)."""
        self.replay: list[tuple[torch.Tensor, torch.Tensor]] = []
        """replay_buffer: a ring of ``REPLAY_CAP`` transitions (observations, next observations), detached."""
        self.metric: list[torch.Tensor] = []
        """metric_reset: this epoch's detached outputs."""
        self.collapsed = False
        """moe_collapse: the failing step routes every token to one expert."""
        self.keys: collections.deque[torch.Tensor] = collections.deque(maxlen=QUEUE_BATCHES)
        """moco_queue: the last batches' detached keys (the raw model's ``queue`` attribute: their rows, truncated)."""
        if job.shape == "moco_queue":
            self.raw.queue = torch.zeros(0, width, dtype=self.dtype)

    # -------------------------------------------------------------- construction
    def wrap(self, raw: nn.Module) -> nn.Module:
        w, device = self.job.wrapper, self.device
        m = raw
        if w == "fsdp2":
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            policy = (
                MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                if self.job.precision == "mixed_policy"
                else MixedPrecisionPolicy()
            )
            for layer in m:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer, mp_policy=policy)
            fully_shard(m, mp_policy=policy)
        self._leaf_hooks(raw)
        if w == "fsdp1":
            from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision

            mp = (
                MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                if self.job.precision == "mixed_policy"
                else None
            )
            m = FullyShardedDataParallel(m, device_id=torch.device("cpu"), use_orig_params=True, mixed_precision=mp)
        if w == "ddp_compile":
            m = torch.compile(m, backend="eager")
        if w in DDP_WRAPPERS:
            from torch.nn.parallel import DistributedDataParallel

            storages = device.storages
            before = set(storages.live)
            m = DistributedDataParallel(m, gradient_as_bucket_view=w == "ddp_bucket_view")
            owner = id(m)
            # the Reducer's buckets, allocated at construction (what it leaves alive): a job that never
            # runs a backward (inference) holds them all the same; rebuilt at the first backward, the
            # new ones are seen by the communication hook, and these freed leave the count
            made = [storages.live[k] for k in list(storages.live) if k not in before]
            for k, ref in enumerate(made):
                device.truth.buckets[(owner, -1 - k)] = ref
            m.register_comm_hook(self.group, lambda state, bucket: device.truth.bucket_hook(owner, state, bucket))
        if w in ("compile", "compile_ddp"):
            m = torch.compile(m, backend="eager")
        if w == "checkpointed":
            m = Checkpointed(m)
        return m

    def _leaf_hooks(self, raw: nn.Module) -> None:
        before = torch._dynamo.disable(self.device.before)
        after = torch._dynamo.disable(self.device.after)
        for leaf in raw.modules():
            if not list(leaf.children()):
                leaf.register_forward_pre_hook(before)
                leaf.register_forward_hook(after)

    def optimizer(self, m: nn.Module) -> Any:
        o = self.job.optimizer
        # progressive unfreezing: an optimizer over every parameter, the frozen ones stepped once unfrozen
        everything = self.job.shape == "unfreezing" and m is self.model
        params = [p for p in m.parameters() if p.requires_grad or everything]
        if o == "sgd":
            return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
        if o == "zero":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=1e-4, process_group=self.group)
        if o == "adam8bit":
            import bitsandbytes

            return bitsandbytes.optim.AdamW8bit(params, lr=1e-4)
        return torch.optim.AdamW(params, lr=1e-4, fused=o == "adamw_fused", foreach=o == "adamw_foreach" or None)

    # -------------------------------------------------------------- the loop
    def inputs(self, size: int, batch: int = 16) -> torch.Tensor:
        """One forward's input: ``size`` scales the batch (batches, tbptt) or the sequence (growing)."""
        dtype = self.dtype
        if self.job.shape == "growing":
            return torch.randn(4, 2 + 2 * size, D, dtype=dtype)
        if self.job.shape == "attn_attribute":
            return torch.randn(4 * size, ATTN_TOKENS, D, dtype=dtype)
        if self.job.shape == "moe_collapse":
            return torch.randn(4 * size, TOKENS, D, dtype=dtype)
        if self.job.shape == "kept_outputs":
            batch = KEPT_BATCH
        return torch.randn(batch * size, D, dtype=dtype)

    def context(self) -> Any:
        if self.job.precision == "autocast_bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)

        return contextlib.nullcontext()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's output, and the loss the other models add (a teacher's distillation under
        ``no_grad``, the discriminator's verdict on the generator's output)."""
        out = self.model(x)
        extra = torch.zeros((), dtype=torch.float32)
        if self.teacher is not None:
            with torch.no_grad():
                target = self.teacher(x)
            extra = extra + (out.float() - target.float()).square().mean()
        if self.critic is not None:
            extra = extra + self.critic(out).float().mean()
        return out, extra

    def unit_loss(self, size: int) -> torch.Tensor:
        """One micro-batch: its forwards and its loss (an episode, a window, a batch, a sequence)."""
        shape = self.job.shape
        total = torch.zeros((), dtype=torch.float32)
        with self.context():
            if shape == "rl":
                for _ in range(2 * size):  # an episode: a forward per step, one loss for the episode
                    logits, extra = self.forward(torch.randn(8, D, dtype=self.dtype))
                    logp = logits.float().log_softmax(-1)
                    action = torch.multinomial(logp.detach().exp(), 1)
                    total = total - logp.gather(1, action).sum() * float(torch.rand(())) + extra
                return total
            if shape == "tbptt":
                h = self.hidden if self.hidden is not None and self.hidden.shape[0] == 16 * size else None
                for _ in range(WINDOW):
                    x = self.inputs(size)
                    h, extra = self.forward(x if h is None else x + h)
                    total = total + h.float().square().mean() + extra
                self.hidden = h.detach()
                return total
            if shape == "replay_buffer":
                return self._replayed(size)
            if shape == "actor_critic":
                return self._actor_critic(size)
            out, extra = self.forward(self.inputs(size))
            loss = out.float().square().mean() + extra
            if shape == "kept_outputs":
                self.kept.append(out)  # for a metric after the step: the output as returned, graph node and all
            if shape == "metric_reset":
                self.metric.append(out.detach())
            if shape == "moco_queue":
                loss = loss + self._queued(out)
            if shape == "memory_bank":
                if self.bank:
                    bank = torch.cat(self.bank).float()
                    loss = loss + 0.1 * (out.float() @ bank.T).logsumexp(-1).mean()
                self.bank.append(out.detach())
                while sum(b.shape[0] for b in self.bank) > BANK_ROWS and len(self.bank) > 1:
                    self.bank.pop(0)
            return loss

    def _replayed(self, size: int) -> torch.Tensor:
        """A DQN-like loss on a batch of transitions drawn from the replay ring: the temporal-difference
        error against the model's own estimate of the next observations, under ``no_grad``."""
        at = torch.randint(len(self.replay), ()).item()
        obs, following = self.replay[int(at)]
        rows = torch.randint(REPLAY_ROWS, (16 * size,))
        q, extra = self.forward(obs[rows])
        with torch.no_grad():
            target = self.model(following[rows])
        return (q.float() - 0.99 * target.float()).square().mean() + extra

    def _queued(self, out: torch.Tensor) -> torch.Tensor:
        """moco_queue: the contrast against the queued keys, then this batch's keys queued (both bounded)."""
        queue = self.raw.queue
        extra = torch.zeros((), dtype=torch.float32)
        if queue.shape[0]:
            negatives = torch.cat([queue, *self.keys]).float()
            extra = 0.1 * (out.float() @ negatives.T).logsumexp(-1).mean()
        keys = out.detach()
        self.keys.append(keys.clone())
        self.raw.queue = torch.cat([keys, queue])[:BANK_ROWS]
        return extra

    def _actor_critic(self, size: int) -> torch.Tensor:
        """A rollout acting under ``no_grad`` (a forward an environment step), then the update: one forward
        over the rollout's observations, the policy's and the value's losses."""
        observations = [torch.randn(16 * size, D, dtype=self.dtype) for _ in range(ROLLOUT)]
        with torch.no_grad():
            for obs in observations:
                self.model(obs)
        logits, extra = self.forward(torch.cat(observations))
        logp = logits.float().log_softmax(-1)
        value = logits.float().mean(-1)
        return -(logp.max(-1).values * float(torch.rand(()))).mean() + value.square().mean() + extra

    def roll(self, kept: list[Any]) -> None:
        """One environment step of the rollout that forgets ``no_grad``: its logits and value kept (graphs and
        all) for the update that never comes before the OOM."""
        with self.context():
            logits = self.model(torch.randn(16, D, dtype=self.dtype))
            kept.append((logits, logits.float().mean(-1)))
        self.device.feed()

    def _collect(self) -> None:
        """replay_buffer: the step's transitions from the environment, into the ring (once full, the
        oldest entry replaced)."""
        entry = (
            torch.randn(REPLAY_ROWS, D, dtype=self.dtype),
            torch.randn(REPLAY_ROWS, D, dtype=self.dtype),
        )
        if len(self.replay) < REPLAY_CAP:
            self.replay.append(entry)
        else:
            self.replay[self.step_count % REPLAY_CAP] = entry

    def _unfreeze(self) -> None:
        """unfreezing: one more Linear layer trained every ``UNFREEZE_EVERY`` steps, from the last down."""
        layers = [m for m in self.raw.children() if isinstance(m, nn.Linear)]
        trained = min(len(layers), 1 + self.step_count // UNFREEZE_EVERY)
        for layer in layers[len(layers) - trained :]:
            if not layer.weight.requires_grad:
                layer.requires_grad_(True)
        self.device.truth.settle()

    def _route(self) -> None:
        """moe_collapse: the router's bias towards expert 0, one more ``TILT`` each step; every token at
        the failing step."""
        for m in self.raw.modules():
            if isinstance(m, MoE):
                m.tilt = 1e4 if self.collapsed else TILT * self.step_count

    def step(self, size: int, micro: Optional[int] = None) -> None:
        """One optimizer step of the job's accumulation, ``size`` the micro-batches' size (``micro`` of
        them where given, else the accumulation's)."""
        acc = self.job.accumulation
        count = micro or (1 if acc == "single" else MICRO)
        shape = self.job.shape
        if shape == "unfreezing":
            self._unfreeze()
        elif shape == "replay_buffer":
            self._collect()
        elif shape == "moe_collapse":
            self._route()
        frozen = self.critic is not None and self.job.models == "gan_frozen"
        if self.critic is not None:
            self._critic_step(1 if frozen else size)  # gan_frozen: the discriminator steps at the warm-up's batch
        if frozen:
            assert self.critic is not None
            self.critic.requires_grad_(False)  # the generator's update: its gradient flows through D
        keep = self.job.shape == "loss_history_leak"  # kept with its graph, which backward must leave
        if acc == "summed":
            loss = sum((self.unit_loss(size) for _ in range(count)), torch.zeros(()))
            loss.backward(retain_graph=keep)
            self.history += [loss] if keep else []
        else:
            for i in range(count):
                with self._sync(last=i == count - 1):
                    loss = self.unit_loss(size)
                    loss.backward(retain_graph=keep)
                    self.history += [loss] if keep else []
                self.device.feed()
        self.device.feed()
        self.optimizers[0].step()
        self.optimizers[0].zero_grad()
        if frozen:
            assert self.critic is not None
            self.critic.requires_grad_(True)
        self.kept.clear()  # kept_outputs: the metric read them after the step
        self._after_step()
        if shape == "metric_reset" and self.step_count % EPOCH == 0:
            self.metric.clear()  # the epoch's metric computed and reset
            self.device.feed()

    def _critic_step(self, size: int) -> None:
        assert self.critic is not None
        with self.context():
            fake = self.model(self.inputs(size)).detach()
            real = torch.randn_like(fake)
            loss = self.critic(torch.cat([real, fake])).float().mean()
        loss.backward()
        self.optimizers[1].step()
        self.optimizers[1].zero_grad()
        self.device.feed()

    def _sync(self, last: bool) -> Any:

        if self.job.accumulation != "no_sync" or last:
            if self.job.wrapper == "fsdp2":
                self.model.set_requires_gradient_sync(True)
            return contextlib.nullcontext()
        if self.job.wrapper == "fsdp2":
            self.model.set_requires_gradient_sync(False)
            return contextlib.nullcontext()
        inner = getattr(self.model, "_orig_mod", self.model)
        return inner.no_sync()

    def _after_step(self) -> None:
        self.step_count += 1
        if self.ema is not None:
            with torch.no_grad():
                for e, p in zip(self.ema.parameters(), self.raw.parameters()):
                    e.mul_(0.99).add_(p.detach(), alpha=0.01)
        self.device.feed()
        self.device.truth.settle()

    def validate(self) -> None:
        with torch.no_grad():
            for _ in range(5):
                with self.context():
                    self.model(self.inputs(1))
                self.device.feed()

    def checkpoint(self) -> None:
        blob = io.BytesIO()
        torch.save({k: v for k, v in self.model.state_dict().items()}, blob)
        self.device.feed()

    def infer(self, size: int) -> None:
        """One forward of the inference job: autograd recording (``no_grad`` forgotten), nothing kept."""
        with self.context():
            self.forward(self.inputs(size))
        self.device.feed()

    def evaluate(self, kept: list[Any]) -> None:
        """One forward of the evaluation that forgets ``no_grad`` and keeps its output."""
        with self.context():
            kept.append(self.model(self.inputs(1)))
        self.device.feed()

    def evaluate_into(self, loop: EvalLoop) -> None:
        """One forward of the Trainer-like evaluation: under ``no_grad``, its logits kept by the loop's container."""
        with torch.no_grad(), self.context():
            loop.preds.add(self.model(self.inputs(1)).detach())
        self.device.feed()

    def generate(self, size: int) -> None:
        """A beam-search-like generation under ``inference_mode``: ``BEAMS * size`` sequences, a token appended a
        forward, the beams reordered by a score."""
        with torch.inference_mode(), self.context():
            x = torch.randn(BEAMS * size, PROMPT, D, dtype=self.dtype)
            for _ in range(NEW_TOKENS):
                out = self.model(x)
                order = out[:, -1].float().sum(-1).argsort(descending=True)
                x = torch.cat([x[order], out[order, -1:]], dim=1)
        self.device.feed()

    def forwards_per_backward(self) -> int:
        """The most forwards of the model one backward of this job consumes, by its construction."""
        per_unit = {"rl": 2 * max(warm_sizes(self.job)), "tbptt": WINDOW}.get(self.job.shape, 1)  # actor_critic: 1
        return per_unit * (MICRO if self.job.accumulation == "summed" else 1)


# ------------------------------------------------------------------ one run
WARM_SIZES = {"growing": [1, 2, 3, 4, 5, 6], "rl": [2, 1, 2, 1, 2, 1]}
"""The warm-up steps' sizes (sequences grow; episodes vary); the rest use size 1."""


WARM_STEPS = {
    "unfreezing": UNFREEZE_STEPS,
    "replay_buffer": REPLAY_STEPS,
    "metric_reset": EPOCH * EPOCHS,
    "moe_collapse": MOE_STEPS,
}
"""The warm-up's length where a shape needs more than ``WARMUP_STEPS`` (each step a size-1 step)."""


def warm_sizes(job: Job) -> list[int]:
    if job.shape == "ramped":
        return list(RAMP)
    return WARM_SIZES.get(job.shape, [1] * WARM_STEPS.get(job.shape, WARMUP_STEPS))


def failing_size(job: Job, grow: int) -> int:
    """The escalated step's size: ``grow`` times the warm-up's largest (a ramp: its next doublings; the
    MoE job: the same batch, the routing collapsed)."""
    if job.shape == "moe_collapse":
        return 1
    if job.shape == "ramped":
        return RAMP_ESCALATIONS[grow] * max(RAMP)
    return grow * max(warm_sizes(job))


@dataclasses.dataclass
class Outcome:
    job: str
    rank: int = 0
    capacity: int = 0
    counted: dict[str, Any] = dataclasses.field(default_factory=dict)
    truth: dict[str, int] = dataclasses.field(default_factory=dict)
    crossed: bool = False
    cause: Optional[str] = None
    remedies: list[str] = dataclasses.field(default_factory=list)
    summary: str = ""
    flag_max: int = 0
    flag_before_oom: int = 0
    flags: list[bool] = dataclasses.field(default_factory=list)
    """Per publish, oldest first: either live leak flag up (the forward pile, a device's ``step_trend.leak``).
    The last is the flag at the OOM: no step row comes between it and the OOM."""
    step_flags: list[bool] = dataclasses.field(default_factory=list)
    """Per publish: the step rows' leak flag (a device's ``step_trend.leak``) alone."""
    module_training: Optional[bool] = None
    grad_enabled: Optional[bool] = None
    """Autograd recorded in the failing forward (the event's ``grad_enabled``)."""
    module_frozen: Optional[bool] = None
    """The failing forward's outermost module trains nothing (the event's ``module_frozen``)."""
    error: Optional[str] = None
    seconds: float = 0.0
    parallelism: dict[str, Any] = dataclasses.field(default_factory=dict)
    consumption: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The event's forwards since the last backward and the most one backward consumed (wire 1.8)."""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _schedule(
    job: Job, program: Program, publish: Callable[[], None], pause: Callable[[], None], leak: int, grow: int
) -> None:
    """The job: the warm-up steps, its phase, then the failing part (armed): the escalated step, or
    ``leak`` forwards of the evaluation that keeps its outputs."""
    device = program.device
    if job.phase in INFERENCE_PHASES:
        program.model.eval()
        forward = program.generate if job.phase == "generate" else program.infer
        for size in warm_sizes(job):
            forward(size)
            publish()
        device.arm()
        forward(failing_size(job, grow))
        return
    for size in warm_sizes(job):
        program.step(size)
        publish()
    if job.phase == "checkpoint_pause":
        pause()
        program.checkpoint()
        publish()
    elif job.phase in ("no_grad_validation", *KEEPING_PHASES):
        pause()
        program.validate()
        publish()
    device.arm()
    if job.piles_to_oom:
        kept: list[Any] = []
        loop = EvalLoop()
        least = LEAK_MULTIPLE * program.forwards_per_backward() + 16
        if job.phase in ("eval_leak", "trainer_eval"):
            program.model.eval()  # eval_train_mode leaves the model in training mode
        for _ in range(leak):
            if job.phase in EVAL_LEAKS:
                program.evaluate(kept)
            elif job.phase == "trainer_eval":
                program.evaluate_into(loop)
            elif job.shape == "actor_critic":
                program.roll(kept)
            else:
                program.step(1)  # the training leak: its steps go on, each keeping its loss
            device.mark()
            publish()
            if device.capacity is None and len(device.marks) >= least + 1 and device.marks[-1] > device.warm * 1.2:
                return  # a dry run: enough seen to place the capacity
        return
    if job.shape == "kept_outputs":  # one window of more micro-batches, each keeping its output
        program.step(1, micro=MICRO * grow)
        return
    program.collapsed = job.shape == "moe_collapse"
    program.step(failing_size(job, grow))


def _capacity(job: Job, device: Device, program: Program) -> tuple[int, int]:
    """From a dry run: the capacity between the most the warm-up needed and what the failing part
    needs; for the leak, crossed once it kept ``LEAK_MULTIPLE`` times the forwards one backward of the
    job consumes (and outgrew the warm-up); and how many evaluation forwards the leak may run."""
    warm = device.warm
    if job.piles_to_oom:
        least = LEAK_MULTIPLE * program.forwards_per_backward() + 16
        for i, need in enumerate(device.marks):
            if i + 1 >= least and need > warm * 1.1:
                return (device.marks[i - 1] + need) // 2, i + 8
        raise RuntimeError(f"the leak never outgrew the warm-up in {len(device.marks)} forwards")
    top = max(device.failing, default=0)
    if top <= warm * (KEPT_ROOM if job.shape == "kept_outputs" else 1.05):
        raise NoRoom(f"the failing step needs {top}, the warm-up {warm}: no room for an OOM between")
    return (warm + top) // 2, 0


def run(job: Job, rank: int = 0, group: Any = None, root: Optional[str] = None) -> Outcome:
    """Run ``job`` through the real hook to its OOM; the outcome with what the event says."""
    out = Outcome(job=job.id, rank=rank)
    started = time.perf_counter()
    spool = tempfile.mkdtemp(prefix="jobspace-", dir=root)
    try:
        for grow in ESCALATIONS:
            try:
                capacity, leak = _dry(job, group, grow)
                break
            except NoRoom:
                if grow == ESCALATIONS[-1]:
                    raise
        out.capacity = capacity
        _real(job, group, capacity, leak, grow, spool, out)
    except Exception as exc:  # a harness or torch failure is an outcome too (reported, never hidden)
        out.error = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        shutil.rmtree(spool, ignore_errors=True)
        out.seconds = round(time.perf_counter() - started, 3)
    return out


def _fresh() -> None:
    """A new job: the objects of the last one collected (the hook's walk of live modules, where it
    knows no model, must find this job's alone), dynamo's caches and counters gone (``compiled`` reads
    them); one intra-op thread (the jobs are small; more threads only contend on a shared machine).
    What survives is frozen out of the collector, so the next collection scans one job's objects."""
    import gc

    torch.set_num_threads(1)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    gc.collect()
    gc.freeze()


class NoRoom(RuntimeError):
    """The failing part of a dry run needed no more than its warm-up: escalate more."""


def _dry(job: Job, group: Any, grow: int) -> tuple[int, int]:
    """The same job without the hook and without a capacity: what each part needs."""
    _fresh()
    storages = Storages()
    device = Device(storages, Truth(), None, None)
    with storages:
        program = Program(job, device, group)
        leak = (LEAK_MULTIPLE * program.forwards_per_backward() + 16) * (6 if job.phase == "trainer_eval" else 3)
        _schedule(job, program, lambda: None, lambda: None, leak, grow)
    try:
        capacity, leak, failed = *_capacity(job, device, program), None
    except RuntimeError as exc:
        capacity, leak, failed = 0, 0, exc
    if group is not None:  # one GPU size for every rank, and a rank's failure fails them all
        both = torch.tensor([capacity, leak, failed is not None])
        torch.distributed.all_reduce(both, op=torch.distributed.ReduceOp.MAX, group=group)
        capacity, leak = int(both[0]), int(both[1])
        if failed is None and both[2]:
            failed = NoRoom("another rank's dry run left no room")
    if failed is not None:
        raise failed
    return capacity, leak


def _real(job: Job, group: Any, capacity: int, leak: int, grow: int, spool: str, out: Outcome) -> None:
    from oomsight.config import Settings
    from oomsight.hook.runtime import Hook

    _fresh()
    storages, truth = Storages(), Truth()
    device = Device(storages, truth, capacity, group)
    cuda = LiveCuda(total=capacity)
    device.cuda = cuda
    hook = Hook(Settings().replace(spool_dir=spool, termination_message_path=""), cuda, None, torch=torch)
    assert hook.steps is not None
    hook.forwards.device_type = "cpu"  # the model lives on the CPU: its tensors count as device 0's
    hook.steps.device_type = "cpu"
    hook.forwards.min_interval = 0.0  # a GPU forward takes longer than the read interval; these do not
    hook.step_memory.min_interval = 0.0
    hook.start()
    hook.sampler.stop_thread()  # the harness ticks and publishes, as the thread would

    def publish() -> None:
        hook.sampler.tick()
        hook.sampler.publish()
        with open(hook.writer.snapshot_path) as fh:
            doc = json.load(fh)
        devices = doc.get("devices", [])
        pile = max((int(d.get("forward_pile_bytes") or 0) for d in devices), default=0)
        out.flag_max = max(out.flag_max, pile)
        step = any(bool((d.get("step_trend") or {}).get("leak")) for d in devices)
        out.step_flags.append(step)
        out.flags.append(step or pile > 0)

    def pause() -> None:
        if hook.steps is not None and hook.steps.last_step_wall is not None:
            hook.steps.last_step_wall -= 5.0  # the steps paused (a checkpoint save, a validation)

    try:
        with storages:
            program = Program(job, device, group)
            with contextlib.suppress(Oom):
                _schedule(job, program, publish, pause, leak, grow)
    finally:
        hook.stop()
    if device.at_oom is None:
        raise RuntimeError("no OOM: the job never crossed its capacity")
    out.flag_before_oom = out.flag_max
    out.truth = device.at_oom["truth"]
    out.crossed = device.at_oom["crossed"]
    events = os.listdir(os.path.join(spool, "events"))
    if len(events) != 1:
        raise RuntimeError(f"{len(events)} OOM events written")
    with open(os.path.join(spool, "events", events[0])) as fh:
        event = json.load(fh)
    states = event.get("model_states") or {}
    out.counted = {k: states.get(k) for k in CATEGORIES}
    d = event["diagnosis"]
    out.cause, out.remedies, out.summary = d["cause"], list(d["facts"].get("remedies", [])), d["summary"]
    out.module_training = event.get("module_training")
    out.module_frozen = event.get("module_frozen")
    out.grad_enabled = event.get("grad_enabled")
    out.consumption = {k: event.get(k) for k in ("forwards_since_backward", "most_forwards_per_backward", "phase")}
    out.parallelism = dict((event.get("job") or {}).get("parallelism") or {})


# ------------------------------------------------------------------ the invariants
ALLOWED_TRAINING = frozenset(("model_states", "growing_demand", "activations"))
"""Causes a training step that grew (a larger batch, a longer episode or sequence) may have: its
states filling the device, its demand outgrowing the earlier steps', or activations that do not fit.
No other process, no memory outside the allocator, one request no larger than a module's output,
reserved never above allocated at the OOM (no fragmentation), steps and optimizers known."""
ALLOWED_LEAK = frozenset(("leak",))
ALLOWED_KEPT = frozenset(("leak", "activations", "model_states"))
"""The Trainer-like evaluation that keeps every batch's logits, detached, until it runs out: what it keeps (a
leak of sorts: ``eval_accumulation_steps`` bounds it), or what the device holds besides; never grown demand."""
ALLOWED_BY_SHAPE = {"ramped": frozenset(("growing_demand",)), "moe_collapse": frozenset(("growing_demand",))}
"""Shapes whose failing step has one cause: the ramp's next doubling, the MoE's collapsed routing (at the
same batch: its demand grew, its states did not)."""
FIRST_FIX = {"ramped": "bound_input", "kept_outputs": "kept_outputs", "moe_collapse": "expert_capacity"}
"""The remedy a shape's failing step must name first (where its own failing part runs out)."""
FILLING = {"replay_buffer": 8, "metric_reset": 8, "memory_bank": 1}
"""Shapes whose buffers fill and then stay (a ring, a bank) or are reset (an epoch's metric): while filling
the step rows may look like a leak (memory cannot tell a buffer that will stop from one that will not),
but the step-row flag is down over this many last publishes (the last: the flag at the OOM, no step row
comes between)."""


def leads_here(job: Job, out: Outcome, first: Optional[str]) -> bool:
    """Whether ``first``, a result-changing remedy, may lead on ``job``: what it changes is what the job's
    construction shows trains nothing or grew by itself (``remedies.LEADS_WHEN``)."""
    from oomsight.analysis import remedies

    shown = {"frozen"} if job.models == "teacher" else set()
    shown |= {"routing"} if job.shape == "moe_collapse" else set()
    shown |= {"forward"} if out.grad_enabled is False else set()
    return bool(getattr(remedies, "LEADS_WHEN", {}).get(first, frozenset()) & shown)


def episode_like(job: Job) -> bool:
    """A validation left in training mode, without no_grad, keeping its logits, in a job whose backwards consume
    episodes of varying length (REINFORCE): the event's facts are those of a longer episode than any before (a
    pile of graphs in a model in training mode, backwards that consumed several forwards, each a different
    number), so the diagnosis may say either; it must name what holds the graphs (docs/diagnosis.md, limits)."""
    return job.phase == "eval_train_mode" and job.shape == "rl"


def allowed_causes(job: Job) -> frozenset[str]:
    if episode_like(job):
        return ALLOWED_LEAK | {"growing_demand"}
    if job.leaks:
        return ALLOWED_LEAK
    if job.phase == "trainer_eval":
        return ALLOWED_KEPT
    return ALLOWED_BY_SHAPE.get(job.shape, ALLOWED_TRAINING)


def first_fix(job: Job) -> Optional[str]:
    """The remedy the job's failing part must name first (None: no one remedy). FSDP1's flat parameters hide
    which parameters are an MoE's experts (the layout walk counts no expert bytes under them), so the routing is
    not shown there and its capacity factor cannot lead: a known limit (docs/diagnosis.md), the same verdict at
    f2c2e6c (this job entered the CI sample when issue 48's values joined it)."""
    if job.wrapper == "fsdp1" and job.shape == "moe_collapse":
        return None
    return None if job.piles_to_oom else FIRST_FIX.get(job.shape)


def in_use(job: Job) -> set[str]:
    """Remedies the job already does, by its construction."""
    used: set[str] = set()
    if job.precision in ("autocast_bf16", "bf16_params", "mixed_policy"):
        used |= {"autocast"}
    if job.precision in ("bf16_params", "mixed_policy"):
        used |= {"bf16_params", "half_precision"}
    if job.wrapper in COMPILED:
        used.add("compile")
    if job.wrapper in SHARDED:
        used.add("shard")
    if job.wrapper == "ddp_bucket_view":
        used.add("bucket_view")
    if job.optimizer == "adamw_fused" and job.phase not in INFERENCE_PHASES:
        used.add("fused_optimizer")
    if job.wrapper == "checkpointed":
        used.add("checkpointing")
    return used


LEAK_FIRST = frozenset(("leak", "kept_outputs", "detach_kept"))
"""What a true leak's first remedy may be: keep nothing alive (or nothing with its graph) that outlives its use;
never what changes the result (``no_grad``), unless the evidence shows the forward trains nothing."""
FIRST_FIXES = {"eval_train_mode": LEAK_FIRST, "actor_critic": LEAK_FIRST}
"""Issue 48: the phases and shapes whose failing part must name one of these first."""
BOUNDED = frozenset(("moco_queue", "memory_bank", "replay_buffer", "metric_reset"))
"""Shapes whose detached buffers are bounded (a queue with a cap, a ring, a bank, a metric reset each epoch):
never told to drop what they keep first, which changes the method."""
OPTIMIZER_TEXT = re.compile(
    r"optimizer\.step\(\)|optimizer step|gradient accumulation|accumulate (n micro-batches|their gradients)",
    re.IGNORECASE,
)
"""A remedy text about training (accumulating gradients, ``optimizer.step()``): never to a process with no
optimizer (``eval_accumulation``'s text is about the evaluation loop's own accumulation)."""
NO_OPTIMIZER_CHECKED = frozenset(("generate", "inference_only"))
"""The phases with no optimizer whose remedy texts are checked. inference_only joins once the diagnosis gives it
no training advice: at 730ea3f its growing-sequence job with autocast is told ``batch`` ("accumulate N
micro-batches before optimizer.step()") second."""


def remedy_text(key: str) -> str:
    from oomsight.analysis import remedies

    return str(remedies.REMEDY.get(key, ""))


def issue48_violations(job: Job, out: Outcome, first: Optional[str]) -> dict[str, str]:
    """The invariants of issue 48's axes (item 5)."""
    found: dict[str, str] = {}
    expected = FIRST_FIXES.get(job.phase) or FIRST_FIXES.get(job.shape)
    if episode_like(job):
        expected = None
        if "holds" not in out.summary:
            found["kept"] = f"a pile of graphs without the holder named: {out.summary}"
    if expected is not None and first not in expected and not (
        first in result_changing() and leads_here(job, out, first)
    ):
        found["first_fix"] = f"{first} first, not one of {sorted(expected)}: {out.remedies}: {out.summary}"
    if job.shape in BOUNDED and not job.piles_to_oom and first == "leak":
        found["bounded"] = f"a bounded buffer told to drop what it keeps first: {out.remedies}: {out.summary}"
    kept = job.phase == "trainer_eval" or job.shape == "attn_attribute"
    if kept and (out.cause == "growing_demand" or first == "bound_input"):
        found["kept"] = f"{out.cause}, {first} first, where the input never grew: {out.summary}"
    if job.models == "gan_frozen" and (first == "frozen_no_grad" or out.module_frozen):
        found["frozen_phase"] = (
            f"module_frozen {out.module_frozen}, {first} first, for a model its optimizer holds: {out.remedies}"
        )
    if job.phase in NO_OPTIMIZER_CHECKED:
        texts = [k for k in out.remedies if k != "eval_accumulation" and OPTIMIZER_TEXT.search(remedy_text(k))]
        if texts:
            found["no_optimizer"] = f"training advice to a process with no optimizer: {texts} of {out.remedies}"
    return found


def violations(job: Job, out: Outcome) -> dict[str, str]:
    """Invariant name -> what broke (empty: the job keeps them all)."""
    if out.error is not None:
        return {"harness": out.error}
    found: dict[str, str] = {}
    wrong = {k: (out.counted.get(k), out.truth.get(k)) for k in CATEGORIES if out.counted.get(k) != out.truth.get(k)}
    if wrong:
        found["bytes"] = "; ".join(f"{k} counted {c} truth {t}" for k, (c, t) in wrong.items())
    if not out.crossed:
        return found  # another rank ran out: this one's diagnosis judges an OOM it did not have
    allowed = allowed_causes(job)
    if out.cause not in allowed:
        found["cause"] = f"{out.cause} (allowed {sorted(allowed)}): {out.summary}"
    first = out.remedies[0] if out.remedies else None
    expected = first_fix(job)
    # a result-changing remedy first only where the job's construction shows what it changes
    if not job.trains_nothing and first in result_changing() and not leads_here(job, out, first):
        found["first_remedy"] = f"{first} first on a training forward: {out.remedies}"
    if expected is not None and first != expected:
        found["first_fix"] = f"{first} first, not {expected}: {out.remedies}: {out.summary}"
    # keep nothing alive, keep no graph on what is kept (detach_kept), or a framework's own way to move it
    fixes = {"leak", "detach_kept"} | ({"kept_outputs", "eval_accumulation"} if job.shape == "kept_outputs" else set())
    if job.leaks and not episode_like(job) and not fixes & set(out.remedies[:2]):
        found["leak_fix"] = f"the leak's fix is not among the first two remedies: {out.remedies}"
    found.update(issue48_violations(job, out, first))
    piles = job.graph_piles  # the live flag is the pile of forwards that no backward consumes
    if not piles and out.flag_max and job.phase != "trainer_eval":  # a pile without graphs: either way
        found["live_flag"] = f"forward_pile_bytes {out.flag_max} on a job that piles no forwards"
    if piles and not out.flag_before_oom and not episode_like(job):
        found["live_flag"] = "the leak's live flag never rose before its OOM"
    steps = "".join("1" if f else "0" for f in out.step_flags)
    if job.shape not in TRAINING_LEAKS:  # the step rows of a job that does not leak
        last = FILLING.get(job.shape)
        if last is None and any(out.step_flags):
            found["live_flag"] = f"the step rows' leak flag up on a job that keeps nothing (per publish: {steps})"
        if last is not None and any(out.step_flags[-last:]):
            found["live_flag"] = (
                f"the step rows' leak flag up in the last {last} publishes of a buffer that stays "
                f"(per publish: {steps})"
            )
    used = sorted(in_use(job) & set(out.remedies))
    if used:
        found["in_use"] = f"advised {used}, which the job already does: {out.remedies}"
    return found
