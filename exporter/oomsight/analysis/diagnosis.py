"""Why a CUDA OOM happened, and the remedy that fits: a pure function of the facts.

The causes form a closed set (:class:`Cause`), checked in this order (``docs/diagnosis.md``):

``other_process``       other processes on the GPU hold a large share of it
``non_pytorch_memory``  this process holds a large share outside the caching allocator
``leak``                the memory that survives between steps rose step after step, the step's own did not
``model_states``        parameters, gradients and optimizer state alone (nearly) fill the device
``oversized_request``   one request is more than half of all this process could use, in an otherwise normal step
``growing_demand``      the failing step needed more than any earlier step's peak: larger batch, longer sequence
``fragmentation``       the step needed no more than before and the bytes existed, but in no block large enough
``activations``         a steady step whose activations do not fit: the job is simply too big as configured
``exhaustion``          out of memory with too little known to say more (no step and no optimizer seen)

Each diagnosis states its evidence in numbers (``facts``) and names remedies the job
does not already use (``remedies.pick``). How the job lays out its memory (wire 1.6: DDP, FSDP,
ZeRO, frozen and quantised weights, a frozen second model's forward, CUDA-graph pools, memory
outside the allocator that grows, an allocator back-end without block statistics) picks the
remedies that fit it and keeps the rules from reading one layout as another. Every number the
rules use is a row of ``analysis.thresholds``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from oomsight.analysis import findings as census_findings
from oomsight.analysis import remedies, trend
from oomsight.analysis import thresholds as th
from oomsight.analysis.evidence import CAUSES, GENERATION_FRAMES, MODULE_FRAME, Cause, Evidence, on_stack
from oomsight.analysis.oomfacts import ModelStates, OomFacts, facts_from_event, leak_growth, states_held
from oomsight.analysis.wording import say
from oomsight.wire.schema import Diagnosis

__all__ = ["CAUSES", "Cause", "ModelStates", "OomFacts", "diagnose", "facts_from_event", "leak_growth"]


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the precedence table: a finding, how it knows, and why it comes before the rows below."""

    finding: str
    evaluate: Callable[[Evidence], Optional[Diagnosis]]
    strength: str
    """``observed``: read off the job's own objects (the census); ``counted``: read off the allocator's counters,
    the step rows and the forward/backward counts."""
    why: str


def diagnose(f: OomFacts) -> Diagnosis:
    """Classify one OOM from the facts recorded at the moment it happened: every finding is evaluated on its own
    (:data:`PRECEDENCE`), the first row that found something decides, and the diagnosis lists every finding that
    did (``facts.findings``)."""
    ev = Evidence(f)
    found = findings(ev)
    chosen = next((found[row.finding] for row in PRECEDENCE if row.finding in found), None)
    if chosen is None:
        chosen = _fallback(ev)
    chosen["facts"]["findings"] = list(found)
    return chosen


def findings(ev: Evidence) -> dict[str, Diagnosis]:
    """Every finding of :data:`PRECEDENCE` that found something, in the table's order. Each starts from the same
    facts (one finding's numbers never leak into another's); one that raises is skipped and named."""
    base = dict(ev.facts)
    found: dict[str, Diagnosis] = {}
    failed: list[str] = []
    for row in PRECEDENCE:
        ev.facts = dict(base)
        try:
            result = row.evaluate(ev)
        except Exception:  # a pure function of recorded numbers: one malformed value skips its finding alone
            failed.append(row.finding)
            continue
        if result is not None:
            found[row.finding] = result
    ev.facts = dict(base)
    if failed:
        for d in found.values():
            d["facts"]["findings_failed"] = failed
        ev.facts["findings_failed"] = failed
    return found


