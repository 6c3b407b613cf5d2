"""``oomsight predict``: the peak memory of a training step, and the largest batch, before launch.

    oomsight predict --model gpt2 --batch 8 --autocast bf16 --capacity 40GiB
    oomsight predict --module my_model.py:spec --batch 32 --json
    oomsight predict --model llama:hidden_size=4096,num_hidden_layers=32 --dtype bf16 --lora 16 --gpu A100-80GB

``--model`` names one of ``oomsight.predict.models`` or a ``transformers`` configuration
(``hfmodel``: a folder, a config.json, ``TYPE:KEY=VALUE,...``); ``--module FILE:NAME`` loads a
function of the user's file that returns ``{"build": () -> nn.Module, "batch": (n, device) ->
inputs}`` (and optionally ``"optimizer"``: params -> Optimizer, ``"step"``: (model, batch,
optimizer) -> None). Nothing is downloaded and no GPU is used.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import sys
import traceback
from typing import Any, NoReturn, Optional

from oomsight.analysis.units import format_bytes
from oomsight.predict import inputs, optimizer
from oomsight.predict.predictor import DEFAULT_MARGIN
from oomsight.tools import exitcode

EXAMPLE = (
    "examples:\n  oomsight predict --model gpt2 --batch 8 --autocast bf16 --capacity 40GiB\n"
    "  oomsight predict --module my_model.py:spec --batch 32 --json\n"
    "  oomsight predict --model llama:hidden_size=2048,num_hidden_layers=16 --dtype bf16 --seq-len 2048\n"
    "  oomsight predict --model ./Llama-2-7b/config.json --dtype bf16 --lora 16 --quantize 4bit --gpu L4\n"
    "  oomsight predict --model llama --world-size 8 --parallel fsdp2 --gpu H100 --gpus-needed"
)
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
UNITS = inputs.UNITS
CATEGORY_ORDER = ("parameters", "buffers", "gradients", "optimizer_state", "activations", "temporaries", "workspace")
"""The categories of a prediction in the order of a training step's life: what the model holds,
then what backward and the optimizer add, then what a step makes and frees; every one shown,
a category at 0 too (GPT-2's gradients are freed before its peak: 0 says so, a gap would not)."""
DATA_DEPENDENT = ("_local_scalar_dense", "DataDependentOutputException", "data-dependent")
"""Signs that the step read a tensor's value (``.item()``, ``.tolist()``, ``if tensor:``)."""


def add(sub: Any) -> None:
    """Register the subcommand on the ``oomsight`` parser."""
    p = sub.add_parser(
        "predict",
        help="predict a training step's peak GPU memory and the largest batch, on the CPU",
        description="Predict a training step's peak GPU memory and the largest batch that fits, on the CPU.",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--model",
        help="a named model (see --list), a transformers config folder or config.json, "
        "or TYPE:KEY=VALUE,... (e.g. llama:hidden_size=2048,num_hidden_layers=16)",
    )
    what.add_argument("--module", help="FILE.py:NAME, a function returning the model spec (docs/prediction.md)")
    what.add_argument("--list", action="store_true", help="list the named models")
    p.add_argument("--batch", type=int, default=8, help="batch size (micro-batch with --accumulation; default 8)")
    p.add_argument("--autocast", choices=("bf16", "fp16"), default=None, help="torch.autocast('cuda') dtype")
    p.add_argument("--accumulation", type=int, default=1, help="micro-batches per optimizer step (default 1)")
    p.add_argument("--keep-outputs", action="store_true", help="the loop keeps outputs = model(**batch) until "
                   "the next forward returns, as a hand-written loop does; a Trainer drops them")  # fmt: skip
    p.add_argument("--optimizer", choices=("adamw", "sgd", "adamw8bit"), default="adamw",
                   help="default adamw; adamw8bit: bitsandbytes' 8-bit state")  # fmt: skip
    p.add_argument("--optimizer-impl", choices=optimizer.IMPLEMENTATIONS, default=None,
                   help="torch's implementation (its foreach=/fused= arguments): foreach (CUDA's default: "
                   "list-wide temporaries), fused (none), for-loop (one parameter's at a time)")  # fmt: skip
    p.add_argument("--dtype", choices=tuple(DTYPES), default=None, help="the parameters' dtype (default as built)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sample of a transformers config")
    p.add_argument("--lora", default=None, help="RANK[:MODULE,...]: LoRA adapters (PEFT's where installed)")
    p.add_argument("--quantize", choices=("4bit", "4bit-double", "8bit"), default=None,
                   help="the frozen base's linear layers stored as bitsandbytes stores them")  # fmt: skip
    p.add_argument("--prepare-kbit", action="store_true", help="PEFT's prepare_model_for_kbit_training after "
                   "--quantize, as TRL applies it: 16-bit parameters cast to fp32, checkpointing as transformers "
                   "defaults it, the embeddings' output requiring grad")  # fmt: skip
    p.add_argument("--gpu", default=None, help="A100-40GB, A100-80GB, H100, H200, L4, L40S, B200, ...: "
                   "capacity (less CUDA context and NCCL) and compute capability")  # fmt: skip
    p.add_argument("--generate", default=None, help="PROMPT:NEW: inference with a key/value cache, "
                   "prefill and one forward per new token (a transformers configuration)")  # fmt: skip
    p.add_argument("--cache", choices=("dynamic", "static"), default=None, help="--generate's cache (default dynamic)")
    _add_parallel_arguments(p)
    p.add_argument("--steps", type=int, default=3, help="training steps traced (default 3)")
    p.add_argument("--capacity", default=None, help="memory the process may use, e.g. 80GiB: search the largest batch")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                   help=f"share of --capacity kept free (default {DEFAULT_MARGIN:.2f})")  # fmt: skip
    p.add_argument("--expandable-segments", action="store_true", help="model expandable_segments:True")
    p.add_argument("--json", action="store_true", help="print JSON instead of prose")
    p.set_defaults(handler=run)
    _one_line_errors(p)


