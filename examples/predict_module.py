"""A model of your own for ``oomsight predict --module`` (docs/prediction.md, "Your own model").

    oomsight predict --module examples/predict_module.py:spec --batch 16 --capacity 24GiB

``spec()`` returns a dict:

- ``build``: ``() -> nn.Module``, the model in training mode. It is called on the meta device, so
  it makes no weights: build from shapes, load no checkpoint.
- ``batch``: ``(n) -> inputs`` (or ``(n, device)``, called with ``"cpu"``): the inputs of one step for
  a batch of ``n`` samples, a tensor, a tuple or a dict of them. Make them on the CPU; the tracer
  turns them into fake CUDA tensors, so their size, not their values, matters. The same function
  serves every batch size the largest-batch search tries.
- ``optimizer`` (optional): ``(params) -> torch.optim.Optimizer``; AdamW (``--optimizer``) otherwise.
- ``step`` (optional): ``(model, batch, optimizer) -> None``, one training step. Without it the step is
  ``loss = model(**batch)`` for a dict (``model(*batch)`` for a tuple, ``model(batch)`` otherwise),
  the loss its output, or its ``.loss``, or the mean of the output; then ``backward()``,
  ``optimizer.step()`` and ``zero_grad(set_to_none=True)``. A step that reads a tensor's value
  (``.item()``, ``if loss > 0``) cannot be traced: keep it out.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

VOCAB, WIDTH, LAYERS, SEQ = 8000, 256, 4, 128


class TinyLM(nn.Module):
    """A small decoder-only language model: embedding, transformer encoder layers with a causal mask, head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, nhead=4, dim_feedforward=4 * WIDTH, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, LAYERS)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
        hidden = self.blocks(self.embed(ids), mask=mask, is_causal=True)
        logits = self.head(hidden)
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def batch(n: int) -> dict[str, torch.Tensor]:
    """``n`` samples of ``SEQ`` token ids and their labels (the next tokens, here random)."""
    return {"ids": torch.randint(0, VOCAB, (n, SEQ)), "labels": torch.randint(0, VOCAB, (n, SEQ))}


def step(model: nn.Module, inputs: dict[str, torch.Tensor], optimizer: Any) -> None:
    """One training step with gradient clipping, as a training loop of one's own does it."""
    loss = model(**inputs)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def spec() -> dict[str, Any]:
    return {
        "build": lambda: TinyLM().train(),
        "batch": batch,
        "optimizer": lambda params: torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1),
        "step": step,
    }
