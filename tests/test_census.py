"""The census at the OOM (issue 48, wire 1.11): what holds the bytes, read from the job's own objects, and the
findings it gives the diagnosis. Real torch on the CPU (its tensors counted as device 0's), the real hook."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pytest

from oomsight.analysis import diagnosis, remedies
from oomsight.analysis.diagnosis import PRECEDENCE, diagnose
from oomsight.hook import census

from fakes import GIB, MIB, FakeCuda

torch = pytest.importorskip("torch")
nn = torch.nn


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        probs = self.proj(x).softmax(-1)
        self.last_probs = probs  # kept for a plot, graph and all
        return probs


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = _Attention()
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.attn(x))


class EvalContainer:
    """Like transformers' EvalLoopContainer: keeps every batch's predictions, detached."""

    def __init__(self) -> None:
        self.tensors = None

    def add(self, t):
        self.tensors = t if self.tensors is None else torch.cat([self.tensors, t])


def _take(**kw):
    return census.take(torch, 0, device_type="cpu", **kw)


def _holder(found, fragment):
    matches = [h for h in found["holders"] if fragment in h["name"]]
    assert matches, [h["name"] for h in found["holders"]]
    return matches[0]


def test_outputs_kept_with_their_graphs_are_named_by_the_local_that_holds_them():
    model = _Model()
    opt = torch.optim.AdamW(model.parameters())
    all_logits = []
    for _ in range(5):
        all_logits.append(model(torch.randn(16, 8)))
    found = _take(roots=[model], optimizers=[opt])
    assert found["complete"] and found["cut_short"] is None
    kept = _holder(found, "local `all_logits` of test_outputs_kept")
    assert (kept["kind"], kept["graph_tensors"], kept["detached_tensors"], kept["length"]) == ("list", 5, 0, 5)
    assert kept["bytes"] == 5 * 16 * 2 * 4
    attr = _holder(found, "_Model.attn.last_probs")  # the module attribute, by the module's path
    assert (attr["kind"], attr["graph_tensors"]) == ("attribute", 1)
    assert {m["module"]: m["trained"] for m in found["modules"]} == {"_Model.attn": True, "_Model.head": True}
    params = sum(p.numel() * 4 for p in model.parameters())
    assert sum(m["bytes"] for m in found["modules"]) == params


def test_parameters_gradients_and_optimizer_state_are_no_holders():
    model = _Model()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    found = _take(roots=[model], optimizers=[opt])
    names = [h["name"] for h in found["holders"]]
    # the optimizer's state dicts and the parameters' gradients are model states, never holders
    assert not any("AdamW" in n or ".state" in n or "exp_avg" in n for n in names), names


def test_the_model_states_are_found_without_the_hook_knowing_the_model():
    model = _Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    found = _take()  # before any step the hook may know neither
    assert not any("momentum" in h["name"] for h in found["holders"])
    assert any(m["module"].startswith("_Model.") for m in found["modules"])


def test_a_bounded_deque_says_its_cap_and_a_framework_container_its_attribute():
    queue = collections.deque(maxlen=4)
    box = EvalContainer()
    for _ in range(6):
        queue.append(torch.randn(8, 8))
        box.add(torch.randn(8, 3))
    found = _take()
    q = _holder(found, "local `queue`")
    assert (q["kind"], q["cap"], q["length"], q["detached_tensors"]) == ("deque", 4, 4, 4)
    b = _holder(found, "local `box` of test_a_bounded_deque")
    assert b["name"].endswith(".tensors") and b["kind"] == "attribute" and b["bytes"] == 6 * 8 * 3 * 4


def test_copies_of_the_parameters_are_said_to_be_copies():
    model = _Model()
    ema = {name: p.detach().clone() for name, p in model.named_parameters()}
    found = _take(roots=[model])
    copies = _holder(found, "local `ema`")
    assert copies["parameter_copies"] and copies["detached_tensors"] == 4 and len(ema) == 4


def test_a_census_past_its_budget_says_it_was_cut_short():
    kept = [torch.randn(4) for _ in range(3)]
    found = _take(budget=census.Budget(seconds=0.0))
    assert not found["complete"] and found["cut_short"] == "time"
    found = _take(budget=census.Budget(objects=10))
    assert not found["complete"] and found["cut_short"] == "objects" and found["objects"] == 10
    assert kept


def test_other_processes_are_split_into_the_jobs_children_and_other_tenants():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        me = os.getpid()
        split = census.processes([(me, 100), (child.pid, 300 * MIB), (1, 2 * GIB)])
        assert split["split"]
        assert [p["pid"] for p in split["children"]] == [child.pid] and split["children"][0]["bytes"] == 300 * MIB
        assert [p["pid"] for p in split["others"]] == [1]
        # NVML's PIDs from another namespace (ours not among them): nothing is split
        assert not census.processes([(child.pid, 1), (1, 2)])["split"]
        assert not census.processes(None)["split"]
    finally:
        child.kill()
        child.wait()


# --------------------------------------------------------------- findings over a recorded census
CAPACITY = 24 * GIB


def _facts(census_doc, **kw):
    f = {
        "requested_bytes": 2 * GIB,
        "device_total_bytes": CAPACITY,
        "device_free_bytes": 64 * MIB,
        "physical_free_bytes": 64 * MIB,
        "allocated_bytes": CAPACITY - GIB,
        "reserved_bytes": CAPACITY - 512 * MIB,
        "phase": "forward",
        "grad_enabled": True,
        "census": census_doc,
    }
    f.update(kw)
    return f


def _census(*holders, processes=None):
    return {"complete": True, "cut_short": None, "seconds": 0.1, "holders": list(holders), "processes": processes}


def _h(name, kind="list", graph=0, detached=0, nbytes=0, cap=None, framework=None, copies=False):
    return {
        "name": name, "kind": kind, "framework": framework, "graph_tensors": graph, "detached_tensors": detached,
        "bytes": nbytes, "length": graph + detached, "cap": cap, "parameter_copies": copies,
    }


def test_the_jobs_own_workers_on_the_gpu_are_told_to_keep_cuda_out_of_them():
    procs = {"split": True, "children": [{"pid": 7, "bytes": 3 * GIB, "name": "pt_data_worker"}], "siblings": [],
             "others": []}
    d = diagnose(_facts(_census(processes=procs)))
    assert d["cause"] == "other_process" and d["facts"]["remedies"][0] == "worker_cuda", d["summary"]
    assert "own child processes" in d["summary"] and "pt_data_worker (pid 7)" in d["summary"]


def test_a_trainer_evaluation_keeping_its_logits_is_told_to_move_them_not_that_its_input_grew():
    held = _h("local `all_preds` of evaluation_loop (transformers/trainer.py:4200).tensors", kind="attribute",
              detached=1, nbytes=12 * GIB, framework="transformers")
    d = diagnose(_facts(_census(held), grad_enabled=False))
    assert d["cause"] == "leak", d["summary"]
    assert d["facts"]["remedies"][0] == "eval_accumulation"
    assert "input grew" not in d["summary"] and "all_preds" in d["summary"] and "12.00 GiB" in d["summary"]


def test_a_graph_kept_on_a_module_attribute_is_told_to_detach_it():
    held = _h("GPT.blocks.0.attn.last_probs", kind="attribute", graph=1, nbytes=6 * GIB)
    d = diagnose(_facts(_census(held), model_states={"parameters_bytes": GIB, "gradients_bytes": GIB,
                                                      "optimizer_state_bytes": 2 * GIB,
                                                      "optimizer_state_expected_bytes": 2 * GIB, "optimizers": 1}))
    assert d["cause"] == "leak" and d["facts"]["remedies"][0] == "detach_kept", d["summary"]
    assert d["facts"]["remedies"][0] not in remedies.CHANGES


def test_a_bounded_queue_a_kv_cache_and_parameter_copies_are_never_blamed():
    for held in (
        _h("local `queue`", kind="deque", detached=4096, nbytes=12 * GIB, cap=4096),
        _h("DynamicCache.layers", kind="kv_cache", detached=64, nbytes=12 * GIB, framework="transformers"),
        _h("local `ema`", kind="dict", detached=100, nbytes=12 * GIB, copies=True),
    ):
        d = diagnose(_facts(_census(held)))
        assert "kept_tensors" not in d["facts"]["findings"], (held["name"], d["summary"])


def test_a_floor_that_a_bounded_buffer_raised_is_no_leak():
    rows = [[s, float(s), 4 * GIB + s * 300 * MIB, 6 * GIB + s * 300 * MIB, 8 * GIB, 1] for s in range(3, 15)]
    base = _facts(None, phase="forward", steps_memory=rows)
    assert diagnose(base)["cause"] == "leak"
    queue = _h("MoCo.queue", kind="deque", detached=4096, nbytes=4 * GIB, cap=4096)
    d = diagnose(_facts(_census(queue), steps_memory=rows))
    assert d["cause"] != "leak" and d["facts"]["findings"][:1] != ["leak"], d["summary"]


def test_no_optimizer_means_no_advice_about_optimizer_steps():
    """A beam search under inference_mode, no optimizer: no remedy speaks of accumulating gradients."""
    load = [[1994.0 + i / 10, min(i, 20) * 100 * MIB] for i in range(60)]
    cache = [[2000.0 + i / 10, 6 * GIB + i * 25 * MIB] for i in range(70)]
    stack = ["serve.py:40 in main", "transformers/generation/utils.py:2802 in generate"]
    d = diagnose(_facts(None, grad_enabled=False, sampled_allocated=load + cache, time=2007.0, stack=stack))
    assert not any("optimizer.step()" in text or "accumulate" in text for text in d["remedies"]), d["remedies"]


def test_an_event_without_a_census_is_diagnosed_as_before():
    f = _facts(None)
    f.pop("census")
    assert diagnose(f)["facts"].get("census_complete") is None


def test_every_finding_is_one_row_of_the_precedence_table_shown_in_the_docs():
    names = [row.finding for row in PRECEDENCE]
    assert len(names) == len(set(names))
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "diagnosis.md")) as fh:
        text = fh.read()
    assert diagnosis.precedence_markdown() in text


# --------------------------------------------------------------- through the hook
def test_the_oom_event_records_the_census_and_a_failing_census_leaves_the_diagnosis(cpu_hook, spool, monkeypatch):
    cuda = FakeCuda(total=CAPACITY)
    cpu_hook(cuda)
    model = _Model()
    all_logits = [model(torch.randn(4, 8)) for _ in range(3)]
    cuda.set(0, allocated=20 * GIB, peak_allocated=21 * GIB, reserved=22 * GIB)
    cuda.observer(0, 2 * GIB, CAPACITY, 64 * MIB)
    (name,) = os.listdir(os.path.join(spool, "events"))
    with open(os.path.join(spool, "events", name)) as fh:
        ev = json.load(fh)
    kept = _holder(ev["census"], "local `all_logits`")
    assert kept["graph_tensors"] == 3 and ev["census"]["complete"]
    assert ev["diagnosis"]["facts"]["census_complete"] is True
    assert all_logits

    def broken(*_a, **_k):
        raise RuntimeError("boom")

    monkeypatch.setattr(census, "take", broken)
    cuda.observer(0, 2 * GIB, CAPACITY, 64 * MIB)
    events = sorted(os.listdir(os.path.join(spool, "events")))
    with open(os.path.join(spool, "events", events[-1])) as fh:
        ev2 = json.load(fh)
    assert ev2["census"]["cut_short"] == "failed" and ev2["diagnosis"]["cause"]


def _concatenate_onto(box, t):
    """A framework's call that concatenates onto what a container keeps: the kept tensor is an argument too."""
    args = (box.tensors, t)
    found = _take()
    box.tensors = torch.cat(args)
    return found