def _outside_rule(ev: Evidence) -> Optional[Diagnosis]:
    if ev.others is not None and _decisive(ev, ev.others, ev.outside or 0):
        return _other_process(ev, ev.others, say("outside.others", held=ev.others, total=ev.total))
    if ev.outside is None:
        return None
    nv = ev.f.get("nvml")
    listed = nv.get("other_processes") if nv else None
    if ev.others is None and listed is not None and listed >= 2 and _decisive(ev, ev.outside, 0):
        # NVML lists processes but not under our PID (a container): we are one of them
        return _other_process(
            ev,
            ev.outside,
            say("outside.listed", listed=listed, outside=ev.outside),
        )
    if ev.outside_leak is not None:
        return ev.result(
            Cause.NON_PYTORCH_MEMORY,
            ["outside_leak", "non_pytorch", "history"],
            say("outside.leak", outside=ev.outside, growth=ev.outside_leak),
        )
    if ev.outside < th.value("outside_share") * ev.total and not _outside_decides(ev):
        return None
    if ev.others is None:  # NVML cannot see our PID (containers): it may be other tenants too
        return ev.result(
            Cause.NON_PYTORCH_MEMORY,
            ["non_pytorch", "other_process"],
            say("outside.unseen_pids", outside=ev.outside),
        )
    return ev.result(
        Cause.NON_PYTORCH_MEMORY,
        ["non_pytorch"],
        say("outside.own", outside=ev.outside),
    )


def _outside_decides(ev: Evidence) -> bool:
    """This process's memory outside its allocator, below ``outside_share``, still decided the OOM: it
    is more than a CUDA context and a NCCL communicator take (``outside_large_bytes``), and the job's
    own known need would have fit beside a CUDA context alone (``context_bytes``)."""
    if ev.others is None or (ev.outside or 0) < th.value("outside_large_bytes"):
        return False
    return max(ev.need, ev.prior_peak or 0) + th.value("context_bytes") <= ev.total


def _decisive(ev: Evidence, held: int, own_outside: int) -> bool:
    """Whether ``held`` bytes of other processes are the cause: a large share of the GPU, or enough
    to matter while the job's own known need (plus its memory outside the allocator) fits alone."""
    if held >= th.value("outside_share") * ev.total:
        return True
    own = max(ev.need, ev.prior_peak or 0) + own_outside
    return held >= th.value("decisive_share") * ev.total and own <= ev.total


def _other_process(ev: Evidence, held: int, summary: str) -> Diagnosis:
    own = max(ev.need, ev.prior_peak or 0)
    if own <= ev.total:
        summary += say("outside.own_fits", own=own)
    return ev.result(Cause.OTHER_PROCESS, ["other_process"], summary)


def _leak_rule(ev: Evidence) -> Optional[Diagnosis]:
    t = ev.trend
    growth = t.floor_growth_bytes if t.leak else ev.short_leak
    bounded = census_findings.bounded_growth(ev, growth)
    if bounded is not None:  # the census saw what rose: a buffer with a cap, which stops there
        ev.facts["bounded_by"] = bounded.get("name")
        return None
    if t.leak:
        summary = say("leak.floor", growth=t.floor_growth_bytes, slope=int(t.floor_slope))
    elif ev.short_leak is not None:
        summary = say("leak.short", growth=ev.short_leak)
        ev.facts["floor_growth_bytes"] = ev.short_leak
    elif ev.window_kept is not None:
        return _window_rule(ev, *ev.window_kept)
    elif ev.piled is not None:
        return _piled_rule(ev, ev.piled)
    elif ev.legacy_leak is not None:
        summary = say("leak.legacy", growth=ev.legacy_leak)
        ev.facts["floor_growth_bytes"] = ev.legacy_leak
    else:
        return None
    return ev.result(Cause.LEAK, ["leak", "history"], summary)


def _window_rule(ev: Evidence, growth: int, backwards: int) -> Diagnosis:
    """Outputs kept through an accumulation window: after each backward the memory rose by about the same,
    though every backward frees its micro-batch's activations."""
    ev.facts["floor_growth_bytes"] = growth
    ev.facts["window_backwards"] = backwards
    return ev.result(
        Cause.LEAK,
        ["kept_outputs", "leak", "history"],
        say("leak.window", growth=growth, backwards=backwards),
    )


