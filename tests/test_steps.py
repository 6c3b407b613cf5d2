"""The global optimizer step hook, with a real (CPU) torch optimizer where it matters."""

import types

import pytest

from oomsight.config import Settings, StepSettings
from oomsight.hook.errors import ErrorBook
from oomsight.hook.steps import StepTracker

from fakes import FakeCuda, FakeOptimizer


class FakeTensor:
    def __init__(self, nbytes, ptr, device=0, cuda=True):
        self.is_cuda = cuda
        self.device = types.SimpleNamespace(index=device)
        self._storage = types.SimpleNamespace(data_ptr=lambda: ptr, nbytes=lambda: nbytes)
        self.grad = None

    def untyped_storage(self):
        return self._storage


def tracker(**kw):
    return StepTracker(Settings().replace(**kw).steps, FakeCuda(), ErrorBook())


def test_categories_sum_parameters_gradients_and_state_once_per_storage():
    w, b = FakeTensor(400, 1), FakeTensor(40, 2)
    w.grad, b.grad = FakeTensor(400, 3), FakeTensor(40, 4)
    tied = w  # the same parameter listed twice (tied weights) counts once
    cpu = FakeTensor(10_000, 9, cuda=False)
    opt = FakeOptimizer(
        [w, b, tied, cpu], state={w: {"exp_avg": FakeTensor(400, 5), "exp_avg_sq": FakeTensor(400, 6), "step": 3}}
    )
    t = tracker()
    t.post_step(opt, (), {})
    params, grads, state, _ = t.categories[0]
    assert (params, grads, state) == (440, 440, 800)


def test_tensors_on_two_devices_are_kept_apart():
    opt = FakeOptimizer([FakeTensor(100, 1, device=0), FakeTensor(300, 2, device=1)])
    t = tracker()
    t.post_step(opt, (), {})
    assert t.categories[0][0] == 100 and t.categories[1][0] == 300


def test_the_walk_runs_at_most_once_per_interval():
    clock = iter([0.0, 1.0, 2.0, 100.0]).__next__
    t = StepTracker(StepSettings(), FakeCuda(), ErrorBook(), clock=clock)
    opt = FakeOptimizer([FakeTensor(100, 1)])
    walks = []
    t.walk = lambda: walks.append(1)  # type: ignore[method-assign]
    for _ in range(4):
        t.post_step(opt, (), {})
    assert len(walks) == 2  # first step, then after categories_interval_seconds (30 s)
    assert t.count == 4 and t.duration_total == pytest.approx(100.0) and t.last_duration == pytest.approx(98.0)


def test_a_failing_walk_is_swallowed():
    class Broken:
        param_groups = property(lambda self: 1 / 0)
        state = {}

    t = tracker()
    t.post_step(Broken(), (), {})
    assert t.errors.counts["step_hook"] == 1 and t.count == 1


def test_the_real_global_hook_sees_a_real_optimizer_step():
    torch = pytest.importorskip("torch")
    t = tracker()
    assert t.register(torch)
    try:
        p = torch.nn.Parameter(torch.zeros(4))
        opt = torch.optim.SGD([p], lr=0.1)
        for _ in range(3):
            p.sum().backward()
            opt.step()
    finally:
        t.unregister()
    opt.step()  # after unregistering: not counted
    assert t.count == 3


def test_with_no_optimizer_the_live_parameters_are_found_and_walked_like_an_optimizers():
    torch = pytest.importorskip("torch")
    from oomsight.hook.steps import Unstepped, find_live, walk_optimizers

    model = torch.nn.Linear(4, 4)
    optimizers, parameters = find_live(__import__("gc"), torch.optim.Optimizer, torch.nn.Parameter)
    assert not [o for o in optimizers if any(p is model.weight for g in o.param_groups for p in g["params"])]
    assert any(p is model.weight for p in parameters) and any(p is model.bias for p in parameters)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizers, _ = find_live(__import__("gc"), torch.optim.Optimizer, torch.nn.Parameter)
    assert any(o is opt for o in optimizers)
    # walked like an optimizer with no state: bytes by device, dtype counted, nothing expected
    w = FakeTensor(400, 1)
    w.dtype = "torch.bfloat16"
    totals, dtypes, _expected = walk_optimizers([Unstepped([w, FakeTensor(40, 2, cuda=False)])])
    assert totals[0] == [400, 0, 0] and dtypes == {"bfloat16": 400}
