"""A ``transformers`` model from its configuration, for ``oomsight predict --model``.

``--model`` takes, besides the named models of ``models``:

- a local directory holding ``config.json`` or the path of a ``.json`` file (nothing is downloaded:
  ``AutoConfig.from_pretrained(..., local_files_only=True)``);
- a model type with overrides, ``llama:hidden_size=2048,num_hidden_layers=16``
  (``AutoConfig.for_model``; each value read as JSON where it parses, a string otherwise).

The model is built by its head (``head_of``): ``AutoModelForImageClassification`` for a model that
takes images (ViT, DeiT, Swin, ConvNeXt, ResNet), ``AutoModelForSeq2SeqLM`` for an encoder-decoder
(T5), ``AutoModelForMaskedLM`` for an encoder (BERT), ``AutoModelForCausalLM`` for a decoder, the bare
model for a dual encoder of images and text (CLIP); built on the meta device by the tracer, so a 7 B
configuration makes no weights. Its batch (``batch_of``) follows what the model takes (``inputs_of``):
``(batch, seq_len)`` token ids with the same labels; images of the configuration's ``image_size`` and
``num_channels`` with integer labels; both for a dual encoder, with ``return_loss=True`` (its
contrastive loss).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from typing import Any, Callable

import torch
from torch import nn

from oomsight.predict.inputs import InputError, check_config
from oomsight.predict.models import images

HEADS = ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForMaskedLM")
"""The auto classes tried in order: the first whose mapping knows the configuration builds it."""
IMAGE_HEAD = "AutoModelForImageClassification"
"""The head of a model that takes images: its loss is the cross-entropy of integer labels."""
TEXT, IMAGES, IMAGES_AND_TEXT = "text", "images", "images and text"
"""What a model takes (``inputs_of``)."""
DEFAULT_IMAGE_SIZE = 224
"""Pixels a side where the configuration gives no ``image_size`` (ResNet's): ImageNet's crop, as the named
vision models of ``models`` take."""
DEFAULT_SEQ_LEN = 1024
"""Tokens per sample when ``--seq-len`` is not given (capped by the configuration's positions)."""


class ConfigError(InputError):
    """The ``--model`` text names no configuration that can be read: the line to print."""


def is_config(text: str) -> bool:
    """Whether ``--model`` names a configuration (a path, or ``TYPE:KEY=VALUE,...``)."""
    return os.path.exists(text) or ":" in text or text.endswith(".json")


def load_config(text: str) -> Any:
    """The ``transformers`` configuration ``text`` names, its values checked before ``transformers``
    builds it (``inputs.check_config``); ``ConfigError`` (or ``InputError``) with the line otherwise."""
    import transformers

    if os.path.isdir(text) or text.endswith(".json"):
        values = _read_file(text)
        kind, where, typed = values.pop("model_type", None), text, False
        if not kind:
            raise ConfigError(f"--model {text}: the file has no model_type")
    else:
        kind, _, rest = text.partition(":")
        values, where, typed = parse_overrides(rest), kind, True
    with _quiet():
        try:
            defaults = transformers.AutoConfig.for_model(kind)
        except ValueError as exc:
            raise ConfigError(f"--model {text}: unknown model type {kind!r} ({_first_line(exc)[:160]})") from None
        named = check_config(where, defaults, values, typed)
    try:
        with _quiet():
            if os.path.isdir(text):
                return transformers.AutoConfig.from_pretrained(text, local_files_only=True)
            return transformers.AutoConfig.for_model(kind, **named)
    except Exception as exc:  # transformers' own validation, past ours: its last line
        raise ConfigError(f"--model {where}: transformers refuses the configuration: {_last_line(exc)}") from None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' warnings about a configuration (a token id past a small test vocabulary) kept
    off stderr while it is built: what matters to memory is checked by ``check_config``, and a
    refusal stays one line."""
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _read_file(text: str) -> dict[str, Any]:
    """The entries of a config.json (``text``, or ``text/config.json`` for a folder)."""
    if not os.path.exists(text):
        raise ConfigError(f"--model {text}: no such file")
    path = os.path.join(text, "config.json") if os.path.isdir(text) else text
    if not os.path.isfile(path):
        raise ConfigError(f"--model {text}: the folder has no config.json")
    try:
        with open(path, encoding="utf-8") as fh:
            found = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--model {text}: {type(exc).__name__}: {_first_line(exc)}") from None
    if not isinstance(found, dict):
        raise ConfigError(f"--model {text}: the file holds no JSON object")
    return found


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


def _last_line(exc: BaseException) -> str:
    """The last line of a multi-line error (a strict dataclass's: the cause comes last)."""
    text = str(exc).strip()
    return text.splitlines()[-1].strip()[:300] if text else type(exc).__name__


def builder(config: Any) -> Callable[[], nn.Module]:
    """``build()`` of the model the configuration describes, in training mode, without a cache."""
    import transformers

    if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", None) is None:
        # labels are shifted right into the decoder's inputs from this token (T5's own configs give
        # 0, its pad token; a bare ``t5:...`` configuration has none and the shift would fail)
        config.decoder_start_token_id = getattr(config, "pad_token_id", None) or 0
    if getattr(config, "architectures", None) is None:
        # where a head maps to several classes (DeiT's classifier, with and without its teacher),
        # transformers picks by ``architectures``, which a bare configuration has as None (not iterable)
        config.architectures = []

    def build() -> nn.Module:
        head = head_of(config)
        auto = getattr(transformers, head) if head else transformers.AutoModel
        model = auto.from_config(config)
        if hasattr(model.config, "use_cache"):
            model.config.use_cache = False
        return model.train()

    return build


def head_of(config: Any) -> str | None:
    """The auto class that builds ``config`` for training, as docs/prediction.md names it: a model that
    takes images by ``AutoModelForImageClassification``; an encoder-decoder (T5, BART) by
    ``AutoModelForSeq2SeqLM``; an encoder (BERT, RoBERTa: ``is_decoder`` false and a masked-LM head
    known) by ``AutoModelForMaskedLM``, not the causal head transformers also maps BERT to
    (``BertLMHeadModel``); else ``AutoModelForCausalLM``; else the first of ``HEADS`` that knows it
    (None: the bare ``AutoModel``, which is how a dual encoder such as CLIP returns its loss)."""
    import transformers

    def knows(head: str) -> bool:
        return type(config) in getattr(transformers, head)._model_mapping

    if inputs_of(config) == IMAGES and knows(IMAGE_HEAD):
        return IMAGE_HEAD
    if getattr(config, "is_encoder_decoder", False) and knows("AutoModelForSeq2SeqLM"):
        return "AutoModelForSeq2SeqLM"
    if not getattr(config, "is_decoder", False) and knows("AutoModelForMaskedLM"):
        return "AutoModelForMaskedLM"
    return next((head for head in HEADS if knows(head)), None)


def inputs_of(config: Any) -> str:
    """What the model of ``config`` takes, read from its bare class (``AutoModel``'s): ``IMAGES`` where
    its ``main_input_name`` is ``pixel_values`` (ViT, DeiT, Swin, ConvNeXt, ResNet); ``IMAGES_AND_TEXT``
    where its forward takes ``pixel_values``, ``input_ids`` and ``return_loss`` (a dual encoder: CLIP,
    SigLIP); ``TEXT`` otherwise, a configuration ``AutoModel`` does not know included."""
    import inspect

    import transformers

    try:
        mapped: Any = transformers.AutoModel._model_mapping[type(config)]
    except KeyError:
        return TEXT
    bare = mapped[0] if isinstance(mapped, (list, tuple)) else mapped  # several: the first is the default
    if getattr(bare, "main_input_name", None) == "pixel_values":
        return IMAGES
    if {"pixel_values", "input_ids", "return_loss"} <= set(inspect.signature(bare.forward).parameters):
        return IMAGES_AND_TEXT
    return TEXT


def text_side(config: Any) -> Any:
    """The configuration of the text a model takes: a dual encoder's ``text_config``, else ``config``."""
    return (getattr(config, "text_config", None) or config) if inputs_of(config) == IMAGES_AND_TEXT else config


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


def batch_of(config: Any, seq_len: int) -> Callable[[int, str], Any]:
    """``batch(n, device)``: the inputs of one step for what the model takes (``inputs_of``): ``n`` images
    of the configuration's size and channels (``image_inputs``; ``seq_len`` does not apply), ``n``
    samples of ``seq_len`` tokens (``tokens``), or both for a dual encoder, with ``return_loss=True``."""
    takes = inputs_of(config)
    if takes == IMAGES:
        return image_inputs(config)
    if takes == TEXT:
        return tokens(config, seq_len)
    pictures = image_inputs(getattr(config, "vision_config", config), labelled=False)
    words = tokens(text_side(config), seq_len)

    def batch(n: int, device: str) -> dict[str, Any]:
        return {**pictures(n, device), "input_ids": words(n, device)["input_ids"], "return_loss": True}

    return batch


def image_inputs(config: Any, labelled: bool = True) -> Callable[[int, str], Any]:
    """``batch(n, device)``: ``n`` images of the configuration's ``image_size`` (``DEFAULT_IMAGE_SIZE``
    where it has none) and ``num_channels``, with an integer label below ``num_labels`` each where
    ``labelled`` and the model has a classification head to take them."""
    classes = int(getattr(config, "num_labels", 2)) if labelled and head_of(config) == IMAGE_HEAD else None
    size = getattr(config, "image_size", None) or DEFAULT_IMAGE_SIZE
    return images(classes, size, int(getattr(config, "num_channels", None) or 3))