def _piled_rule(ev: Evidence, growth: int) -> Diagnosis:
    when = (
        say("piled.no_step")
        if ev.f.get("last_step_time") is None
        else say("piled.after_step", seconds=ev.f.get("time", 0.0) - (ev.f.get("last_step_time") or 0.0))
    )
    if on_stack(ev.f, GENERATION_FRAMES):
        ev.facts["piled_up_bytes"] = growth
        return ev.result(
            Cause.GROWING_DEMAND,
            ["bound_input", "eval_batch", "half_precision"],
            say("piled.generation", when=when, growth=growth),
        )
    ev.facts["floor_growth_bytes"] = growth
    graphs = bool(ev.f.get("grad_enabled")) or ev.forward_pile is not None
    rose = say("piled.each_forward" if ev.forward_pile is not None else "piled.lowest", growth=growth)
    summary = say("piled.loop", when=when, rose=rose) + (say("piled.with_graphs") if graphs else ".")
    return ev.result(Cause.LEAK, ["no_grad", "leak", "eval_batch"] if graphs else ["leak", "eval_batch"], summary)


def _model_states_rule(ev: Evidence) -> Optional[Diagnosis]:
    # FSDP's all-gathered parameters alive at the OOM are parameters too (not in parameters_bytes)
    states = ev.states + ev.unsharded if ev.states is not None else None
    # in optimizer.step() activations are freed, unless graph pools keep them between replays
    in_step = ev.f.get("phase") == "optimizer" and ev.private < th.value("private_pool_share") * ev.total
    bar = th.value("model_states_share") * ev.total
    if states is None or (states < bar and not in_step):
        return None
    if ev.training and not in_step and _outgrown(ev):
        return None  # the same states fitted the earlier steps: the step's own demand grew (the demand rule)
    if ev.training and states >= bar and ev.frozen >= th.value("frozen_dominant_share") * states:
        return _frozen_weights(ev, states)
    if not ev.training:
        return ev.result(
            Cause.MODEL_STATES,
            ["half_precision", "shard"],
            say("states.no_optimizer", states=states, total=ev.total, allocated=ev.allocated),
        )
    if states < bar:  # activations are gone by optimizer.step()
        return ev.result(
            Cause.MODEL_STATES,
            ["fused_optimizer", *_model_states_order(ev)],
            say("states.in_step", states=states, total=ev.total, allocated=ev.allocated, requested=ev.requested),
        )
    where = say("states.where_step") if in_step else ""
    gathered = say("states.gathered", gathered=ev.unsharded) if ev.unsharded else ""
    # in optimizer.step() with states that fit the capacity: the foreach temporaries did not (docs/diagnosis.md)
    fused = ["fused_optimizer"] if in_step and states < ev.total and not _states_rose(ev) else []
    return ev.result(
        Cause.MODEL_STATES,
        [*fused, *_untrained_first(ev), *_layout_first(ev), *_model_states_order(ev)],
        say(
            "states.fill", states=states, total=ev.total, gathered=gathered, where=where, allocated=ev.allocated,
            frozen=_frozen_part(ev),
        ),
    )


def _states_rose(ev: Evidence) -> bool:
    """The gradients and optimizer state held at the step rows rose (wire 1.10: parameters started to train,
    progressive unfreezing): states that grow step by step outgrow a fused step too, so it is no first remedy."""
    held = [r[trend.STATES] for r in ev.f.get("steps_memory") or [] if len(r) > trend.STATES and r[trend.STATES] >= 0]
    return len(held) >= 2 and held[-1] > held[0] * (1 + th.value("demand_margin"))


def _outgrown(ev: Evidence) -> bool:
    """The failing step outgrew the earlier ones for a reason the job showed: the routing of a model with
    experts at the same input, or an input that rose through the step rows. States that fill most of the
    device then did not change; what one step takes in or sends to an expert did (a collapsing MoE router
    was told model_states, cpu_offload first, in the job space)."""
    d = ev.trend.demand
    return ev.routing or (d is not None and bool(d.input_rose))


def _untrained_first(ev: Evidence) -> list[str]:
    """Gradients of a model no optimizer trains are pure waste: freezing it comes first."""
    return ["freeze_untrained"] if ev.untrained_grads else []


def _frozen_weights(ev: Evidence, states: int) -> Diagnosis:
    """Frozen weights (a LoRA base, a teacher, a reference model) that leave no room: shrinking or
    moving them is the remedy; checkpointing saves activations, never weights."""
    return ev.result(
        Cause.MODEL_STATES,
        [*_untrained_first(ev), "quantize_base", "offload_frozen", "smaller_base", "light_optimizer"],
        say(
            "states.frozen", modules=_modules(ev), frozen=ev.frozen, states=states, total=ev.total,
            allocated=ev.allocated,
        ),
    )


