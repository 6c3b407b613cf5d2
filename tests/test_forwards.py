"""Forward-resolved memory (wire 1.7): a process with no optimizer step rows the memory left after each
forward of its outermost model that recorded a graph, and an evaluation loop that keeps every batch's
graph is told a leak at any speed. The real hook over the real torch (CPU modules, a fake allocator
whose counters each test sets)."""

from __future__ import annotations

import json
import os

import pytest

from oomsight.analysis import trend
from oomsight.hook.forwards import FIND_CALLS, IDLE_FORWARDS

from fakes import GIB, MIB, FakeCuda

torch = pytest.importorskip("torch")
nn = torch.nn

CAPACITY = 24 * GIB


@pytest.fixture
def hook_on(cpu_hook):
    return cpu_hook


def _evaluate(cuda, model, batches, kept_per_forward, oom_at=None, base=4 * GIB, keep=True):
    """``batches`` forwards; before forward k the allocator says ``base + k * kept_per_forward`` will be
    left after it (its peak 256 MiB above). With ``oom_at`` the allocator runs out inside that forward."""
    outputs = []
    inner = model[0]
    for k in range(1, batches + 1):
        left = base + k * kept_per_forward
        cuda.set(0, allocated=left, peak_allocated=left + 256 * MIB, reserved=left + 512 * MIB)
        if k == oom_at:
            handle = inner.register_forward_pre_hook(lambda *_: cuda.observer(0, 2 * GIB, CAPACITY, 64 * MIB))
            model(torch.randn(2, 8))
            handle.remove()
            break
        out = model(nn.Identity()(torch.randn(2, 8)))  # a stateless module first: not the model
        if keep:
            outputs.append(out)
    return outputs


def _model():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _event(spool):
    (name,) = os.listdir(os.path.join(spool, "events"))
    with open(os.path.join(spool, "events", name)) as fh:
        return json.load(fh)


def test_an_evaluation_loop_keeping_every_graph_is_a_leak_told_from_its_forwards(hook_on, spool):
    cuda = FakeCuda(total=CAPACITY)
    hook = hook_on(cuda)
    _evaluate(cuda, _model(), batches=9, kept_per_forward=2 * GIB, oom_at=9)
    ev = _event(spool)
    rows = ev["forwards_memory"]
    assert [r[0] for r in rows] == list(range(1, 9))
    assert [r[2] for r in rows] == [4 * GIB + k * 2 * GIB for k in range(1, 9)]
    assert hook.forwards.root_name == "Sequential"
    d = ev["diagnosis"]
    assert d["cause"] == "leak", d["summary"]
    assert d["facts"]["remedies"][0] == "no_grad"
    assert "after each forward" in d["summary"]


def test_a_loop_that_keeps_nothing_is_not_a_leak(hook_on, spool):
    cuda = FakeCuda(total=CAPACITY)
    hook_on(cuda)
    _evaluate(cuda, _model(), batches=9, kept_per_forward=0, oom_at=9, base=20 * GIB)
    ev = _event(spool)
    assert len(ev["forwards_memory"]) == 8
    assert ev["diagnosis"]["cause"] != "leak"
    assert ev["diagnosis"]["facts"]["remedies"][0] == "no_grad"  # still: autograd records with no optimizer


def test_a_first_step_that_sums_its_micro_batches_losses_is_not_a_pile(hook_on, spool):
    """An optimizer exists, none has stepped: forwards keeping their graphs until one backward are the
    step's activations, never told to run without autograd."""
    cuda = FakeCuda(total=CAPACITY)
    hook_on(cuda)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # noqa: F841 (alive at the OOM, as a training job's)
    _evaluate(cuda, model, batches=9, kept_per_forward=2 * GIB, oom_at=9)
    ev = _event(spool)
    assert len(ev["forwards_memory"]) == 8
    assert ev["model_states"]["optimizers"] == 1
    assert ev["diagnosis"]["cause"] != "leak"
    assert "no_grad" not in ev["diagnosis"]["facts"]["remedies"]


