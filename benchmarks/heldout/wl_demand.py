"""Growing demand: the job's per-step need rises with its input (schedule, data, generation length).

Nothing is kept between steps; the steps before the failing one fit. The remedy (``bound_input``) caps
the sequence length / micro-batch / generation length, keeping the intended schedule through gradient
accumulation or truncation where that applies.
"""

from __future__ import annotations

import random

import torch
from common import DRY, autocast, cap_gpu, dev, fast_fp32, llama, llama_config, pick, tokens, workload


@workload("growing_demand", "bound_input")
def llama_seqlen_curriculum(remedy: bool) -> None:
    """Llama-style LM (~130M, bf16 autocast) with a sequence-length curriculum: 256, 512, 1024, ... every 8 steps.

    The batch is fixed at 8 sequences, so activations and logits double at every stage; the 2048 stage no
    longer fits in 11 GiB. Remedy: cap the curriculum at 1024 tokens (``max_seq_len``).
    """
    cap_gpu(11)
    model = llama(768, 12, 2048, 12)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=not DRY.on)
    max_seq_len = 1024 if remedy else 8192
    for step in range(pick(48, 2)):
        seq = min(256 * 2 ** (step // 8), max_seq_len)
        ids = tokens(pick(8, 2), pick(seq, 16), model.config.vocab_size)
        with autocast():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@workload("growing_demand", "bound_input")
def resnet_batch_size_warmup(remedy: bool) -> None:
    """ResNet-50 (HF ResNetForImageClassification, fp32) with a batch-size warm-up: 64, 128, ... 512 images.

    A large-batch recipe ramps the batch every 3 steps; fp32 activations grow with it and the ~192-image
    step runs out of 10 GiB. Remedy: cap the micro-batch at 64 and reach the scheduled batch by gradient
    accumulation (the optimizer sees the same effective batch).
    """
    from transformers import ResNetConfig, ResNetForImageClassification

    fast_fp32()
    cap_gpu(10)
    tiny = {"embedding_size": 8, "hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1]}
    cfg = ResNetConfig(num_labels=1000, **pick({}, tiny))
    with dev():
        model = ResNetForImageClassification(cfg).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    micro_cap = pick(64, 2) if remedy else 1 << 30
    for step in range(pick(24, 2)):
        batch = pick(64 * (1 + step // 3), 4)
        micro = min(batch, micro_cap)
        for _ in range(batch // micro):
            x = torch.randn(micro, 3, pick(224, 32), pick(224, 32), device=dev()).to(memory_format=torch.channels_last)
            y = torch.randint(0, 1000, (micro,), device=dev())
            (model(pixel_values=x, labels=y).loss * micro / batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@workload("growing_demand", "bound_input")
def llama_classifier_untruncated_outlier(remedy: bool) -> None:
    """Llama-style sequence classifier, dynamic padding, and one untruncated 12k-token document at batch 12.

    The tokenizer was called without ``truncation=True``; the data are short (32..256 tokens) except one
    document. Padding to the longest in its batch makes that step 16 x 12288 tokens: demand jumps with the
    input. Labelled growing_demand (input-driven demand), not oversized_request: the whole step's
    activations scale, no single tensor dominates (sdpa attention, no seq x seq matrix). Remedy: truncate
    to 512 tokens.
    """
    from transformers import AutoModelForSequenceClassification

    cap_gpu(10)
    cfg = llama_config(768, 12, 2048, 12)
    cfg.num_labels, cfg.pad_token_id = 2, 0
    with dev():
        model = AutoModelForSequenceClassification.from_config(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    rng = random.Random(1)
    max_length = 512 if remedy else None
    for step in range(pick(20, 2)):
        lengths = [rng.randint(32, 256) for _ in range(pick(16, 2))]
        if step == 12:
            lengths[3] = 12288
        if max_length:
            lengths = [min(n, max_length) for n in lengths]
        seq = pick(max(lengths), 16)
        ids = tokens(len(lengths), seq, cfg.vocab_size).clamp_(min=1)
        mask = (torch.arange(seq, device=dev())[None] < torch.tensor(lengths, device=dev())[:, None]).long()
        ids = ids * mask  # right padding with pad_token_id 0
        with autocast():
            y = torch.randint(0, 2, (len(lengths),), device=dev())
            loss = model(input_ids=ids, attention_mask=mask, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@workload("growing_demand", "bound_input")
def llama_generate_kv_cache_growth(remedy: bool) -> None:
    """Batch generation with a ~1B Llama-style model (bf16, full multi-head KV) and a growing KV cache.

    ``model.generate`` with 128 prompts of 256 tokens and ``max_new_tokens=1024``: the DynamicCache grows by
    ~17 MB per generated token and runs out of 10 GiB a couple of hundred tokens in. Inference under no_grad, so
    it is the cache, not autograd. Remedy: bound the generation length (``max_new_tokens=128``).
    """
    cap_gpu(10)
    model = llama(2048, 16, 5632, 16, dtype=torch.bfloat16)
    model.eval()
    new = pick(128 if remedy else 1024, 4)
    prompts = tokens(pick(128, 2), pick(256, 8), model.config.vocab_size)
    with torch.no_grad():
        out = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new,
                             min_new_tokens=new, do_sample=True, top_k=50, pad_token_id=0)
    print("generated", tuple(out.shape))
