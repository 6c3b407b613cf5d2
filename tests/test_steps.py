"""The global optimizer step hook, with a real (CPU) torch optimizer where it matters."""


import pytest

from oomsight.config import Settings, StepSettings
from oomsight.hook.errors import ErrorBook
from oomsight.hook.steps import StepTracker

from fakes import FakeCuda, FakeOptimizer


def tracker(**kw):
    return StepTracker(Settings().replace(**kw).steps, FakeCuda(), ErrorBook())


def cpu_tracker():
    """A tracker that measures the CPU's tensors of the real torch (the hook measures CUDA's)."""
    torch = pytest.importorskip("torch")
    t = tracker()
    t.torch, t.device_type = torch, "cpu"
    return t, torch


def only(monkeypatch, *objects):
    """The walk's scan for live models sees only ``objects``: a whole test run keeps other tests'
    CPU modules alive, which the scan would find as well (on a GPU it counts only CUDA storages)."""
    import types
    import weakref

    from oomsight.hook import steps

    refs = [weakref.ref(o) for o in objects]  # held weakly, as the garbage collector holds nothing
    alive = lambda: [o for o in (r() for r in refs) if o is not None]  # noqa: E731
    monkeypatch.setattr(steps, "gc", types.SimpleNamespace(get_objects=alive))


def test_categories_sum_parameters_gradients_and_state_once_per_storage(monkeypatch):
    t, torch = cpu_tracker()
    model = torch.nn.Linear(10, 10)
    tied = torch.nn.Linear(10, 10)
    only(monkeypatch, model, tied)
    tied.weight = model.weight  # tied weights: one storage, counted once
    opt = torch.optim.AdamW(model.parameters())
    t.set_roots([model, tied])
    model(torch.zeros(1, 10)).sum().backward()
    opt.step()
    t.post_step(opt, (), {})
    params, grads, state, _ = t.categories[0]
    assert (params, grads) == (440 + 40, 440)  # the tied module's own bias is a parameter too
    assert state == 2 * 440 + 2 * 4  # exp_avg and exp_avg_sq of both, and two 4-byte step counters


def test_the_models_seen_called_add_their_frozen_parameters(monkeypatch):
    t, torch = cpu_tracker()
    student, teacher = torch.nn.Linear(4, 4), torch.nn.Linear(4, 64).requires_grad_(False)
    only(monkeypatch, student, teacher, *teacher.children())
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    t.post_step(opt, (), {})
    # never called, the teacher is found all the same by the walk's scan for live models
    assert t.categories[0][0] == 80 + 1280
    t.live = type(t.live)()  # as before any scan: only what the optimizer holds is known
    t.live._next = float("inf")
    t._next_walk = 0.0
    t.post_step(opt, (), {})
    assert t.categories[0][0] == 80
    t.set_roots([student, teacher])
    t.post_step(opt, (), {})  # learning new models walks at the next step, whatever the interval
    assert t.categories[0][0] == 80 + 1280
    assert t.layout_states[0]["frozen_parameters_bytes"] == 1280
    assert t.layout_states[0]["frozen_modules"] == ["Linear"]
    del teacher
    assert len(t.roots) == 1  # held weakly: a model the job drops is not kept alive


def test_the_walk_runs_at_most_once_per_interval():
    clock = iter([0.0, 1.0, 2.0, 100.0]).__next__
    t = StepTracker(StepSettings(), FakeCuda(), ErrorBook(), clock=clock)
    opt = FakeOptimizer([])
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

    t, _torch = cpu_tracker()
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


def test_at_an_oom_the_live_models_and_optimizers_are_found_through_the_garbage_collector():
    torch = pytest.importorskip("torch")
    import gc

    from oomsight.hook.steps import find_live, model_states

    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    optimizers, modules = find_live(gc, torch.optim.Optimizer, torch.nn.Module)
    assert any(m is model for m in modules) and any(m is model[0] for m in modules)
    assert not [o for o in optimizers if any(p is model[0].weight for g in o.param_groups for p in g["params"])]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizers, _ = find_live(gc, torch.optim.Optimizer, torch.nn.Module)
    assert any(o is opt for o in optimizers)
    # the CPU machine has no CUDA tensors: nothing on a CUDA device, no model states there
    assert model_states([opt], [model], torch, 0, gc) is None


def test_a_step_row_carries_the_memory_outside_the_allocator_where_nvml_sees_the_process():
    from oomsight.hook.cuda import reading_from_nested
    from oomsight.hook.stepmemory import outside_bytes

    from fakes import nested_stats

    r = reading_from_nested(nested_stats(allocated=3 << 30, reserved=4 << 30))
    seen = {"process_visible": True, "process_used_bytes": 5 << 30}
    assert outside_bytes(seen, r) == 1 << 30  # context, NCCL, an extension's own cudaMalloc
    assert outside_bytes({"process_visible": False, "process_used_bytes": None}, r) == -1
    assert outside_bytes(None, r) == -1


def test_the_text_report_says_the_parallelism_and_the_frozen_part_of_the_parameters(spool):
    from oomsight.analysis.inventory import take_inventory
    from oomsight.tools import report
    from oomsight.wire.spool import SpoolReader

    from fakes import GIB
    from spoolmaker import hooked_process

    hook, _cuda = hooked_process(spool)
    hook.steps.layout_states = {0: {"frozen_parameters_bytes": GIB // 2, "frozen_modules": ["LlamaForCausalLM"]}}
    hook.job.setup["parallelism"] = {"world_size": 4, "strategy": "fsdp2", "sharding": "FULL_SHARD", "shard_size": 4}
    hook.sampler.publish()
    state = SpoolReader(spool).read()
    text = report.render(take_inventory(state, state.snapshots[0]["time"]), spool)
    assert "parallelism: fsdp2 over 4 ranks (sharding FULL_SHARD, shard size 4)" in text
    assert "of these: 512.00 MiB frozen parameters; frozen models: LlamaForCausalLM" in text


def test_a_process_that_never_stepped_gets_its_layout_from_the_walk_at_its_oom(monkeypatch):
    """Inference, an evaluation-only process: no optimizer step, so no walk, until the OOM's walk of
    the live models, whose layout then stands (the OOM's job carries the parallelism: an FSDP inference
    is never advised to shard, the job space's ``inference_only`` jobs under FSDP). A later walk's is
    not replaced."""
    from oomsight.hook import steps
    from oomsight.hook.steps import model_states

    t, torch = cpu_tracker()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    only(monkeypatch, model)
    assert t.layout is None
    states = model_states([], [], torch, 0, steps.gc, "cpu", t.walked_at_oom)  # the live models, as at an OOM
    assert states is not None and states["parameters_bytes"] == 80
    first = t.layout
    assert first is not None and first.parallelism["strategy"] == "none"
    model_states([], [model], torch, 0, steps.gc, "cpu", t.walked_at_oom)
    assert t.layout is first
