"""Issue 48: eight fresh jobs of the kinds the issue names, each labelled by construction.

Written from the job's side only (what it allocates, what holds it, and why), without reading oomsight's
analysis code. Every one runs out of memory; its ``--remedy`` run applies exactly the fix its remedy key
names and then fits: ``eval_accumulation`` (Trainer's ``eval_accumulation_steps``), ``detach_kept`` (keep
``.detach()`` of what a module or list keeps), ``worker_cuda`` (keep CUDA out of DataLoader workers),
``fused_optimizer``, ``bound_batch``, ``checkpointing`` and ``bound_input``.

Where a job's GPU is set from its own measured graph (``_cap_from``, as in ``wl_piles``), the plain and the
remedy run measure the same plain graph, so both get the same GPU and the plain run runs out where its
docstring says on any card. The worker job (``other_process``) fills the real device and runs alone.
"""

from __future__ import annotations

import collections
import copy
import functools
import math
import tempfile
from typing import Any

import torch
import torch.nn.functional as F
from common import DRY, GIB, bert_config, cap_gpu, dev, fast_fp32, gpt2, pick, tokens, workload
from torch.utils.checkpoint import checkpoint
from wl_piles import _cap_from, _measured, _param_bytes

# --- 1. leak: HF Trainer.evaluate() keeps every batch's logits on the GPU ---------------------------------


class _TokenSet(torch.utils.data.Dataset):
    """Random token sequences as ``{"input_ids", "labels"}`` rows (a causal LM's own labels)."""

    def __init__(self, n: int, seq: int, vocab: int, seed: int) -> None:
        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _next_token_accuracy(pred) -> dict[str, float]:  # type: ignore[no-untyped-def]
    logits = pred.predictions[0] if isinstance(pred.predictions, tuple) else pred.predictions
    hits = logits[:, :-1].argmax(-1) == pred.label_ids[:, 1:]
    return {"next_token_accuracy": float(hits.mean())}


@workload("leak", "eval_accumulation")
def hf_trainer_evaluate_keeps_logits(remedy: bool) -> None:
    """Hugging Face ``Trainer`` on a small GPT-2 (2 blocks x 256, vocabulary 50257, built from a config): 20
    training steps, then ``trainer.evaluate()`` over 512 sequences of 64 tokens (64 batches of 8) with a
    ``compute_metrics`` (next-token accuracy) and no ``eval_accumulation_steps``, on a 4 GiB GPU.

    Without ``eval_accumulation_steps`` the Trainer's evaluation loop keeps every batch's logits on the GPU
    (8 x 64 x 50257 fp32, ~103 MB a batch) and concatenates them each step, until the loop ends and hands
    them to ``compute_metrics``: ~6.6 GB for the set, and the concatenation briefly holds the old and the new
    copy, so it runs out some 15-20 batches in. The input never grows; what grows is outputs the framework
    keeps (graph-free: the Trainer evaluates under ``no_grad``). Label **leak** (kept outputs). Remedy
    (``eval_accumulation``): ``eval_accumulation_steps=8``: every 8 batches the Trainer moves what it kept
    to the CPU (numpy), so the GPU holds at most 8 batches' logits; the metric is the same number.
    """
    from transformers import Trainer, TrainingArguments

    cap_gpu(4)
    model = gpt2(2, 256, 4, n_positions=128)
    vocab, seq, batch = model.config.vocab_size, pick(64, 8), pick(8, 2)
    train, evals = _TokenSet(pick(160, 4), seq, vocab, 0), _TokenSet(pick(512, 6), seq, vocab, 1)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, per_device_train_batch_size=batch, per_device_eval_batch_size=batch,
            max_steps=pick(20, 2), learning_rate=3e-4, logging_steps=10, save_strategy="no", eval_strategy="no",
            report_to="none", dataloader_num_workers=0, disable_tqdm=True, use_cpu=DRY.on,
            eval_accumulation_steps=pick(8, 2) if remedy else None)
        trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=evals,
                          compute_metrics=_next_token_accuracy)
        trainer.train()
        print("evaluate:", trainer.evaluate(), flush=True)


