"""Findings read off the census at the OOM (wire 1.11, ``hook.census``): what the job's own objects show holds
the bytes. Each evaluator takes the :class:`~oomsight.analysis.evidence.Evidence` of one OOM and returns a
diagnosis or None; ``analysis.diagnosis`` puts them in its precedence table beside the findings read off the
allocator's counters and the step rows. Every sentence states what the census recorded: a count, the bytes, the
name by which the job reaches the holder. An event without a census (older writers, a census cut short before it
saw holders) gives none of these findings, and the counters decide as before."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from oomsight.analysis import thresholds as th
from oomsight.analysis import trend
from oomsight.analysis.evidence import Cause, Evidence
from oomsight.analysis.wording import say
from oomsight.wire.schema import Diagnosis

UNBOUNDED = ("list", "dict", "tuple", "set", "attribute")
"""Holders that may keep growing (a ``deque`` with a ``maxlen`` cannot; a key/value cache is generation's own)."""


def holders(ev: Evidence) -> list[Mapping[str, Any]]:
    """The census's holders that the job reaches by a name (a local, a global, a model's module path): one reached
    by none, or only by its class (a ``WeakKeyDictionary`` inside torch's checkpointing), is nothing the job's code
    names and nothing a sentence can point it to."""
    census = ev.f.get("census") or {}
    return named(census.get("holders") if isinstance(census, Mapping) else None)


def named(found: Any) -> list[Mapping[str, Any]]:
    """Of a census's holders, those the job reaches by a name (:func:`holders`)."""
    return [
        h
        for h in found or []
        if isinstance(h, Mapping)
        and not str(h.get("name", "")).startswith("an unnamed")
        and h.get("reached_by") not in ("class", "none")
    ]


def says(h: Mapping[str, Any]) -> str:
    n_graph, n_det = int(h.get("graph_tensors") or 0), int(h.get("detached_tensors") or 0)
    what = []
    if n_graph:
        what.append(say("census.graph_tensors", n=n_graph, s="s" if n_graph != 1 else ""))
    if n_det:
        what.append(say("census.detached_tensors", n=n_det, s="s" if n_det != 1 else ""))
    where = f" ({h.get('framework')})" if h.get("framework") else ""
    kind = h.get("kind")
    container = f"the {kind} " if kind not in ("attribute", None) else "the attribute "
    return say(
        "census.holder", container=container, name=h.get("name"), where=where, what=" and ".join(what),
        bytes=int(h.get("bytes") or 0),
    )


def own_children(ev: Evidence) -> Optional[Diagnosis]:
    """The GPU's other processes include this job's own children (DataLoader workers that opened CUDA, helpers it
    started), holding a decisive share: the process tree says whose they are."""
    census = ev.f.get("census") or {}
    procs = census.get("processes") if isinstance(census, Mapping) else None
    if not isinstance(procs, Mapping) or not procs.get("split"):
        return None
    children = [p for p in procs.get("children") or [] if isinstance(p, Mapping)]
    held = sum(max(int(p.get("bytes") or 0), 0) for p in children)
    if not children or held < th.value("decisive_share") * ev.total:
        return None
    names = ", ".join(f"{p.get('name') or '?'} (pid {p.get('pid')})" for p in children[:4])
    ev.facts["child_processes_bytes"] = held
    return ev.result(
        Cause.OTHER_PROCESS,
        ["worker_cuda", "other_process"],
        say("census.own_children", count=len(children), held=held, total=ev.total, names=names),
    )


def kept_graphs(ev: Evidence) -> Optional[Diagnosis]:
    """Tensors with an autograd graph kept by a container or attribute beyond what this job's backwards consume:
    the forwards since a backward last consumed one go beyond ``pile_consumed_multiple`` times the most one
    backward took (``trend.unconsumed``), and the census names what holds their outputs."""
    held = [h for h in holders(ev) if int(h.get("graph_tensors") or 0) > 0 and h.get("kind") in UNBOUNDED]
    if not held or not _beyond_consumed(ev):
        return None
    rose = ev.forward_pile or ev.piled or ev.trend.leak or ev.short_leak
    if not rose and sum(int(h.get("bytes") or 0) for h in held) < th.value("kept_share") * ev.total:
        return None  # graphs kept, but no memory rose with them: named in the facts, not blamed
    top = held[0]
    ev.facts["held_by"] = top.get("name")
    ev.facts["held_graph_tensors"] = int(top.get("graph_tensors") or 0)
    pending, most = ev.pending, ev.consumed
    consumed = say("census.most_consumed", most=most) if most is not None else say("census.none_consumed")
    recording = bool(ev.f.get("grad_enabled"))
    # where the forward trains nothing (no optimizer, no backward ever) autograd itself is the waste: no_grad first
    keys = ["no_grad", "detach_kept", "leak"] if recording and ev.trains_nothing else ["detach_kept", "leak"]
    keys += ["no_grad"] if recording and not ev.trains_nothing else []
    return ev.result(
        Cause.LEAK,
        keys,
        say("census.kept_graphs", pending=pending, consumed=consumed, holder=says(top), rise=_rise(ev)),
    )


def _rise(ev: Evidence) -> str:
    """The memory rise the counters recorded beside what the census saw holding it."""
    if ev.forward_pile:
        return say("census.rise_each_forward", growth=ev.forward_pile)
    if ev.piled:
        return say("census.rise_lowest", growth=ev.piled)
    if ev.trend.leak:
        return say("census.rise_floor", growth=ev.trend.floor_growth_bytes)
    return ""


def _beyond_consumed(ev: Evidence) -> bool:
    pending, most = ev.pending, ev.consumed
    if pending is None:
        return False
    least = ev.f.get("least_forwards_per_backward")
    return trend.unconsumed(pending, most, ev.training, ev.f.get("module_training"), least)


def kept_tensors(ev: Evidence) -> Optional[Diagnosis]:
    """Tensors outside the model states held by containers, module attributes or a framework's buffer, at least
    ``kept_share`` of the capacity: what they hold is memory the failing allocation lacks. A bounded ``deque``,
    a key/value cache and copies of parameters (EMA, snapshots) are not counted; a single tensor kept as an
    attribute counts where it carries a graph, a framework keeps it, or memory rose as it grew."""
    counted = [h for h in holders(ev) if _kept(ev, h)]
    held = sum(int(h.get("bytes") or 0) for h in counted)
    if not counted or held < th.value("kept_share") * ev.total:
        return None
    graphs = any(int(h.get("graph_tensors") or 0) for h in counted)
    framework = next((h.get("framework") for h in counted if h.get("framework")), None)
    ev.facts["held_by"] = counted[0].get("name")
    ev.facts["held_bytes"] = held
    keys = ["detach_kept"] if graphs else []
    if framework == "transformers" and not graphs:
        keys.append("eval_accumulation")
    keys += ["kept_outputs", "leak"]
    said = "; ".join(says(h) for h in counted[:3])
    return ev.result(
        Cause.LEAK,
        keys,
        say(
            "census.kept_tensors", held=held, total=ev.total, said=said, allocated=ev.allocated,
            requested=ev.requested,
        ),
    )


def _kept(ev: Evidence, h: Mapping[str, Any]) -> bool:
    if h.get("kind") not in UNBOUNDED or h.get("parameter_copies"):
        return False
    if h.get("kind") != "attribute":
        return True
    return bool(int(h.get("graph_tensors") or 0) or h.get("framework") or ev.piled or ev.trend.leak)


def bounded_growth(ev: Evidence, growth: Optional[int]) -> Optional[Mapping[str, Any]]:
    """A bounded buffer the census of this OOM saw that explains ``growth``, the rise a leak rule read
    (:func:`bounded_holder`)."""
    return bounded_holder(holders(ev), growth)


def bounded_holder(found: list[Mapping[str, Any]], growth: Optional[int]) -> Optional[Mapping[str, Any]]:
    """Of the named holders ``found``, a bounded buffer (a ``deque`` with ``maxlen``) that holds at least half of
    ``growth``: filling it raised the floor, and it stops at its cap. The OOM's diagnosis and the hook's leak scan
    both read it."""
    if not growth:
        return None
    for h in found:
        if h.get("cap") is not None and int(h.get("bytes") or 0) >= growth / 2:
            return h
    return None
