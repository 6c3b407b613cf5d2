"""``oomsight predict``: the peak memory of a training step, and the largest batch, before launch.

    oomsight predict --model gpt2 --batch 8 --autocast bf16 --capacity 40GiB
    oomsight predict --module my_model.py:spec --batch 32 --json
    oomsight predict --model llama:hidden_size=4096,num_hidden_layers=32 --dtype bf16 --lora 16 --gpu A100-80GB

The command's flags, exit codes and output; what it predicts is ``oomsight.predict``'s: the flags become
one ``PredictJob`` (``predict/job.py``), the job a model spec (``predict/spec.py``), the spec a result
(``predict/orchestration.py``), printed as JSON or prose (``predict/prose.py``).

``--model`` names one of ``oomsight.predict.models`` or a ``transformers`` configuration
(``hfmodel``: a folder, a config.json, ``TYPE:KEY=VALUE,...``); ``--module FILE:NAME`` loads a
function of the user's file that returns ``{"build": () -> nn.Module, "batch": (n, device) ->
inputs}`` (and optionally ``"optimizer"``: params -> Optimizer, ``"step"``: (model, batch,
optimizer) -> None). Nothing is downloaded and no GPU is used.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NoReturn

from oomsight.predict import inputs, optimizer, orchestration, prose
from oomsight.predict.job import DTYPES, job_from_args
from oomsight.predict.predictor import DEFAULT_MARGIN
from oomsight.predict.spec import SpecError, spec_of
from oomsight.tools import exitcode, manifest
from oomsight.wire.fields import PREDICTED_PEAK_ANNOTATION, PREDICTED_PEAK_RESERVED_ANNOTATION

EXAMPLE = (
    "examples:\n  oomsight predict --model gpt2 --batch 8 --autocast bf16 --capacity 40GiB\n"
    "  oomsight predict --module my_model.py:spec --batch 32 --json\n"
    "  oomsight predict --model llama:hidden_size=2048,num_hidden_layers=16 --dtype bf16 --seq-len 2048\n"
    "  oomsight predict --model ./Llama-2-7b/config.json --dtype bf16 --lora 16 --quantize 4bit --gpu L4\n"
    "  oomsight predict --model llama --world-size 8 --parallel fsdp2 --gpu H100 --gpus-needed"
)


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
    p.add_argument("--annotate", metavar="MANIFEST", default=None,
                   help="print MANIFEST (a Pod, Job, Deployment, ... or Kubeflow job; - for stdin) with the predicted "
                   "peak in its pod template's annotations; the prediction goes to stderr")  # fmt: skip
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


def run(args: argparse.Namespace) -> int:
    """The subcommand: the named models with ``--list``; else the job checked (exit 2 with one line), its
    spec built (exit 2), predicted (exit 1 where the step cannot be traced) and printed."""
    if args.list:
        from oomsight.predict import models

        for name, spec in sorted(models.MODELS.items()):
            print(f"{name:20} {spec.summary}")
        return exitcode.OK
    try:
        job = job_from_args(args)
        pods = manifest.read(args.annotate) if args.annotate else None  # before the trace: a bad file costs none
        user_spec = spec_of(job)
    except (SpecError, inputs.InputError, manifest.ManifestError) as exc:
        print(f"oomsight predict: {exc}", file=sys.stderr)
        return exitcode.USAGE
    try:
        result = orchestration.result(job, user_spec)
    except Exception as exc:  # the user's model could not be traced: say so in one line
        print(f"oomsight predict: {orchestration.untraceable(exc)}"[:600], file=sys.stderr)
        return exitcode.REFUSED
    said = json.dumps(result, indent=1) if args.json else prose.text(result)
    if pods is None:
        print(said)
        return exitcode.OK
    print(said, file=sys.stderr)  # stdout is the manifest: ... --annotate job.yaml | kubectl apply -f -
    sys.stdout.write(manifest.annotated(pods, peak_annotations(result)))
    return exitcode.OK


def peak_annotations(result: dict[str, Any]) -> dict[str, str]:
    """The predicted peak as pod annotations, integer bytes as strings: the peak allocated and reserved of
    one GPU, or of one rank with ``--parallel`` (what each rank's process will measure)."""
    rank, one = result.get("parallel"), result["prediction"]
    if rank:
        allocated, reserved = rank["per_rank_peak_allocated_bytes"], rank.get("per_rank_peak_reserved_bytes")
    else:
        allocated, reserved = one["peak_allocated_bytes"], one.get("peak_reserved_bytes")
    found = {PREDICTED_PEAK_ANNOTATION: str(int(allocated))}
    if reserved is not None:
        found[PREDICTED_PEAK_RESERVED_ANNOTATION] = str(int(reserved))
    return found
