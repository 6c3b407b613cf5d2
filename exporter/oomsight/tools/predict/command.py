"""``oomsight predict``: the peak memory of a training step, and the largest batch, before launch.

    oomsight predict --model gpt2 --batch 8 --autocast bf16 --capacity 40GiB
    oomsight predict --module my_model.py:spec --batch 32 --json

``--model`` names one of ``oomsight.tools.predict.models``; ``--module FILE:NAME`` loads a
function of the user's file that returns ``{"build": () -> nn.Module, "batch": (n, device) ->
inputs}`` (and optionally ``"optimizer"``: params -> Optimizer, ``"step"``: (model, batch,
optimizer) -> None). Nothing is downloaded and no GPU is used.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import re
import sys
from typing import Any, Optional

from oomsight.analysis.units import format_bytes
from oomsight.tools import exitcode

EXAMPLE = (
    "examples:\n  oomsight predict --model gpt2 --batch 8 --autocast bf16 --capacity 40GiB\n"
    "  oomsight predict --module my_model.py:spec --batch 32 --json"
)
UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "kb": 10**3, "mb": 10**6}
UNITS.update({"gb": 10**9, "tb": 10**12})


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
    what.add_argument("--model", help="a named model (see --list)")
    what.add_argument("--module", help="FILE.py:NAME, a function returning the model spec (docs/prediction.md)")
    what.add_argument("--list", action="store_true", help="list the named models")
    p.add_argument("--batch", type=int, default=8, help="batch size (micro-batch with --accumulation; default 8)")
    p.add_argument("--autocast", choices=("bf16", "fp16"), default=None, help="torch.autocast('cuda') dtype")
    p.add_argument("--accumulation", type=int, default=1, help="micro-batches per optimizer step (default 1)")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw", help="default adamw")
    p.add_argument("--steps", type=int, default=3, help="training steps traced (default 3)")
    p.add_argument("--capacity", default=None, help="memory the process may use, e.g. 80GiB: search the largest batch")
    p.add_argument("--margin", type=float, default=0.10, help="share of --capacity kept free (default 0.10)")
    p.add_argument("--expandable-segments", action="store_true", help="model expandable_segments:True")
    p.add_argument("--json", action="store_true", help="print JSON instead of prose")
    p.set_defaults(handler=run)


def parse_bytes(text: str) -> int:
    """``80GiB``, ``40 GB``, ``1e9`` → bytes; ``ValueError`` otherwise."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in UNITS:
        raise ValueError(f"{text!r} is not a size (e.g. 80GiB, 40GB, 1e9)")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def run(args: argparse.Namespace) -> int:
    from oomsight.tools.predict import models

    if args.list:
        for name, spec in sorted(models.MODELS.items()):
            print(f"{name:20} {spec.summary}")
        return exitcode.OK
    problem = _check(args)
    if problem:
        print(f"oomsight predict: {problem}", file=sys.stderr)
        return exitcode.USAGE
    try:
        user_spec = _spec(args)
    except (KeyError, ValueError, OSError, ImportError, AttributeError, TypeError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"oomsight predict: {message}", file=sys.stderr)
        return exitcode.USAGE
    try:
        result = _predict(args, user_spec)
    except Exception as exc:  # the user's model could not be traced: say so in one line
        print(f"oomsight predict: the step could not be traced on fake tensors: {type(exc).__name__}: {exc}"[:600],
              file=sys.stderr)  # fmt: skip
        return exitcode.REFUSED
    print(json.dumps(result, indent=1) if args.json else _prose(result))
    return exitcode.OK


def _check(args: argparse.Namespace) -> Optional[str]:
    if args.batch < 1 or args.accumulation < 1 or not 1 <= args.steps <= 20:
        return "--batch and --accumulation must be at least 1, --steps 1 to 20"
    if not 0.0 <= args.margin < 0.5:
        return "--margin must be between 0 and 0.5"
    if args.capacity is not None:
        try:
            args.capacity_bytes = parse_bytes(args.capacity)
        except ValueError as exc:
            return f"--capacity: {exc}"
    return None


def _spec(args: argparse.Namespace) -> dict[str, Any]:
    from oomsight.tools.predict import models

    if args.model:
        named = models.get(args.model)
        return {"build": named.build, "batch": named.batch}
    path, _, name = args.module.rpartition(":")
    if not path or not name:
        raise ValueError(f"--module {args.module}: give FILE.py:NAME")
    loader = importlib.util.spec_from_file_location("oomsight_user_model", path)
    if loader is None or loader.loader is None:
        raise ValueError(f"--module: {path} is not a Python file")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    found = getattr(module, name)()
    if not isinstance(found, dict) or not {"build", "batch"} <= set(found):
        raise TypeError(f"--module: {name}() must return a dict with 'build' and 'batch'")
    return dict(found)


def _predict(args: argparse.Namespace, spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from oomsight.tools.predict import largest_batch, predict_peak

    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.autocast or "")
    optimizer = spec.get("optimizer") or (
        functools.partial(torch.optim.SGD, lr=0.01, momentum=0.9) if args.optimizer == "sgd" else torch.optim.AdamW
    )
    kwargs: dict[str, Any] = {
        "autocast": autocast,
        "accumulation": args.accumulation,
        "steps": args.steps,
        "expandable_segments": bool(args.expandable_segments) or None,
    }

    def batch(n: int) -> Any:
        return spec["batch"](n, "cpu")

    p = predict_peak(spec["build"], batch, args.batch, optimizer, spec.get("step"), **kwargs)
    out: dict[str, Any] = {"prediction": p.to_dict()}
    if args.capacity is not None:
        search = largest_batch(
            spec["build"], batch, args.capacity_bytes, optimizer, spec.get("step"), margin=args.margin,
            start=args.batch, **kwargs,
        )  # fmt: skip
        out["largest_batch"] = {k: v for k, v in search.to_dict().items() if k != "prediction"}
    return out


def _prose(result: dict[str, Any]) -> str:
    p = result["prediction"]
    lines = [
        f"batch {p['batch_size']}, {p['steps']} steps: peak allocated {format_bytes(p['peak_allocated_bytes'])}, "
        f"peak reserved {format_bytes(p['peak_reserved_bytes'])}"
        + (" (expandable segments)" if p["expandable_segments"] else ""),
        "at the peak: "
        + ", ".join(f"{k.replace('_', ' ')} {format_bytes(v)}" for k, v in p["by_category_bytes"].items() if v),
        "per step: " + ", ".join(format_bytes(v) for v in p["step_peak_allocated_bytes"]),
    ]
    search = result.get("largest_batch")
    if search:
        lines.append(
            f"largest batch under {format_bytes(search['capacity_bytes'])} with {search['margin']:.0%} kept free: "
            f"{search['max_batch_size']} ({len(search['tried'])} predictions, {search['seconds']:.0f} s)"
        )
    lines.append(f"(predicted in {p['seconds']:.1f} s on the CPU; docs/prediction.md says how and how well)")
    return "\n".join(lines)