# --- 2. leak: an attention module keeps its last probabilities, graph and all, as an attribute -------------


class _PlotAttention(torch.nn.Module):
    """Causal self-attention written out (softmax probabilities materialised) that keeps its last
    probabilities as ``self.last_attn`` for attention-map plots; ``detach``: keep them without their graph."""

    def __init__(self, d: int, heads: int, detach: bool) -> None:
        super().__init__()
        self.heads, self.detach = heads, detach
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.drop = torch.nn.Dropout(0.1)
        self.last_attn: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        probs = scores.masked_fill(causal, float("-inf")).softmax(-1)
        self.last_attn = probs.detach() if self.detach else probs  # for the attention-map plots
        return self.proj((self.drop(probs) @ v).transpose(1, 2).reshape(b, s, d))


class _PlotBlock(torch.nn.Module):
    def __init__(self, d: int, heads: int, detach: bool) -> None:
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn = _PlotAttention(d, heads, detach)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class _PlotLM(torch.nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int, detach: bool) -> None:
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, d), torch.nn.Embedding(seq, d)
        self.blocks = torch.nn.ModuleList(_PlotBlock(d, heads, detach) for _ in range(layers))
        self.ln_f, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


@workload("leak", "detach_kept")
def lm_attention_keeps_last_probs_for_plots(remedy: bool) -> None:
    """A GPT-like LM (8 blocks x 768, 12 heads, sequence 1024, vocabulary 16384, fp32, AdamW) whose attention
    module keeps its last softmax probabilities as an attribute, ``self.last_attn = probs``, graph and all,
    for attention-map plots. Every 8 steps the job plots them: ``model.eval()`` and one forward of a fixed
    probe batch of 8 sequences (grad mode left on: ``eval()`` is taken for enough), then back to training.

    During training the attribute costs nothing a step does not hold anyway (backward frees the saved
    tensors; the probabilities themselves are kept until the next forward replaces them). After the plot
    forward it holds that forward's whole graph: each layer's probabilities reach back through every
    earlier layer, and no backward will consume it; the next training forward replaces the attributes one
    layer at a time, so the plot graph lives until that forward's last layer, beside the new graph. The GPU
    is the states plus 1.6 training graphs (measured at the first forward): the first training step after
    the first plot runs out. Label **leak** (a graph no backward consumes, held by a module attribute; the
    input never changes). Remedy (``detach_kept``): ``self.last_attn = probs.detach()``: the plot forward's
    graph dies with it; the kept probabilities (the same plots) are replaced layer by layer as before.
    """
    fast_fp32()
    vocab, d, layers, heads, seq = pick(16384, 256), pick(768, 32), pick(8, 2), pick(12, 4), pick(1024, 16)
    with dev():
        model = _PlotLM(vocab, d, layers, heads, seq, detach=remedy)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=not DRY.on)
    probe = tokens(pick(8, 2), seq, vocab)
    for step in range(pick(16, 3)):
        model.train()
        ids = tokens(pick(4, 2), seq, vocab)
        if step == 0:
            logits, graph = _measured(lambda ids=ids: model(ids))
            _cap_from(3 * _param_bytes(model), graph, 1.6, "training graphs")
        else:
            logits = model(ids)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        del logits
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step} loss {loss.item():.3f}", flush=True)
        if (step + 1) % pick(8, 2) == 0:
            model.eval()
            model(probe)  # only for the attention maps below (the logits are dropped)
            maps = [blk.attn.last_attn[0].mean(0) for blk in model.blocks]
            entropy = [float(-(m * m.clamp_min(1e-9).log()).sum(-1).mean()) for m in maps]
            print("attention entropy per layer", " ".join(f"{e:.2f}" for e in entropy), flush=True)
            del maps


# --- 3. model states: the first foreach AdamW step ---------------------------------------------------------