def test_a_kept_tensor_is_its_holders_while_a_call_concatenates_onto_it():
    """The Trainer's evaluation loop ran out inside its container's concatenation (H100, issue 48): the kept
    predictions were also a running call's arguments, and must stay the container's."""
    box = EvalContainer()
    box.add(torch.randn(64, 3))
    found = _concatenate_onto(box, torch.randn(8, 3))
    held = _holder(found, ".tensors")
    assert held["bytes"] == 64 * 3 * 4 and held["kind"] == "attribute"


def _snapshot(spool):
    from oomsight.wire.spool import SpoolReader

    (snap,) = SpoolReader(spool).read().snapshots
    return snap


def _steps_keeping(hook, cuda, keep, steps=20):
    """A training loop whose floor rises by what ``keep`` holds each step (16 MiB, detached), driven through the
    real step hook; then the publish that schedules the leak scan and the step that runs it."""
    model = _Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook.step_memory.min_interval = 0.0
    hook.sampler.tick()
    for step in range(1, steps + 2):
        model(torch.randn(4, 8)).sum().backward()
        cuda.set(0, allocated=GIB + step * 16 * MIB, peak_allocated=GIB + step * 16 * MIB + 64 * MIB, reserved=3 * GIB)
        opt.step()
        opt.zero_grad()
        keep(torch.zeros(4 * MIB))  # 16 MiB a step, no graph
        if step == steps:
            hook._before_publish()  # the sampler thread's check: the floor rose, a scan is due at the next step
    hook.sampler.publish()


