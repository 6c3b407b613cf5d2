"""A ``transformers`` model from its configuration, for ``oomsight predict --model``.

``--model`` takes, besides the named models of ``models``:

- a local directory holding ``config.json`` or the path of a ``.json`` file (nothing is downloaded:
  ``AutoConfig.from_pretrained(..., local_files_only=True)``);
- a model type with overrides, ``llama:hidden_size=2048,num_hidden_layers=16``
  (``AutoConfig.for_model``; each value read as JSON where it parses, a string otherwise).

The model is built by ``AutoModelForCausalLM`` (a decoder), else ``AutoModelForSeq2SeqLM`` (T5's
kind), else ``AutoModelForMaskedLM`` (BERT's); built on the meta device by the tracer, so a 7 B
configuration makes no weights. Its batch is ``(batch, seq_len)`` token ids with the same labels.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import torch
from torch import nn

HEADS = ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForMaskedLM")
"""The auto classes tried in order: the first whose mapping knows the configuration builds it."""
DEFAULT_SEQ_LEN = 1024
"""Tokens per sample when ``--seq-len`` is not given (capped by the configuration's positions)."""


class ConfigError(ValueError):
    """The ``--model`` text names no configuration that can be read: the line to print."""


def is_config(text: str) -> bool:
    """Whether ``--model`` names a configuration (a path, or ``TYPE:KEY=VALUE,...``)."""
    return os.path.exists(text) or ":" in text or text.endswith(".json")


def load_config(text: str) -> Any:
    """The ``transformers`` configuration ``text`` names (``ConfigError`` otherwise)."""
    import transformers

    if os.path.isdir(text) or text.endswith(".json"):
        if not os.path.exists(text):
            raise ConfigError(f"--model {text}: no such file")
        folder = text if os.path.isdir(text) else os.path.dirname(os.path.abspath(text))
        if os.path.isdir(text) and not os.path.isfile(os.path.join(text, "config.json")):
            raise ConfigError(f"--model {text}: the folder has no config.json")
        try:
            if os.path.isdir(text):
                return transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
            with open(text, encoding="utf-8") as fh:
                found = json.load(fh)
            kind = found.pop("model_type", None)
            if not kind:
                raise ConfigError(f"--model {text}: the file has no model_type")
            return transformers.AutoConfig.for_model(kind, **found)
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"--model {text}: {type(exc).__name__}: {_first_line(exc)}") from None
    kind, _, rest = text.partition(":")
    overrides = parse_overrides(rest)
    try:
        return transformers.AutoConfig.for_model(kind, **overrides)
    except ValueError as exc:
        raise ConfigError(f"--model {text}: unknown model type {kind!r} ({_first_line(exc)[:160]})") from None


def parse_overrides(text: str) -> dict[str, Any]:
    """``hidden_size=2048,rope_theta=5e5,tie_word_embeddings=false`` → a dict of JSON values."""
    found: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--model: {item!r} is not KEY=VALUE")
        try:
            found[key.strip()] = json.loads(value)
        except ValueError:
            found[key.strip()] = value.strip()
    return found


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def builder(config: Any) -> Callable[[], nn.Module]:
    """``build()`` of the model the configuration describes, in training mode, without a cache."""
    import transformers

    if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", None) is None:
        # labels are shifted right into the decoder's inputs from this token (T5's own configs give
        # 0, its pad token; a bare ``t5:...`` configuration has none and the shift would fail)
        config.decoder_start_token_id = getattr(config, "pad_token_id", None) or 0

    def build() -> nn.Module:
        for head in HEADS:
            auto = getattr(transformers, head)
            if type(config) in auto._model_mapping:
                model = auto.from_config(config)
                break
        else:
            model = transformers.AutoModel.from_config(config)
        if hasattr(model.config, "use_cache"):
            model.config.use_cache = False
        return model.train()

    return build


def seq_len_of(config: Any, asked: int | None) -> int:
    """The tokens per sample: ``asked``, else ``DEFAULT_SEQ_LEN`` capped by the positions the model has."""
    if asked:
        return asked
    positions = [getattr(config, k, None) for k in ("max_position_embeddings", "n_positions")]
    known = [p for p in positions if isinstance(p, int) and p > 0]
    return min([DEFAULT_SEQ_LEN, *known])


def tokens(config: Any, seq_len: int) -> Callable[[int, str], Any]:
    """``batch(n, device)``: ``n`` samples of ``seq_len`` token ids, their labels the same ids."""
    vocab = int(getattr(config, "vocab_size", 32000))

    def batch(n: int, device: str) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab, (n, seq_len), device=device)
        return {"input_ids": ids, "labels": ids}

    return batch