@workload("model_states", "fused_optimizer")
def bert_large_mlm_foreach_adamw_first_step(remedy: bool) -> None:
    """BERT-large masked-LM pre-training (HF ``BertForMaskedLM`` from a config: 24 x 1024, ~335M params, fp32,
    1.34 GB of weights), batch 2 x 128, AdamW with the default implementation (``foreach`` on CUDA), on a GPU
    of 4.5 x the weights' bytes (~5.6 GiB).

    Weights, gradients and the two AdamW moments are 4 x 1.34 GB and fit, with ~0.5 x the weights to spare
    (the step's activations are ~0.7 GB and freed by backward). At its first step the foreach AdamW creates
    the moments and then takes ``torch._foreach_sqrt`` of every second moment at once: a temporary list as
    large as the weights, which does not fit. Label **model_states** (the optimizer's update over the
    states; nothing grows). Remedy (``fused_optimizer``): ``AdamW(..., fused=True)``: the fused kernel
    updates each parameter in place without the whole-group temporaries; the same update rule.
    """
    from transformers import BertForMaskedLM

    fast_fp32()
    cfg = bert_config(1024, 24, 16, 4096)
    with dev():
        model = BertForMaskedLM(cfg)
    weights = _param_bytes(model)
    if not DRY.on:
        print(f"cap {4.5 * weights / GIB:.2f} GiB: 4.5 x {weights / GIB:.2f} GiB of weights", flush=True)
        cap_gpu(4.5 * weights / GIB)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01,
                            fused=True if remedy and not DRY.on else None)
    for step in range(pick(6, 2)):
        ids = tokens(2, pick(128, 16), cfg.vocab_size)
        labels = ids.masked_fill(torch.rand(ids.shape, device=dev()) > 0.15, -100)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step} loss {loss.item():.3f}", flush=True)


# --- 4. other process (the job's own children): spawn DataLoader workers that open CUDA -------------------


class _Thumbnails(torch.utils.data.Dataset):
    """Decoded thumbnails (uint8 3 x 64 x 64, random) and a class each; deterministic per index."""

    def __init__(self, n: int, side: int = 64, classes: int = 1000) -> None:
        self.n, self.side, self.classes = n, side, classes

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, 256, (3, self.side, self.side), dtype=torch.uint8, generator=g), i % self.classes


def _augment(images: torch.Tensor, decode_side: int, out_side: int = 224) -> torch.Tensor:
    """GPU augmentation: a random crop of the thumbnails, up to the decode resolution, brightness jitter (in
    place), down to ``out_side``, normalised. The decode-resolution float batch is the one large temporary
    (every other step works on a contiguous tensor in place or on small ones, so nothing copies it)."""
    side = images.shape[-1]
    crop = int(side * 0.8)
    top, left = (int(v) for v in torch.randint(0, side - crop + 1, (2,)))
    x = images[:, :, top:top + crop, left:left + crop].float().div_(255)
    x = F.interpolate(x, size=(decode_side, decode_side), mode="bilinear", align_corners=False).mul_(1.1)
    x = F.interpolate(x, size=(out_side, out_side), mode="bilinear", align_corners=False)
    return x.sub_(0.5).div_(0.25)


def _collate(batch: list, decode_side: int, device: str):  # type: ignore[no-untyped-def]
    """The DataLoader's collate_fn, run in each worker: with ``device`` set, the batch goes to that device
    and is augmented there (CUDA in the worker); with ``device=None`` it stays a uint8 CPU batch."""
    images = torch.stack([b[0] for b in batch])
    labels = torch.tensor([b[1] for b in batch])
    if device is None:
        return images, labels
    return _augment(images.to(device), decode_side), labels.to(device)


class _ResidualMLP(torch.nn.Module):
    """A deep residual MLP classifier over 32 x 32 pooled images (its fp32 weights are most of its memory)."""

    def __init__(self, d: int, layers: int, classes: int = 1000) -> None:
        super().__init__()
        self.stem = torch.nn.Linear(3 * 32 * 32, d)
        self.backbone = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(layers))
        self.head = torch.nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(F.adaptive_avg_pool2d(x, 32).flatten(1))
        for lin in self.backbone:
            h = h + F.relu(lin(h)) * 0.1
        return self.head(h)