def test_a_live_evaluation_leak_raises_the_leak_flag_before_the_oom(hook_on, spool):
    """The hook judges its forward rows at each publish (once per new row) and writes the rise in the
    snapshot; the sidecar's oomsight_leak_suspected reads it. A loop keeping nothing: no flag."""
    from prometheus_client import CollectorRegistry, generate_latest

    from oomsight.metrics.collector import SpoolCollector
    from oomsight.wire.schema import validate
    from oomsight.wire.spool import SpoolReader

    def flag():
        registry = CollectorRegistry()
        registry.register(SpoolCollector(spool))
        line = [x for x in generate_latest(registry).decode().splitlines() if x.startswith("oomsight_leak_suspected{")]
        return float(line[0].rsplit(" ", 1)[1])

    cuda = FakeCuda(total=CAPACITY)
    hook = hook_on(cuda)
    model = _model()
    _evaluate(cuda, model, batches=6, kept_per_forward=0, base=4 * GIB)
    hook.sampler.tick()
    hook.sampler.publish()
    (doc,) = SpoolReader(spool).read().snapshots
    assert doc["devices"][0]["forward_pile_bytes"] == 0 and flag() == 0.0  # (the reader fills the default)
    _evaluate(cuda, model, batches=8, kept_per_forward=GIB, base=4 * GIB)
    hook.sampler.publish()
    (doc,) = SpoolReader(spool).read().snapshots
    assert validate(doc) == "snapshot"
    assert doc["devices"][0]["forward_pile_bytes"] >= 4 * GIB  # of the 8 GiB the last 8 forwards kept
    assert flag() == 1.0


def _ours(hook):
    """oomsight's global pre-hooks that find a model (the job probe's windows have their own)."""
    return [
        h
        for h in torch.nn.modules.module._global_forward_pre_hooks.values()
        if getattr(h, "__self__", None) is hook.forwards
    ]


def _train(model, opt, steps):
    for _ in range(steps):
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
        opt.zero_grad()


def test_a_validation_phase_in_a_training_job_that_keeps_its_graphs_is_a_leak(hook_on, spool):
    """Once the steps pause (3 step times, 1 s at least) the sampler thread arms the rows again; a
    validation loop in eval mode that keeps every batch's graph is told apart from the steps."""
    cuda = FakeCuda(total=CAPACITY)
    hook = hook_on(cuda)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(model, opt, 1)
    hook.steps.last_step_wall -= 5.0
    hook._arm_forwards_in_a_pause()  # one step: no step time yet, so no pause can be told
    assert not _ours(hook)
    _train(model, opt, 2)
    # the steps end the rows, not the hook: it watches what the backwards consume (one forward each)
    assert model._forward_hooks and hook.forwards.series(0) == [] and hook.forwards.most_consumed == 1
    hook._arm_forwards_in_a_pause()  # no pause yet: nothing armed
    assert not _ours(hook)
    hook.steps.last_step_wall -= 5.0  # the steps paused
    hook._arm_forwards_in_a_pause()
    model.eval()
    _evaluate(cuda, model, batches=9, kept_per_forward=2 * GIB, oom_at=9)
    ev = _event(spool)
    assert len(ev["forwards_memory"]) == 8 and ev["module_training"] is False
    assert (ev["forwards_since_backward"], ev["most_forwards_per_backward"]) == (8, 1)
    d = ev["diagnosis"]
    # a training job: the forward may train, so the remedy that keeps the result comes first, and
    # no_grad says what it changes
    # (the census names what keeps them: the list `outputs`, and says to keep their .detach())
    assert d["cause"] == "leak" and d["facts"]["remedies"][:3] == ["detach_kept", "leak", "no_grad"], d["summary"]
    assert d["facts"]["changes_result"] == ["no_grad"]
    assert "This changes the result" in d["remedies"][2] and "This changes" not in d["remedies"][0]
    assert "list local `outputs` of _evaluate" in d["summary"] and "the most one backward consumed together is 1" in (
        d["summary"]
    )


def _paused(hook_on):
    """Two training steps, then a pause long enough for the forward rows to be armed again."""
    cuda = FakeCuda(total=CAPACITY)
    hook = hook_on(cuda)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(model, opt, 2)
    hook.steps.last_step_wall -= 5.0
    hook._arm_forwards_in_a_pause()
    return cuda, hook, model, opt


def test_a_training_mode_pile_in_a_job_whose_backwards_took_one_forward_each_raises_the_flag(hook_on, spool):
    """Every backward of this job consumed one forward: it keeps no episode or window, so graphs piling in a
    model left in training mode (a validation without no_grad, a rollout that forgets it) go beyond what it
    consumes, whatever the flag says (issue 48: 72 and 180 forwards pending against 1 per backward)."""
    cuda, hook, model, _opt = _paused(hook_on)
    kept = _evaluate(cuda, model, batches=6, kept_per_forward=GIB)
    assert len(hook.forwards.series(0)) == 6 and hook.forwards.training is True
    assert hook.forwards.most_consumed == 1
    assert hook.forwards.pile(0, CAPACITY) is not None
    assert kept


