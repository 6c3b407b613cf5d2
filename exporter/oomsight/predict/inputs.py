"""Every input of ``oomsight predict`` checked before anything is traced (issue 34, step 4).

What is wrong is said in one line and the command exits 2 (``exitcode.USAGE``), within seconds, with
no traceback. The flags are checked as the job is built (``job.job_from_args``, with this module's
parsers: ``parse_bytes``, ``parse_generate``, ``parse_lora``, and its bounds); what only the model can
tell is checked here as the spec is built: a transformers configuration (``check_config``: a key
the model type does not have, named with the close one; a value of the wrong kind; a size or count
below 1; a hidden size its heads do not divide), the sequence length against the model's positions
(``check_positions``), the flags about tokens for a model that takes images (``check_image_model``),
LoRA's targets against the model's modules (``check_lora_targets``) and
``--module``'s spec (``module_spec``). The checks are plain code reading the flags and the
configuration's values; they run before ``transformers`` builds the configuration, so its own
validation (a multi-line traceback) is never what the user sees.
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
import typing
from typing import Any, Callable, Optional, Protocol

MAX_TOKENS = 1 << 20
"""Tokens per sample (``--seq-len``, ``--generate``'s prompt) the predictor accepts: 1,048,576. A
longer sample is no training or prompt length in use (its attention logits alone would be terabytes)."""
MAX_NEW_TOKENS = 2048
"""New tokens ``--generate`` traces: each is one forward of the model on fake tensors, 0.1 s (a
2-layer model) to 0.6 s (16 layers) apiece on this repository's 2-core machine, so 2,048 is 3 to 20
minutes and 100,000 would be hours; the cache figure at any length is arithmetic (``generation``)."""
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
UNITS.update({"kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12})
"""Size suffixes as written (IEC binary, SI decimal), case kept: ``Gb`` would be gigabits and
``gib`` no unit at all, so both are refused rather than guessed; a bare number is refused too
(``--capacity 40`` meant 40 GB, not 40 bytes)."""
AT_LEAST_1 = (
    "hidden_size", "n_embd", "d_model", "intermediate_size", "n_inner", "d_ff", "num_hidden_layers", "n_layer",
    "num_layers", "num_decoder_layers", "num_attention_heads", "n_head", "num_heads", "num_key_value_heads",
    "vocab_size", "max_position_embeddings", "n_positions", "head_dim", "d_kv", "sliding_window",
    "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "encoder_layers", "decoder_layers",
    "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim",
)  # fmt: skip
"""Sizes and counts of a transformers configuration that must be a whole number of at least 1 where given."""
COUNT_LIKE = re.compile(r"^(num_|n_).+|.+(_size|_dim|_layers|_heads|_experts)$")
"""Other whole-number settings named like a size or a count: never below 0."""
DEFAULT_TARGETS = ("q_proj", "v_proj")
"""LoRA's target modules when none are given (PEFT's default for Llama-style models)."""
MODULE_KEYS = ("build", "batch", "optimizer", "step")
"""What ``--module``'s function may return (the first two required)."""
NAMED_MODELS = ("bert", "gpt2", "gpt2-checkpointed", "llama", "llama-checkpointed", "resnet50", "vit_b_16")
"""The names of ``models.MODELS``, here so that a wrong name is refused before torch is imported (a test
keeps the two equal)."""
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
"""A Hugging Face Hub repository id, ``ORG/NAME``: read from the local cache where it is there, never downloaded."""
MODEL_FORMS = (
    "a named model (oomsight predict --list), a local folder holding config.json, a config.json, "
    "or TYPE:KEY=VALUE,... (e.g. llama:hidden_size=2048,num_hidden_layers=16)"
)
NEGATIVE_SIZE = re.compile(r"^-[0-9.]+(e[0-9]+)?\s*[A-Za-z]*$")
"""``-5GiB``: read as a (negative) value of its flag, so ``parse_bytes`` can say what is wrong with it,
not as an unknown option followed by argparse's usage."""


class InputError(ValueError):
    """An input of ``oomsight predict`` that cannot be used: the line to print (exit 2)."""


# -- the flags ------------------------------------------------------------------------------------