def _modules(ev: Evidence) -> str:
    return say("frozen.modules", names=", ".join(ev.frozen_modules)) if ev.frozen_modules else ""


def _frozen_part(ev: Evidence) -> str:
    part = say("frozen.part", frozen=ev.frozen, modules=_modules(ev)) if ev.frozen else ""
    if ev.untrained_grads:
        part += say("frozen.untrained", grads=ev.untrained_grads)
    return part


def _model_states_order(ev: Evidence) -> list[str]:
    """The remedies of the job's layout: a sharded job is never told to shard (the next ZeRO stage,
    optimizer-state offload, a lighter or bf16 state, more ranks); on one GPU or under DDP, the
    single-process change whose estimate fits first, then sharding."""
    stage = ev.layout.get("zero_stage")
    if ev.strategy == "zero" and stage in (1, 2):
        return ["next_zero_stage", "cpu_offload", "light_optimizer", "bf16_params", "more_ranks"]
    if remedies.sharded(ev.job):
        return ["cpu_offload", "light_optimizer", "bf16_params", "more_ranks"]
    p = _parameters(ev.f)
    # a change fits when its states plus what this step needed besides the states it held stay within
    # capacity (in optimizer.step() the optimizer's temporaries and new state; in forward, activations)
    fits = ev.total - max(ev.need - (states_held(ev.f) or 0), 0)
    trainable = max(p - ev.frozen, 0)
    light = p + trainable * (1 + th.value("light_optimizer_state_ratio")) if p else None
    half = (ev.states or 0) / 2
    bucket = (ev.states or 0) - ev.buckets if ev.buckets else None
    candidates = (("bucket_view", bucket), ("light_optimizer", light), ("bf16_params", half))
    estimates = sorted((est, key) for key, est in candidates if est)
    single = [key for est, key in estimates if est < fits]  # the one leaving the most room first
    rest = [k for k in ("light_optimizer", "bf16_params") if k not in single]
    if ev.strategy == "ddp" or int(ev.f.get("world_size") or 1) > 1 or not single:
        cheap = [k for k in single if k == "bucket_view"]
        return [*cheap, "shard", *(["bucket_view"] if ev.buckets else []), "light_optimizer", "bf16_params"]
    return [*single, "cpu_offload", "shard", *rest]


def _parameters(f: OomFacts) -> int:
    ms = f.get("model_states") or f.get("categories")
    return int(ms["parameters_bytes"]) if ms else 0


def _frozen_forward_rule(ev: Evidence) -> Optional[Diagnosis]:
    """The forward of a frozen second model (teacher, reference, reward model) inside a training step:
    not an evaluation of the trained model; its activations and its weights are its own."""
    if not ev.frozen_forward or _fragmented(ev):
        return None
    recording = bool(ev.f.get("grad_enabled"))
    keys = ["frozen_no_grad", "precompute_frozen", "frozen_half"] if recording else ["precompute_frozen", "frozen_half"]
    keys = [*_untrained_first(ev), *keys]
    weights = say("frozen_forward.weights", modules=_modules(ev), frozen=ev.frozen) if ev.frozen else ""
    return ev.result(
        Cause.ACTIVATIONS,
        [*keys, "offload_frozen", "eval_batch"],
        say("frozen_forward", needed=_needed(ev))
        + (say("frozen_forward.recording") if recording else ".")
        + weights,
    )


def _oversized_rule(ev: Evidence) -> Optional[Diagnosis]:
    if ev.requested <= th.value("oversized_share") * ev.usable:
        return None
    if ev.step_need is not None and ev.outgrew(ev.step_need - ev.requested):
        return None  # the step had already outgrown earlier ones: growing demand
    if ev.f.get("phase") == "forward" and on_stack(ev.f, (MODULE_FRAME,)):
        return _huge_activation(ev)
    return ev.result(
        Cause.OVERSIZED_REQUEST,
        ["oversized", "bound_input"],
        say("oversized", requested=ev.requested, usable=ev.usable),
    )