def _resume_adamw(opt: torch.optim.AdamW, step: int) -> None:
    """The AdamW state a checkpoint's ``optimizer.load_state_dict`` leaves on the GPU: both moments of every
    parameter and its step count (on the parameter's device, as the fused AdamW keeps it)."""
    for group in opt.param_groups:
        for p in group["params"]:
            opt.state[p] = {"step": torch.tensor(float(step), device=p.device if group.get("fused") else "cpu"),
                            "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}


@workload("other_process", "worker_cuda")
def finetune_spawn_workers_augment_on_gpu(remedy: bool) -> None:
    """Image fine-tuning resumed from a checkpoint (model and AdamW state on the GPU), with 12 DataLoader
    workers started with ``spawn`` whose ``collate_fn`` moves each batch to the GPU and augments it there
    (random crop, up to a ~1900-pixel decode resolution, jitter, down to 224). Runs alone on the real GPU.

    Sized from the card's memory T: the model (a deep residual MLP, fp32 weights ~0.2 T) with its resumed
    AdamW moments is 0.6 T before training; the first 16 steps train only the head (backbone frozen, a
    warm-up), then the backbone's gradients (0.2 T) join: 0.8 T in all, which fits the card alone. Each
    worker is a process of its own on the GPU: a CUDA context (~0.3-0.5 GiB) plus what its caching
    allocator keeps of the augmentation temporary (a 40 x 3 x ~1900^2 fp32 batch, 0.02 T) and the small
    224-pixel batches it has sent: ~0.3 T for the 12 (~25 GiB of 79), reached during the warm-up (0.6 T +
    0.3 T fits). When the backbone unfreezes its gradients no longer fit and the main process runs out in
    backward (the worker processes hold what is missing). Label
    **other_process** (processes other than the one that ran out hold the memory: here the job's own
    children, not another tenant). Remedy (``worker_cuda``): keep CUDA out of the workers: they return
    uint8 CPU batches, ``pin_memory=True``, and the main process moves each batch to the GPU and runs the
    same augmentation there (~0.02 T more in the main process, no worker contexts): same data, same model.
    """
    fast_fp32()
    total = pick(torch.cuda.get_device_properties(0).total_memory if not DRY.on else 0, 1 << 30)
    workers, batch, d = pick(12, 2), pick(40, 4), pick(8192, 64)
    decode_side = pick(int(math.sqrt(0.02 * total / (batch * 3 * 4))) // 32 * 32, 96)
    layers = pick(max(4, int(0.2 * total / (d * d * 4))), 2)
    with dev():
        model = _ResidualMLP(d, layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=not DRY.on)
    _resume_adamw(opt, 1000)
    print(f"GPU {total / GIB:.1f} GiB: {layers} x {d} layers ({_param_bytes(model) / GIB:.1f} GiB of weights), "
          f"decode side {decode_side}, {workers} spawn workers, CUDA in the workers: {not remedy}", flush=True)
    model.backbone.requires_grad_(False)
    loader = torch.utils.data.DataLoader(
        _Thumbnails(pick(40 * 48, 24)), batch_size=batch, shuffle=True, num_workers=workers,
        multiprocessing_context="spawn", prefetch_factor=2, pin_memory=remedy and not DRY.on,
        collate_fn=functools.partial(_collate, decode_side=decode_side, device=None if remedy else str(dev())))
    warmup = pick(16, 2)
    for step, (images, labels) in enumerate(loader):
        if step == warmup:
            model.backbone.requires_grad_(True)
            print("backbone unfrozen", flush=True)
        if remedy:
            images = _augment(images.to(dev(), non_blocking=True), decode_side)
            labels = labels.to(dev(), non_blocking=True)
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step} loss {loss.item():.3f}", flush=True)
        if step >= warmup + pick(6, 1):
            break
    del loader


# --- 5. growing demand: beam search under inference_mode, no optimizer -------------------------------------


@workload("growing_demand", "bound_batch")
def bart_beam_search_summaries_batch_too_large(remedy: bool) -> None:
    """Summarisation inference only: BART-large (from a config, 12+12 layers x 1024, bf16, no optimizer in
    the process) ``generate()`` with beam search (8 beams, exactly 384 new tokens: ``min_new_tokens`` keeps
    the random model from stopping) over 64 documents of 512 tokens in one call, under
    ``torch.inference_mode()``, on a 20 GiB GPU.

    Where the memory is: 64 x 8 = 512 beams each hold the cross-attention keys and values of their
    document (12 layers x 512 x 1024 x 2 x bf16: ~12 GiB, made at the first decoding step, with the
    encoder output repeated per beam) and a self-attention cache that grows by 48 KiB a beam and token
    (~24 MiB a token for 512 beams); each step's beam reordering copies caches a layer at a time. The
    first decoding steps fit with ~5 GiB to spare; the self-attention cache fills it some 200 tokens in.
    Label **growing_demand**: nothing is kept beyond its need (the cache lives until the call returns, the
    summaries go to the CPU) and there is no graph (inference_mode); it is not one forward's activations
    that do not fit (every forward takes one token a beam, and the first steps fit) but the per-step need,
    which grows with the tokens generated at this batch x beams. Remedy (``bound_batch``): 16 documents per
    ``generate()`` call (four calls): a quarter of the caches, and the same summaries (beam search treats
    each document alone; all documents are the same length, so no padding changes).
    """
    from transformers import BartConfig, BartForConditionalGeneration

    cap_gpu(20)
    d, layers, heads, ff = pick(1024, 64), pick(12, 2), pick(16, 4), pick(4096, 128)
    cfg = BartConfig(vocab_size=50265, d_model=d, encoder_layers=layers, decoder_layers=layers,
                     encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ff,
                     decoder_ffn_dim=ff, max_position_embeddings=1024)
    with dev():
        model = BartForConditionalGeneration(cfg).to(pick(torch.bfloat16, torch.float32)).eval()
    docs = tokens(pick(64, 4), pick(512, 16), cfg.vocab_size)
    per_call = pick(16, 2) if remedy else len(docs)
    new, beams = pick(384, 6), pick(8, 2)
    summaries = []
    with torch.inference_mode():
        for i in range(0, len(docs), per_call):
            chunk = docs[i:i + per_call]
            out = model.generate(input_ids=chunk, attention_mask=torch.ones_like(chunk), num_beams=beams,
                                 max_new_tokens=new, min_new_tokens=new, do_sample=False, early_stopping=True,
                                 no_repeat_ngram_size=0)
            summaries.append(out.cpu())
            print(f"documents {i}-{i + len(chunk) - 1}: {tuple(out.shape)}", flush=True)
    print("summaries", sum(len(s) for s in summaries), flush=True)


# --- 6. leak: validation in train mode without no_grad keeps its logits ------------------------------------


class _Basic(torch.nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(cout)
        self.c2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(cout)
        self.skip = torch.nn.Sequential()
        if stride != 1 or cin != cout:
            self.skip = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            torch.nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + self.skip(x))


def _resnet(width: int, classes: int) -> torch.nn.Module:
    """A ResNet-18-shaped classifier (BatchNorm, dropout before the head)."""
    w = width
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, w, 3, 1, 1, bias=False), torch.nn.BatchNorm2d(w), torch.nn.ReLU(),
        _Basic(w, w, 1), _Basic(w, w, 1), _Basic(w, 2 * w, 2), _Basic(2 * w, 2 * w, 1),
        _Basic(2 * w, 4 * w, 2), _Basic(4 * w, 4 * w, 1), _Basic(4 * w, 8 * w, 2), _Basic(8 * w, 8 * w, 1),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Dropout(0.2), torch.nn.Linear(8 * w, classes))


