"""Activations: a steady job whose activations / temporaries are simply too big for the GPU.

Every step asks for the same memory; the first (or first few) steps already fail. The remedies are the
usual knobs: checkpointing, smaller micro-batch with accumulation, autocast, no_grad for inference.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from common import DRY, autocast, bert_config, cap_gpu, dev, fast_fp32, gpt2, llama, pick, tokens, workload


@workload("activations", "autocast")
def resnet50_fp32_large_batch(remedy: bool) -> None:
    """ResNet-50 (HF ResNetForImageClassification), plain fp32, batch 160 at 224x224, on a 10 GiB GPU.

    ~80 MB of fp32 conv/BN activations per image, ~13 GB for the step against 10 GiB: too big from the first
    step. Remedy: bf16 autocast (channels_last), which halves the activations at the same batch.
    """
    from transformers import ResNetConfig, ResNetForImageClassification

    cap_gpu(10)
    tiny = {"embedding_size": 8, "hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1]}
    cfg = ResNetConfig(num_labels=1000, **pick({}, tiny))
    with dev():
        model = ResNetForImageClassification(cfg).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    for _step in range(pick(8, 1)):
        x = torch.randn(pick(160, 4), 3, pick(224, 32), pick(224, 32), device=dev())
        x = x.to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (x.shape[0],), device=dev())
        if remedy:
            with autocast():
                loss = model(pixel_values=x, labels=y).loss
        else:
            loss = model(pixel_values=x, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@workload("activations", "checkpointing")
def llama_long_context_bf16_autocast(remedy: bool) -> None:
    """Llama-style LM (~280M, 20 layers) at 16k context, batch 1, bf16 autocast already on, on a 16 GiB GPU.

    Autocast and flash/sdpa attention are already in place; 20 layers x 16k tokens of saved activations
    (~16 GB) plus logits and AdamW states exceed 16 GiB on the first step. Remedy: activation
    checkpointing (``model.gradient_checkpointing_enable()``), which keeps one layer input per layer.
    """
    cap_gpu(16)
    model = llama(1024, 20, 2816, 16, vocab=16000)
    model.config.use_cache = False
    if remedy:
        model.gradient_checkpointing_enable()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4, fused=not DRY.on)
    for _step in range(pick(4, 1)):
        ids = tokens(1, pick(16384, 32), model.config.vocab_size)
        with autocast():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@workload("activations", "batch")
def gpt2_medium_ckpt_accum_still_too_big(remedy: bool) -> None:
    """GPT-2 medium (24 layers), gradient checkpointing AND gradient accumulation already on; micro-batch 16 x 1024.

    Checkpointing shrank the per-layer activations, but the fp32 logits of a 16 x 1024 micro-batch
    (16k x 50257: logits, log-softmax and their gradient, ~3.3 GB each) plus AdamW states still exceed
    16 GiB. Remedy: micro-batch 4 with 4x more accumulation steps (same effective batch of 64).
    """
    fast_fp32()
    cap_gpu(16)
    model = gpt2(24, 1024, 16)
    model.config.use_cache = False
    model.gradient_checkpointing_enable()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=not DRY.on)
    effective = pick(64, 2)
    micro = pick(4 if remedy else 16, 1)
    for _step in range(pick(2, 1)):
        for _ in range(effective // micro):
            ids = tokens(micro, pick(1024, 16), model.config.vocab_size)
            (model(input_ids=ids, labels=ids).loss * micro / effective).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)


class _Block(torch.nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class NanoGPT(torch.nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, ctx: int) -> None:
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(ctx, d)
        self.blocks = torch.nn.ModuleList(_Block(d, heads) for _ in range(layers))
        self.ln, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


@workload("activations", "batch")
def nanogpt_compiled_fp32(remedy: bool) -> None:
    """Hand-written nanoGPT (12 x 768, 4k vocab) with ``torch.compile`` per block, trained in fp32 at batch 32 x 1024.

    Regional compilation (each block compiled, the usual way to keep compile time down). Inductor fuses
    the pointwise ops, but the fp32 matmul outputs saved for backward (~12 GB at this batch) still exceed
    12 GiB with the logits and AdamW states. Remedy: micro-batch 8 with 4-step gradient accumulation.
    (bf16 autocast alone was measured NOT to be enough here: it still ran out at 12 GiB.)
    """
    fast_fp32()
    cap_gpu(12)
    model = NanoGPT(4096, pick(768, 64), pick(12, 2), pick(12, 4), 1024).to(dev())
    if not DRY.on:
        for blk in model.blocks:
            blk.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=not DRY.on)
    batch, accum = pick(32, 2), (4 if remedy else 1)
    for _step in range(pick(3, 1)):
        for _ in range(accum):
            idx = torch.randint(0, 4096, (batch // accum, pick(1024, 16)), device=dev())
            (model(idx, idx) / accum).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@workload("activations", "no_grad")
def vit_large_predict_with_grad_enabled(remedy: bool) -> None:
    """Batch prediction with ViT-L/16 (fp32) in ``model.eval()`` but without ``torch.no_grad()``.

    The predictions are moved to the CPU, so nothing outlives a batch; but with grad mode on, one forward
    saves every layer's activations for a backward that never comes (~18 GB for 64 images over 24 layers),
    which does not fit 8 GiB. Label activations (a steady per-batch need, not a leak). Remedy:
    ``torch.inference_mode()``.
    """
    import contextlib

    from transformers import ViTConfig, ViTForImageClassification

    fast_fp32()
    cap_gpu(8)
    cfg = ViTConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096) \
        if not DRY.on else ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128)
    with dev():
        model = ViTForImageClassification(cfg)
    model.eval()
    preds = []
    ctx = torch.inference_mode() if remedy else contextlib.nullcontext()
    with ctx:
        for _batch in range(pick(10, 2)):
            x = torch.randn(pick(64, 2), 3, cfg.image_size, cfg.image_size, device=dev())
            preds.append(model(pixel_values=x).logits.argmax(-1).cpu())
    print("predicted", sum(len(p) for p in preds))


@workload("activations", "batch")
def bert_large_embed_corpus_batch_too_big(remedy: bool) -> None:
    """Corpus embedding with a BERT-large encoder in bf16 under ``torch.inference_mode()``, batch 1024 x 512.

    No autograd at all; the per-layer temporaries of one 1024 x 512 batch (the 4096-wide MLP intermediate
    and GELU output, ~2 GB each, plus attention and hidden states) exceed 6 GiB. Label activations
    (temporaries of a steady job). Remedy: batch 128.
    """
    from transformers import BertModel

    cap_gpu(6)
    with dev():
        model = BertModel(bert_config(1024, 24, 16, 4096), add_pooling_layer=False).to(torch.bfloat16)
    model.eval()
    n_docs, batch = pick(2048, 4), pick(128 if remedy else 1024, 2)
    embeddings = []
    with torch.inference_mode():
        for start in range(0, n_docs, batch):
            ids = tokens(min(batch, n_docs - start), pick(512, 16), 30000)
            h = model(input_ids=ids).last_hidden_state
            embeddings.append(F.normalize(h[:, 0].float(), dim=-1).cpu())
    print("embedded", sum(len(e) for e in embeddings))


@workload("activations", "batch")
def t5_autobatch_catches_oom(remedy: bool) -> None:
    """T5 (encoder-decoder, ~220M) fine-tune with a hand-rolled "find the largest batch" loop that catches OOM.

    Starts at batch 256 (256 source / 128 target tokens), catches ``torch.cuda.OutOfMemoryError``, frees
    and halves until a step succeeds, then trains on. The job ends FITS; the OOMs it raised and caught were
    activations too big for the batch (the labelled cause). Remedy: start at the batch that fits, 16,
    with 16-step accumulation, so no OOM is ever raised.
    """
    from transformers import T5Config, T5ForConditionalGeneration

    fast_fp32()
    cap_gpu(12)
    size = pick({"d_model": 768, "d_ff": 3072, "num_layers": 12, "num_heads": 12, "vocab_size": 32128},
                {"d_model": 64, "d_ff": 128, "d_kv": 16, "num_layers": 2, "num_heads": 4, "vocab_size": 1000})
    cfg = T5Config(decoder_start_token_id=0, pad_token_id=0, **size)
    with dev():
        model = T5ForConditionalGeneration(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=not DRY.on)
    effective = pick(256, 2)
    batch, accum = (pick(16, 1), effective // pick(16, 1)) if remedy else (effective, 1)

    def step(b: int, acc: int) -> None:
        for _ in range(acc):
            src = tokens(b, pick(256, 16), cfg.vocab_size)
            tgt = tokens(b, pick(128, 8), cfg.vocab_size)
            (model(input_ids=src, labels=tgt).loss / acc).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    done = 0
    while done < pick(3, 1):
        oom = False
        try:
            step(batch, accum)
            done += 1
        except torch.cuda.OutOfMemoryError:
            oom = True
        if oom:  # outside the except block, so the traceback's frames no longer pin the tensors
            opt.zero_grad(set_to_none=True)
            if not DRY.on:
                torch.cuda.empty_cache()
            batch, accum = batch // 2, accum * 2
            print(f"OOM caught, retrying with batch {batch} x {accum} accumulation", flush=True)
            if batch == 0:
                raise RuntimeError("no batch size fits")