def _train_summed(model, opt, forwards):
    """Steps that each sum a number of forwards' losses before one backward (``forwards``: one count a step, an
    episode's length)."""
    for n in forwards:
        sum(model(torch.randn(2, 8)).sum() for _ in range(n)).backward()
        opt.step()
        opt.zero_grad()


def _paused_after(hook_on, forwards):
    """Steps of the given forwards per backward (``_train_summed``), then a pause that arms the rows again."""
    cuda = FakeCuda(total=CAPACITY)
    hook = hook_on(cuda)
    model = _model()
    model.opt = torch.optim.SGD(model.parameters(), lr=0.1)  # alive as long as the model, as a job's is
    _train_summed(model, model.opt, forwards)
    hook.steps.last_step_wall -= 5.0
    hook._arm_forwards_in_a_pause()
    return cuda, hook, model


def test_a_training_mode_pile_beyond_what_backwards_consumed_raises_no_flag(hook_on, spool):
    """A job whose backwards consume several forwards together, as many as its episodes are long (they vary): a
    longer episode than any before (its backward still to come) in a model left in training mode keeps the flag
    down; the same forwards in eval mode raise it. Where every backward took the same number (a fixed window),
    the same pile raises it in training mode too."""
    cuda, hook, model = _paused_after(hook_on, [1, 2])
    assert (hook.forwards.least_consumed, hook.forwards.most_consumed) == (1, 2)
    kept = _evaluate(cuda, model, batches=10, kept_per_forward=GIB)
    assert len(hook.forwards.series(0)) == 10 and hook.forwards.training is True
    assert hook.forwards.pile(0, CAPACITY) is None
    model.eval()
    kept += _evaluate(cuda, model, batches=1, kept_per_forward=GIB, base=14 * GIB)
    assert hook.forwards.training is False and hook.forwards.pile(0, CAPACITY) is not None


def test_a_pause_then_more_steps_drops_the_rows_and_the_hooks(hook_on, spool):
    cuda, hook, model, opt = _paused(hook_on)
    _evaluate(cuda, model, batches=3, kept_per_forward=GIB)  # a training-mode forward with grad: rowed
    assert len(hook.forwards.series(0)) == 3
    assert hook.forwards.pile(0, CAPACITY) is None  # 3 graphs: within what a backward may consume (4 x 1)
    model.eval()
    _evaluate(cuda, model, batches=3, kept_per_forward=GIB, base=7 * GIB)
    assert hook.forwards.pile(0, CAPACITY) == 5 * GIB  # 6 rows, each 1 GiB above the last: beyond, in eval mode
    opt.step()  # a step and no new row: the verdict on the rows of the pause falls with them
    assert hook.forwards.pile(0, CAPACITY) is None
    _train(model, opt, 2)  # the steps resume: the rows are stale; the hook stays to watch the backwards
    assert hook.forwards.series(0) == [] and model._forward_hooks
    hook._arm_forwards_in_a_pause()  # armed again only after a new pause
    assert not _ours(hook)