def parse_bytes(text: str) -> int:
    """``80GiB``, ``40 GB``, ``1e9B`` → bytes (``UNITS``, case as written); ``ValueError`` otherwise."""
    if text.strip().startswith("-"):
        raise ValueError(f"{text.strip()!r} is negative: give the memory the process may use, e.g. 80GiB")
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if m and not m.group(2):
        raise ValueError(
            f"{text.strip()!r} has no unit: write {m.group(1)}GB (x 10^9 bytes) or {m.group(1)}GiB (x 2^30), "
            f"{m.group(1)}B for bytes"
        )
    if not m or m.group(2) not in UNITS:
        raise ValueError(f"{text!r} is not a size (e.g. 80GiB = 80 x 2^30 bytes, 40GB = 40 x 10^9, 1e9B)")
    found = int(float(m.group(1)) * UNITS[m.group(2)])
    if found < 1:
        raise ValueError(f"{text!r} is no memory at all")
    return found


def parse_generate(text: str) -> tuple[int, int]:
    """``2048:256`` → (prompt tokens, new tokens); ``ValueError`` otherwise."""
    prompt, _, new = text.partition(":")
    if not (prompt.isdigit() and new.isdigit()) or int(prompt) < 1 or int(new) < 1:
        raise ValueError(f"--generate {text}: give PROMPT:NEW token counts, e.g. 2048:256")
    return int(prompt), int(new)


def parse_lora(text: str) -> tuple[int, tuple[str, ...]]:
    """``16`` or ``16:q_proj,k_proj,v_proj,o_proj`` → (rank, target module names); ``ValueError`` otherwise."""
    rank_text, _, targets = text.partition(":")
    if not rank_text.isdigit() or int(rank_text) < 1:
        raise ValueError(f"--lora {text}: give RANK[:MODULE,...], e.g. 16:q_proj,v_proj")
    names = tuple(t.strip() for t in targets.split(",") if t.strip()) or DEFAULT_TARGETS
    return int(rank_text), names


def hub_cached_config(repo: str) -> Optional[str]:
    """The config.json of Hub repository ``repo`` in the local Hugging Face cache (``HF_HUB_CACHE``, else
    ``HF_HOME``/hub, else ~/.cache/huggingface/hub): the revision ``refs/main`` names, else the newest
    snapshot holding one; None where the cache has none."""
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    folder = os.path.join(cache, "models--" + repo.replace("/", "--"))
    try:
        with open(os.path.join(folder, "refs", "main")) as f:
            main = os.path.join(folder, "snapshots", f.read().strip(), "config.json")
        if os.path.isfile(main):
            return main
    except OSError:  # no refs/main: a snapshot of another revision may still hold one
        pass
    snapshots = os.path.join(folder, "snapshots")
    revisions = os.listdir(snapshots) if os.path.isdir(snapshots) else []
    found = [f for f in (os.path.join(snapshots, r, "config.json") for r in revisions) if os.path.isfile(f)]
    return max(found, key=os.path.getmtime) if found else None


# -- a transformers configuration ------------------------------------------------------------------


def check_config(where: str, defaults: Any, values: dict[str, Any], typed: bool) -> dict[str, Any]:
    """``values`` (the ``TYPE:KEY=VALUE`` overrides, or a config.json's entries) checked against the
    model type's ``defaults`` (its configuration as ``transformers`` builds it bare); the values with
    their keys as the configuration names them. ``typed``: keys were typed on the command line, so a
    key the model type does not have is a typo (a config.json may carry keys of its own)."""
    aliases = dict(getattr(type(defaults), "attribute_map", {}) or {})
    known = _known_keys(defaults, aliases)
    if typed:
        for key in values:
            if key not in known and not _consumed(defaults, key, values[key]):
                close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
                hint = f" (did you mean {close[0]}?)" if close else " (transformers would keep it and no layer read it)"
                raise InputError(f"--model {where}: no setting named {key!r}{hint}")
    hints = _hints(type(defaults))
    named = {aliases.get(k, k): v for k, v in values.items()}
    for key, value in named.items():
        _check_kind(where, key, value, hints.get(key), getattr(defaults, key, None))
    merged = {**_raw_defaults(defaults), **named}
    for key, value in named.items():
        _check_size(where, key, value)
    _check_heads(where, merged, named)
    return named


def _known_keys(defaults: Any, aliases: dict[str, str]) -> set[str]:
    import dataclasses

    fields = {f.name for f in dataclasses.fields(defaults)} if dataclasses.is_dataclass(defaults) else set()
    return set(defaults.to_dict()) | set(aliases) | fields