def _one_line_errors(p: argparse.ArgumentParser) -> None:
    """predict's own parser says what is wrong in one line (exit 2), not the usage's 16: ``--capacity -5GiB``
    reaches ``parse_bytes`` as a value (argparse took it for an unknown option), and argparse's own errors
    (a flag without its value, a choice not offered) are one line naming ``--help``."""
    if hasattr(p, "_negative_number_matcher"):  # argparse's test of a value that starts with '-'
        p._negative_number_matcher = inputs.NEGATIVE_SIZE

    def error(message: str) -> NoReturn:
        p.exit(exitcode.USAGE, f"oomsight predict: {message} (oomsight predict --help lists the flags)\n")

    p.error = error  # type: ignore[method-assign]


def _add_parallel_arguments(p: Any) -> None:
    """The multi-GPU flags (``predict/parallel.py`` computes their per-rank peak)."""
    p.add_argument("--world-size", type=int, default=1, help="ranks (GPUs) the job runs on (default 1)")
    p.add_argument("--parallel", choices=("ddp", "fsdp", "fsdp2", "zero1", "zero2", "zero3"), default=None,
                   help="how the ranks share the model (needed with --world-size > 1)")  # fmt: skip
    p.add_argument("--shard-size", type=int, default=None, help="fsdp/fsdp2 hybrid sharding: ranks per shard group")
    p.add_argument("--no-reshard", action="store_true", help="fsdp/fsdp2: keep units gathered after forward")
    p.add_argument("--offload", choices=("optimizer", "params"), default=None, help="to the host")
    p.add_argument("--bucket-view", action="store_true", help="ddp: gradient_as_bucket_view=True")
    p.add_argument("--mixed-precision", choices=("bf16", "fp16"), default=None,
                   help="fsdp2: MixedPrecisionPolicy(param_dtype); fsdp: MixedPrecision(param_dtype, reduce_dtype, "
                   "buffer_dtype) as accelerate sets it: fp32 masters gathered in 16 bits")  # fmt: skip
    p.add_argument("--checkpointing", action="store_true",
                   help="activation checkpointing of every block of a transformers configuration")  # fmt: skip
    p.add_argument("--largest-batch", action="store_true",
                   help="search the largest (micro-)batch: per rank with --parallel, with --generate too")  # fmt: skip
    p.add_argument("--gpus-needed", action="store_true", help="the fewest GPUs of --gpu/--capacity that fit")


parse_bytes = inputs.parse_bytes
"""``80GiB``, ``40 GB``, ``1e9B`` → bytes; a bare number is refused (``inputs.parse_bytes``)."""


