"""Named models for ``oomsight predict --model NAME`` and the verification on the H200.

Each entry builds the model from a configuration (no weights are downloaded or made) and
an input batch of a given size; the same builders run the real steps in
``benchmarks/bench_predict.py``, so prediction and measurement see one model.
Transformers models come from their config classes (``transformers``); vision models from
``torchvision`` and, where it cannot be imported, from ``transformers``' own ResNet and ViT.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
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
    needs: tuple[str, ...] = ("transformers",)
    """Packages that can build it, any one of them (the first that imports is used)."""


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


def images(classes: int | None, size: int | Sequence[int] = 224, channels: int = 3) -> Callable[[int, str], Any]:
    """``batch(n, device)``: ``n`` images of ``channels`` x ``size`` x ``size`` pixels (``size`` an int, or
    (height, width)) and, where ``classes`` is given, an integer label below it for each."""
    height, width = (size, size) if isinstance(size, int) else (int(size[0]), int(size[-1]))

    def batch(n: int, device: str) -> dict[str, torch.Tensor]:
        found = {"pixel_values": torch.randn(n, channels, height, width, device=device)}
        if classes is not None:
            found["labels"] = torch.randint(0, classes, (n,), device=device)
        return found

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
        try:
            import torchvision
        except ImportError:  # the same architecture from transformers' config classes
            return WithLoss(_hf_vision(name)).train()
        return WithLoss(getattr(torchvision.models, name)(weights=None)).train()

    return build


def _hf_vision(name: str) -> nn.Module:
    """transformers' ResNet-50 (its ``ResNetConfig`` default) or ViT-B/16 (``ViTConfig``'s), 1,000 classes."""
    import transformers

    if name == "resnet50":
        resnet = transformers.ResNetConfig()
        resnet.num_labels = 1000
        return transformers.ResNetForImageClassification(resnet)
    vit = transformers.ViTConfig()
    vit.num_labels = 1000
    return transformers.ViTForImageClassification(vit)


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
    "resnet50": ModelSpec(
        "resnet50",
        _vision("resnet50"),
        images(1000),
        "ResNet-50, 224x224 (torchvision's; transformers' without it)",
        ("torchvision", "transformers"),
    ),
    "vit_b_16": ModelSpec(
        "vit_b_16",
        _vision("vit_b_16"),
        images(1000),
        "ViT-B/16, 224x224 (torchvision's; transformers' without it)",
        ("torchvision", "transformers"),
    ),
}


def get(name: str) -> ModelSpec:
    """The named model; ``KeyError`` lists the names."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None


def check_available(spec: ModelSpec) -> None:
    """``ImportError`` with the line to print when no package that builds ``spec`` is installed."""
    if not any(importlib.util.find_spec(package) for package in spec.needs):
        either = " or ".join(spec.needs)
        raise ImportError(f"--model {spec.name} needs {either}: pip install {spec.needs[-1]}")