@workload("leak", "detach_kept")
def resnet_validation_in_train_mode_keeps_logits(remedy: bool) -> None:
    """ResNet-18-shaped classifier (64 base channels, BatchNorm, 100 classes, 64 x 64 images, fp32, SGD),
    training batch 128; every 10 steps a validation pass of 60 batches of 8 that forgets both
    ``model.eval()`` and ``torch.no_grad()`` and keeps each batch's ``logits`` in a list for the epoch's
    top-1 and per-class accuracy (``torch.cat`` at the end).

    Each kept logits tensor is only 8 x 100 floats, but it carries its graph: every validation forward's
    saved activations (BatchNorm in train mode saves its batch statistics too) stay alive, about 1/16 of a
    training graph each. The GPU is the states plus 1.6 training graphs (measured at the first forward),
    so the first validation runs out after some 20 batches: graphs of forwards no backward consumes, in a
    job whose every backward consumed one. Label **leak**. Remedy (``detach_kept``): keep ``logits.detach()``:
    the same logits, the same BatchNorm updates, no graph kept (``no_grad`` would fit too, but in a job that
    trains nothing shows the validation forward trains nothing, so it may not lead).
    """
    fast_fp32()
    classes, side = 100, pick(64, 16)
    with dev():
        model = _resnet(pick(64, 4), classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    for step in range(pick(12, 2)):
        model.train()
        x = torch.randn(pick(128, 4), 3, side, side, device=dev())
        y = torch.randint(0, classes, (x.shape[0],), device=dev())
        if step == 0:
            logits, graph = _measured(lambda x=x: model(x))
            _cap_from(3 * _param_bytes(model), graph, 1.6, "training graphs")
        else:
            logits = model(x)
        loss = F.cross_entropy(logits, y)
        del logits
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step} loss {loss.item():.3f}", flush=True)
        if (step + 1) % pick(10, 2):
            continue
        kept, targets = [], []
        for _batch in range(pick(60, 2)):
            xv = torch.randn(pick(8, 2), 3, side, side, device=dev())
            out = model(xv)
            kept.append(out.detach() if remedy else out)  # the remedy keeps the same logits without their graphs
            targets.append(torch.randint(0, classes, (xv.shape[0],), device=dev()))
        logits, y = torch.cat(kept), torch.cat(targets)
        top1 = (logits.argmax(-1) == y).float().mean().item()
        print(f"validation top-1 {top1:.4f} over {len(y)} images", flush=True)
        del kept, targets, logits, y


