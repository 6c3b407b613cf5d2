"""Jobs that fit (label ``none``): they must end FITS and must not be flagged.

They are chosen to look like trouble to a naive reader of a memory timeline: noisy per-step memory, and
memory that rises over the first steps and then stays flat.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from common import DRY, autocast, bert_config, cap_gpu, dev, pick, tokens, workload


@workload("none", "none")
def bert_dynamic_padding_fits(remedy: bool) -> None:
    """BERT-base classifier fine-tune with dynamic padding (batch 32, lengths 16..384) on a 10 GiB GPU.

    Per-step memory swings with each batch's longest sequence, but nothing is kept between steps and the
    longest possible batch needs ~5 GB: fits.
    """
    from transformers import BertForSequenceClassification

    cap_gpu(10)
    with dev():
        model = BertForSequenceClassification(bert_config(num_labels=5))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-5)
    rng = random.Random(2)
    running = 0.0
    for step in range(pick(60, 2)):
        lengths = [int(min(384, max(16, rng.expovariate(1 / 90)))) for _ in range(pick(32, 2))]
        seq = pick(max(lengths), 16)
        ids = tokens(len(lengths), seq, 30000)
        mask = (torch.arange(seq, device=dev())[None] < torch.tensor(lengths, device=dev())[:, None]).long()
        with autocast():
            y = torch.randint(0, 5, (len(lengths),), device=dev())
            loss = model(input_ids=ids, attention_mask=mask, labels=y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        running = 0.98 * running + 0.02 * loss.item()
        if step % 50 == 0:
            print(f"step {step} loss {running:.3f}", flush=True)


class _MoE(torch.nn.Module):
    """Top-1 routed mixture of experts; an expert that got no token this step gets no gradient."""

    def __init__(self, d: int, ff: int, n_experts: int) -> None:
        super().__init__()
        self.router = torch.nn.Linear(d, n_experts)
        self.w_in = torch.nn.ModuleList(torch.nn.Linear(d, ff) for _ in range(n_experts))
        self.w_out = torch.nn.ModuleList(torch.nn.Linear(ff, d) for _ in range(n_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        gate = self.router(flat).softmax(-1)
        weight, expert = gate.max(-1)
        out = torch.zeros_like(flat)
        for e in expert.unique().tolist():
            idx = (expert == e).nonzero().squeeze(1)
            h = self.w_out[e](F.gelu(self.w_in[e](flat[idx])))
            out = out.index_add(0, idx, h * weight[idx, None])
        return x + out.view_as(x)


@workload("none", "none")
def moe_lazy_optimizer_state_fits(remedy: bool) -> None:
    """Mixture-of-experts LM (2 MoE layers x 128 experts, ~540M params) with AdamW: warm-up rise, then flat.

    AdamW creates an expert's state the first time that expert has a gradient, i.e. the first step it is
    routed a token. With 256 tokens a step over 128 experts per layer, most experts appear in step 1 and
    the rest over the next few steps, so memory rises over the first ~5 steps (to ~9 GB) and then stays
    flat for the remaining 20 steps. Fits in 14 GiB.
    """
    cap_gpu(14)
    d, ff, n_exp, vocab = pick(1024, 32), pick(1024, 64), pick(128, 4), 32000
    emb = torch.nn.Embedding(vocab, d)
    layers = torch.nn.ModuleList(_MoE(d, ff, n_exp) for _ in range(2))
    head = torch.nn.Linear(d, vocab)
    model = torch.nn.ModuleList([emb, layers, head]).to(dev())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _step in range(pick(25, 2)):
        ids = torch.randint(0, vocab, (pick(2, 2), pick(128, 8)), device=dev())
        x = emb(ids)
        for layer in layers:
            x = layer(x)
        loss = F.cross_entropy(head(x).flatten(0, 1), ids.roll(-1, 1).flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@workload("none", "none")
def lightning_cnn_fits(remedy: bool) -> None:
    """A PyTorch Lightning ``Trainer.fit`` of a small CNN on random 64x64 images, bf16-mixed, on a 4 GiB GPU.

    Lightning's own loop (optimizer step, logging of ``self.log`` values, validation every 50 steps under
    no_grad); the model and batch need well under 2 GB. Fits.
    """
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader, TensorDataset

    cap_gpu(4)

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            ch = pick(128, 8)
            self.body = torch.nn.Sequential(
                torch.nn.Conv2d(3, ch, 3, padding=1), torch.nn.BatchNorm2d(ch), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                torch.nn.Conv2d(ch, 2 * ch, 3, padding=1), torch.nn.BatchNorm2d(2 * ch), torch.nn.ReLU(),
                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(2 * ch, 10))

        def training_step(self, batch, _idx):  # type: ignore[no-untyped-def]
            x, y = batch
            loss = F.cross_entropy(self.body(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, _idx):  # type: ignore[no-untyped-def]
            x, y = batch
            self.log("val_acc", (self.body(x).argmax(-1) == y).float().mean())

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    n = pick(128 * 50, 8)
    data = TensorDataset(torch.randn(n, 3, 64, 64), torch.randint(0, 10, (n,)))
    train = DataLoader(data, batch_size=pick(128, 4), shuffle=True)
    val = DataLoader(TensorDataset(data.tensors[0][:512], data.tensors[1][:512]), batch_size=pick(128, 4))
    trainer = pl.Trainer(accelerator="cpu" if DRY.on else "gpu", devices=1, precision="32" if DRY.on else "bf16-mixed",
                         max_steps=pick(150, 2), val_check_interval=pick(50, 1), logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Net(), train, val)
