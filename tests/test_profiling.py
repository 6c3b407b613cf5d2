"""On-demand profiling with the real torch.profiler on the CPU (CUDA columns are 0 here;
the GPU test checks them against the profiler's own table)."""

import contextlib
import gzip
import json
import os
import time
import types

import pytest

from oomsight.analysis.profile_plan import plan_start_step
from oomsight.config import Settings
from oomsight.hook.errors import ErrorBook
from oomsight.hook.profiler import Profiler, top_k, unavailable_reason
from oomsight.hook.runtime import Hook
from oomsight.wire.requests import ProfileRequest, parse_request, write_request
from oomsight.wire.schema import ProfileOp, validate
from oomsight.wire.spool import SpoolReader, SpoolWriter

from fakes import FakeCuda

torch = pytest.importorskip("torch")


@pytest.fixture
def hooked(spool):
    cuda = FakeCuda()
    cuda.set(0, allocated=1 << 30, reserved=1 << 30)
    hook = Hook(Settings().replace(spool_dir=spool, termination_message_path=""), cuda, None, torch)
    hook.start()
    hook.sampler.stop_thread()
    hook.sampler.tick()
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 64)

    def step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    yield hook, step
    hook.stop()


def wait_profiles(spool, n=1, timeout=30.0):
    end = time.time() + timeout
    while time.time() < end:
        profiles = SpoolReader(spool).read().profiles
        if len(profiles) >= n:
            return profiles
        time.sleep(0.05)
    raise TimeoutError("no profile document")


def test_a_request_profiles_exactly_n_steps_from_the_aligned_step(hooked, spool):
    hook, step = hooked
    for _ in range(3):
        step()
    write_request(spool, "r1", steps=4, start_step=5)
    hook.sampler.publish()  # the sampler thread polls requests when it publishes
    assert hook.profiler.plan is not None and hook.profiler.plan.id == "r1"
    for _ in range(12):
        step()
    (doc,) = wait_profiles(spool)
    assert validate(doc) == "profile"
    assert (doc["request_id"], doc["start_step"], doc["steps"]) == ("r1", 5, 4)
    ops = {row["op"] for row in doc["top_by_time"]}
    assert "aten::addmm" in ops or "other" in ops
    cpu = {row["op"]: row["cpu_time_us"] for row in doc["top_by_time"]}
    assert any(v > 0 for v in cpu.values())
    art = os.path.join(spool, "artifacts")
    with open(os.path.join(art, doc["table_artifact"])) as fh:
        assert "Name" in fh.read()
    with gzip.open(os.path.join(art, doc["trace_artifact"])) as fh:
        assert "traceEvents" in json.load(fh)


def test_the_snapshot_says_which_profile_runs_and_then_none(hooked, spool):
    hook, step = hooked
    write_request(spool, "r2", steps=2, start_step=0)
    hook.sampler.publish()
    step()
    assert hook.sampler.build()["profiling"] == "r2"
    for _ in range(3):
        step()
    wait_profiles(spool)
    time.sleep(0.1)
    assert hook.sampler.build()["profiling"] is None


def test_a_second_request_waits_for_the_running_one(hooked, spool):
    hook, step = hooked
    write_request(spool, "a", steps=3, start_step=0)
    hook.sampler.publish()
    step()
    write_request(spool, "b", steps=2, start_step=0)
    hook.sampler.publish()
    assert hook.profiler.running.id == "a" and hook.profiler.plan is None
    for _ in range(4):
        step()
    wait_profiles(spool, 1)
    time.sleep(0.1)
    hook.sampler.publish()  # now b is picked up
    for _ in range(4):
        step()
    ids = sorted(p["request_id"] for p in wait_profiles(spool, 2))
    assert ids == ["a", "b"]


def test_old_and_malformed_requests_are_ignored(hooked, spool):
    hook, _ = hooked
    path = write_request(spool, "old", steps=2, start_step=0)
    with open(path) as fh:
        doc = json.load(fh)
    doc["created_at"] = hook.process["started_at"] - 10  # from before this process started
    with open(path, "w") as fh:
        json.dump(doc, fh)
    with open(os.path.join(spool, "requests", "bad.json"), "w") as fh:
        fh.write('{"kind": "profile_request", "id": "../x", "steps": 1000}')
    hook.sampler.publish()
    assert hook.profiler.plan is None