# --- 7. activations: a GAN whose generator step runs out with D frozen -------------------------------------


class _PixelNorm(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-8)


def _g_block(cin: int, cout: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Upsample(scale_factor=2, mode="nearest"),
        torch.nn.Conv2d(cin, cout, 3, 1, 1), torch.nn.LeakyReLU(0.2), _PixelNorm(),
        torch.nn.Conv2d(cout, cout, 3, 1, 1), torch.nn.LeakyReLU(0.2), _PixelNorm())


class _Generator(torch.nn.Module):
    """ProGAN-shaped generator: 4 x 4 from a 512-d latent, six up-sampling blocks to 256 x 256, no BatchNorm
    (pixel norm), so recomputing a block in backward gives exactly the same values."""

    def __init__(self, chans: list[int], checkpointed: bool) -> None:
        super().__init__()
        self.c0, self.checkpointed = chans[0], checkpointed
        self.fc = torch.nn.Linear(512, chans[0] * 16)
        self.blocks = torch.nn.ModuleList(_g_block(a, b) for a, b in zip(chans, chans[1:]))
        self.to_rgb = torch.nn.Conv2d(chans[-1], 3, 1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = F.leaky_relu(self.fc(z), 0.2).view(len(z), self.c0, 4, 4)
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False) if self.checkpointed else blk(x)
        return torch.tanh(self.to_rgb(x))


def _discriminator(chans: list[int]) -> torch.nn.Module:
    layers: list[torch.nn.Module] = [torch.nn.Conv2d(3, chans[0], 1), torch.nn.LeakyReLU(0.2)]
    for a, b in zip(chans, chans[1:]):
        layers += [torch.nn.Conv2d(a, a, 3, 1, 1), torch.nn.LeakyReLU(0.2), torch.nn.Conv2d(a, b, 3, 1, 1),
                   torch.nn.LeakyReLU(0.2), torch.nn.AvgPool2d(2)]
    return torch.nn.Sequential(*layers, torch.nn.Flatten(), torch.nn.LazyLinear(1))


