"""The job ``oomsight predict`` is asked about: one frozen ``PredictJob``, built once from the flags by
``job_from_args`` with every flag checked on the way (issue 52).

What is wrong is one line in an ``InputError`` (the command exits 2), said before torch or transformers
is imported: sizes need a unit, ``--seq-len`` and ``--generate`` within what the predictor traces, a flag
that does not apply to the job refused in words. What the checks parse (``--capacity``'s bytes, ``--gpu``'s
card, ``--lora``'s rank and targets, ``--generate``'s token counts) is kept on the job, so nothing
downstream parses a flag again. The checks of what only the model can tell (a configuration's keys, its
positions, LoRA's targets, ``--module``'s spec) are ``inputs``'; they run when the spec is built
(``spec``).
"""

from __future__ import annotations

import argparse
import difflib
import os
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Callable, Optional, TypeVar

from oomsight.predict import inputs
from oomsight.predict.gpu import Gpu
from oomsight.predict.inputs import InputError

if TYPE_CHECKING:
    from oomsight.predict.parallel import Layout

Parsed = TypeVar("Parsed")

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""``--dtype``, ``--autocast`` and ``--mixed-precision`` values -> torch's dtype names."""


@dataclass(frozen=True)
class PredictJob:
    """A training step (or ``--generate``'s inference) to predict, as the flags of ``oomsight predict`` give
    it (their defaults are the parser's, ``tools/predict_command.py``), then what the checks parse out of
    them."""

    model: Optional[str]
    """``--model``: a named model, a transformers config folder or config.json, or ``TYPE:KEY=VALUE,...``
    (a Hub id found in the local cache becomes its config.json); None with ``--module``."""
    module: Optional[str]
    """``--module FILE.py:NAME``: a function of the user's file returning the model spec."""
    batch: int
    """``--batch``: samples per (micro-)batch."""
    autocast: Optional[str]
    """``--autocast``: ``bf16`` or ``fp16``, torch.autocast('cuda')'s dtype; None: no autocast."""
    accumulation: int
    """``--accumulation``: micro-batches per optimizer step."""
    keep_outputs: bool
    """``--keep-outputs``: the loop keeps the outputs until the next forward returns."""
    optimizer: str
    """``--optimizer``: ``adamw``, ``sgd`` or ``adamw8bit``."""
    optimizer_impl: Optional[str]
    """``--optimizer-impl``: ``foreach``, ``fused`` or ``for-loop``; None: CUDA's default (foreach)."""
    dtype: Optional[str]
    """``--dtype``: the parameters' dtype (a key of ``DTYPES``); None: as built."""
    seq_len: Optional[int]
    """``--seq-len``: tokens per sample of a transformers configuration; None: its default."""
    lora: Optional[str]
    """``--lora RANK[:MODULE,...]`` as given (parsed: ``lora_rank``, ``lora_targets``)."""
    quantize: Optional[str]
    """``--quantize``: ``4bit``, ``4bit-double`` or ``8bit``, the frozen base as bitsandbytes stores it."""
    prepare_kbit: bool
    """``--prepare-kbit``: PEFT's prepare_model_for_kbit_training after ``--quantize``."""
    gpu: Optional[str]
    """``--gpu``: a card's name as given (parsed: ``gpu_spec``)."""
    generate: Optional[str]
    """``--generate PROMPT:NEW`` as given (parsed: ``prompt_tokens``, ``new_tokens``)."""
    cache: Optional[str]
    """``--cache``: ``dynamic`` or ``static``; ``dynamic`` once checked with ``--generate``."""
    world_size: int
    """``--world-size``: ranks (GPUs) of the job."""
    parallel: Optional[str]
    """``--parallel``: ddp, fsdp, fsdp2, zero1, zero2 or zero3; None: one GPU."""
    shard_size: Optional[int]
    """``--shard-size``: ranks per shard group of hybrid sharding; None: all of them."""
    no_reshard: bool
    """``--no-reshard``: fsdp/fsdp2 keep units gathered after forward."""
    offload: Optional[str]
    """``--offload``: ``optimizer`` or ``params`` to the host."""
    bucket_view: bool
    """``--bucket-view``: ddp's gradient_as_bucket_view=True."""
    mixed_precision: Optional[str]
    """``--mixed-precision``: ``bf16`` or ``fp16``, FSDP's parameter dtype."""
    checkpointing: bool
    """``--checkpointing``: activation checkpointing of every block of a transformers configuration."""
    largest_batch: bool
    """``--largest-batch``: search the largest (micro-)batch."""
    gpus_needed: bool
    """``--gpus-needed``: the fewest GPUs that fit."""
    steps: int
    """``--steps``: training steps traced, 1 to 20."""
    capacity: Optional[str]
    """``--capacity`` as given, e.g. ``80GiB`` (parsed: ``capacity_bytes``)."""
    margin: float
    """``--margin``: share of the capacity kept free, 0 to 0.5."""
    expandable_segments: bool
    """``--expandable-segments``: the allocator modelled with expandable_segments:True."""
    capacity_bytes: Optional[int] = None
    """``--capacity`` in bytes, else ``--gpu``'s whole memory, else None (no search, no verdict)."""
    gpu_spec: Optional[Gpu] = None
    """``--gpu``'s card from the catalogue (``gpu.GPUS``)."""
    lora_rank: int = 0
    """``--lora``'s rank; 0 without ``--lora``."""
    lora_targets: tuple[str, ...] = ()
    """``--lora``'s target modules (``inputs.DEFAULT_TARGETS`` where none are named)."""
    prompt_tokens: int = 0
    """``--generate``'s prompt length in tokens; 0 without ``--generate``."""
    new_tokens: int = 0
    """``--generate``'s new tokens; 0 without ``--generate``."""


