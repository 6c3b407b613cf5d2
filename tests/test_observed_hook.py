"""Issue 43 through the real hook (wire 1.10): what the job shows is recorded where it happens. The real
Hook over the real torch (CPU modules, a fake allocator whose counters each test sets): the gradients and
optimizer state held at each step row, the input each forward takes, the memory after each backward of an
accumulation window, and the experts' parameters; and the verdicts they decide."""

from __future__ import annotations

import json
import os

import pytest

from oomsight.analysis import trend

from fakes import GIB, MIB, FakeCuda

torch = pytest.importorskip("torch")
nn = torch.nn

CAPACITY = 24 * GIB


@pytest.fixture
def hook_on(cpu_hook):
    """The real hook on a CPU model, its step rows taken at every step, its devices known."""

    def made(cuda):
        hook = cpu_hook(cuda)
        hook.step_memory.min_interval = 0.0
        hook.sampler.tick()
        return hook

    return made


class Net(nn.Module):
    def __init__(self, layers=6, width=64, experts=0):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.experts = nn.ModuleList(nn.Linear(width, width) for _ in range(experts))

    def forward(self, x=None, *, features=None):
        h = x if x is not None else features
        for layer in self.layers:
            h = torch.relu(layer(h))
        for expert in self.experts:
            h = h + expert(h)
        return h


def held_truth(opt):
    grads = sum(p.grad.untyped_storage().nbytes() for g in opt.param_groups for p in g["params"] if p.grad is not None)
    state = sum(v.untyped_storage().nbytes() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    return grads + state


def test_state_appearing_as_layers_unfreeze_is_measured_at_each_row_and_is_no_leak(hook_on):
    cuda = FakeCuda(total=CAPACITY)
    hook = hook_on(cuda)
    model = Net().requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    truths = []
    for step in range(24):
        if step % 3 == 0 and step // 3 < len(model.layers):
            model.layers[len(model.layers) - 1 - step // 3].requires_grad_(True)  # top down
        model(torch.randn(4, 64)).square().mean().backward()
        opt.step()  # the hook's row is taken here: its floor the state now held, as a GPU's would be
        truths.append(held_truth(opt))
        # the allocator says what the device would: a base plus what the job now holds, scaled to GiB
        floor = 4 * GIB + truths[-1] * 4096
        cuda.set(0, allocated=floor, peak_allocated=floor + 2 * GIB, reserved=floor + 2 * GIB)
        opt.zero_grad(set_to_none=False)
    rows = hook.step_memory.series(0)
    held = [r[trend.STATES] for r in rows]
    assert held[-1] == truths[-1] and len(set(held)) >= 5  # stairs, as layers unfroze
    # the floors of the rows come from the allocator's value before each row; held is measured at the row
    assert all(h in truths for h in held)


def test_the_input_a_forward_takes_is_read_from_its_arguments_or_keywords(hook_on):
    cuda = FakeCuda(total=CAPACITY)
    hook = hook_on(cuda)
    model = Net(layers=2)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step, batch in enumerate((4, 8, 16, 32)):
        x = torch.randn(batch, 64)
        out = model(x) if step % 2 else model(features=x)
        out.mean().backward()
        opt.step()
        opt.zero_grad()
    elements = [r[trend.INPUT] for r in hook.step_memory.series(0)]
    # the model is found at its first forward (whose input the hook it then puts on it cannot see)
    assert elements == [-1, 8 * 64, 16 * 64, 32 * 64]


def _event(spool):
    (name,) = os.listdir(os.path.join(spool, "events"))
    with open(os.path.join(spool, "events", name)) as fh:
        return json.load(fh)


@pytest.mark.parametrize("kept", [0, 2 * GIB])
def test_outputs_kept_through_an_accumulation_window_are_read_after_each_backward(hook_on, spool, kept):
    cuda = FakeCuda(total=CAPACITY)
    hook_on(cuda)
    model = Net(layers=2, experts=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):  # steps with 4 micro-batches each, nothing kept
        for _ in range(4):
            model(torch.randn(4, 64)).mean().backward()
        opt.step()
        opt.zero_grad()
    base = 6 * GIB
    logits = []
    for k in range(8):  # the failing window: each micro-batch's output kept for a metric
        out = model(torch.randn(4, 64))
        cuda.set(0, allocated=base + (k + 1) * kept, peak_allocated=base + (k + 2) * kept + GIB,
                 reserved=base + (k + 2) * kept + GIB)
        out.mean().backward()
        logits.append(out)
    cuda.observer(0, 4 * GIB, CAPACITY, 64 * MIB)
    event = _event(spool)
    rows = event["backwards_memory"]
    assert [r[2] for r in rows] == [base + (k + 1) * kept for k in range(8)]
    assert event["model_states"]["expert_parameters_bytes"] == 2 * (64 * 64 + 64) * 4
    d = event["diagnosis"]
    if kept:
        assert d["cause"] == "leak" and d["facts"]["remedies"][0] == "kept_outputs", d["summary"]
    else:
        assert d["cause"] != "leak", d["summary"]