def _g_step_measured(G: Any, D: Any, z: torch.Tensor, remedy: bool) -> tuple[torch.Tensor, int]:
    """G's step output through the frozen D, and the plain (unchecked) step's graph bytes, measured in both runs."""
    G.checkpointed = False
    plain, g_graph = _measured(lambda: G(z))
    out, d_fake_graph = _measured(lambda: D(plain))
    G.checkpointed = remedy
    if remedy:
        del plain, out
        out = D(G(z))
    return out, g_graph + d_fake_graph


@workload("activations", "checkpointing")
def progan_generator_step_with_frozen_discriminator(remedy: bool) -> None:
    """Unconditional GAN at 256 x 256: a ProGAN-shaped generator (512 ... 32 channels) and a discriminator
    of half its width, non-saturating loss, Adam (betas 0, 0.99) for both, batch 32. D's step takes real
    and fake images (the fakes made under ``no_grad``); G's step freezes D with ``D.requires_grad_(False)``
    (D's own optimizer still holds its parameters), passes G's output through D and back into G.

    G's step holds G's activations (the 128- and 256-pixel blocks most of them) and D's activations for
    the fakes (needed to carry the gradient through D to G, though D's weights get none): ~2.4 x what D's
    step holds. The GPU is the states plus D's step graph and 60 % of the way to G's step graph, both
    measured in the first (uncapped) iteration: from the second iteration on, D's step fits and G's step runs out, in
    G's forward or backward. Nothing is kept across steps and the batch is constant. Label
    **activations**. D is frozen but trained by its own optimizer, and the gradient to G flows through it:
    running D under ``no_grad`` in G's step would cut G's gradient (``frozen_no_grad`` is wrong here).
    Remedy (``checkpointing``): each generator block under ``torch.utils.checkpoint`` (non-reentrant):
    G's step keeps the block inputs and recomputes one block at a time in backward; the same values (no
    BatchNorm, no dropout), the same training.
    """
    fast_fp32()
    g_ch = pick([512, 512, 256, 128, 64, 32, 32], [16, 8, 8])
    d_ch = pick([8, 16, 32, 64, 128, 256, 256], [4, 8, 8])
    batch = pick(32, 2)
    with dev():
        G, D = _Generator(g_ch, checkpointed=remedy), _discriminator(d_ch)
    side = 4 * 2 ** (len(g_ch) - 1)
    D(torch.zeros(1, 3, side, side, device=dev()))  # materialise the lazy head
    opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.0, 0.99))
    opt_d = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.0, 0.99))
    states = 4 * (_param_bytes(G) + _param_bytes(D))
    for it in range(pick(6, 2)):
        real = torch.rand(batch, 3, side, side, device=dev()) * 2 - 1
        z = torch.randn(batch, 512, device=dev())
        with torch.no_grad():
            fake = G(z)
        scores, d_graph = _measured(lambda real=real, fake=fake: D(torch.cat([real, fake])))
        loss_d = F.softplus(-scores[:batch]).mean() + F.softplus(scores[batch:]).mean()
        del scores
        loss_d.backward()
        opt_d.step()
        opt_d.zero_grad(set_to_none=True)
        D.requires_grad_(False)
        z = torch.randn(batch, 512, device=dev())
        if it == 0:  # the plain generator's graph in both runs (the remedy run drops this one)
            out, step_graph = _g_step_measured(G, D, z, remedy)
            print(f"graphs: D's step {d_graph / GIB:.2f} GiB, G's step {step_graph / GIB:.2f} GiB", flush=True)
        else:
            out = D(G(z))
        loss_g = F.softplus(-out).mean()
        del out
        loss_g.backward()
        opt_g.step()
        opt_g.zero_grad(set_to_none=True)
        D.requires_grad_(True)
        if it == 0:
            _cap_from(states, d_graph + 0.6 * (step_graph - d_graph), 1, "D's step graph + 0.6 x (G's - D's)")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # the cap binds at the next cudaMalloc
        print(f"iteration {it} loss D {loss_d.item():.3f} G {loss_g.item():.3f}", flush=True)


# --- 8. growing demand (not a leak): a MoCo queue fills to its cap, then the batch grows -------------------