def test_top_k_keeps_k_rows_and_sums_the_rest_as_other():
    rows = [
        ProfileOp(
            op=f"op{i}",
            calls=1,
            self_cuda_memory_bytes=i,
            self_cuda_time_us=float(i),
            cuda_time_us=0.0,
            cpu_time_us=0.0,
        )
        for i in range(15)
    ]
    out = top_k(rows, "self_cuda_memory_bytes", k=10)
    assert [r["op"] for r in out[:3]] == ["op14", "op13", "op12"]
    assert out[-1]["op"] == "other" and out[-1]["self_cuda_memory_bytes"] == sum(range(5)) and len(out) == 11


def test_the_start_step_is_ahead_of_the_fastest_rank():
    assert plan_start_step([100, 98], [0.01, 0.01]) == 100 + 200  # 2 s of steps ahead
    assert plan_start_step([7], []) == 10  # no step time known yet: 3 steps
    assert plan_start_step([], []) == 0
    # the lead is counted in the fastest rank's steps, whichever rank is furthest
    assert plan_start_step([100, 100], [0.01, 0.04]) == 100 + 200
    # a snapshot 1 s old of a rank at 0.01 s a step: it is 100 steps further by now
    assert plan_start_step([100, 100], [0.01, 0.04], ages=[1.0, 0.0]) == 200 + 200


@pytest.mark.parametrize("cuda_time", [False, True])
def test_scheduled_profiles_start_by_themselves_memory_only_unless_asked(spool, cuda_time):
    cuda = FakeCuda()
    settings = Settings().replace(spool_dir=spool, termination_message_path="", profile_every_seconds=0.001)
    if cuda_time:
        settings = Settings.from_env({"OOMSIGHT_DIR": spool, "OOMSIGHT_PROFILE_SCHEDULED_CUDA_TIME": "1"})
        settings = settings.replace(termination_message_path="", profile_every_seconds=0.001)
    hook = Hook(settings, cuda, None, torch)
    hook.profiler._last_scheduled = 0
    hook.profiler.poll(spool)
    assert isinstance(hook.profiler.plan, ProfileRequest) and hook.profiler.plan.id.startswith("scheduled-")
    assert hook.profiler.plan.cuda_time is cuda_time


@pytest.mark.parametrize("cuda_time", [False, True])
def test_scheduled_windows_with_cuda_time_warn_of_the_slowdown_at_start(spool, caplog, cuda_time):
    settings = Settings().replace(spool_dir=spool, termination_message_path="", profile_every_seconds=600.0)
    hook = Hook(settings.replace(profile_scheduled_cuda_time=cuda_time), FakeCuda(), None, torch)
    with caplog.at_level("WARNING", logger="oomsight.hook.runtime"):
        hook.start()
    hook.stop()
    warned = [r.getMessage() for r in caplog.records if "trace CUDA time" in r.getMessage()]
    assert len(warned) == int(cuda_time) and all("+10 % to +26 %" in w for w in warned)


class Recording:
    """Stands in for torch.profiler and torch.autograd.profiler_legacy: records what a window opened."""

    ProfilerActivity = types.SimpleNamespace(CPU="cpu", CUDA="cuda")

    def __init__(self, seen, name):
        self.seen, self.name = seen, name

    def profile(self, activities=None, **kw):
        self.seen.append((self.name, activities))
        return contextlib.nullcontext()


@pytest.mark.parametrize(
    ("cuda_time", "legacy", "opened"),
    [
        (True, True, ("kineto", ["cpu", "cuda"])),
        (False, True, ("legacy", None)),  # no Kineto at all, hence no CUPTI
        (False, False, ("kineto", ["cpu"])),  # a torch without the legacy profiler
    ],
)
def test_only_a_window_with_cuda_time_uses_kineto_with_cuda_activity(spool, cuda_time, legacy, opened):
    seen = []
    fake = types.SimpleNamespace(
        profiler=Recording(seen, "kineto"), cuda=types.SimpleNamespace(is_available=lambda: True)
    )
    if legacy:
        fake.autograd = types.SimpleNamespace(profiler_legacy=Recording(seen, "legacy"))
    process = {"id": "p", "started_at": 0.0}
    prof = Profiler(fake, SpoolWriter(spool, "p"), process, ErrorBook())
    prof.plan = ProfileRequest("w", 2, 0, time.time(), cuda_time)
    prof.on_step(1)
    assert prof.running is not None and seen == [opened]