def test_a_pause_with_no_grad_validation_hooks_no_model(hook_on, spool):
    cuda, hook, model, _opt = _paused(hook_on)
    cuda.grad = False  # the fake allocator's view of torch.no_grad()
    with torch.no_grad():
        for _ in range(FIND_CALLS // 4 + 1):
            model(torch.randn(2, 8))
    assert not _ours(hook) and hook.forwards.pending == 0  # nothing recorded: nothing pending
    assert model._forward_hooks  # a training job keeps its hook through a no_grad validation
    hook._arm_forwards_in_a_pause()  # the same pause: not armed again
    assert not _ours(hook)


def test_forwards_without_autograd_are_not_rowed(hook_on, spool):
    cuda = FakeCuda(total=CAPACITY)
    cuda.grad = False
    hook = hook_on(cuda)
    model = _model()
    _evaluate(cuda, model, batches=5, kept_per_forward=GIB)
    assert hook.forwards.root_name is None and not model._forward_hooks  # inference: never hooked
    cuda.grad = True
    _evaluate(cuda, model, batches=1, kept_per_forward=GIB)
    assert hook.forwards.root_name == "Sequential" and len(hook.forwards.series(0)) == 1
    # then an inference loop: after IDLE_FORWARDS forwards without autograd the hook is gone
    cuda.grad = False
    _evaluate(cuda, model, batches=IDLE_FORWARDS, kept_per_forward=0, keep=False)
    assert hook.forwards.count == 1 + IDLE_FORWARDS
    assert not model._forward_hooks and len(hook.forwards.series(0)) == 1


def test_a_copy_of_the_hooked_model_is_ignored_and_a_pickled_one_loads_without_oomsight(hook_on, spool):
    """deepcopy (an EMA copy, a teacher) and torch.save(model) of a model that has the forward hook."""
    import copy
    import pickle
    import subprocess
    import sys

    cuda = FakeCuda(total=CAPACITY)
    hook = hook_on(cuda)
    model = _model()
    _evaluate(cuda, model, batches=2, kept_per_forward=GIB)
    twin = copy.deepcopy(model)
    twin(torch.randn(2, 8))
    assert hook.forwards.count == 2  # the copy's forward is not the model's
    model(torch.randn(2, 8))
    assert hook.forwards.count == 3
    blob = pickle.dumps(model)
    code = "import pickle, sys, torch; m = pickle.loads(sys.stdin.buffer.read()); m(torch.randn(2, 8)); print('ok')"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # no oomsight importable there
    done = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, env=env, timeout=120)
    assert done.stdout.strip() == b"ok", done.stderr[-2000:]
    assert b"oomsight" not in blob.replace(b"oomsight.dropped_forward_hook", b"")


def test_scripting_a_model_that_has_the_hook_names_it(hook_on, spool):
    cuda = FakeCuda(total=CAPACITY)
    hook = hook_on(cuda)
    model = _model()
    _evaluate(cuda, model, batches=1, kept_per_forward=GIB)
    with pytest.raises(RuntimeError, match="oomsight_forward_rows: TorchScript cannot compile"):
        torch.jit.script(model)
    hook.forwards.close()  # as after an inference loop: the hook is gone
    torch.jit.script(model)


def test_the_first_optimizer_step_ends_the_forward_rows_and_the_hook_watches_the_backwards(hook_on, spool):
    cuda = FakeCuda(total=CAPACITY)
    hook = hook_on(cuda)
    model = _model()
    outputs = _evaluate(cuda, model, batches=3, kept_per_forward=GIB)
    assert len(hook.forwards.series(0)) == 3 and hook.forwards.most_consumed is None
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    (model(torch.randn(2, 8)).sum() + sum(o.sum() for o in outputs)).backward()  # 4 graphs, one backward
    assert (hook.forwards.most_consumed, hook.forwards.pending) == (4, 0)
    opt.step()
    model(torch.randn(2, 8)).sum().backward()
    assert hook.forwards.series(0) == []  # training: the step rows tell
    assert hook.forwards.count == 5 and model._forward_hooks
    assert (hook.forwards.most_consumed, hook.forwards.pending) == (4, 0)  # the most one backward took