@pytest.fixture
def roomy_leak_census(monkeypatch):
    """The leak scan's census with the OOM's budget: a test process that ran hundreds of tests before holds more
    objects than half a second walks on a busy CI machine."""
    from oomsight.hook import runtime

    monkeypatch.setattr(runtime, "LEAK_CENSUS_BUDGET", census.Budget(seconds=10.0))


def test_the_leak_scan_names_what_holds_the_rise_and_a_bounded_buffer_keeps_the_flag_down(
    cpu_hook, spool, roomy_leak_census
):
    """The census in the leak scan (issue 48): a queue with a cap filling raises the floor as a leak does; the scan
    names it, with what it holds when full, and the published verdict is no leak while the rise stays within it."""
    cuda = FakeCuda(total=4 * GIB)
    hook = cpu_hook(cuda)
    queue = collections.deque(maxlen=64)
    _steps_keeping(hook, cuda, queue.append)
    snap = _snapshot(spool)
    leak = snap["leak"]
    assert leak is not None and "local `queue`" in (leak.get("bounded_by") or ""), leak
    assert leak["bounded_cap_bytes"] == 64 * 16 * MIB
    assert snap["devices"][0]["step_trend"]["leak"] is False
    assert hook.errors.counts == {}


def test_the_leak_scan_names_the_list_that_keeps_every_step(cpu_hook, spool, roomy_leak_census):
    cuda = FakeCuda(total=4 * GIB)
    hook = cpu_hook(cuda)
    kept: list = []
    _steps_keeping(hook, cuda, kept.append)
    snap = _snapshot(spool)
    leak = snap["leak"]
    assert leak.get("bounded_by") is None and any("local `kept`" in h["name"] for h in leak["holders"]), leak
    assert snap["devices"][0]["step_trend"]["leak"] is True
    assert hook.errors.counts == {}


def test_holders_a_running_frame_keeps_are_named_even_when_the_walk_ran_past_its_deadline(monkeypatch):
    """The H100 ResNet validation job (one of eight at once) ran past 1 s in the naming: its `kept` list was
    recorded as an unnamed list. The running frames' locals cost a lookup each and are read whatever the clock."""
    model = _Model()
    kept = [model(torch.randn(4, 8)) for _ in range(3)]
    find = census._find_holders

    def slow(walk, *args):
        found = find(walk, *args)
        walk.deadline = float("-inf")  # the collector pass used the whole budget
        return found

    monkeypatch.setattr(census, "_find_holders", slow)
    found = _take(roots=[model])
    assert found["cut_short"] == "time"
    assert _holder(found, "local `kept`")["graph_tensors"] == 3 and kept
