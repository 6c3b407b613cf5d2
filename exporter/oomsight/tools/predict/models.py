"""Named models for ``oomsight predict --model NAME`` and the verification on the H200.

Each entry builds the model from a configuration (no weights are downloaded or made) and
an input batch of a given size; the same builders run the real steps in
``benchmarks/bench_predict.py``, so prediction and measurement see one model.
Transformers models come from their config classes (``transformers``); vision models from
``torchvision`` and, where it cannot be imported, from ``transformers``' own ResNet and ViT.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    """How to build one named model and its inputs."""

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[int, str], Any]
    """``batch(batch_size, device)``: the inputs of one step."""
    summary: str


class WithLoss(nn.Module):
    """A classifier whose forward takes labels and returns the cross-entropy loss."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        out = self.net(pixel_values)
        logits = out if isinstance(out, torch.Tensor) else out.logits
        return nn.functional.cross_entropy(logits, labels)


def _tokens(vocab: int, seq: int) -> Callable[[int, str], Any]:
    def batch(n: int, device: str) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab, (n, seq), device=device)
        return {"input_ids": ids, "labels": ids}

    return batch


def _images(classes: int, size: int = 224) -> Callable[[int, str], Any]:
    def batch(n: int, device: str) -> dict[str, torch.Tensor]:
        return {
            "pixel_values": torch.randn(n, 3, size, size, device=device),
            "labels": torch.randint(0, classes, (n,), device=device),
        }

    return batch


def _hf(kind: str, checkpointing: bool = False, **config: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        cfg = getattr(transformers, f"{kind}Config")(**config)
        head = {"GPT2": "GPT2LMHeadModel", "Llama": "LlamaForCausalLM", "Bert": "BertForMaskedLM"}[kind]
        model = getattr(transformers, head)(cfg)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        model.train()
        return model

    return build


def _vision(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision

        return WithLoss(getattr(torchvision.models, name)(weights=None)).train()

    return build


GPT2: dict[str, Any] = {"n_positions": 1024, "attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0}
LLAMA: dict[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 12,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
}
BERT: dict[str, Any] = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}

MODELS: dict[str, ModelSpec] = {
    "gpt2": ModelSpec("gpt2", _hf("GPT2", False, **GPT2), _tokens(50257, 1024), "GPT-2 small (124M), 1024 tokens"),
    "gpt2-checkpointed": ModelSpec(
        "gpt2-checkpointed",
        _hf("GPT2", checkpointing=True, **GPT2),
        _tokens(50257, 1024),
        "GPT-2 small, activation checkpointing per block, 1024 tokens",
    ),
    "llama": ModelSpec(
        "llama", _hf("Llama", False, **LLAMA), _tokens(32000, 1024), "Llama-style decoder (210M, GQA 16/4)"
    ),
    "llama-checkpointed": ModelSpec(
        "llama-checkpointed",
        _hf("Llama", checkpointing=True, **LLAMA),
        _tokens(32000, 1024),
        "Llama-style decoder, activation checkpointing per layer",
    ),
    "bert": ModelSpec("bert", _hf("Bert", False, **BERT), _tokens(30522, 512), "BERT base, masked LM, 512 tokens"),
    "resnet50": ModelSpec("resnet50", _vision("resnet50"), _images(1000), "torchvision ResNet-50, 224x224"),
    "vit_b_16": ModelSpec("vit_b_16", _vision("vit_b_16"), _images(1000), "torchvision ViT-B/16, 224x224"),
}


def get(name: str) -> ModelSpec:
    """The named model; ``KeyError`` lists the names."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None
