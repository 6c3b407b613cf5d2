"""Model states, fragmentation and the oversized request.

``naive_kv_server`` drives its allocations from ``kv_server_events`` (a pure function), so that
``fragsim.py`` can replay the same sequence through a model of the caching allocator and show why the
plain run fails while ``expandable_segments`` succeeds.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from common import DRY, GIB, autocast, bert_config, cap_gpu, dev, llama, pick, tokens, workload

MIB = 1 << 20


@workload("model_states", "bf16_params")
def llama_1b_fp32_adamw(remedy: bool) -> None:
    """~0.95B-parameter Llama-style LM in fp32 with AdamW, batch 2 x 512, on a 12 GiB GPU.

    fp32 params (3.8 GB) + grads (3.8 GB) + AdamW's two moments (7.6 GB, created at the first
    ``optimizer.step``) = 15 GB of model states, more than 12 GiB whatever the batch. Remedy: bf16 params
    (and so bf16 grads and optimizer state, 7.6 GB). Sharding (ZeRO/FSDP) would be the multi-GPU fix; it
    cannot be shown on one GPU.
    """
    cap_gpu(12)
    model = llama(2048, 16, 5632, 16, dtype=torch.bfloat16 if remedy else torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=not DRY.on)
    for _step in range(pick(3, 1)):
        ids = tokens(2, pick(512, 16), model.config.vocab_size)
        with autocast():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@workload("model_states", "light_optimizer")
def llama_2b7_bf16_adamw(remedy: bool) -> None:
    """~2.7B Llama-style LM already in bf16, AdamW, batch 1 x 256, on a 16 GiB GPU.

    bf16 params (5.4 GB) + grads (5.4 GB) + AdamW moments (10.8 GB) = 21.6 GB > 16 GiB: the states alone
    don't fit; activations are small. Remedy: a light optimizer, ``torch.optim.Adafactor`` (factored
    second moment, no first moment), whose state is a few MB. (On several GPUs, sharding would be the other
    fix.)
    """
    cap_gpu(16)
    model = llama(2560, 32, 6912, 20, dtype=torch.bfloat16)
    model.gradient_checkpointing_enable()
    if remedy:
        opt = torch.optim.Adafactor(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=not DRY.on)
    for _step in range(pick(3, 1)):
        ids = tokens(1, pick(256, 16), model.config.vocab_size)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


# --- fragmentation -------------------------------------------------------------------------------

KV_BYTES_PER_TOKEN = 16 * 2 * 8 * 128 * 2  # layers x (K, V) x kv_heads x head_dim x bf16 = 64 KiB
FRAG_CAP_GIB = 8
WEIGHT_TENSORS, WEIGHT_BYTES = 32, 32 * MIB
PROFILE_BYTES = 6 * GIB + 256 * MIB
LONG_PROMPT, LONG_NEW = 32000, 768


def kv_server_events(seed: int = 0, n_requests: int = 160, long_at: int = 70) -> Iterator[tuple]:
    """The server's allocation sequence: ('alloc', id, bytes) / ('free', id) / ('step',).

    FCFS admission on the server's own accounting (weights + reserved KV <= 80% of the GPU), the
    long-context request ``long`` sits at position ``long_at`` in the queue.
    """
    rng = random.Random(seed)
    queue = []
    for i in range(n_requests):
        if i == long_at:
            queue.append(("long", LONG_PROMPT, LONG_NEW))
        queue.append((f"r{i}", rng.randint(256, 3072), rng.choice([128, 256, 512, 1024])))
    for w in range(WEIGHT_TENSORS):
        yield ("alloc", f"w{w}", WEIGHT_BYTES)
    yield ("alloc", "profile", PROFILE_BYTES)  # dummy max-size batch to measure peak activation memory
    yield ("free", "profile")
    budget = int(0.8 * FRAG_CAP_GIB * GIB)
    used = WEIGHT_TENSORS * WEIGHT_BYTES
    active: dict[str, list[int]] = {}  # id -> [remaining new tokens, bytes]
    while queue or active:
        while queue and used + (queue[0][1] + queue[0][2]) * KV_BYTES_PER_TOKEN <= budget:
            rid, prompt, new = queue.pop(0)
            nbytes = (prompt + new) * KV_BYTES_PER_TOKEN
            used += nbytes
            active[rid] = [new, nbytes]
            yield ("alloc", rid, nbytes, prompt)
        yield ("step",)
        for rid in list(active):
            active[rid][0] -= 1
            if active[rid][0] == 0:
                used -= active.pop(rid)[1]
                yield ("free", rid)


@workload("fragmentation", "expandable")
def naive_kv_server(remedy: bool) -> None:
    """A naive continuous-batching server: one contiguous KV-cache tensor per request, sized prompt+max_new.

    Start-up loads the weights and profiles a dummy max-size batch (one 6.25 GiB activation tensor, then
    freed: the caching allocator keeps that segment). Requests (256..3072-token prompts, 128..1024 new
    tokens, 16..250 MiB of KV each) are then carved out of the cached segment and finish at different
    times, leaving holes between live caches. The scheduler admits on its own accounting (80% of the GPU),
    so when a 32k-token request (2 GiB of KV) is admitted, live memory is <= 6.4 of 8 GiB — but no hole is
    2 GiB long and the reserved segments already fill the cap, with nothing entirely free to release: a
    fragmentation OOM (``fragsim.py`` replays the sequence through a model of the allocator).
    Remedy: ``PYTORCH_ALLOC_CONF=expandable_segments:True`` (set by the runner): on the OOM retry the free
    pages inside the holes are unmapped and the 2 GiB are mapped at the end of the segment.
    """
    cap_gpu(FRAG_CAP_GIB)
    scale = pick(1, 1 / 4096)  # --dry: same schedule, bytes scaled down to KiB
    live: dict[str, torch.Tensor] = {}
    new_token = torch.randn(16, 2, 8, 128, device=dev(), dtype=torch.bfloat16)
    pos: dict[str, int] = {}
    for ev in kv_server_events():
        if ev[0] == "alloc" and ev[1].startswith(("w", "profile")):
            live[ev[1]] = torch.empty(max(1, int(ev[2] * scale) // 2), device=dev(), dtype=torch.bfloat16).normal_()
        elif ev[0] == "alloc":
            tokens_ = max(1, int(ev[2] * scale) // KV_BYTES_PER_TOKEN) if DRY.on else ev[2] // KV_BYTES_PER_TOKEN
            kv = torch.empty(16, 2, tokens_, 8, 128, device=dev(), dtype=torch.bfloat16)
            kv[:, :, : min(ev[3], tokens_)].zero_()  # prefill writes the prompt's K/V
            live[ev[1]], pos[ev[1]] = kv, min(ev[3], tokens_ - 1)
            del kv  # no stray reference: the allocation sequence must be exactly the events'
        elif ev[0] == "free":
            del live[ev[1]]
            pos.pop(ev[1], None)
        else:  # one decode step: every active request appends one token's K/V
            for rid, p in pos.items():
                live[rid][:, :, min(p, live[rid].shape[2] - 1)].copy_(new_token)
                pos[rid] = p + 1


# --- oversized request --------------------------------------------------------------------------


@workload("oversized_request", "oversized")
def retrieval_eval_full_score_matrix(remedy: bool) -> None:
    """Dense-retrieval evaluation: encode 64k queries and 64k passages, then ``q @ p.T`` in one go.

    The encoder (a small BERT, bf16, inference mode) and its batches need a few hundred MB; the fp32
    64k x 64k score matrix is one 16 GiB request on an 8 GiB GPU, far bigger than anything else in the job.
    Remedy: score in chunks of 4096 queries and keep the top-100 per query.
    """
    from transformers import BertModel

    cap_gpu(8)
    with dev():
        enc = BertModel(bert_config(384, 6, 6, 1536), add_pooling_layer=False).to(torch.bfloat16).eval()
    n, batch, seq = pick(65536, 8), pick(2048, 4), pick(64, 8)

    def encode() -> torch.Tensor:
        out = []
        with torch.inference_mode():
            for _ in range(0, n, batch):
                with autocast():
                    h = enc(input_ids=tokens(batch, seq, 30000)).last_hidden_state[:, 0]
                out.append(F.normalize(h.float(), dim=-1))
        return torch.cat(out)

    q, p = encode(), encode()
    k = pick(100, 2)
    with torch.inference_mode():
        if remedy:
            top = torch.cat([(q[i:i + 4096] @ p.T).topk(k, dim=1).indices for i in range(0, n, 4096)])
        else:
            top = (q @ p.T).topk(k, dim=1).indices
    print("recall@k computed over", top.shape[0], "queries")