def _evaluation_rule(ev: Evidence) -> Optional[Diagnosis]:
    """A training job's evaluation forward (the model in eval mode) that does not fit: its batch is
    not a training step's, and with autograd recording every activation is kept for nothing."""
    if not ev.evaluating or _fragmented(ev):
        return None
    recording = bool(ev.f.get("grad_enabled"))
    return ev.result(
        Cause.ACTIVATIONS,
        # never cast the weights being trained; eval mode alone does not show the forward trains nothing
        ["no_grad", "eval_batch", "checkpointing"] if recording else ["eval_batch"],
        say("evaluation", needed=_needed(ev)) + say("evaluation.recording" if recording else "evaluation.own_batch"),
    )


def _huge_activation(ev: Evidence) -> Diagnosis:
    """One huge request made by a module in the model's forward: one of its activations, whose size
    follows what the step takes in (batch x sequence), not an operation written to do everything at
    once in user code. A smaller batch shrinks it; chunking that operation does too."""
    recording = bool(ev.f.get("grad_enabled"))
    first = ["no_grad"] if recording and not ev.training else []
    return ev.result(
        Cause.ACTIVATIONS,
        [*first, "batch", "oversized", "bound_input"],
        say("huge_activation", requested=ev.requested, usable=ev.usable),
    )


def _demand_rule(ev: Evidence) -> Optional[Diagnosis]:
    earlier = ev.earlier_forwards
    slack = th.value("demand_slack_share") * ev.total
    if earlier is not None and ev.need > earlier * (1 + th.value("forwards_margin")) + slack:
        return ev.result(
            Cause.GROWING_DEMAND,
            ["bound_input", "eval_batch"],
            say(
                "demand.forwards", earlier=int(earlier), need=ev.need, allocated=ev.allocated, requested=ev.requested,
                input=_input_said(ev),
            ),
        )
    demand = ev.trend.demand
    if not ev.outgrew(ev.step_need) and not ev.trend.growing and demand is None:
        return None
    each = ["backward_each"] if (ev.pending or 0) > 1 and (ev.consumed or 0) > 1 else []
    summary = _demand_summary(ev, demand)
    if ev.routing:
        elements = demand.last_input if demand is not None else ev.same_input or -1
        return ev.result(
            Cause.GROWING_DEMAND,
            ["expert_capacity", "bound_input", "checkpointing", *each, "batch"],
            summary + say("demand.routing", elements=elements, experts=ev.experts) + _kept_until_backward(ev),
        )
    # experts seen, or a writer older than 1.10 that could not say: routing may be the growth too
    maybe_routed = bool(ev.experts) or "expert_parameters_bytes" not in (ev.f.get("model_states") or {})
    if demand is not None and demand.input_rose:
        grew = say("demand.input_rose", first=demand.first_input, last=demand.last_input)
    elif ev.same_input is not None:
        grew = say("demand.same_input", elements=ev.same_input)
    else:
        grew = _input_said(ev) + (say("demand.maybe_routed") if maybe_routed else "")
    return ev.result(
        Cause.GROWING_DEMAND,
        ["bound_input", "checkpointing", *each, "batch", *(["expert_capacity"] if maybe_routed else [])],
        summary + grew + say("demand.end") + _kept_until_backward(ev),
    )


def _input_said(ev: Evidence) -> str:
    """What the event records of the input one forward took in, said as recorded (never guessed)."""
    now = int(ev.f.get("input_elements", -1) or -1)
    return say("input.recorded", elements=now) if now > 0 else say("input.unrecorded")


def _demand_summary(ev: Evidence, demand: Optional[trend.Demand]) -> str:
    """What the failing step needed against the earlier steps, and how their own memory rose."""
    summary = say(
        "demand.step", need=ev.need, allocated=ev.allocated, requested=ev.requested, own=ev.step_need,
        prior=ev.prior_transient, peak=ev.prior_peak,
    )
    if demand is not None:
        summary += say("demand.rose", first=demand.first_bytes, last=demand.last_bytes)
    return summary