PARSED = ("capacity_bytes", "gpu_spec", "lora_rank", "lora_targets", "prompt_tokens", "new_tokens")
"""The fields the checks fill; every other field is a flag of the same name."""
FLAGS = tuple(f.name for f in fields(PredictJob) if f.name not in PARSED)


def job_from_args(ns: argparse.Namespace) -> PredictJob:
    """The job the parsed flags describe, checked in the order the user reads the flags' errors: the
    counts, the capacity, the model's form, the token lengths, the flags that do not apply, then the
    job's own (optimizer, adapters, GPU, several GPUs). ``InputError``: what is wrong, in one line."""
    job = PredictJob(**{name: getattr(ns, name) for name in FLAGS})
    for step in (_counted, _model_found, _lengths, _applying, _optimizer_and_adapters, _gpu_and_ranks):
        job = step(job)
    return job


def _counted(job: PredictJob) -> PredictJob:
    """The counts and ``--margin`` within bounds; ``--capacity`` in bytes."""
    if job.batch < 1 or job.accumulation < 1 or not 1 <= job.steps <= 20:
        raise InputError("--batch and --accumulation must be at least 1, --steps 1 to 20")
    if not 0.0 <= job.margin < 0.5:
        raise InputError("--margin must be between 0 and 0.5")
    if job.capacity is None:
        return job
    return replace(job, capacity_bytes=_parsed(inputs.parse_bytes, job.capacity, "--capacity: "))


def _parsed(parse: Callable[[str], Parsed], text: str, flag: str = "") -> Parsed:
    """``parse(text)``; its ``ValueError`` an ``InputError`` (``flag``: the words said before it)."""
    try:
        return parse(text)
    except ValueError as exc:
        raise InputError(f"{flag}{exc}") from None


def _model_found(job: PredictJob) -> PredictJob:
    """``--model``'s form, before torch or transformers is imported (a wrong name took 14-33 s, the whole
    transformers import, to be refused): a named model, an existing path, ``TYPE:...``, or a Hub id found in
    the local Hugging Face cache (then the job's model is its config.json); anything else refused."""
    found = model_found(job.model)
    return job if found == job.model else replace(job, model=found)


