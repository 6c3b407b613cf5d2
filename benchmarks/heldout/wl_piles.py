"""Forward piles: training jobs that keep several forwards' graphs until one backward, on purpose or not.

Four legitimate patterns keep graphs until a backward that consumes them all (losses summed over
micro-batches, a REINFORCE episode, a truncated-BPTT window), and one job really leaks graphs (a
validation loop inside a training job that forgets ``no_grad`` and keeps its outputs). The legitimate
ones run out because the job's own schedule makes one backward's pile larger than any before it (a
sequence-length curriculum, a longer episode, a longer BPTT window): nothing outlives its backward, so
their remedy only moves memory (``backward_each``, ``checkpointing``) and the job learns the same.

The GPU each job gets is set from the job's own measured graph (``_cap_from``): the allocator is capped
(``common.cap_gpu``) right after the first forward(s), before any backward, at the model states plus a
chosen number of graphs, so the plain run runs out where its docstring says on any card and torch
version. A remedy run measures the same plain graph (one plain forward it then drops where its remedy
changes that forward), so both runs get the same GPU.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F
from common import DRY, GIB, cap_gpu, dev, fast_fp32, gpt2, pick, tokens, workload
from torch.utils.checkpoint import checkpoint


def _allocated() -> int:
    return 0 if DRY.on else torch.cuda.memory_allocated()


def _sync() -> None:
    if not DRY.on:
        torch.cuda.synchronize()


def _param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _cap_from(states_bytes: float, unit_bytes: float, units: float, what: str) -> None:
    """Cap the GPU at ``states_bytes`` (parameters and AdamW state; gradients are freed between steps)
    plus ``units`` graphs of ``unit_bytes`` each."""
    if DRY.on:
        return
    cap = states_bytes + units * unit_bytes
    print(f"cap {cap / GIB:.2f} GiB: states {states_bytes / GIB:.2f} GiB + {units} x {what} "
          f"of {unit_bytes / 2**20:.0f} MiB", flush=True)
    cap_gpu(cap / GIB)


def _measured(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()``'s result and the bytes still allocated because it is alive (its graph)."""
    before = _allocated()
    out = fn()
    _sync()
    return out, _allocated() - before