def test_a_memory_only_window_reports_memory_and_no_cuda_time(hooked, spool):
    hook, step = hooked
    write_request(spool, "m1", steps=3, start_step=0, cuda_time=False)
    hook.sampler.publish()
    assert hook.profiler.plan is not None and hook.profiler.plan.cuda_time is False
    for _ in range(6):
        step()
    (doc,) = wait_profiles(spool)
    assert validate(doc) == "profile"
    assert doc["cuda_time"] is False and doc["top_by_time"] == [] and doc["top_by_memory"]
    assert {r["op"] for r in doc["top_by_memory"]} & {"aten::addmm", "other"}
    assert any(r["cpu_time_us"] > 0 for r in doc["top_by_memory"])
    art = os.path.join(spool, "artifacts")
    with open(os.path.join(art, doc["table_artifact"])) as fh:
        assert "Self CPU Mem" in fh.read()
    with gzip.open(os.path.join(art, doc["trace_artifact"])) as fh:
        events = json.load(fh)  # the Chrome trace's JSON-array form (Perfetto and chrome://tracing open it)
    assert any(e["name"] == "aten::addmm" and e["ph"] == "X" for e in events)


@pytest.mark.parametrize(
    ("extra", "parsed"),
    [({}, True), ({"cuda_time": False}, False), ({"cuda_time": "no"}, None), ({"cuda_time": 0}, None)],
)
def test_a_request_without_cuda_time_means_a_full_window_and_a_wrong_one_is_ignored(extra, parsed):
    doc = {"kind": "profile_request", "id": "r-1", "steps": 3, "start_step": 0, "created_at": 1.0, **extra}
    req = parse_request(doc)
    assert (req.cuda_time if req else None) is parsed


def test_a_process_with_cupti_teardown_refuses_windows_and_says_so(spool, monkeypatch, caplog):
    monkeypatch.setenv("TEARDOWN_CUPTI", "1")
    hook = Hook(Settings().replace(spool_dir=spool, termination_message_path=""), FakeCuda(), None, torch)
    with caplog.at_level("WARNING", logger="oomsight.hook.runtime"):
        hook.start()
    assert [r.getMessage() for r in caplog.records if "no profiling windows" in r.getMessage()] == [
        f"oomsight: no profiling windows in this process: {unavailable_reason()}"
    ]
    try:
        hook.sampler.stop_thread()
        assert hook.sources["step_hook"] is True and hook.sources["profiler"] is False
        write_request(spool, "t1", steps=2, start_step=0)
        hook.sampler.publish()
        assert hook.profiler.plan is None and hook.profiler.running is None
        assert hook.errors.counts["profiler"] == 1  # counted, and logged once
        hook.sampler.publish()
        assert hook.errors.counts["profiler"] == 1  # the same request is not refused twice
    finally:
        hook.stop()


def test_cupti_teardown_set_after_start_still_refuses_the_next_request(hooked, spool, monkeypatch):
    hook, step = hooked
    monkeypatch.setenv("TEARDOWN_CUPTI", "1")
    write_request(spool, "late", steps=2, start_step=0)
    hook.sampler.publish()
    step()
    assert hook.profiler.plan is None and hook.profiler.running is None
    assert hook.errors.counts["profiler"] == 1


@pytest.mark.parametrize("value", [None, "0"])
def test_without_cupti_teardown_the_profiler_is_available(spool, monkeypatch, value):
    if value is None:
        monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    else:
        monkeypatch.setenv("TEARDOWN_CUPTI", value)
    assert unavailable_reason() is None
    hook = Hook(Settings().replace(spool_dir=spool, termination_message_path=""), FakeCuda(), None, torch)
    hook.start()
    try:
        assert hook.sources["profiler"] is True
    finally:
        hook.stop()