def model_found(name: Optional[str]) -> Optional[str]:
    """``--model NAME`` as the predictor reads it (a cached Hub id: its config.json), or ``InputError``."""
    if not name or name in inputs.NAMED_MODELS or ":" in name or os.path.exists(name):
        return name
    if inputs.HUB_ID.match(name):
        cached = inputs.hub_cached_config(name)
        if cached:
            return cached
        raise InputError(
            f"--model {name}: not in the local Hugging Face cache, and predict downloads nothing; save its "
            f"configuration once (AutoConfig.from_pretrained('{name}').save_pretrained('DIR')) and give --model DIR: "
            "a local folder holding config.json works"
        )
    if name.endswith(".json") or os.sep in name or name.startswith((".", "~")):
        raise InputError(f"--model {name}: no such file or folder (give {inputs.MODEL_FORMS})")
    close = difflib.get_close_matches(name, inputs.NAMED_MODELS, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise InputError(f"--model {name}: no model of that name ({hint}give {inputs.MODEL_FORMS})")


def _lengths(job: PredictJob) -> PredictJob:
    """``--seq-len`` and ``--generate`` within the bounds the predictor can trace."""
    if job.seq_len is not None and job.seq_len < 1:
        raise InputError("--seq-len must be at least 1")
    if job.seq_len is not None and job.seq_len > inputs.MAX_TOKENS:
        raise InputError(
            f"--seq-len {job.seq_len:,} is past the {inputs.MAX_TOKENS:,} tokens per sample the predictor takes"
        )
    if not job.generate:
        return job
    prompt, new = _parsed(inputs.parse_generate, job.generate)
    if prompt > inputs.MAX_TOKENS:
        raise InputError(f"--generate {job.generate}: a prompt past {inputs.MAX_TOKENS:,} tokens is not predicted")
    if new > inputs.MAX_NEW_TOKENS:
        raise InputError(
            f"--generate {job.generate}: at most {inputs.MAX_NEW_TOKENS:,} new tokens (each is one traced forward, "
            f"{new:,} would take hours on a CPU); the cache at any length is in docs/prediction.md"
        )
    return replace(job, prompt_tokens=prompt, new_tokens=new)


def _applying(job: PredictJob) -> PredictJob:
    """A flag given where it changes nothing, said in words (it was ignored silently before)."""
    where = {
        "cache": (job.generate, "--cache applies to --generate (the key/value cache of inference)"),
        "seq_len": (not job.generate, "--seq-len does not apply with --generate: its PROMPT is the tokens"),
        "keep_outputs": (not job.generate, "--keep-outputs applies to a training step, not --generate"),
        "optimizer_impl": (not job.generate, "--optimizer-impl applies to a training step, not --generate"),
        "shard_size": (job.parallel, "--shard-size (hybrid sharding) applies to --parallel fsdp or fsdp2"),
        "no_reshard": (job.parallel, "--no-reshard applies to --parallel fsdp or fsdp2"),
        "offload": (job.parallel, "--offload applies to --parallel fsdp, fsdp2 or zero1-3"),
        "bucket_view": (job.parallel, "--bucket-view applies to --parallel ddp"),
        "mixed_precision": (
            job.parallel == "fsdp2" or (job.parallel == "fsdp" and not job.offload),
            "--mixed-precision applies to --parallel fsdp2 or fsdp (not fsdp with --offload)",
        ),
        "checkpointing": (job.model, "--checkpointing applies to a transformers configuration (--model)"),
        "prepare_kbit": (
            job.model and job.lora and job.quantize and not job.generate,
            "--prepare-kbit applies to a QLoRA job: --model, --quantize and --lora (it freezes every "
            "parameter but the adapters), not --generate",
        ),
    }
    for name, (applies, words) in where.items():
        if getattr(job, name) not in (None, False) and not applies:
            raise InputError(words)
    return replace(job, cache="dynamic") if job.generate and job.cache is None else job


def _optimizer_and_adapters(job: PredictJob) -> PredictJob:
    """``--optimizer-impl`` against ``--optimizer``, what ``--generate`` cannot take, ``--lora`` parsed."""
    from oomsight.predict import optimizer

    wrong_impl = optimizer.check(job.optimizer, job.optimizer_impl)
    if wrong_impl:
        raise InputError(wrong_impl)
    if job.generate and (job.lora or job.quantize == "8bit" or job.parallel):
        raise InputError("--generate takes neither --lora, --quantize 8bit nor --parallel (one GPU, inference)")
    if not job.lora:
        return job
    rank, targets = _parsed(inputs.parse_lora, job.lora)
    return replace(job, lora_rank=rank, lora_targets=targets)


def _gpu_and_ranks(job: PredictJob) -> PredictJob:
    """``--gpu`` from the catalogue (its memory the capacity where none is given), then the searches and the
    layout of several GPUs (torch is imported only here, and only with ``--parallel``)."""
    from oomsight.predict import gpu

    if job.gpu:
        try:
            card = gpu.get(job.gpu)
        except KeyError as exc:
            raise InputError(str(exc.args[0])) from None
        job = replace(
            job, gpu_spec=card, capacity_bytes=card.total_bytes if job.capacity is None else job.capacity_bytes
        )
    if job.largest_batch and not (job.gpu or job.capacity):
        raise InputError("--largest-batch needs --gpu or --capacity")
    if job.gpus_needed and not ((job.gpu or job.capacity) and job.parallel):
        raise InputError("--gpus-needed needs --parallel and --gpu or --capacity")
    if job.world_size > 1 and not job.parallel:
        raise InputError("--world-size above 1 needs --parallel ddp|fsdp|fsdp2|zero1|zero2|zero3")
    if job.parallel:
        from oomsight.predict import parallel

        problem = parallel.check(layout(job))
        if problem:
            raise InputError(problem)
    return job


def layout(job: PredictJob) -> Layout:
    """How the job's ranks share the model (``parallel.Layout``)."""
    from oomsight.predict import parallel

    assert job.parallel is not None, "a layout is of a job with --parallel"
    return parallel.Layout(
        job.world_size, job.parallel, not job.no_reshard, job.offload, job.bucket_view, job.shard_size
    )