def test_a_program_whose_modules_hold_nothing_on_the_device_is_not_hooked_for_long(hook_on, spool):
    cuda = FakeCuda(total=CAPACITY)
    hook = hook_on(cuda)
    hook.forwards.device_type = "cuda"  # these CPU modules are not the model looked for
    assert len(_ours(hook)) == 1
    model = _model()
    for _ in range(FIND_CALLS // 3 + 1):
        model(torch.randn(2, 8))  # 4 module calls each
    assert not _ours(hook) and hook.forwards.root_name is None


def test_a_forward_hook_that_fails_is_counted_and_removed_never_raised(hook_on, spool):
    cuda = FakeCuda(total=CAPACITY)
    hook = hook_on(cuda)
    model = _model()
    cuda.read_error = RuntimeError("allocator gone")
    model(torch.randn(2, 8))
    model(torch.randn(2, 8))
    assert hook.errors.counts["forward_memory"] == 1
    assert not model._forward_hooks


def test_rows_rising_by_the_same_amount_are_a_pile_and_a_growing_input_is_not():
    kept = [[k, float(k), 4 * GIB + k * GIB, 4 * GIB + k * GIB + 300 * MIB] for k in range(1, 9)]
    assert trend.forward_pile(kept, CAPACITY) == 6 * GIB  # rows 2..8: the first forward is skipped
    flat = [[k, float(k), 4 * GIB, -1] for k in range(1, 9)]
    assert trend.forward_pile(flat, CAPACITY) is None
    # a longer input leaves more and needs more on top of it: the forward's own memory grows too
    growing = [[k, float(k), 4 * GIB + k * GIB, 4 * GIB + k * GIB + k * GIB] for k in range(1, 9)]
    assert trend.forward_pile(growing, CAPACITY) is None
    # three forwards that each kept 2 GiB: the short-series rule (a rise of 5 % of the GPU or more)
    short = [[k, float(k), 4 * GIB + k * 2 * GIB, -1] for k in range(1, 5)]
    assert trend.forward_pile(short, CAPACITY) == 4 * GIB
    assert trend.forward_pile([["x", None, 1, 2], [1e400, 1, 1, 1]], CAPACITY) is None


def test_what_each_forward_begins_with_tells_a_growing_input_from_a_pile():
    """A loop whose input grows by 1 GiB of graph a forward and keeps nothing, in a model that frees no
    temporary (its peak is what it leaves): what each forward leaves rises as a pile's does, what it
    begins with does not (the job space's inference over growing sequences, before the 5th column)."""
    growing = [[k, float(k), 4 * GIB + k * GIB, 4 * GIB + k * GIB, 4 * GIB] for k in range(1, 9)]
    assert trend.forward_pile([r[:4] for r in growing], CAPACITY) == 6 * GIB  # read after each forward only
    assert trend.forward_pile(growing, CAPACITY) is None
    # the previous output still held as the next forward begins (``out = model(x)``): the start rises
    # by the growth, and so does each forward's own memory above it
    held = [[k, float(k), 4 * GIB + (2 * k - 1) * GIB, -1, 4 * GIB + (k - 1) * GIB] for k in range(1, 9)]
    assert trend.forward_pile(held, CAPACITY) is None
    kept = [[k, float(k), 4 * GIB + k * GIB, -1, 4 * GIB + (k - 1) * GIB] for k in range(1, 9)]
    assert trend.forward_pile(kept, CAPACITY) == 6 * GIB


def test_a_rowed_forward_is_read_as_it_begins_and_as_it_ends(hook_on, spool):
    cuda = FakeCuda(total=CAPACITY)
    hook_on(cuda)
    model = _model()
    outputs = []
    for k in range(1, 5):
        began = 4 * GIB + k * GIB
        cuda.set(0, allocated=began, peak_allocated=began, reserved=began + GIB)
        # inside the forward, the first layer's output takes 1 GiB more than the forward began with
        grown = {"allocated": began + GIB, "peak_allocated": began + GIB, "reserved": began + GIB}
        handle = model[0].register_forward_hook(lambda *_, g=grown: cuda.set(0, **g))
        outputs.append(model(torch.randn(2, 8)))
        handle.remove()
    cuda.observer(0, 2 * GIB, CAPACITY, 64 * MIB)
    rows = _event(spool)["forwards_memory"]
    # the first forward is the one the model is found in: its pre-hooks had run (and it is never judged)
    assert rows[0][4] == -1
    assert [(r[2], r[4]) for r in rows[1:]] == [(5 * GIB + k * GIB, 4 * GIB + k * GIB) for k in range(2, 5)]


def _steps_of(model, opt, lengths):
    """One optimizer step per entry: that many forwards keep their graphs until one backward of their
    summed losses (micro-batches summed, an episode's log-probabilities, a truncated-BPTT window)."""
    for n in lengths:
        sum(model(torch.randn(2, 8)).sum() for _ in range(n)).backward()
        opt.step()
        opt.zero_grad()


def _validate_without_grad(cuda, model, batches=5):
    cuda.grad = False
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(2, 8))
    cuda.grad = True


# (the steps before, a no_grad validation first, the failing step's forwards, the forward that runs out, eval mode)
TRAINING_PILES = {
    "summed_micro_batches_after_a_checkpoint_save": ([8, 8, 8], False, 8, 6, False),
    "summed_micro_batches_last_forward": ([8, 8, 8], False, 8, 8, False),
    "summed_micro_batches_in_eval_mode": ([8, 8, 8], False, 8, 7, True),
    "reinforce_a_longer_episode": ([10, 25, 15], False, 60, 60, False),
    "truncated_bptt_after_no_grad_validation": ([16, 16, 16], True, 16, 12, False),
}


