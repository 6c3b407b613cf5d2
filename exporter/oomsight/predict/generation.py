"""Inference with a key/value cache for ``oomsight predict --generate PROMPT:NEW``.

``model.generate()`` cannot run on fake tensors: its stopping test reads a tensor's value
(``unfinished_sequences.max() == 0`` → ``aten._local_scalar_dense``). The predictor therefore drives
the loop ``generate()`` runs for greedy decoding itself, without the stopping test: one forward over
the prompt (prefill) into the cache, then one forward per new token, each keeping only the last
position's logits (``logits_to_keep=1``, as ``generate()`` asks of models that support it), under
``torch.no_grad()``, the model in eval mode. The cache is transformers' own ``DynamicCache`` (it grows
by concatenation: each layer's keys and values are copied one token longer at every step) or
``StaticCache`` (allocated once for ``PROMPT + NEW`` tokens and written in place).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
from torch import nn

from oomsight.predict import inputs

CACHES = ("dynamic", "static")


parse = inputs.parse_generate
"""``2048:256`` → (prompt tokens, new tokens) (``inputs.parse_generate``)."""


def eval_mode(build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """``build`` in eval mode, its parameters frozen (no gradient is ever made)."""

    def build_eval() -> nn.Module:
        return build().eval().requires_grad_(False)

    return build_eval


def decode_step(new_tokens: int, cache: str) -> Callable[[nn.Module, Any, Any], None]:
    """``step(model, batch, optimizer)``: prefill on ``batch["input_ids"]``, then ``new_tokens`` - 1
    more forwards of one token each (the prefill made the first)."""

    def step(model: nn.Module, batch: Any, _optimizer: Any) -> None:
        ids = batch["input_ids"] if isinstance(batch, dict) else batch
        kv = make_cache(model, cache, int(ids.shape[0]), int(ids.shape[1]) + new_tokens)
        name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{name: kv})
            for _ in range(new_tokens - 1):
                ids = out.logits[:, -1:].argmax(-1)
                out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{name: kv})
            del out, kv

    return step


def make_cache(model: Any, kind: str, batch: int, length: int) -> Any:
    import transformers

    config = model.config  # shaped at its first update by the keys it is given (batch, heads, dtype)
    if kind == "static":
        return transformers.StaticCache(config=config, max_cache_len=length)
    return transformers.DynamicCache(config=config)


def cache_bytes(config: Any, batch: int, length: int, itemsize: int, cache: str = "dynamic") -> int:
    """Keys and values of every layer for ``length`` tokens: what the cache holds at the end. A
    sliding-window layer holds its window: transformers' ``DynamicSlidingWindowLayer`` keeps the last
    ``window - 1`` tokens, ``StaticSlidingWindowLayer`` allocates ``min(window, length)`` (a chunked
    layer likewise, its chunk the window)."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * batch * heads * head_dim * itemsize
    return sum(per_token * tokens for tokens in cached_tokens(config, length, cache))


def cached_tokens(config: Any, length: int, cache: str = "dynamic") -> list[int]:
    """Tokens each layer's cache holds after ``length`` tokens, by its type (``layer_types``, else every
    layer sliding where ``sliding_window`` is set, as transformers' ``get_layer_types_and_kwargs`` infers)."""
    layers = int(config.num_hidden_layers)
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None) or ["sliding_attention" if window else "full_attention"] * layers
    found = []
    for kind in list(types)[:layers]:
        span = getattr(config, "attention_chunk_size", None) if kind == "chunked_attention" else window
        if kind in ("sliding_attention", "chunked_attention") and span:
            found.append(min(length, span) if cache == "static" else min(length, span - 1))
        else:
            found.append(length)
    return found