def run(args: argparse.Namespace) -> int:
    if args.list:
        from oomsight.predict import models

        for name, spec in sorted(models.MODELS.items()):
            print(f"{name:20} {spec.summary}")
        return exitcode.OK
    problem = _check(args)
    if problem:
        print(f"oomsight predict: {problem}", file=sys.stderr)
        return exitcode.USAGE
    try:
        user_spec = _spec(args)
    except (SpecError, inputs.InputError) as exc:
        print(f"oomsight predict: {exc}", file=sys.stderr)
        return exitcode.USAGE
    try:
        result = _predict(args, user_spec)
        if args.capacity_bytes is not None and not args.generate and not _fits(args, result):
            result["changes"] = _changes(args, user_spec)
    except Exception as exc:  # the user's model could not be traced: say so in one line
        print(f"oomsight predict: {untraceable(exc)}"[:600], file=sys.stderr)
        return exitcode.REFUSED
    print(json.dumps(result, indent=1) if args.json else _prose(result))
    return exitcode.OK


class SpecError(ValueError):
    """What was given to predict cannot be used: the line to print."""


def untraceable(exc: BaseException) -> str:
    """Why the step could not be traced, in one line: the cause first where it is known."""
    text = f"{type(exc).__name__}: {exc}"
    if any(sign in text for sign in DATA_DEPENDENT):
        return (
            "the step has data-dependent control flow (.item(), .tolist(), if on a tensor's value), which a "
            "trace on fake tensors cannot follow: move it out of the step or give --module a 'step' without it "
            f"({_first_line(text)})"
        )
    where = _user_frame(exc)
    return f"the step could not be traced on fake tensors{where}: {_first_line(text)}"


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _user_frame(exc: BaseException) -> str:
    """`` at FILE:LINE`` of the innermost frame outside torch and oomsight, if any."""
    skip = (os.sep + "torch" + os.sep, os.sep + "oomsight" + os.sep, os.sep + "transformers" + os.sep, "<frozen")
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not any(s in f.filename for s in skip)]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


_check = inputs.check
"""Every flag checked before anything is traced (``inputs.check``: one line, exit 2)."""


def _layout(args: argparse.Namespace) -> Any:
    from oomsight.predict import parallel

    return parallel.Layout(
        args.world_size, args.parallel, not args.no_reshard, args.offload, args.bucket_view, args.shard_size
    )


def _spec(args: argparse.Namespace) -> dict[str, Any]:
    """The model spec the flags describe: the named model, config or user file, then ``--dtype``,
    ``--lora`` and ``--quantize`` applied to what its ``build()`` returns, in that order."""
    found = _base_spec(args)
    if args.optimizer_impl and found.get("optimizer"):
        raise SpecError(
            "--optimizer-impl applies to the optimizer predict builds (--optimizer); the --module's own "
            "'optimizer' chooses its implementation itself (foreach=, fused=)"
        )
    if args.lora:  # a target the model does not have is the user's to fix, not the trace's (exit 2)
        inputs.check_lora_targets(found["build"], args.lora_targets, importlib.util.find_spec("peft") is not None)
    found = {**found, "build": _adapted(args, found["build"])}
    if args.generate:
        from oomsight.predict import generation, hfmodel

        if "config" not in found:
            raise SpecError("--generate needs a transformers configuration (--model TYPE:... or a config.json)")
        found.update(
            build=generation.eval_mode(found["build"]),
            batch=hfmodel.tokens(found["config"], args.prompt_tokens),
            step=generation.decode_step(args.new_tokens, args.cache),
            optimizer=_no_optimizer,
        )
    return found


def _no_optimizer(_params: Any) -> None:
    """Inference: nothing to step."""
    return None


def _adapted(args: argparse.Namespace, build: Any) -> Any:
    import importlib.util

    import torch

    from oomsight.predict import adapter

    if args.dtype:
        dtype = getattr(torch, DTYPES[args.dtype])
        build = functools.partial(_built_as, build, dtype)
    if getattr(args, "checkpointing", False):
        build = functools.partial(_checkpointed, build)
    if args.lora:
        peft = importlib.util.find_spec("peft") is not None
        build = adapter.with_lora(build, args.lora_rank, args.lora_targets, peft)
    if args.quantize:
        build = adapter.with_quantized_base(build, args.quantize)
    if getattr(args, "prepare_kbit", False):
        build = adapter.prepared_for_kbit_training(build)
    return build


def _built_as(build: Any, dtype: Any) -> Any:
    return build().to(dtype)