def _kept_until_backward(ev: Evidence) -> str:
    """What the job's backwards show (wire 1.8): forwards whose graphs live until one backward."""
    if (ev.pending or 0) <= 1 or ev.consumed is None:
        return ""
    least = ev.f.get("least_forwards_per_backward")
    varied = least is not None and least < ev.consumed
    between = say("kept.between", least=least, most=ev.consumed) if varied else f"{ev.consumed}"
    said = say("kept.pending", pending=ev.pending, between=between)
    held = [h for h in census_findings.holders(ev) if int(h.get("graph_tensors") or 0) > 0]
    if held:  # what holds them, as the census saw it: the user tells a longer episode from outputs kept for nothing
        said += say("kept.holder", holder=census_findings.says(held[0]))
    return said + "."


def _fragmented(ev: Evidence) -> bool:
    """Enough bytes reserved but unallocated and free for the request, and no block large enough."""
    block = ev.f.get("largest_free_block_bytes")
    enough = ev.cached_free >= th.value("fragmentation_share") * ev.total
    bytes_exist = ev.cached_free + ev.free >= ev.requested and enough
    return bytes_exist and ev.free < ev.requested and (block is None or block < ev.requested)


def _fragmentation_rule(ev: Evidence) -> Optional[Diagnosis]:
    block = ev.f.get("largest_free_block_bytes")
    # In a training step that never completed, what the rest of the step needs is unknown: the
    # request may fit a defragmented cache while the step as a whole does not.
    need_known = ev.prior_peak is not None or ev.states is None
    if not (_fragmented(ev) and need_known) or ev.no_allocator_detail:
        return None  # a back-end without block sizes gives no evidence of fragmentation
    fix = "split" if ev.f.get("expandable_segments") else "expandable"
    return ev.result(
        Cause.FRAGMENTATION,
        [fix, "shapes"],
        say("fragmentation", requested=ev.requested, cached_free=ev.cached_free, block=block, free=ev.free),
    )


def _stranded_rule(ev: Evidence) -> Optional[Diagnosis]:
    """Bytes the failing request could have had but for a private pool (CUDA graphs of torch.compile
    mode="reduce-overhead", MemPool) holding them unallocated: memory the allocator holds that the request
    cannot use (``fragmentation``), in a private pool rather than in holes of the default pool, so the
    remedy is the graphs' memory, never expandable segments (private pools never use them). Checked
    before the model states: an eager optimizer step beside a graph pool fails this way."""
    spare = int(ev.f.get("private_pool_free_bytes") or 0)
    own = ev.cached_free + ev.free
    if ev.private < th.value("private_pool_share") * ev.total or own >= ev.requested or own + spare < ev.requested:
        return None
    return ev.result(
        Cause.FRAGMENTATION,
        ["graph_pools", "fused_optimizer" if ev.f.get("phase") == "optimizer" else "checkpointing"],
        say("stranded", requested=ev.requested, spare=spare, private=ev.private, own=own),
    )


def _graph_pool_rule(ev: Evidence) -> Optional[Diagnosis]:
    """Private pools (CUDA graphs of torch.compile mode="reduce-overhead", MemPool) holding a large
    share: their bytes serve only their graphs, so they are neither fragmentation of the default pool
    nor memory the rest of the step could use."""
    if ev.private < th.value("private_pool_share") * ev.total:
        return None
    spare = ev.f.get("private_pool_free_bytes")
    unused = say("graph_pools.unused", spare=int(spare)) if isinstance(spare, int) else ""
    return ev.result(
        Cause.ACTIVATIONS,
        ["graph_pools", "checkpointing", "batch"],
        say("graph_pools", private=ev.private, reserved=ev.reserved, unused=unused, need=ev.need, total=ev.total),
    )


def _layout_first(ev: Evidence) -> list[str]:
    """A sharded layout that keeps gathered parameters from forward to backward: resharding after
    forward comes before any activation remedy."""
    if ev.strategy == "fsdp2" and ev.layout.get("reshard_after_forward") is False:
        return ["reshard_after_forward"]
    if ev.strategy == "fsdp" and ev.layout.get("sharding") in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2"):
        return ["full_shard"]
    return []


