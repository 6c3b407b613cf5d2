"""Shared plumbing for the held-out workloads: the registry, the ``--dry`` switch, the GPU cap.

A workload is a function ``fn(remedy: bool) -> None`` registered with ``@workload(label, remedy_key)``.
Under ``--dry`` (``DRY.on``) every workload runs on the CPU with tiny shapes and one or two steps,
only to show that it imports, builds its model and takes a step; sizes are picked with ``pick(gpu, dry)``.
"""

from __future__ import annotations

import os
from typing import Callable

import torch

GIB = 1 << 30


class _Dry:
    on = False


DRY = _Dry()
WORKLOADS: dict[str, tuple[str, str, Callable[[bool], None]]] = {}


def workload(label: str, remedy: str) -> Callable[[Callable[[bool], None]], Callable[[bool], None]]:
    def deco(fn: Callable[[bool], None]) -> Callable[[bool], None]:
        WORKLOADS[fn.__name__] = (label, remedy, fn)
        return fn

    return deco


def pick(gpu, dry):  # type: ignore[no-untyped-def]
    """The GPU-sized value, or the tiny CPU one under --dry."""
    return dry if DRY.on else gpu


def dev() -> torch.device:
    return torch.device("cpu") if DRY.on else torch.device("cuda")


def cap_gpu(gib: float) -> None:
    """Pretend the GPU has ``gib`` GiB: the caching allocator refuses to reserve more than that."""
    if DRY.on:
        return
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gib * GIB / total))


def autocast():  # type: ignore[no-untyped-def]
    """bf16 autocast on the GPU (a no-op context on the CPU dry run)."""
    return torch.autocast(device_type=dev().type, dtype=torch.bfloat16, enabled=not DRY.on)


def fast_fp32() -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def tokens(batch: int, seq: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), device=dev())


def gpt2(n_layer: int, n_embd: int, n_head: int, n_positions: int = 1024, **kw):  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM, GPT2Config

    if DRY.on:
        n_layer, n_embd, n_head = 2, 64, 4
    cfg = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_positions=n_positions, **kw)
    with dev():
        return AutoModelForCausalLM.from_config(cfg)


def llama_config(hidden: int, layers: int, inter: int, heads: int, vocab: int = 32000, kv_heads: int | None = None,
                 max_pos: int = 32768):  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig

    if DRY.on:
        hidden, layers, inter, heads, kv_heads, vocab = 64, 2, 128, 4, None, 1000
    return LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                       num_attention_heads=heads, num_key_value_heads=kv_heads or heads, vocab_size=vocab,
                       max_position_embeddings=max_pos, tie_word_embeddings=False)


def llama(hidden: int, layers: int, inter: int, heads: int, vocab: int = 32000, dtype=None, **kw):  # type: ignore[no-untyped-def]
    """A Llama-style causal LM built from a config, directly on the device (no weights are downloaded)."""
    from transformers import AutoModelForCausalLM

    cfg = llama_config(hidden, layers, inter, heads, vocab, **kw)
    with dev():
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype or torch.float32)


def bert_config(hidden: int = 768, layers: int = 12, heads: int = 12, inter: int = 3072, **kw):  # type: ignore[no-untyped-def]
    from transformers import BertConfig

    if DRY.on:
        hidden, layers, heads, inter = 64, 2, 4, 128
    return BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      intermediate_size=inter, **kw)


def env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")