def _checkpointed(build: Any) -> Any:
    """transformers' activation checkpointing of every block (non-reentrant, as accelerate and TRL set it)."""
    model = build()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _base_spec(args: argparse.Namespace) -> dict[str, Any]:
    from oomsight.predict import hfmodel, models

    if args.model and args.model not in models.MODELS and hfmodel.is_config(args.model):
        return _config_spec(args)
    if args.seq_len is not None:
        raise SpecError("--seq-len applies to a transformers configuration (--model TYPE:... or a config.json)")
    if args.model:
        try:
            named = models.get(args.model)
            models.check_available(named)
        except (KeyError, ImportError) as exc:
            raise SpecError(exc.args[0] if exc.args else exc) from None
        return {"build": named.build, "batch": named.batch}
    path, _, name = args.module.rpartition(":")
    if not path or not name:
        raise SpecError(f"--module {args.module}: give FILE.py:NAME")
    if not os.path.isfile(path):
        raise SpecError(f"--module: {path}: no such file")
    function = getattr(_load(path), name, None)
    if not callable(function):
        raise SpecError(f"--module: {path} has no function {name}")
    try:
        found = function()
    except Exception as exc:
        raise SpecError(f"--module: {path}: {name}() raised {_in_user_file(exc, path)}") from None
    return inputs.module_spec(found, f"{path}: {name}()")


def _config_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The spec of a transformers configuration: its model by its head, its batch by what it takes
    (``hfmodel.inputs_of``); the flags about tokens checked against that and against its positions."""
    from oomsight.predict import hfmodel

    try:
        config = hfmodel.load_config(args.model)
    except hfmodel.ConfigError as exc:
        raise SpecError(str(exc)) from None
    except ImportError:
        raise SpecError(
            f"--model {args.model}: a configuration needs transformers (pip install 'oomsight[predict]')"
        ) from None
    where, takes = args.model.partition(":")[0], hfmodel.inputs_of(config)
    found = {"build": hfmodel.builder(config), "config": config}
    if takes != hfmodel.TEXT:
        inputs.check_image_model(where, args, with_text=takes == hfmodel.IMAGES_AND_TEXT)
    if takes == hfmodel.IMAGES:
        return {**found, "batch": hfmodel.image_inputs(config)}
    text = hfmodel.text_side(config)
    inputs.check_positions(text, where, args)
    seq = hfmodel.seq_len_of(text, args.seq_len)
    return {**found, "batch": hfmodel.batch_of(config, seq), "seq_len": seq}


def _load(path: str) -> Any:
    """The user's file as a module; its own error (a ``SyntaxError``, a ``NameError``) named with
    the file and line, never a traceback."""
    loader = importlib.util.spec_from_file_location("oomsight_predict_module", path)
    if loader is None or loader.loader is None:
        raise SpecError(f"--module: {path} is not a Python file")
    module = importlib.util.module_from_spec(loader)
    try:
        loader.loader.exec_module(module)
    except SyntaxError as exc:
        raise SpecError(f"--module: {path}:{exc.lineno}: SyntaxError: {exc.msg}") from None
    except Exception as exc:  # the user's file failed while it was imported
        raise SpecError(f"--module: {path} failed to import: {_in_user_file(exc, path)}") from None
    return module


def _in_user_file(exc: BaseException, path: str) -> str:
    """``NameError: name 'x' is not defined (line 6)``: the error and its line in the user's file."""
    target = os.path.abspath(path)
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) == target]
    return f"{type(exc).__name__}: {_first_line(str(exc))}" + (f" (line {lines[-1]})" if lines else "")


def _fits(args: argparse.Namespace, result: dict[str, Any]) -> bool:
    """Whether the job as given fits: per rank, or on one GPU its peak reserved within the budget."""
    if "parallel" in result:
        return bool(result["parallel"].get("fits", True))
    return int(result["prediction"]["peak_reserved_bytes"]) <= _budget(args, 1)


def _changes(args: argparse.Namespace, spec: dict[str, Any]) -> dict[str, Any]:
    """The cheapest change that fits (``change.py``): each predicted with the job's other settings."""
    from oomsight.predict import change

    job = {**vars(args), "own_optimizer": bool(spec.get("optimizer")), "own_step": bool(spec.get("step")),
           "config": "config" in spec}  # fmt: skip

    def peak_of(overrides: dict[str, Any]) -> int:
        variant = argparse.Namespace(**{**vars(args), **overrides, "gpus_needed": False, "largest_batch": False})
        return _job_peak(variant, _spec(variant) if "checkpointing" in overrides else spec)

    world = args.world_size
    found = change.search(change.candidates(job), peak_of, _budget(args, world), _usable(args, world))
    return {**found.to_dict(), "margin": args.margin}