def _raw_defaults(defaults: Any) -> dict[str, Any]:
    """The model type's settings as declared, before its ``__post_init__`` derives some from others
    (Llama's ``num_key_value_heads`` is None, then the heads): what the user's overrides meet."""
    import dataclasses

    if not dataclasses.is_dataclass(defaults):
        return dict(defaults.to_dict())
    return {f.name: getattr(type(defaults), f.name, None) if f.default is dataclasses.MISSING else f.default
            for f in dataclasses.fields(defaults)}  # fmt: skip


def _consumed(defaults: Any, key: str, value: Any) -> bool:
    """Whether ``transformers`` takes ``key`` into another setting (a legacy name: ``rope_theta`` into
    ``rope_parameters``) rather than keeping it as an attribute nothing reads."""
    try:
        built = type(defaults)(**{key: value})
    except Exception:  # refused by transformers: not an attribute it keeps silently
        return True
    return key not in built.to_dict()


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an annotation that does not resolve: check by the defaults' values
        return {}


def _kind_of(hint: Any, default: Any) -> Optional[type]:
    """``int``, ``float`` or ``bool`` where the setting is one of them (``X | None`` too), else None."""
    if hint is not None:
        args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        return args[0] if len(args) == 1 and args[0] in (int, float, bool) else None
    return type(default) if type(default) in (int, float, bool) else None


def _check_kind(where: str, key: str, value: Any, hint: Any, default: Any) -> None:
    kind = _kind_of(hint, default)
    if value is None or kind is None:
        return
    if kind is bool and not isinstance(value, bool):
        raise InputError(f"--model {where}: {key}={value} must be true or false")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise InputError(f"--model {where}: {key}={value} must be a whole number (the default is {default})")
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise InputError(f"--model {where}: {key}={value} must be a number (the default is {default})")