def _fallback(ev: Evidence) -> Diagnosis:
    if not ev.training:
        return _no_training(ev)
    cats = ev.f.get("categories")
    if ev.states is None and cats is None:
        return ev.result(
            Cause.EXHAUSTION,
            ["batch", "autocast", "checkpointing", "compile"],
            say("exhaustion.no_step", total=ev.total, allocated=ev.allocated, requested=ev.requested),
        )
    states = ev.states or 0
    gathered = say("activations.gathered", gathered=ev.unsharded) if ev.unsharded else ""
    parts = f"{_frozen_part(ev)}{gathered}"
    return ev.result(
        Cause.ACTIVATIONS,
        [*_layout_first(ev), "checkpointing", "autocast", "batch", "compile"],
        say("activations.steady" if parts else "activations.steady_plain", need=ev.need, total=ev.total, states=states,
            parts=parts),
    )


def _needed(ev: Evidence) -> str:
    return say("needed", allocated=ev.allocated, requested=ev.requested, total=ev.total)


def _no_training(ev: Evidence) -> Diagnosis:
    """Out of memory in a process that has no optimizer and never stepped one."""
    needed = _needed(ev)
    if ev.states is not None and ev.f.get("phase") in ("forward", None):  # the weights are known
        recording = bool(ev.f.get("grad_enabled"))
        return ev.result(
            Cause.ACTIVATIONS,
            ["no_grad", "batch", "autocast", "compile"] if recording else ["batch", "autocast", "compile"],
            say("forward.weights", needed=needed, states=ev.states)
            + (say("forward.weights_recording") if recording else "."),
        )
    if ev.f.get("grad_enabled") and ev.f.get("phase") in ("forward", None):
        return ev.result(
            Cause.EXHAUSTION,
            ["no_grad", "batch", "autocast", "compile"],
            say("forward.recording", needed=needed),
        )
    return ev.result(
        Cause.EXHAUSTION,
        ["batch", "autocast", "checkpointing", "compile"],
        say("exhaustion.no_optimizer", needed=needed),
    )


PRECEDENCE: tuple[Row, ...] = (
    Row(
        "own_children", census_findings.own_children, "observed",
        "the job's own child processes hold the memory: no remedy inside the training process frees it",
    ),
    Row(
        "outside", _outside_rule, "counted",
        "other tenants or memory outside the allocator: no remedy inside the allocator frees it",
    ),
    Row(
        "kept_graphs", census_findings.kept_graphs, "observed",
        "outputs kept with their graphs beyond what the backwards consume, named by what holds them: the leak the "
        "counted rows below infer, seen",
    ),
    Row(
        "leak", _leak_rule, "counted",
        "memory kept from every step or forward raises everything after it; a bounded buffer the census saw vetoes it",
    ),
    Row(
        "stranded", _stranded_rule, "counted",
        "bytes held unallocated by private pools: checked before the states, which an eager step beside graphs fills",
    ),
    Row("model_states", _model_states_rule, "counted", "states that fill the capacity leave no room for any batch"),
    Row(
        "frozen_forward", _frozen_forward_rule, "counted",
        "a frozen model's forward in a training step: its own remedies, not the trained model's",
    ),
    Row(
        "evaluation", _evaluation_rule, "counted",
        "an evaluation forward's batch is its own: comparing it with the steps is no verdict",
    ),
    Row(
        "kept_tensors", census_findings.kept_tensors, "observed",
        "tensors outside the model states kept by containers, attributes or a framework, a decisive share: what "
        "would otherwise read as a step that grew",
    ),
    Row("oversized", _oversized_rule, "counted", "one request larger than half of what the process could use"),
    Row("demand", _demand_rule, "counted", "the failing step needed more than any earlier one"),
    Row("graph_pools", _graph_pool_rule, "counted", "private pools' bytes serve only their graphs"),
    Row("fragmentation", _fragmentation_rule, "counted", "enough bytes, no block large enough, a step no bigger"),
)
"""The one precedence table: the first row whose finding found something decides; the fallback (``activations``
or ``exhaustion``) where none did. docs/diagnosis.md shows it (a test keeps the two equal)."""


def precedence_markdown() -> str:
    """The precedence table as ``docs/diagnosis.md`` prints it (a test keeps the two equal)."""
    lines = ["| # | finding | knows by | why it comes before the rows below |", "| --- | --- | --- | --- |"]
    for i, row in enumerate(PRECEDENCE, 1):
        lines.append(f"| {i} | `{row.finding}` | {row.strength} | {row.why} |")
    return "\n".join(lines) + "\n"