def _job_peak(args: argparse.Namespace, spec: dict[str, Any]) -> int:
    """The peak reserved per rank of the job the flags describe, with no search."""
    from oomsight.predict import predict_peak, sharded

    if args.parallel and sharded.traced(_layout(args)):
        return int(_per_rank(args, spec, {})["per_rank_peak_reserved_bytes"])
    make_optimizer = spec.get("optimizer") or _optimizer(args)
    p = predict_peak(spec["build"], lambda n: spec["batch"](n, "cpu"), args.batch, make_optimizer, spec.get("step"),
                     **_trace_settings(args))  # fmt: skip
    if not args.parallel:
        return p.peak_reserved_bytes
    return int(_per_rank(args, spec, in_order(p.to_dict()))["per_rank_peak_reserved_bytes"])


def _predict(args: argparse.Namespace, spec: dict[str, Any]) -> dict[str, Any]:
    from oomsight.predict import largest_batch, predict_peak

    kwargs = _trace_settings(args)
    make_optimizer = spec.get("optimizer") or _optimizer(args)

    def batch(n: int) -> Any:
        return spec["batch"](n, "cpu")

    from oomsight.predict import sharded

    if args.parallel and sharded.traced(_layout(args)):  # the rank is traced itself: no one-GPU trace
        return _predict_traced_rank(args, spec)
    p = predict_peak(spec["build"], batch, args.batch, make_optimizer, spec.get("step"), **kwargs)
    out: dict[str, Any] = {"prediction": in_order(p.to_dict())}
    if "seq_len" in spec and not args.generate:
        out["prediction"]["seq_len"] = spec["seq_len"]
    if args.generate:
        out["generate"] = _generate_facts(args, spec)
    if args.gpu:
        out["gpu"] = _gpu_facts(args)
    if args.parallel:
        out["parallel"] = _per_rank(args, spec, out["prediction"])
        if args.largest_batch and "usable_bytes" in out["parallel"]:
            out["largest_batch_per_rank"] = _largest_per_rank(args, spec, batch, make_optimizer, kwargs)
    # one GPU searches whenever it has a capacity; generation (hundreds of forwards a try) when asked
    if args.capacity_bytes is not None and not args.parallel and (args.largest_batch or not args.generate):
        search = largest_batch(
            spec["build"], batch, _usable(args, 1), make_optimizer, spec.get("step"), margin=args.margin,
            start=args.batch, judge="reserved", known={args.batch: p}, **kwargs,
        )  # fmt: skip
        out["largest_batch"] = {k: v for k, v in search.to_dict().items() if k != "prediction"}
    return out


def _predict_traced_rank(args: argparse.Namespace, spec: dict[str, Any]) -> dict[str, Any]:
    """``--parallel fsdp|fsdp2|ddp``: rank 0 traced on a fake process group is the prediction."""
    out: dict[str, Any] = {}
    if args.gpu:
        out["gpu"] = _gpu_facts(args)
    out["parallel"] = _per_rank(args, spec, {})
    rank = out["parallel"]
    out["prediction"] = {
        "batch_size": args.batch, "peak_allocated_bytes": rank["per_rank_peak_allocated_bytes"],
        "peak_reserved_bytes": rank["per_rank_peak_reserved_bytes"], "by_category_bytes": rank["parts_bytes"],
        "rank": 0, "seq_len": spec.get("seq_len"), "workspace_bytes": rank["workspace_bytes"],
        "seconds": rank["trace_seconds"],
    }  # fmt: skip
    if args.largest_batch and "usable_bytes" in rank:
        layout = _layout(args)
        out["largest_batch_per_rank"] = parallel_search(
            lambda b: _line_and_reserved(_traced_rank(args, spec, layout, b)), rank["usable_bytes"], args.batch
        )
    return out


def parallel_search(peak_of: Any, budget: int, start: int) -> dict[str, Any]:
    from oomsight.predict import parallel

    return parallel.largest_batch(peak_of, budget, start=start)


