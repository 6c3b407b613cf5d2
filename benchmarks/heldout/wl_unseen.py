"""Issue 43: seven fresh jobs the diagnosis was never shown, each labelled by construction.

Written from the job's side only (what it allocates and why), without reading oomsight's analysis code.
Every OOM label has a ``--remedy`` path that applies exactly the fix its remedy key names and then fits;
the two ``none`` jobs fit and are there to show whether the live leak flag stays down on memory that rises
and then stops (a replay buffer filling to its cap) or rises and falls (epoch-scoped metric buffers).
"""

from __future__ import annotations

import collections
import math

import torch
import torch.nn.functional as F
from common import DRY, autocast, cap_gpu, dev, gpt2, pick, tokens, workload
from wl_activations import _Block  # a GPT-2 block of nn.Linear layers (qkv, proj, fc, out)

# --- growing demand: a batch-size ramp --------------------------------------------------------------------


@workload("growing_demand", "bound_input")
def gpt2_batch_size_doubling(remedy: bool) -> None:
    """GPT-2 (6 layers, fp32 params, bf16 autocast, seq 256) whose batch doubles every 3 steps: 8, 16, 32, 64, ...

    A large-batch recipe ramps the batch; nothing is kept between steps, so each step's need is its own
    activations and logits (~1 MB a token, the 50257-wide logits most of it), which double with the batch.
    The states are ~1.3 GB; batch 8 and 16 need ~2 and ~4 GB, 32 about 8 GB, 64 about 16 GB: the ramp
    runs out of 12 GiB at batch 64 at the latest. Remedy (``bound_input``): cap the micro-batch at 16 (a
    size that fitted) and reach the scheduled batch by gradient accumulation: the optimizer sees the same
    effective batch, memory no longer follows the schedule.
    """
    cap_gpu(12)
    model = gpt2(6, 768, 12)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=not DRY.on)
    micro_cap = pick(16, 2) if remedy else 1 << 30
    for step in range(pick(18, 2)):
        batch = pick(8 * 2 ** (step // 3), 4)
        micro = min(batch, micro_cap)
        for _ in range(batch // micro):
            ids = tokens(micro, pick(256, 16), model.config.vocab_size)
            with autocast():
                loss = model(input_ids=ids, labels=ids).loss
            (loss * micro / batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step} batch {batch} loss {loss.item():.3f}", flush=True)


# --- leak: gradient accumulation that keeps every micro-batch's logits -------------------------------------


@workload("leak", "leak")
def gpt2_accum_keeps_microbatch_logits(remedy: bool) -> None:
    """GPT-2 (4 layers, fp32), 8 micro-batches a step, each with its own backward; every micro-batch's logits
    (as returned: not detached, still carrying their grad_fn) go into a list for a running train accuracy
    computed after ``optimizer.step()``, and the list is never cleared.

    Each backward frees its micro-batch's saved activations, but the kept logits (1 x 256 x 50257 fp32,
    ~51 MB) stay: ~410 MB more every step, flat transient, until the 10 GiB GPU runs out near step 20 of 60.
    Label leak: the growth is tensors the loop keeps. Remedy (keep nothing; the brief called this key
    ``kept_outputs``, the held-out set's leak remedy key is ``leak``): count the argmax hits of each
    micro-batch as it comes (a GPU scalar) and drop the logits; the accuracy is the same number.
    """
    cap_gpu(10)
    model = gpt2(4, 768, 12)
    vocab = model.config.vocab_size
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=not DRY.on)
    kept: list = []
    correct = torch.zeros((), dtype=torch.long, device=dev())
    seen = 0
    accum = pick(8, 2)
    for step in range(pick(60, 2)):
        for _ in range(accum):
            ids = tokens(1, pick(256, 16), vocab)
            out = model(input_ids=ids, labels=ids)
            (out.loss / accum).backward()
            if remedy:
                correct += (out.logits[:, :-1].argmax(-1) == ids[:, 1:]).sum()
            else:
                kept.append((out.logits, ids))
            seen += ids[:, 1:].numel()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if not remedy:
            correct = sum(((lg[:, :-1].argmax(-1) == y[:, 1:]).sum() for lg, y in kept), torch.zeros_like(correct))
        print(f"step {step} train acc {correct.item() / seen:.5f}", flush=True)


@workload("leak", "kept_outputs")
def gpt2_accum_window_keeps_logits(remedy: bool) -> None:
    """GPT-2 (4 layers, fp32), micro-batches each with its own backward; every micro-batch's logits (as
    returned, with their grad_fn) go into a list for the step's train accuracy, computed and cleared right
    after ``optimizer.step()``: nothing outlives a step, but within the window each micro-batch keeps its
    ~51 MB of logits (1 x 256 x 50257 fp32). The warm-up steps accumulate 8 micro-batches; from step 10 the
    schedule accumulates 160 (a larger effective batch by accumulation, as a recipe ramps it), whose kept
    logits (~8.2 GB) no longer fit the 8 GiB cap beside the model and its AdamW state. Label leak (inside the
    accumulation window). Remedy (``kept_outputs``): count each micro-batch's argmax hits as it comes and keep
    nothing; the accuracy is the same number.
    """
    cap_gpu(8)
    model = gpt2(4, 768, 12)
    vocab = model.config.vocab_size
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=not DRY.on)
    for step in range(pick(14, 2)):
        accum = pick(8 if step < 10 else 160, 2)
        kept: list = []
        correct = torch.zeros((), dtype=torch.long, device=dev())
        seen = 0
        for _ in range(accum):
            ids = tokens(1, pick(256, 16), vocab)
            out = model(input_ids=ids, labels=ids)
            (out.loss / accum).backward()
            if remedy:
                correct += (out.logits[:, :-1].argmax(-1) == ids[:, 1:]).sum()
            else:
                kept.append((out.logits, ids))
            seen += ids[:, 1:].numel()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if not remedy:
            correct = sum(((lg[:, :-1].argmax(-1) == y[:, 1:]).sum() for lg, y in kept), torch.zeros_like(correct))
            kept.clear()
        print(f"step {step} micro-batches {accum} train acc {correct.item() / seen:.5f}", flush=True)


# --- model states: progressive unfreezing ------------------------------------------------------------------


class CpuAdamW:
    """AdamW whose state lives on the CPU: each step copies the GPU gradients into pinned fp32 master
    parameters, steps ``torch.optim.AdamW`` there and copies the updated values back. Same update rule and
    the same fp32 numbers as AdamW on the GPU (the state is created only for parameters that have a
    gradient, as there); only where the moments live changes."""

    def __init__(self, params: list, **kw) -> None:  # type: ignore[no-untyped-def]
        pin = not DRY.on
        self.pairs = [(p, p.detach().to("cpu", copy=True).pin_memory() if pin else p.detach().cpu().clone())
                      for p in params]
        for _p, m in self.pairs:
            m.requires_grad_(True)
        self.opt = torch.optim.AdamW([m for _p, m in self.pairs], **kw)

    def step(self) -> None:
        stepped = []
        for p, m in self.pairs:
            if p.grad is None:
                m.grad = None
                continue
            if m.grad is None:
                m.grad = torch.empty_like(m, pin_memory=not DRY.on)
            m.grad.copy_(p.grad, non_blocking=True)
            stepped.append((p, m))
        if not DRY.on:
            torch.cuda.synchronize()
        self.opt.step()
        with torch.no_grad():
            for p, m in stepped:
                p.copy_(m, non_blocking=True)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p, _m in self.pairs:
            p.grad = None


@workload("model_states", "cpu_offload")
def gpt2_progressive_unfreezing_adamw(remedy: bool) -> None:
    """GPT-2-like LM (HF GPT2 from a config: 16 blocks x 1536, ~530M params, fp32), AdamW over all parameters,
    progressive unfreezing from the top: at the start only the top block (and the final norm) trains, one
    more block is unfrozen every 2 steps; the embeddings stay frozen. Batch 1 x 128 tokens.

    A block is ~28M params: unfreezing one adds its gradients (113 MB) and, at its first step, its AdamW
    moments (226 MB) plus the optimizer's per-step temporaries, so memory climbs in stairs with the trainable
    set; saved activations grow to ~0.8 GB (measured on the CPU: 1.65 GB at batch 2 with all blocks training).
    The 2.1 GB of weights plus the states of ~7-9 blocks fill 6 GiB; all 16 blocks would need ~8.4 GB.
    Label model_states: the gradients and optimizer state of what trains. Remedy (``cpu_offload``): keep
    the AdamW state on the CPU (``CpuAdamW``: pinned fp32 master
    copies, torch.optim.AdamW stepped there, values copied back): the GPU holds the weights and at most all
    gradients (~4.8 GB with the activations). Same math, so it changes nothing the job learns.
    """
    cap_gpu(6)
    model = gpt2(16, 1536, 16)
    model.requires_grad_(False)
    blocks = list(model.transformer.h)
    model.transformer.ln_f.requires_grad_(True)
    params = list(model.parameters())
    if remedy:
        trainable = [p for b in blocks for p in b.parameters()] + list(model.transformer.ln_f.parameters())
        opt = CpuAdamW(trainable, lr=1e-4, weight_decay=0.01)
    else:
        opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)  # type: ignore[assignment]
    every = 2
    for step in range(pick(2 * 16 + 4, 3)):
        for b in blocks[len(blocks) - min(len(blocks), 1 + step // every):]:
            b.requires_grad_(True)
        ids = tokens(1, pick(128, 16), model.config.vocab_size)
        with autocast():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        n = sum(p.numel() for p in params if p.requires_grad)
        print(f"step {step} trainable {n:,} loss {loss.item():.3f}", flush=True)


# --- none: a DQN replay buffer filling to its cap ----------------------------------------------------------


@workload("none", "none")
def dqn_replay_buffer_fills_then_flat(remedy: bool) -> None:
    """DQN (Nature CNN, double-DQN target) on 32 vectorised Atari-like envs (random 4 x 84 x 84 frames) whose
    replay buffer is a ``deque(maxlen=200)`` of GPU tensors (obs, next_obs, action, reward, done).

    Every step pushes 32 transitions (~7.2 MB of fp32 frames); the deque fills over the first 200 of 500
    steps (40 % of the run), to ~1.45 GB, and from then on each push drops the oldest: memory rises steadily,
    then stays flat for 300 steps. Nothing else is kept; ~2 GB at most on a 6 GiB GPU. Fits: the rise is a
    bounded buffer filling, not a leak.
    """
    cap_gpu(6)
    n_env, frames, size, actions = pick(32, 2), 4, pick(84, 36), 6

    def qnet() -> torch.nn.Module:
        flat = 64 * 7 * 7 if not DRY.on else 64
        return torch.nn.Sequential(
            torch.nn.Conv2d(frames, 32, 8, 4), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 4, 2), torch.nn.ReLU(),
            torch.nn.Conv2d(64, 64, 3, 1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(flat, 512),
            torch.nn.ReLU(), torch.nn.Linear(512, actions)).to(dev())

    online, target = qnet(), qnet()
    target.load_state_dict(online.state_dict())
    opt = torch.optim.Adam(online.parameters(), lr=1e-4)
    replay: collections.deque = collections.deque(maxlen=pick(200, 3))
    obs = torch.rand(n_env, frames, size, size, device=dev())
    steps, batch, gamma = pick(500, 6), pick(256, 4), 0.99
    for step in range(steps):
        eps = max(0.05, 1 - step / (0.5 * steps))
        with torch.no_grad():
            greedy = online(obs).argmax(-1)
        act = torch.where(torch.rand(n_env, device=dev()) < eps, torch.randint(0, actions, (n_env,), device=dev()),
                          greedy)
        next_obs = torch.cat([obs[:, 1:], torch.rand(n_env, 1, size, size, device=dev())], 1)
        reward = torch.randn(n_env, device=dev())
        done = torch.rand(n_env, device=dev()) < 0.01
        replay.append((obs, next_obs, act, reward, done))
        obs = next_obs
        pushes = torch.randint(0, len(replay), (batch,)).tolist()
        envs = torch.randint(0, n_env, (batch,)).tolist()
        rows = [tuple(t[e] for t in replay[i]) for i, e in zip(pushes, envs)]
        o, o2, a, r, d = (torch.stack(col) for col in zip(*rows))
        with torch.no_grad():
            best = online(o2).argmax(-1, keepdim=True)
            y = r + gamma * (~d) * target(o2).gather(1, best).squeeze(1)
        q = online(o).gather(1, a[:, None]).squeeze(1)
        loss = F.smooth_l1_loss(q, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0:
            target.load_state_dict(online.state_dict())
            print(f"step {step} buffer {len(replay)} loss {loss.item():.4f}", flush=True)


# --- none: epoch-scoped metric buffers ---------------------------------------------------------------------


@workload("none", "none")
def classifier_epoch_metric_buffers_fits(remedy: bool) -> None:
    """Image classifier (small CNN, 10000 fine-grained classes, batch 512 of 32 x 32 images) that appends each
    batch's detached softmax probabilities and targets to GPU lists for epoch-end top-1/top-5 accuracy, and
    clears the lists at every epoch end; 6 epochs of 15 steps.

    Each step keeps 512 x 10000 fp32 probs (~20 MB): ~300 MB rises over an epoch, the epoch-end
    ``torch.cat`` briefly doubles it, and then it falls back to the floor: a saw-tooth, bounded by one epoch.
    Well under 2 GB on a 4 GiB GPU. Fits: memory kept for an epoch and released at its end is not a leak.
    """
    cap_gpu(4)
    classes, ch = pick(10000, 50), pick(128, 8)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, ch, 3, padding=1), torch.nn.BatchNorm2d(ch), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(ch, 2 * ch, 3, padding=1), torch.nn.BatchNorm2d(2 * ch), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(2 * ch, classes)).to(dev())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batch, per_epoch = pick(512, 4), pick(15, 2)
    for epoch in range(pick(6, 2)):
        probs: list = []
        targets: list = []
        for _step in range(per_epoch):
            x = torch.randn(batch, 3, 32, 32, device=dev())
            y = torch.randint(0, classes, (batch,), device=dev())
            with autocast():
                logits = model(x)
            loss = F.cross_entropy(logits.float(), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            probs.append(logits.detach().float().softmax(-1))
            targets.append(y)
        p, t = torch.cat(probs), torch.cat(targets)
        top5 = p.topk(5, -1).indices
        top1 = (top5[:, 0] == t).float().mean().item()
        acc5 = (top5 == t[:, None]).any(-1).float().mean().item()
        probs.clear()
        targets.clear()
        del p, t, top5
        print(f"epoch {epoch} loss {loss.item():.3f} top1 {top1:.4f} top5 {acc5:.4f}", flush=True)


# --- model states: a frozen base with LoRA adapters --------------------------------------------------------


class _GPT(torch.nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, positions: int = 1024) -> None:
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, d), torch.nn.Embedding(positions, d)
        self.blocks = torch.nn.ModuleList(_Block(d, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(d)
        for m in self.modules():  # GPT-2's initialisation
            if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
                torch.nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, torch.nn.Linear):
                torch.nn.init.zeros_(m.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for b in self.blocks:
            x = b(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied head


class LoRALinear(torch.nn.Module):
    """``base(x) + B(A(x)) * alpha / r``, base frozen, A and B (fp32) trainable; B starts at zero."""

    def __init__(self, base: torch.nn.Module, d_in: int, d_out: int, r: int = 16, alpha: float = 32) -> None:
        super().__init__()
        self.base, self.scale = base, alpha / r
        self.lora_a = torch.nn.Linear(d_in, r, bias=False)
        self.lora_b = torch.nn.Linear(r, d_out, bias=False)
        torch.nn.init.zeros_(self.lora_b.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)  # (the casts matter only on the CPU dry run, without autocast)
        return y + (self.lora_b(self.lora_a(x.to(self.lora_a.weight.dtype))) * self.scale).to(y.dtype)


def _to_4bit(model: _GPT) -> str:
    """Swap every block linear of a CPU model for bitsandbytes' NF4 ``Linear4bit`` (bf16 compute); the rest
    to bf16. Raises where bitsandbytes does not import or cannot quantise here."""
    import bitsandbytes as bnb

    for blk in model.blocks:
        for name in ("qkv", "proj", "fc", "out"):
            lin = getattr(blk, name)
            q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=True, compute_dtype=torch.bfloat16,
                                  quant_type="nf4")
            q.weight = bnb.nn.Params4bit(lin.weight.data, requires_grad=False, quant_type="nf4")
            q.bias = torch.nn.Parameter(lin.bias.data.to(torch.bfloat16), requires_grad=False)
            setattr(blk, name, q)
    for mod in (model.wte, model.wpe, model.ln_f, *(m for b in model.blocks for m in (b.ln1, b.ln2))):
        mod.to(torch.bfloat16)
    return f"nf4 base via bitsandbytes {bnb.__version__}"


@workload("model_states", "quantize_base")
def gpt2_frozen_base_lora_no_room(remedy: bool) -> None:
    """LoRA fine-tune (rank 16 on every block linear, hand-written: no peft) of a frozen fp32 GPT-2-like base
    (24 blocks x 2048, ~1.31B params: 5.25 GB of weights), bf16 autocast, batch 2 x 512, on a 6.5 GiB GPU.

    The adapters (~12M params) and their AdamW state are ~0.2 GB; the step's activations (gradients flow
    back through every frozen block to the lowest adapter) are ~3 GB. The frozen weights take ~75 % of the
    cap and leave ~1.7 GB, less than one step needs: the first step runs out. Label model_states (the
    weights; no checkpointing fixes it at this batch and nothing is kept between steps). Remedy
    (``quantize_base``): the base in NF4 via bitsandbytes' ``Linear4bit`` where bitsandbytes imports and
    quantises (~0.9 GB of weights), else the base in bf16 (2.6 GB; the GPU machine without bitsandbytes
    and the CPU dry run take this path): either way ~4-5.6 GB in all. The run prints which.
    """
    cap_gpu(6.5)
    vocab, d, layers, heads = 50257, pick(2048, 64), pick(24, 2), pick(16, 4)
    how = "fp32 base"
    if remedy:
        try:
            if DRY.on:
                raise RuntimeError("dry run on the CPU")
            base = _GPT(vocab, d, layers, heads)
            how = _to_4bit(base)
            base = base.to(dev())
        except Exception as exc:  # no bitsandbytes, or it cannot quantise here: a bf16 base
            base = None  # type: ignore[assignment]
            if not DRY.on:
                torch.cuda.empty_cache()
            with dev():
                base = _GPT(vocab, d, layers, heads).to(torch.bfloat16)
            how = f"bf16 base ({type(exc).__name__}: {exc})"
    else:
        with dev():
            base = _GPT(vocab, d, layers, heads)
    print("quantize_base:" if remedy else "base:", how, flush=True)
    base.requires_grad_(False)
    for blk in base.blocks:
        for name, (d_in, d_out) in {"qkv": (d, 3 * d), "proj": (d, d), "fc": (d, 4 * d), "out": (4 * d, d)}.items():
            setattr(blk, name, LoRALinear(getattr(blk, name), d_in, d_out).to(dev()))
    trainable = [p for p in base.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=2e-4)
    for step in range(pick(6, 2)):
        ids = tokens(2, pick(512, 16), vocab)
        with autocast():
            logits = base(ids)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step} loss {loss.item():.3f}", flush=True)


# --- growing demand: an MoE router collapsing under padded dispatch ----------------------------------------


class _MoELayer(torch.nn.Module):
    """Top-1 MoE FFN with a router, an ``experts`` ModuleList, and padded dispatch: tokens are scattered into
    an [E, load, d] buffer (load = the busiest expert's token count, or a fixed capacity) and run through all
    experts at once with batched matmuls. The selection adds a per-expert bias that a load-balancing rule
    adjusts after each step in proportion to the expert's load (aux-loss-free balancing) -- with the sign
    flipped, a bug: the busiest expert's bias rises fastest, so routing collapses onto one expert over the
    steps (busiest share ~0.15 at the start, ~0.5 near step 25, ~0.9 near step 35 at 8192 tokens)."""

    def __init__(self, d: int, ff: int, n_experts: int, capacity_factor: float | None) -> None:
        super().__init__()
        self.router = torch.nn.Linear(d, n_experts, bias=False)
        self.experts = torch.nn.ModuleList(
            torch.nn.ModuleDict({"w_in": torch.nn.Linear(d, ff), "w_out": torch.nn.Linear(ff, d)})
            for _ in range(n_experts))
        self.register_buffer("select_bias", torch.zeros(n_experts))
        self.capacity_factor = capacity_factor
        self.last_load = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        n_tok, n_exp = flat.shape[0], len(self.experts)
        logits = self.router(flat)
        expert = (logits.detach() + self.select_bias).argmax(-1)
        gate = logits.softmax(-1).gather(1, expert[:, None])
        counts = torch.bincount(expert, minlength=n_exp)
        with torch.no_grad():  # the balancing rule, sign flipped (the bug): busy experts get busier
            self.select_bias += 0.03 * (counts.float() * n_exp / n_tok - 1)
        order = torch.argsort(expert, stable=True)
        sorted_exp = expert[order]
        starts = torch.cumsum(counts, 0) - counts
        slot = torch.arange(n_tok, device=x.device) - starts[sorted_exp]
        most = int(counts.max())
        self.last_load = most / n_tok
        load = most if self.capacity_factor is None else math.ceil(self.capacity_factor * n_tok / n_exp)
        keep = slot < load  # with a capacity: the overflow tokens are dropped (the residual carries them)
        tok, e_k, s_k = order[keep], sorted_exp[keep], slot[keep]
        buf = flat.new_zeros(n_exp, load, flat.shape[1])
        buf = buf.index_put((e_k, s_k), flat[tok])
        w_in = torch.stack([e["w_in"].weight.t() for e in self.experts])  # [E, d, ff]
        b_in = torch.stack([e["w_in"].bias for e in self.experts])[:, None]
        w_out = torch.stack([e["w_out"].weight.t() for e in self.experts])  # [E, ff, d]
        b_out = torch.stack([e["w_out"].bias for e in self.experts])[:, None]
        h = torch.baddbmm(b_out, F.gelu(torch.baddbmm(b_in, buf, w_in)), w_out)
        out = torch.zeros_like(flat).index_put((tok,), h[e_k, s_k] * gate[tok])
        return out.view_as(x)


class _MoEBlock(torch.nn.Module):
    def __init__(self, d: int, heads: int, moe: _MoELayer) -> None:
        super().__init__()
        self.heads, self.ln1, self.ln2 = heads, torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj, self.moe = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d), moe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d))
        return x + self.moe(self.ln2(x))