def _moco_encoder(width: int, dim: int) -> torch.nn.Module:
    w = width
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, w, 3, 1, 1, bias=False), torch.nn.BatchNorm2d(w), torch.nn.ReLU(),
        _Basic(w, 2 * w, 2), _Basic(2 * w, 4 * w, 2), _Basic(4 * w, 8 * w, 2),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8 * w, dim))


def _momentum_update(enc_k: torch.nn.Module, enc_q: torch.nn.Module) -> None:
    with torch.no_grad():  # the momentum encoder
        for pk, pq in zip(enc_k.parameters(), enc_q.parameters()):
            pk.mul_(0.999).add_(pq.detach(), alpha=0.001)


@workload("growing_demand", "bound_input")
def moco_deque_queue_fills_then_batch_grows(remedy: bool) -> None:
    """MoCo-style contrastive pre-training (a small ResNet encoder on 64 x 64 crops, 2048-d keys, momentum
    key encoder, InfoNCE against a queue of negatives), batch 512; the queue is a ``deque(maxlen=200)`` of
    each step's detached, normalised keys on the GPU (512 x 2048 fp32, 4 MB a push), concatenated for
    every step's negatives. At step 400 the schedule raises the batch to 2048.

    The queue fills over the first 200 steps (to ~0.84 GB, twice that while concatenated) and then stays
    flat: every push drops the oldest. The batch increase multiplies the step's activations and its
    B x 102400 logits by four at once, and that step runs out (the GPU is the states, the queue twice,
    two encoder graphs and six logits' worth at batch 512, measured at the first forward). Label
    **growing_demand** (what one forward takes in rose); the rise before it is a bounded buffer filling,
    not a leak. Remedy (``bound_input``): micro-batches of at most 512 (what fitted), their gradients
    accumulated (each loss scaled by its share), the keys pushed per micro-batch after the step: every
    query still meets the same queue, and the queue keeps the same number of keys.
    """
    fast_fp32()
    dim, cap_k, tau = pick(2048, 32), pick(200, 3), 0.2
    base, big, grow_at = pick(512, 4), pick(2048, 16), pick(400, 6)
    with dev():
        enc_q = _moco_encoder(pick(32, 4), dim)
    enc_k = copy.deepcopy(enc_q).requires_grad_(False)
    opt = torch.optim.SGD(enc_q.parameters(), lr=0.03, momentum=0.9, weight_decay=1e-4)
    queue: collections.deque = collections.deque(maxlen=cap_k)
    side = pick(64, 16)

    def views(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.rand(n, 3, side, side, device=dev())
        return x + 0.1 * torch.randn_like(x), x.flip(-1)

    for step in range(pick(grow_at + 6, grow_at + 2)):
        batch = base if step < grow_at else big
        micro = min(batch, base) if remedy else batch
        keys = []
        for start in range(0, batch, micro):
            xq, xk = views(micro)
            if step == 0 and start == 0:
                q, graph = _measured(lambda xq=xq: enc_q(xq))
                logits_bytes = base * (cap_k * base + 1) * 4
                states = 4 * _param_bytes(enc_q) + 2 * cap_k * base * dim * 4 + 6 * logits_bytes
                _cap_from(states, graph, 2, "encoder graphs at batch 512")
            else:
                q = enc_q(xq)
            q = F.normalize(q, dim=1)
            with torch.no_grad():
                k = F.normalize(enc_k(xk), dim=1)
            pos = (q * k).sum(1, keepdim=True)
            neg = q @ torch.cat(list(queue)).T if queue else q.new_zeros(micro, 0)
            logits = torch.cat([pos, neg], 1) / tau
            loss = F.cross_entropy(logits, torch.zeros(micro, dtype=torch.long, device=dev()))
            (loss * micro / batch).backward()
            keys.append(k)
            del q, pos, neg, logits
        opt.step()
        opt.zero_grad(set_to_none=True)
        _momentum_update(enc_k, enc_q)
        queue.extend(keys)  # one push per micro-batch: at most 512 keys each, the deque keeps the last 200
        if step % 50 == 0 or step >= grow_at:
            print(f"step {step} batch {batch} queue {sum(len(t) for t in queue)} keys loss {loss.item():.3f}",
                  flush=True)