def _save_checkpoint_and_pause(model: torch.nn.Module, opt: torch.optim.Optimizer, step_seconds: list[float]) -> None:
    """torch.save of model and optimizer state to a temp dir, then wait (an upload, a barrier): the steps
    pause for at least 4 step times and 1.5 s."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, os.path.join(d, "ckpt.pt"))
    step = statistics.median(step_seconds) if step_seconds else 0.0
    pause = pick(max(1.5, 4 * step), 0.0)
    time.sleep(pause)
    print(f"checkpoint saved in {time.perf_counter() - t0 - pause:.2f} s, paused {pause:.2f} s "
          f"(step {step:.3f} s)", flush=True)


def _gpt2_summed_microbatches(remedy: bool, train_mode: bool) -> None:
    fast_fp32()
    model = gpt2(6, 768, 12)
    model.train(train_mode)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    n_micro, micro = 8, pick(2, 2)
    stages = [(pick(256, 16), pick(6, 2)), (pick(512, 32), pick(4, 1))]  # (sequence length, optimizer steps)
    vocab = model.config.vocab_size
    params = _param_bytes(model)
    step_seconds: list[float] = []
    capped = False
    for stage, (seq, n_steps) in enumerate(stages):
        if stage:
            _save_checkpoint_and_pause(model, opt, step_seconds)
        for _step in range(n_steps):
            t0 = time.perf_counter()
            total = None
            for _k in range(n_micro):
                ids = tokens(micro, seq, vocab)
                loss, graph = _measured(lambda ids=ids: model(input_ids=ids, labels=ids).loss / n_micro)
                if not capped:  # stage 2 doubles the tokens of a micro-batch: twice this graph
                    _cap_from(3 * params, 2 * graph, 6.5, "stage-2 micro-batch graphs")
                    capped = True
                if remedy:
                    loss.backward()  # each micro-batch's graph freed at its own backward
                else:
                    total = loss if total is None else total + loss
            if total is not None:
                total.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            _sync()
            step_seconds.append(time.perf_counter() - t0)
            print(f"stage {stage} seq {seq} step {len(step_seconds)} loss {float(loss) * n_micro:.3f}", flush=True)


@workload("growing_demand", "backward_each")
def gpt2_summed_microbatches_after_checkpoint_save(remedy: bool) -> None:
    """GPT-2 (6 layers, fp32, dropout on) whose every optimizer step sums the losses of 8 micro-batches
    (2 x seq tokens each) before one backward; a sequence-length curriculum 256 -> 512.

    After 6 steps at 256 tokens the job saves a checkpoint (model + AdamW state with torch.save to a temp
    dir) and waits (>= 4 step times, >= 1.5 s); the first step at 512 tokens then runs out in micro-batch
    forward 7 (of 8): the GPU holds the states plus 6.5 stage-2 micro-batch graphs (about 7 with the
    freed gradients' room), and the 256-token steps needed 4. Label **growing_demand**: every step's graphs
    die at its backward (each backward consumes all 8 forwards), the job's schedule doubled what one step
    takes in. Remedy ``backward_each``: ``(loss / 8).backward()`` per micro-batch, the same summed
    gradients with one graph alive at a time.
    """
    _gpt2_summed_microbatches(remedy, train_mode=True)


@workload("growing_demand", "backward_each")
def gpt2_eval_mode_summed_microbatches_after_checkpoint_save(remedy: bool) -> None:
    """The same job fine-tuning dropout-free: ``model.eval()`` for the whole training (a common recipe
    when fine-tuning from a checkpoint), so the forwards are those of an evaluation but every one trains.

    Runs out in micro-batch forward 7 of the first 512-token step after the checkpoint save, as its
    train-mode twin (the cap is set from this job's own dropout-free graph). Label **growing_demand**,
    remedy ``backward_each``, for the same reasons.
    """
    _gpt2_summed_microbatches(remedy, train_mode=False)


class _Policy(torch.nn.Module):
    def __init__(self, obs: int, hidden: int, actions: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(obs, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, actions),
        )

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.net(state)


@torch.no_grad()
def _advantages(rewards: list[torch.Tensor]) -> torch.Tensor:
    """Rewards-to-go (discount 0.99) of an episode, normalised."""
    returns = torch.zeros_like(rewards[0])
    rtg = []
    for r in reversed(rewards):
        returns = r + 0.99 * returns
        rtg.append(returns)
    adv = torch.stack(rtg[::-1])
    return (adv - adv.mean()) / (adv.std() + 1e-6)


@workload("growing_demand", "checkpointing")
def reinforce_long_episode(remedy: bool) -> None:
    """REINFORCE with an MLP policy (3 x 2048 hidden) over 512 vectorised environments; each episode keeps
    every step's log-probabilities (and so each step's policy graph) until the episode's one backward.

    Episodes run 120, 60, 200, 90, 170 and 140 steps, then one of 580 (2.9 x the longest so far): the GPU
    holds the states plus 320 policy-step graphs, so the long episode runs out near its step 320; the
    200-step episode used 200. Label **growing_demand**: each episode's graphs die at its backward; the
    episode (the input of one backward) got longer. Remedy ``checkpointing``: the policy's forward runs
    under ``torch.utils.checkpoint`` (non-reentrant), so a step keeps only its state and logits and the
    hidden activations are recomputed in backward; the gradients are the same.
    """
    fast_fp32()
    n_envs, obs, hidden, actions = pick(512, 4), 64, pick(2048, 32), 16
    policy = _Policy(obs, hidden, actions).to(dev())
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    dynamics = torch.randn(obs, obs, device=dev()) / obs**0.5
    action_shift = torch.randn(actions, obs, device=dev())
    goal = torch.randn(obs, device=dev())
    lengths = pick([120, 60, 200, 90, 170, 140, 580], [6, 3, 9])
    params = _param_bytes(policy)

    def act(state: torch.Tensor, plain: bool = False) -> torch.Tensor:
        if remedy and not plain:
            return checkpoint(policy, state, use_reentrant=False)
        return policy(state)

    def probe_unit() -> int:
        state = torch.randn(n_envs, obs, device=dev())
        kept, graph = _measured(lambda: [torch.distributions.Categorical(logits=act(state, plain=True)).log_prob(
            torch.zeros(n_envs, dtype=torch.long, device=dev())) for _ in range(8)])
        del kept
        return graph // 8

    if remedy:  # the same GPU as the plain run: measured on the plain policy step, then dropped
        _cap_from(3 * params, probe_unit(), 320, "policy-step graphs")
    for episode, length in enumerate(lengths):
        state = torch.randn(n_envs, obs, device=dev())
        log_probs, rewards = [], []
        before = _allocated()
        for t in range(length):
            dist = torch.distributions.Categorical(logits=act(state))
            action = dist.sample()
            log_probs.append(dist.log_prob(action))
            with torch.no_grad():
                state = torch.tanh(state @ dynamics + action_shift[action] + 0.1 * torch.randn_like(state))
                rewards.append(-(state - goal).pow(2).mean(1))
            if not remedy and episode == 0 and t == 7:
                _sync()
                _cap_from(3 * params, (_allocated() - before) // 8, 320, "policy-step graphs")
        loss = -(torch.stack(log_probs) * _advantages(rewards)).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"episode {episode} length {length} mean reward {float(torch.stack(rewards).mean()):.3f}", flush=True)


class _TbpttLM(torch.nn.Module):
    """A two-layer LSTM language model called once per time step (the state is carried by the caller)."""

    def __init__(self, vocab: int, emb: int, hidden: int, checkpointed: bool) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, emb)
        self.cell1 = torch.nn.LSTMCell(emb, hidden)
        self.cell2 = torch.nn.LSTMCell(hidden, hidden)
        self.head = torch.nn.Linear(hidden, vocab)
        self.checkpointed = checkpointed

    def _step(self, x: torch.Tensor, y: torch.Tensor, h1: torch.Tensor, c1: torch.Tensor, h2: torch.Tensor,
              c2: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h1, c1 = self.cell1(self.emb(x), (h1, c1))
        h2, c2 = self.cell2(h1, (h2, c2))
        return F.cross_entropy(self.head(h2), y), h1, c1, h2, c2

    def forward(self, x: torch.Tensor, y: torch.Tensor, state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        if self.checkpointed and torch.is_grad_enabled():
            return checkpoint(self._step, x, y, *state, use_reentrant=False)
        return self._step(x, y, *state)


class _Stream:
    """Token pairs (input, next) read in order from one random stream, wrapping at its end."""

    def __init__(self, vocab: int, batch: int) -> None:
        self.tokens = torch.randint(0, vocab, (batch, 8192 if not DRY.on else 256), device=dev())
        self.pos = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pos + 1 >= self.tokens.shape[1]:
            self.pos = 0
        self.pos += 1
        return self.tokens[:, self.pos - 1], self.tokens[:, self.pos]


def _window(model: _TbpttLM, stream: _Stream, k: int, state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, tuple]:
    """k forwards of the per-time-step model; the window's mean loss and the state it ends in."""
    total = None
    for _t in range(k):
        x, y = stream.next()
        out = model(x, y, state)
        loss, state = out[0], tuple(out[1:])
        total = loss if total is None else total + loss
    return total / k, state


@workload("growing_demand", "checkpointing")
def lstm_tbptt_after_no_grad_validation(remedy: bool) -> None:
    """Truncated BPTT of a two-layer LSTM LM (vocab 32k, hidden 1024, batch 256): k forwards of the
    per-time-step model, then one backward of the window's summed loss; the state is detached between
    windows.

    40 windows of k=16, then a validation pass under ``torch.no_grad()`` (60 windows of 16), then the
    schedule lengthens the window to k=48 (longer dependencies for the second epoch); the GPU holds the
    states plus 36 time-step graphs, so the first k=48 window after the validation runs out near its
    forward 37. Label **growing_demand**, not activations: the same job fitted with 16 time steps per
    backward (16 of 36), every window's graphs die at its backward, and what one backward takes in
    (its window) was tripled by the job's schedule mid-run. Remedy ``checkpointing``: each time step
    (cells, head, loss) runs under ``torch.utils.checkpoint``, keeping only its inputs (token, h, c).
    """
    fast_fp32()
    vocab, emb, hidden, batch = pick(32000, 100), pick(512, 16), pick(1024, 32), pick(256, 4)
    model = _TbpttLM(vocab, emb, hidden, checkpointed=remedy).to(dev())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    schedule = [(16, pick(40, 2))]  # (k, windows) of the first epoch; then 48 (the second)
    val_windows = pick(60, 2)
    stream = _Stream(vocab, batch)

    def fresh() -> tuple[torch.Tensor, ...]:
        return tuple(torch.zeros(batch, hidden, device=dev()) for _ in range(4))

    def window(k: int, state: tuple[torch.Tensor, ...], plain: bool = False) -> tuple[torch.Tensor, tuple]:
        model.checkpointed = remedy and not plain
        return _window(model, stream, k, state)

    def learn(loss: torch.Tensor, state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return tuple(s.detach() for s in state)

    def train_window(k: int, state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return learn(*window(k, state))

    state = fresh()
    # the GPU: measured on the plain model's first 16 time steps (dropped in the remedy run, trained on in the plain)
    before = _allocated()
    loss, probe_state = window(16, state, plain=True)
    _sync()
    _cap_from(3 * _param_bytes(model), (_allocated() - before) // 16, 36, "time-step graphs")
    if not remedy:
        state = learn(loss, probe_state)
    del loss, probe_state
    for k, n in schedule:
        for _w in range(n):
            state = train_window(k, state)
    print("epoch 1 done", flush=True)
    with torch.no_grad():
        val_state, val_loss = fresh(), 0.0
        for _w in range(val_windows):
            loss, val_state = window(16, val_state)
            val_loss += float(loss)
    print(f"validation loss {val_loss / val_windows:.3f}", flush=True)
    k, n = 48, pick(10, 1)  # the longer windows of the second epoch
    for _w in range(n):
        state = train_window(k, state)
    print("epoch 2 done", flush=True)


@workload("leak", "leak")
def gpt2_validation_keeps_graphs_in_training_job(remedy: bool) -> None:
    """GPT-2 (6 layers, fp32) training with a backward per micro-batch (4 micro-batches of 2 x 512 tokens
    accumulated per optimizer step); every 8 steps a validation loop in eval mode that forgets
    ``torch.no_grad()`` and appends each batch's ``outputs`` (loss and logits, with their graphs) to a
    list for epoch-end metrics.

    The GPU holds the states plus 12 training micro-batch graphs (training needs one); validation batches
    are 1 x 512 tokens (about half a training graph, plus the kept logits), so the first validation runs
    out after some 20 forwards: graphs no backward will ever consume, in a job whose backwards each
    consumed one forward. Label **leak**: the tensors the loop
    keeps hold every validation batch's activations. Remedy ``leak``: keep ``loss.item()`` and the argmax
    predictions on the CPU (grad mode left as it was: each batch's graph then dies with the batch).
    """
    fast_fp32()
    model = gpt2(6, 768, 12)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    vocab, params = model.config.vocab_size, _param_bytes(model)
    n_micro, micro, seq = 4, pick(2, 2), pick(512, 32)
    capped = False
    for step in range(pick(24, 2)):
        model.train()
        for _k in range(n_micro):
            ids = tokens(micro, seq, vocab)
            loss, graph = _measured(lambda ids=ids: model(input_ids=ids, labels=ids).loss / n_micro)
            if not capped:
                _cap_from(3 * params, graph, 12, "training micro-batch graphs")
                capped = True
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % pick(8, 2):
            continue
        model.eval()
        kept: list = []
        hits = 0
        for _batch in range(pick(64, 2)):
            ids = tokens(pick(1, 1), seq, vocab)
            outputs = model(input_ids=ids, labels=ids)
            if remedy:
                kept.append(outputs.loss.item())
                hits += int((outputs.logits[:, :-1].argmax(-1).cpu() == ids[:, 1:].cpu()).sum())
            else:
                kept.append(outputs)
        val = sum(o if remedy else o.loss.item() for o in kept) / len(kept)
        print(f"step {step + 1} validation loss {val:.3f} hits {hits}", flush=True)