def _largest_per_rank(args: argparse.Namespace, spec: dict[str, Any], batch: Any, make_optimizer: Any,
                      kwargs: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """The largest micro-batch per rank whose per-rank peak fits the usable capacity less the margin."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from oomsight.predict import parallel, predict_peak

    layout = _layout(args)
    with unset_fake_temporarily(), torch.device("meta"):
        laid_units = parallel.units(spec["build"](), layout.shards)

    def peak_of(b: int) -> tuple[int, int]:
        p = predict_peak(spec["build"], batch, b, make_optimizer, spec.get("step"), **kwargs)
        laid = parallel.per_rank(in_order(p.to_dict()), laid_units, layout)
        slack = max(0, p.peak_reserved_bytes - p.peak_allocated_bytes)  # judged on reserved
        line = laid["moments_bytes"]["forward_backward"] + slack
        return line, int(laid["per_rank_peak_allocated_bytes"]) + slack

    budget = int(_usable(args, layout.world_size) * (1.0 - args.margin))
    return parallel.largest_batch(peak_of, budget, start=args.batch)


def _trace_settings(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    return {
        "autocast": {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.autocast or ""),
        "accumulation": args.accumulation,
        "keep_outputs": bool(args.keep_outputs),
        "steps": 1 if args.generate else args.steps,
        "expandable_segments": bool(args.expandable_segments) or None,
        "capability": args.gpu_spec.capability if args.gpu else (9, 0),
    }


def _generate_facts(args: argparse.Namespace, spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from oomsight.predict import generation

    itemsize = torch.empty(0, dtype=getattr(torch, DTYPES[args.dtype or "fp32"])).element_size()
    length = args.prompt_tokens + args.new_tokens
    return {
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "cache": args.cache,
        "kv_cache_bytes_at_the_end": generation.cache_bytes(
            spec["config"], args.batch, length, itemsize, args.cache
        ),
        "sliding_window": getattr(spec["config"], "sliding_window", None),
    }


def _optimizer(args: argparse.Namespace) -> Any:
    """The optimizer ``--optimizer`` and ``--optimizer-impl`` name (``optimizer.factory``)."""
    return optimizer.factory(args.optimizer, args.optimizer_impl)


def _usable(args: argparse.Namespace, world: int) -> int:
    """The allocator's share of the capacity: with ``--gpu``, less the CUDA context and NCCL."""
    from oomsight.predict import gpu

    groups = 2 if args.shard_size and args.shard_size < world else 1  # HSDP: shard and replica groups
    return gpu.usable_bytes(args.capacity_bytes, world, counted=bool(args.gpu), communicators=groups)


def _gpu_facts(args: argparse.Namespace) -> dict[str, Any]:
    from oomsight.predict import gpu

    g = args.gpu_spec
    return {
        "name": g.name,
        "total_bytes": g.total_bytes,
        "capability": list(g.capability),
        "attention_kernel": g.attention,
        "outside_allocator_bytes": gpu.outside_allocator_bytes(
            args.world_size, 2 if args.shard_size and args.shard_size < args.world_size else 1
        ),
        "usable_bytes": _usable(args, args.world_size),
    }


def _per_rank(args: argparse.Namespace, spec: dict[str, Any], prediction: dict[str, Any]) -> dict[str, Any]:
    """The peak per rank of the layout and, with ``--gpus-needed``, the fewest ranks that fit. FSDP, FSDP2
    and DDP are traced rank by rank on a fake process group (``sharded.py``); the others are laid out moment
    by moment from the one-GPU trace (``parallel.per_rank``). The verdict is on the peak reserved."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from oomsight.predict import parallel, sharded

    with unset_fake_temporarily(), torch.device("meta"):
        model = spec["build"]()
    layout = _layout(args)
    if sharded.traced(layout):
        found = _traced_rank(args, spec, layout, args.batch)
    else:
        found = parallel.per_rank(prediction, parallel.units(model, layout.shards), layout)
        slack = int(prediction["peak_reserved_bytes"]) - int(prediction["peak_allocated_bytes"])
        found["per_rank_peak_reserved_bytes"] = found["per_rank_peak_allocated_bytes"] + max(0, slack)
    found["notes"] = parallel.layout_notes(model, layout)
    if args.capacity_bytes is not None:
        budget = _budget(args, layout.world_size)
        found["usable_bytes"], found["fits"] = budget, found["per_rank_peak_reserved_bytes"] <= budget
    if args.gpus_needed:
        if sharded.traced(layout):
            search = sharded.gpus_needed(
                lambda w: _peaks(_traced_rank(args, spec, parallel._with_world(layout, w), args.batch)),
                lambda w: _budget(args, w), layout,
            )  # fmt: skip
            found["gpus_needed"], found["gpus_needed_traces"] = search["gpus_needed"], search["traces"]
        else:
            slack = found["per_rank_peak_reserved_bytes"] - found["per_rank_peak_allocated_bytes"]
            found["gpus_needed"] = parallel.gpus_needed(  # judged on reserved: the allocated peak plus its cache
                prediction, lambda w: parallel.units(model, w), layout, lambda w: _budget(args, w) - slack,
            )  # fmt: skip
    return found


def _line_and_reserved(rank: dict[str, Any]) -> tuple[int, int]:
    """A traced rank's forward/backward moment (the part that grows with the batch) and its peak, in reserved bytes."""
    slack = int(rank["per_rank_peak_reserved_bytes"]) - int(rank["per_rank_peak_allocated_bytes"])
    moments = rank.get("moments_bytes") or {}
    line = max(moments.get("forward", 0), moments.get("backward", 0)) or int(rank["per_rank_peak_allocated_bytes"])
    return line + slack, int(rank["per_rank_peak_reserved_bytes"])


def _peaks(rank: dict[str, Any]) -> tuple[int, int]:
    return int(rank["per_rank_peak_allocated_bytes"]), int(rank["per_rank_peak_reserved_bytes"])


def _budget(args: argparse.Namespace, world: int) -> int:
    """What a rank's allocator may reserve: the capacity less the context and NCCL (``--gpu``), less the margin."""
    return int(_usable(args, world) * (1.0 - args.margin))


def _traced_rank(args: argparse.Namespace, spec: dict[str, Any], layout: Any, batch_size: int) -> dict[str, Any]:
    """Rank 0 of ``layout`` traced on a fake process group, as ``per_rank``'s dict."""
    from dataclasses import asdict

    from oomsight.predict import hfmodel, sharded

    kwargs = {**_trace_settings(args), "steps": 2}
    param_dtype = _dtype(args.mixed_precision)
    make_optimizer = spec.get("optimizer") or _optimizer(args)

    def batch(n: int) -> Any:
        return spec["batch"](n, "cpu")

    if "config" in spec:
        traced = sharded.predict_config_rank(
            spec["config"], lambda c: _adapted(args, hfmodel.builder(c)), batch, batch_size, layout, make_optimizer,
            param_dtype=param_dtype, **kwargs,
        )  # fmt: skip
    else:
        traced = sharded.predict_rank(
            spec["build"], batch, batch_size, layout, make_optimizer, spec.get("step"), param_dtype=param_dtype,
            **kwargs,
        ).to_dict()  # fmt: skip
    return {
        **asdict(layout),
        "per_rank_peak_allocated_bytes": int(traced["peak_allocated_bytes"]),
        "per_rank_peak_reserved_bytes": int(traced["peak_reserved_bytes"]),
        "parts_bytes": traced["by_category_bytes"],
        "moment": traced.get("moment", "traced"),
        "moments_bytes": traced.get("moments_bytes", {}),
        "workspace_bytes": int(traced["workspace_bytes"]),
        "trace_seconds": traced["seconds"],
        "traced": f"rank 0 of {layout.world_size} on a fake process group, {traced.get('layers_traced')} blocks "
        f"traced of {traced.get('layers')}",
    }


def _dtype(name: Optional[str]) -> Any:
    import torch

    return getattr(torch, DTYPES[name]) if name else None


def in_order(prediction: dict[str, Any]) -> dict[str, Any]:
    """The prediction with its categories in ``CATEGORY_ORDER``, zeros kept (any other category
    after them), and the workspace figures told apart: ``workspace_bytes`` is one cuBLAS handle's,
    the ``workspace`` category every handle's the step made (forward and backward each have one,
    and cuBLASLt adds its own)."""
    found = dict(prediction["by_category_bytes"])
    ordered = {name: int(found.pop(name, 0)) for name in CATEGORY_ORDER}
    ordered.update(sorted(found.items()))
    handles = ordered["workspace"] // prediction["workspace_bytes"] if prediction["workspace_bytes"] else 0
    return {
        **prediction,
        "by_category_bytes": ordered,
        "workspace_handles": handles,
    }


def _named_sizes(sizes: dict[str, int]) -> str:
    """``parameters 3.23 MiB, buffers 128 B, ...``: each name with its size, in the dict's order."""
    return ", ".join(f"{k.replace('_', ' ')} {format_bytes(v)}" for k, v in sizes.items())


def _prose_job(result: dict[str, Any]) -> list[str]:
    """The lines of --generate, --gpu and --parallel."""
    lines = []
    gen = result.get("generate")
    if gen:
        window = gen.get("sliding_window")
        lines.append(
            f"generating {gen['new_tokens']} tokens after a {gen['prompt_tokens']}-token prompt, {gen['cache']} cache: "
            f"the cache holds {format_bytes(gen['kv_cache_bytes_at_the_end'])} at the end (in temporaries above)"
            + (f"; its sliding-window layers keep {window:,} tokens" if window else "")
        )
    g = result.get("gpu")
    if g:
        outside = _named_sizes(g["outside_allocator_bytes"])
        lines.append(
            f"{g['name']}: {format_bytes(g['total_bytes'])}, compute capability "
            f"{g['capability'][0]}.{g['capability'][1]} ({g['attention_kernel']}); "
            f"less {outside}: {format_bytes(g['usable_bytes'])} for the allocator"
        )
    par = result.get("parallel")
    if par:
        parts = _named_sizes(par["parts_bytes"])
        lines.append(
            f"{par['parallel']} over {par['world_size']} ranks: peak allocated per rank "
            f"{format_bytes(par['per_rank_peak_allocated_bytes'])} ({parts}); peak reserved "
            f"{format_bytes(par['per_rank_peak_reserved_bytes'])}"
        )
        lines.extend(f"note: {note}" for note in par.get("notes", []))
        if "fits" in par:
            lines.append(f"per rank its peak reserved {'fits' if par['fits'] else 'does not fit'} "
                         f"{format_bytes(par['usable_bytes'])} (the GPU less context, NCCL, margin)")  # fmt: skip
        search = result.get("largest_batch_per_rank")
        if search:
            lines.append(f"largest micro-batch per rank that fits: {search['max_batch_size']} "
                         f"({len(search['tried'])} predictions)")  # fmt: skip
        if "gpus_needed" in par:
            needed = par["gpus_needed"]
            traces = f" ({par['gpus_needed_traces']} traced counts)" if "gpus_needed_traces" in par else ""
            none = "GPUs needed: no count of these GPUs fits this job"
            lines.append(f"GPUs needed: {needed}{traces}" if needed else none)
    return lines


def _prose(result: dict[str, Any]) -> str:
    p = result["prediction"]
    if "rank" in p:  # a traced rank of a sharded job: the per-rank lines say it all
        lines = _prose_job(result)
        par = result["parallel"]
        lines.insert(1 if result.get("gpu") else 0, f"traced: {par['traced']}; the peak falls in the {par['moment']}")
        return "\n".join([*lines, *_prose_changes(result)])
    lines = [
        f"batch {p['batch_size']}, {p['steps']} steps: peak allocated {format_bytes(p['peak_allocated_bytes'])}, "
        f"peak reserved {format_bytes(p['peak_reserved_bytes'])}"
        + (" (expandable segments)" if p["expandable_segments"] else ""),
        "at the peak: " + _named_sizes(p["by_category_bytes"]),
        f"(workspace: {p['workspace_handles']} cuBLAS handle(s) of {format_bytes(p['workspace_bytes'])} "
        "each, forward and backward, and cuBLASLt's own; a category at 0 has nothing alive at the peak)",
        "per step: " + ", ".join(format_bytes(v) for v in p["step_peak_allocated_bytes"]),
    ]
    lines.extend(_prose_job(result))
    search = result.get("largest_batch")
    if search:
        lines.append(
            f"largest batch under {format_bytes(search['capacity_bytes'])} with {search['margin']:.0%} kept free: "
            f"{search['max_batch_size']} ({len(search['tried'])} predictions, {search['seconds']:.0f} s)"
        )
    lines.extend(_prose_changes(result))
    lines.append(f"(predicted in {p['seconds']:.1f} s on the CPU; docs/prediction.md says how and how well)")
    return "\n".join(lines)


def _prose_changes(result: dict[str, Any]) -> list[str]:
    """The cheapest change that fits, and the changes tried before it."""
    found = result.get("changes")
    if not found:
        return []
    budget = format_bytes(found["budget_bytes"])

    def said(t: dict[str, Any]) -> str:
        results = "changes results" if t["changes_results"] else "results unchanged"
        margin = " (within the GPU, not its margin)" if t.get("within_capacity") and not t["fits"] else ""
        return f"{t['flags']} ({t['why']}; {results}): peak reserved {format_bytes(t['peak_reserved_bytes'])}{margin}"

    cheapest = found["cheapest"]
    lines = [f"does not fit {budget} as given; " + (f"the cheapest change that fits: {said(cheapest)}" if cheapest
             else "no single change tried fits")]  # fmt: skip
    lines.extend(f"  tried: {said(t)}" for t in found["tried"] if t is not cheapest and not t["fits"])
    return lines