def _check_size(where: str, key: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        return
    if key in AT_LEAST_1 and value < 1:
        raise InputError(f"--model {where}: {key}={value} must be at least 1")
    if COUNT_LIKE.match(key) and value < 0:
        raise InputError(f"--model {where}: {key}={value} cannot be negative")


def _check_heads(where: str, merged: dict[str, Any], given: dict[str, Any]) -> None:
    """Each head takes ``hidden / heads`` dimensions unless the head size is given apart (``head_dim``,
    T5's ``d_kv``), and grouped-query attention shares a key/value head among a whole number of heads."""
    hidden = _first(merged, "hidden_size", "n_embd")
    heads = _first(merged, "num_attention_heads", "n_head")
    apart = given.get("head_dim") is not None or "d_kv" in merged
    if hidden and heads and not apart and hidden % heads:
        raise InputError(
            f"--model {where}: the hidden size {hidden} is not a multiple of the {heads} attention heads"
        )
    kv = merged.get("num_key_value_heads")
    if heads and isinstance(kv, int) and kv > 0 and heads % kv:
        raise InputError(
            f"--model {where}: the {heads} attention heads are not a multiple of the {kv} key/value heads "
            "(grouped-query attention shares each key/value head among a whole number of heads)"
        )


def _first(values: dict[str, Any], *names: str) -> Optional[int]:
    for name in names:
        value = values.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def positions(config: Any) -> Optional[int]:
    """The positions the model has (``max_position_embeddings``, GPT-2's ``n_positions``), None where it
    has no limit (T5's relative positions)."""
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


class TokenFlags(Protocol):
    """The flags about tokens a model's own checks read (``oomsight.predict.job.PredictJob`` has them)."""

    @property
    def seq_len(self) -> Optional[int]: ...

    @property
    def generate(self) -> Optional[str]: ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def new_tokens(self) -> int: ...


def check_positions(config: Any, where: str, flags: TokenFlags) -> None:
    """``--seq-len``, or ``--generate``'s prompt, within the model's positions; and the prompt with the new
    tokens where positions are learned (GPT-2's table has no row past them). A rotary model generates
    past them as ``generate()`` does, which only warns."""
    limit = positions(config)
    if limit is None:
        return
    if flags.generate:
        rotary = getattr(config, "rope_parameters", None) or getattr(config, "rope_theta", None)
        total = flags.prompt_tokens + (0 if rotary else flags.new_tokens)
        if total > limit:
            raise InputError(
                f"--generate {flags.generate}: {total:,} tokens, past the {limit:,} positions of --model {where}"
                + ("" if rotary else " (learned positions: the table has no row past them)")
            )
    elif flags.seq_len is not None and flags.seq_len > limit:
        raise InputError(
            f"--seq-len {flags.seq_len:,} is past the {limit:,} positions of --model {where} "
            "(max_position_embeddings; raise it in the configuration to predict a longer sample)"
        )


def check_image_model(where: str, flags: TokenFlags, with_text: bool) -> None:
    """The flags about tokens, for a model that takes images (``with_text``: and text, a dual encoder
    such as CLIP, whose text ``--seq-len`` sets): ``--generate`` applies to neither, as neither
    generates tokens; ``--seq-len`` not to images alone, whose size is the configuration's."""
    if flags.generate:
        raise InputError(f"--generate applies to a model that generates tokens; --model {where} takes images")
    if flags.seq_len is not None and not with_text:
        raise InputError(
            f"--seq-len does not apply to --model {where}: it takes images, not tokens "
            "(their size is the configuration's image_size and num_channels)"
        )


# -- LoRA's targets and --module's spec ------------------------------------------------------------


def check_lora_targets(build: Callable[[], Any], targets: tuple[str, ...], peft: bool) -> None:
    """Each ``--lora`` target names modules of the model (PEFT's rule: the module's name, or its last
    dotted parts), of a kind LoRA adapts; built on the meta device (no weights)."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from oomsight.predict import adapter

    try:
        with unset_fake_temporarily(), torch.device("meta"):
            model = build()
    except Exception:  # the build itself fails: the trace says where, as before
        return
    modules = [(name, m) for name, m in model.named_modules() if name]
    layers = list(dict.fromkeys(name.rsplit(".", 1)[-1] for name, m in modules if adapter.adaptable(m, peft)))
    for target in targets:
        found = [m for name, m in modules if adapter.targeted(name, (target,))]
        if not found:
            close = difflib.get_close_matches(target, layers, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise InputError(
                f"--lora: the model has no module named {target} ({hint}the layers LoRA can adapt: {', '.join(layers)})"
            )
        if not any(adapter.adaptable(m, peft) for m in found):
            raise InputError(
                f"--lora: {target} is a {type(found[0]).__name__}, not a layer LoRA adapts "
                f"(the layers it can adapt: {', '.join(layers)})"
            )


def module_spec(found: Any, where: str) -> dict[str, Any]:
    """``--module``'s function's dict, checked against the contract (docs/prediction.md): ``build`` and
    ``batch`` callables, ``batch`` taking ``(n)`` or ``(n, device)``, optionally ``optimizer`` and
    ``step``; ``batch`` returned as ``(n, device)``, the form the command calls."""
    if not isinstance(found, dict) or not {"build", "batch"} <= set(found):
        raise InputError(f"--module: {where} must return a dict with 'build' and 'batch'")
    for key, value in found.items():
        if key not in MODULE_KEYS:
            close = difflib.get_close_matches(str(key), MODULE_KEYS, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise InputError(f"--module: {where} returned {key!r} ({hint}the keys are {', '.join(MODULE_KEYS)})")
        if value is not None and not callable(value):
            raise InputError(f"--module: {where}: {key!r} must be a function, not {type(value).__name__}")
        made = not isinstance(value, type) and hasattr(value, "parameters") and hasattr(value, "forward")
        if key == "build" and made:  # the class itself builds the model: a model already made does not
            raise InputError(
                f"--module: {where}: 'build' must be a function that makes the model (lambda: "
                f"{type(value).__name__}(...)), not a {type(value).__name__} already made"
            )
    return {**found, "batch": batch_of(found["batch"], where)}


def batch_of(batch: Callable[..., Any], where: str) -> Callable[[int, str], Any]:
    """The user's ``batch(n)`` or ``batch(n, device)`` as ``batch(n, device)``."""
    try:
        params = list(inspect.signature(batch).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: called as the command always did
        return batch
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    if len(required) > 2 or not (positional or varargs):
        names = ", ".join(p.name for p in params)
        raise InputError(f"--module: {where}: 'batch' must take (n) or (n, device), not ({names})")
    if len(positional) >= 2 or varargs:
        return batch

    def one_argument(n: int, _device: str) -> Any:
        return batch(n)

    return one_argument