@workload("growing_demand", "expert_capacity")
def moe_router_collapse_padded_dispatch(remedy: bool) -> None:
    """MoE transformer LM (4 blocks x 512, 8 experts of 2048 per block, top-1, ~46M params, fp32) at a constant
    batch of 16 x 512 tokens, padded expert dispatch, and a flipped-sign router-bias balancing rule.

    The padded buffers are [8, load, d or ff] where load is the busiest expert's token count: ~1.2k of 8192
    tokens while routing is balanced (~0.7 GB of dispatch activations for the 4 layers, ~3.2 GB for the whole
    step), up to all 8192 once the bias has driven every token to one expert (~4.8 GB of dispatch alone). The
    batch never changes; the step's demand grows with the routing until it runs out of 5 GiB, near a busiest
    share of ~0.55 (around step 25-30 of 60). Nothing is kept between steps. Label growing_demand (the
    per-step need grows with what routing makes of a fixed input). Remedy (``expert_capacity``): a capacity
    factor of 1.25 (load = 1.25 x 8192 / 8 = 1280 slots an expert), overflow tokens dropped (the residual
    carries them): memory no longer depends on routing (~3.3 GB). The bias bug stays in both runs.
    """
    cap_gpu(5)
    d, ff, n_exp, layers, heads, vocab = pick(512, 32), pick(2048, 64), pick(8, 4), pick(4, 2), pick(8, 4), 8192
    cf = 1.25 if remedy else None
    blocks = torch.nn.ModuleList(_MoEBlock(d, heads, _MoELayer(d, ff, n_exp, cf)) for _ in range(layers))
    emb, head = torch.nn.Embedding(vocab, d), torch.nn.Linear(d, vocab)
    model = torch.nn.ModuleList([emb, blocks, head]).to(dev())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step in range(pick(60, 3)):
        ids = torch.randint(0, vocab, (pick(16, 2), pick(512, 16)), device=dev())
        x = emb(ids)
        for blk in blocks:
            x = blk(x)
        loss = F.cross_entropy(head(x).flatten(0, 1), ids.roll(-1, 1).flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loads = " ".join(f"{b.moe.last_load:.2f}" for b in blocks)
        print(f"step {step} busiest-expert share {loads} loss {loss.item():.3f}", flush=True)