@pytest.mark.parametrize("name", sorted(TRAINING_PILES))
def test_a_training_step_that_keeps_its_graphs_until_one_backward_is_never_told_to_drop_autograd(
    hook_on, spool, name
):
    """The job's own backwards consumed several forwards' graphs together: a pile of no more of them,
    after a pause, is the step's activations. Not a leak, no result-changing remedy first, no live flag."""
    from oomsight.analysis import remedies

    before, validate, forwards, oom_at, eval_mode = TRAINING_PILES[name]
    cuda = FakeCuda(total=CAPACITY)
    hook = hook_on(cuda)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    _steps_of(model, opt, before)
    assert hook.forwards.most_consumed == max(before)
    if validate:
        _validate_without_grad(cuda, model)
    hook.steps.last_step_wall -= 5.0  # a checkpoint save, a validation: the steps paused
    hook._arm_forwards_in_a_pause()
    model.train(not eval_mode)
    per_forward = (CAPACITY - 6 * GIB) // forwards
    _evaluate(cuda, model, batches=oom_at - 1, kept_per_forward=per_forward)
    assert len(hook.forwards.series(0)) == oom_at - 1
    assert hook.forwards.pile(0, CAPACITY) is None  # the live flag stays down
    _evaluate(cuda, model, batches=1, kept_per_forward=0, oom_at=1, base=4 * GIB + (oom_at - 1) * per_forward)
    ev = _event(spool)
    d = ev["diagnosis"]
    assert ev["forwards_since_backward"] == oom_at - 1 and ev["most_forwards_per_backward"] == max(before)
    assert d["cause"] != "leak", d["summary"]
    assert d["facts"]["remedies"][0] not in remedies.CHANGES, d["facts"]["remedies"]
    assert "no_grad" not in d["facts"]["remedies"][:1]


def test_an_evaluation_keeping_its_graphs_in_a_job_whose_backwards_took_eight_is_still_a_leak(hook_on, spool):
    """Beyond what the job's backwards consumed together (4 x 8 forwards), an evaluation that keeps
    every batch's graph is a leak, live and at the OOM."""
    cuda = FakeCuda(total=CAPACITY)
    hook = hook_on(cuda)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _steps_of(model, opt, [8, 8])
    hook.steps.last_step_wall -= 5.0
    hook._arm_forwards_in_a_pause()
    model.eval()
    _evaluate(cuda, model, batches=40, kept_per_forward=GIB // 2)
    assert hook.forwards.pile(0, CAPACITY) is not None
    _evaluate(cuda, model, batches=1, kept_per_forward=0, oom_at=1, base=4 * GIB + 40 * GIB // 2)
    d = _event(spool)["diagnosis"]
    assert d["cause"] == "leak" and d["facts"]["remedies"][0] == "leak", d["summary"]
    assert "no_grad" in d["facts"]["remedies"]


def test_an_evaluation_that_keeps_its_graphs_right_after_the_last_step_is_rowed_and_a_leak(hook_on, spool):
    """No pause: the validation runs out faster than the pause bar. Once its forwards go beyond 4 x what
    one backward of the job consumed, the hook rows them anyway, and the rows show the pile."""
    cuda = FakeCuda(total=CAPACITY)
    hook = hook_on(cuda)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(model, opt, 3)  # a backward per forward
    model.eval()
    outputs = _evaluate(cuda, model, batches=4, kept_per_forward=GIB)
    assert hook.forwards.series(0) == []  # within what a backward may consume: not rowed
    outputs += _evaluate(cuda, model, batches=10, kept_per_forward=GIB, base=8 * GIB)
    assert len(hook.forwards.series(0)) == 10  # forwards 5 to 14 are rowed
    assert hook.forwards.pile(0, CAPACITY) is not None  # the live flag
    _evaluate(cuda, model, batches=1, kept_per_forward=0, oom_at=1, base=18 * GIB)
    d = _event(spool)["diagnosis"]
    assert d["cause"] == "leak" and d["facts"]["remedies"][:3] == ["detach_kept", "leak", "no_grad"], d["summary"]


def test_a_training_mode_pile_beyond_a_fixed_window_raises_the_flag(hook_on, spool):
    """Every backward consumed the same two forwards (a fixed window): a pile beyond the bound in training mode
    is no longer window the job has shown (issue 48: a validation in training mode keeping its logits)."""
    cuda, hook, model = _paused_after(hook_on, [2, 2])
    assert (hook.forwards.least_consumed, hook.forwards.most_consumed) == (2, 2)
    kept = _evaluate(cuda, model, batches=10, kept_per_forward=GIB)
    assert hook.forwards.training is True and hook.forwards.pile(0, CAPACITY) is not None
    assert kept
