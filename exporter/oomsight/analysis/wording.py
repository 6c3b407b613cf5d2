"""The words of every diagnosis, apart from the deciding (issue 48).

The rules of ``analysis.diagnosis`` and ``analysis.findings`` decide a cause and its remedies and choose
which recorded facts to state; this module holds how each is said: one template per sentence or clause,
keyed by the finding that says it, filled only with the numbers and names the rule read off the event.
``{x:bytes}`` renders bytes as ``1.50 GiB`` (``unknown`` where the event has no value), ``{n:,}`` a count.
A newcomer who adds a finding adds its sentences here; ``tests/test_wording.py`` keeps every template used,
every placeholder filled, and no rule holding a sentence of its own.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

from oomsight.analysis.units import format_bytes

SENTENCES: Mapping[str, str] = {
    # -- outside: other tenants, memory outside the allocator --------------------------------------------------
    "outside.others": "Other processes hold {held:bytes} of the {total:bytes} GPU.",
    "outside.listed": (
        "NVML lists {listed} processes on this GPU and {outside:bytes} of it is used outside this process's PyTorch "
        "allocator: by the other processes (and this process's CUDA context)."
    ),
    "outside.leak": (
        "Memory outside PyTorch's allocator (NVML's memory of this process minus reserved, now {outside:bytes}) "
        "rose by {growth:bytes} step after step: a leak outside the allocator, allocations a CUDA extension makes "
        "itself or NCCL communicators (hundreds of MB each) created per step, never freed."
    ),
    "outside.unseen_pids": (
        "{outside:bytes} of the GPU is used outside this process's PyTorch allocator: by its CUDA context, NCCL and "
        "libraries, or by other processes (NVML cannot see process IDs here to tell them apart)."
    ),
    "outside.own": "{outside:bytes} of the GPU is used by this process outside PyTorch's allocator.",
    "outside.own_fits": " This job's own known need ({own:bytes}) would fit the GPU alone.",
    # -- leak: memory kept from every step ------------------------------------------------------------------------
    "leak.floor": (
        "The memory that survives between optimizer steps rose by {growth:bytes} ({slope:bytes} a step) while each "
        "step's own working memory stayed the same: something keeps tensors alive from every step."
    ),
    "leak.short": (
        "The memory that survives between optimizer steps rose by {growth:bytes} at every step since the first one "
        "while each step's own working memory stayed the same: something keeps tensors alive from every step (here "
        "so much that it ran out within a few steps)."
    ),
    "leak.legacy": (
        "The memory that survives between steps grew by {growth:bytes} step after step before the OOM: something "
        "keeps tensors alive."
    ),
    "leak.window": (
        "Within this accumulation window the memory left after each backward rose by {growth:bytes} over "
        "{backwards} backwards, by about the same each, though each backward frees its micro-batch's activations: "
        "the loop keeps something of every micro-batch until the optimizer step (outputs or logits in a list for a "
        "metric)."
    ),
    # -- piled: forwards without an optimizer step ----------------------------------------------------------------
    "piled.no_step": "with no optimizer step in this process",
    "piled.after_step": "{seconds:.0f} s after the last optimizer step",
    "piled.generation": (
        "In generation, {when}, memory rose by {growth:bytes} over the last seconds, forward after forward: the "
        "key/value cache grows with every token. Bound the new tokens or the batch."
    ),
    "piled.each_forward": "the memory left after each forward rose by {growth:bytes}, by about the same each forward",
    "piled.lowest": "even the lowest memory rose by {growth:bytes} over the last seconds",
    "piled.loop": (
        "In a loop of forwards {when} (evaluation, inference), {rose}: something keeps tensors from every batch"
    ),
    "piled.with_graphs": ", with their autograd graphs (autograd is recording).",
    # -- model states ---------------------------------------------------------------------------------------------
    "states.no_optimizer": (
        "The model's weights alone need {states:bytes} of the {total:bytes} capacity (no optimizer in this process; "
        "the OOM came at {allocated:bytes} allocated): a smaller batch cannot make room."
    ),
    "states.in_step": (
        "The OOM came inside optimizer.step(), where activations are already freed: parameters, gradients and "
        "optimizer state ({states:bytes}) and the optimizer's own temporaries did not fit in the {total:bytes} "
        "capacity ({allocated:bytes} allocated, {requested:bytes} requested)."
    ),
    "states.fill": (
        "Parameters, gradients and optimizer state need {states:bytes} of the {total:bytes} capacity{gathered} (the "
        "OOM came{where} at {allocated:bytes} allocated){frozen}: no batch size or activation remedy can make room."
    ),
    "states.gathered": ", {gathered:bytes} of them all-gathered parameters",
    "states.where_step": " in optimizer.step()",
    "states.frozen": (
        "Frozen weights{modules} take {frozen:bytes} of the {states:bytes} of parameters, gradients and optimizer "
        "state, against a {total:bytes} capacity (the OOM came at {allocated:bytes} allocated): no activation remedy "
        "makes room for weights; shrink or move the frozen model."
    ),
    "frozen.modules": " ({names})",
    "frozen.part": "; {frozen:bytes} of the parameters are frozen{modules}",
    "frozen.untrained": ", yet {grads:bytes} of gradients were computed for parameters no optimizer trains",
    # -- forwards that are not the trained model's step -----------------------------------------------------------
    "needed": "{allocated:bytes} allocated and {requested:bytes} more requested of {total:bytes}",
    "frozen_forward": (
        "The OOM came in the forward of a frozen model (no trainable parameter: a teacher, reference or reward "
        "model) inside a training step: {needed}"
    ),
    "frozen_forward.recording": (
        ", with autograd recording, so its activations are kept for a backward that gives it nothing."
    ),
    "frozen_forward.weights": " Frozen weights{modules}: {frozen:bytes}.",
    "evaluation": "An evaluation forward (the model is in eval mode) does not fit: {needed}",
    "evaluation.recording": ", with autograd recording, so every activation is kept for a backward that never comes.",
    "evaluation.own_batch": "; an evaluation batch needs its own size, not the training batch's.",
    "forward.weights": (
        "A forward does not fit: {needed}, of which the weights are {states:bytes} and the forward's activations and "
        "temporaries the rest"
    ),
    "forward.weights_recording": (
        "; autograd was recording, in a process with no optimizer, so every activation is kept for a backward that "
        "may never come."
    ),
    "forward.recording": (
        "A forward needs more than the capacity ({needed}) with autograd recording, in a process that has no "
        "optimizer: if nothing here is trained (inference, evaluation), every activation is kept for a backward "
        "that never comes."
    ),
    # -- one request ----------------------------------------------------------------------------------------------
    "oversized": (
        "One request of {requested:bytes} is more than half of the {usable:bytes} this process could use (reserved "
        "plus free)."
    ),
    "huge_activation": (
        "One tensor of {requested:bytes}, more than half of the {usable:bytes} this process could use (reserved plus "
        "free), was asked for inside the model's forward: an activation, whose size follows the batch and the "
        "sequence length."
    ),
    # -- demand: the failing step needed more ---------------------------------------------------------------------
    "demand.forwards": (
        "Forwards ran for seconds at up to {earlier:bytes} (sampled), then one needed {need:bytes} ({allocated:bytes} "
        "allocated plus {requested:bytes} requested): more than any forward before it{input}."
    ),
    "demand.step": (
        "The failing step needed at least {need:bytes} ({allocated:bytes} allocated plus {requested:bytes} "
        "requested), {own:bytes} of it on top of what survives between steps, against at most {prior:bytes} in any "
        "earlier step (earlier peaks up to {peak:bytes})"
    ),
    "demand.rose": (
        "; the steps' own memory rose from {first:bytes} to {last:bytes} through the step rows while what survives "
        "between steps did not explain it"
    ),
    "demand.routing": (
        ", at the same input ({elements:,} elements a forward) in a model with experts ({experts:bytes} of expert "
        "parameters): the routing grew it, more tokens sent to one expert. Defragmenting cannot help; bound what one "
        "expert takes."
    ),
    "demand.input_rose": ": its input grew from {first:,} to {last:,} elements a forward",
    "demand.same_input": (
        ": at the same input ({elements:,} elements a forward, no more than the earlier steps took), what the step "
        "computes or keeps grew"
    ),
    "demand.maybe_routed": (
        "; in a mixture-of-experts model more tokens routed to one expert grow it too, and these facts cannot tell "
        "the two apart"
    ),
    "demand.end": ". Defragmenting cannot help; bound what one forward takes in, or keep less of each step.",
    "input.recorded": " (the largest input one forward took in since the last step row: {elements:,} elements)",
    "input.unrecorded": (
        " (what one forward took in is not recorded: a larger batch or a longer sequence would raise it so)"
    ),
    "kept.pending": (
        " {pending} forwards have kept their graphs since the last backward; this job's backwards consumed "
        "{between} together: a longer episode, window or accumulation keeps more"
    ),
    "kept.between": "between {least} and {most}",
    "kept.holder": "; {holder}",
    # -- the allocator's blocks and pools -------------------------------------------------------------------------
    "fragmentation": (
        "{requested:bytes} were requested while {cached_free:bytes} sat reserved but unallocated (largest free block "
        "{block:bytes}) and {free:bytes} were free, and the step needed no more than earlier steps did: enough bytes, "
        "no block large enough."
    ),
    "stranded": (
        "{requested:bytes} were requested while {spare:bytes} sat unallocated in private pools (CUDA graphs, MemPool; "
        "{private:bytes} reserved there) and only {own:bytes} were free or cached for everything else: the bytes "
        "existed, held by the graphs' pools, which lend nothing to other allocations (not holes in the default pool: "
        "expandable segments cannot help)."
    ),
    "graph_pools": (
        "{private:bytes} of the {reserved:bytes} reserved sit in private pools (CUDA graphs, MemPool){unused}: only "
        "their own graphs can use them, and the rest of the step needed {need:bytes} of {total:bytes}. Not "
        "fragmentation of the default pool."
    ),
    "graph_pools.unused": ", {spare:bytes} of it unallocated",
    # -- the fallbacks --------------------------------------------------------------------------------------------
    "exhaustion.no_step": (
        "The job needs more than the {total:bytes} capacity: {allocated:bytes} allocated and {requested:bytes} more "
        "requested (no optimizer step was seen, so memory by category is unknown)."
    ),
    "exhaustion.no_optimizer": (
        "The job needs more than the capacity: {needed} (no optimizer exists, so memory by category is unknown)."
    ),
    "activations.steady": (
        "A steady step does not fit: {need:bytes} needed of {total:bytes}, of which parameters, gradients and "
        "optimizer state are {states:bytes}{parts}, and activations and temporaries the rest."
    ),
    "activations.steady_plain": (
        "A steady step does not fit: {need:bytes} needed of {total:bytes}, of which parameters, gradients and "
        "optimizer state are {states:bytes} and activations and temporaries the rest."
    ),
    "activations.gathered": ", all-gathered parameters {gathered:bytes}",
    # -- what every diagnosis adds --------------------------------------------------------------------------------
    "in_use": " Already in use: {used}.",
    "no_allocator_detail": (
        " The {backend} allocator gives no block sizes, split or retry counts (and no OOM observer: captured from "
        "the exception), so fragmentation cannot be seen."
    ),
    # -- the census (analysis.findings) ---------------------------------------------------------------------------
    "census.graph_tensors": "{n} tensor{s} with an autograd graph",
    "census.detached_tensors": "{n} detached tensor{s}",
    "census.holder": "{container}{name}{where} holds {what}, {bytes:bytes}",
    "census.own_children": (
        "{count} of this job's own child processes hold {held:bytes} of the {total:bytes} GPU: {names}. They descend "
        "from this process (DataLoader workers or helpers that opened CUDA), not another tenant."
    ),
    "census.kept_graphs": (
        "{pending} forwards recorded an autograd graph since a backward last consumed one, and {consumed}; {holder}. "
        "Each kept output holds its forward's activations through its graph.{rise}"
    ),
    "census.most_consumed": "the most one backward consumed together is {most}",
    "census.none_consumed": "no backward consumed any",
    "census.rise_each_forward": (
        " The memory left after each forward rose by {growth:bytes}, by about the same each forward."
    ),
    "census.rise_lowest": " Even the lowest memory rose by {growth:bytes} over the last seconds.",
    "census.rise_floor": " The memory left between optimizer steps rose by {growth:bytes}.",
    "census.kept_tensors": (
        "Outside the parameters, gradients and optimizer state, {held:bytes} of the {total:bytes} capacity is held by "
        "what the job keeps: {said}. The OOM came at {allocated:bytes} allocated with {requested:bytes} requested."
    ),
}
"""Every template a diagnosis says, by key: ``<finding>`` or ``<finding>.<clause>``."""


class _Formatter(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        if format_spec == "bytes":
            return "unknown" if value is None else format_bytes(value)
        return str(super().format_field(value, format_spec))


_FORMATTER = _Formatter()


def say(key: str, **values: Any) -> str:
    """The template ``key`` filled with ``values`` (a missing key or value raises: a finding that raises is skipped
    and named by ``diagnosis.findings``, and the tests fill every template)."""
    return _FORMATTER.format(SENTENCES[key], **values)


def placeholders(key: str) -> list[str]:
    """The names a template asks for, in order (the tests fill each)."""
    return [name for _text, name, _spec, _conv in _FORMATTER.parse(SENTENCES[key]) if name]
