"""The framework callbacks on CPU: the values read off a spool (made by the real hook over
fakes), and a real Lightning fit and a real Hugging Face Trainer that log them."""

import json
import logging
import math
import os
import subprocess
import sys

import pytest
import torch

from oomsight.tools.integrations.reading import LogFeed, MemoryReader, Source
from oomsight.wire.spool import write_atomic

from fakes import GIB
from spoolmaker import hooked_process

EXPECTED = {
    "oomsight/hook_running": 1.0,
    "oomsight/leak_suspected": 0.0,
    "oomsight/peak_allocated_gib": 4.0,
    "oomsight/peak_reserved_gib": 5.0,
    "oomsight/window_peak_reserved_gib": 4.0,
    "oomsight/allocated_gib": 3.0,
    "oomsight/reserved_gib": 4.0,
    "oomsight/step_peak_allocated_gib": 4.0,
    "oomsight/headroom_gib": 135.0,  # 140 GiB - 4 GiB window peak - 1 GiB outside PyTorch (NVML)
    "oomsight/headroom_ratio": 135 / 140,
    "oomsight/oom_events": 0.0,
}


@pytest.fixture
def hooked(spool):
    hook, cuda = hooked_process(spool)  # no RANK/WORLD_SIZE in the environment: the trainers would go distributed
    return hook, cuda, MemoryReader(Source(spool, hook.process["id"]), interval_seconds=0.0)


def oom(cuda):
    """An oversized request, as the allocator's observer reports it (the event is written at once)."""
    cuda.observer(0, 100 * GIB, 140 * GIB, 2 * GIB)


def test_importing_oomsight_and_its_integrations_imports_no_framework():
    code = (
        "import sys, oomsight, oomsight.tools.integrations, oomsight.tools.integrations.reading\n"
        "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_the_reading_of_a_hooked_process_has_its_headroom_and_peaks(hooked):
    reading = hooked[2].read()
    assert reading.values == pytest.approx(EXPECTED) and set(reading.values) == set(EXPECTED)
    assert reading.last_oom is None


def test_an_oom_adds_its_count_and_cause_and_warns_once(hooked, caplog):
    _, cuda, reader = hooked
    oom(cuda)
    feed = LogFeed(reader)
    with caplog.at_level(logging.WARNING, logger="oomsight.tools.integrations.reading"):
        first, again = feed.values(), feed.values()
    assert first == again
    assert first["oomsight/oom_events"] == 1.0 and first["oomsight/last_oom_cause/oversized_request"] == 1.0
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith("oomsight: CUDA out of memory on cuda:0 at step 2 (pending): oversized_request: ")


def test_a_leak_finding_sets_the_leak_flag(hooked):
    hook, _, reader = hooked
    hook.leak = {"checked_at": 1.0, "step": 2, "graph_tensors": 3, "graph_bytes": GIB, "growth_bytes": GIB, "sites": []}
    hook.sampler.publish()
    assert reader.read().values["oomsight/leak_suspected"] == 1.0


def _add_to_device(spool, process_id, key, value):
    path = os.path.join(spool, "snapshots", f"{process_id}.json")
    with open(path) as fh:
        doc = json.load(fh)
    doc["devices"][0][key] = value
    write_atomic(path, json.dumps(doc).encode(), durable=False)


def test_a_leak_in_the_step_rows_is_logged_as_a_forecast_in_steps_and_seconds(hooked, spool):
    hook, _, reader = hooked
    mib = 1 << 20
    rows = [
        [i + 1, 100.0 + 0.1 * i, (1 << 30) + i * 128 * mib, (3 << 30) + i * 128 * mib, 4 << 30, 1.0] for i in range(20)
    ]
    _add_to_device(spool, hook.process["id"], "steps_memory", rows)
    values = reader.read().values
    assert abs(values["oomsight/forecast/floor_slope_bytes_per_step"] - 128 * mib) < mib
    assert values["oomsight/forecast/steps"] > 0
    assert abs(values["oomsight/forecast/seconds"] - 0.1 * values["oomsight/forecast/steps"]) < 0.05
    assert all(math.isfinite(v) for v in values.values())


def test_without_a_running_hook_only_hook_running_0_is_logged():
    assert MemoryReader(find=lambda: None).read().values == {"oomsight/hook_running": 0.0}


def test_the_spool_is_read_at_most_once_an_interval_unless_forced(hooked):
    _, cuda, _ = hooked
    now = [100.0]
    reader = MemoryReader(hooked[2].source, interval_seconds=5.0, clock=lambda: now[0])
    assert reader.read().values["oomsight/oom_events"] == 0.0
    oom(cuda)
    now[0] += 4.9
    assert reader.read().values["oomsight/oom_events"] == 0.0
    now[0] += 0.2
    assert reader.read().values["oomsight/oom_events"] == 1.0
    oom(cuda)
    assert reader.read(force=True).values["oomsight/oom_events"] == 2.0


def test_a_failing_read_is_counted_logged_once_and_never_raised(caplog):
    def broken():
        raise OSError("spool gone")

    reader = MemoryReader(find=broken, interval_seconds=0.0)
    with caplog.at_level(logging.WARNING):
        assert reader.read().values == reader.read().values == {"oomsight/hook_running": 0.0}
    assert reader.failures == 2 and len(caplog.records) == 1 and "spool gone" in caplog.records[0].getMessage()


# ---------------------------------------------------------------------------- real frameworks
pl = pytest.importorskip("pytorch_lightning")


class TinyLightning(pl.LightningModule):
    def __init__(self, fail_at=None, on_fail=None):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        self.fail_at, self.on_fail = fail_at, on_fail

    def training_step(self, batch, batch_idx):
        if batch_idx == self.fail_at:
            self.on_fail()
            raise RuntimeError("CUDA out of memory. Tried to allocate 100.00 GiB")
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
        return torch.utils.data.DataLoader(data, batch_size=4)


class RecordingLogger(pl.loggers.Logger):
    def __init__(self):
        super().__init__()
        self.rows = []

    name, version = "recording", 0

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))


def fit(callback, model=None, max_steps=4, rec=None):
    from oomsight.tools.integrations.lightning import OomsightCallback

    assert isinstance(callback, OomsightCallback)
    rec = rec if rec is not None else RecordingLogger()
    trainer = pl.Trainer(
        max_steps=max_steps,
        log_every_n_steps=2,
        callbacks=[callback],
        logger=rec,
        accelerator="cpu",
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model or TinyLightning())
    return [(step, row) for step, row in rec.rows if any(k.startswith("oomsight/") for k in row)]


def test_a_lightning_fit_logs_the_values_of_the_spool_every_log_step(hooked):
    from oomsight.tools.integrations.lightning import OomsightCallback

    rows = fit(OomsightCallback(reader=hooked[2]))
    assert [step for step, _ in rows] == [2, 4, 4]  # the log steps, then the end of the fit
    for _, row in rows:
        assert row == pytest.approx(EXPECTED)


CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="the hook would run here: test_gpu_integrations.py")


@CPU_ONLY
def test_a_lightning_fit_on_cpu_starts_the_hook_and_logs_that_it_has_no_device():
    from oomsight.tools.integrations.lightning import OomsightCallback

    cb = OomsightCallback()
    rows = fit(cb)
    assert cb.feed.hook_started is False  # no CUDA here: the hook says why and stays idle
    assert rows and all(row == {"oomsight/hook_running": 0.0} for _, row in rows)


def test_an_oom_that_ends_a_lightning_fit_is_logged_with_its_cause(hooked, caplog):
    from oomsight.tools.integrations.lightning import OomsightCallback

    _, cuda, reader = hooked
    rec = RecordingLogger()
    model = TinyLightning(fail_at=3, on_fail=lambda: oom(cuda))
    with caplog.at_level(logging.WARNING), pytest.raises(RuntimeError, match="CUDA out of memory"):
        fit(OomsightCallback(reader=reader), model, max_steps=8, rec=rec)
    step, last = rec.rows[-1]
    assert step == 3 and last["oomsight/oom_events"] == 1.0 and last["oomsight/last_oom_cause/oversized_request"] == 1.0
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("oomsight: CUDA out of memory")]
    assert len(said) == 1 and "oversized_request" in said[0]


transformers = pytest.importorskip("transformers")


class TinyHf(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def forward(self, x, labels=None):
        out = self.net(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


class Spy(transformers.TrainerCallback):
    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


def hf_trainer(tmp_path, callbacks):
    data = [{"x": torch.randn(4), "labels": torch.randn(1)} for _ in range(32)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=4,
        logging_steps=2,
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    return transformers.Trainer(model=TinyHf(), args=args, train_dataset=data, callbacks=callbacks)


def test_a_hf_trainer_logs_the_values_of_the_spool_and_keeps_them_in_its_history(hooked, tmp_path):
    from oomsight.tools.integrations.hf import OomsightCallback, install

    spy = Spy()
    trainer = hf_trainer(tmp_path, [spy])
    install(trainer, OomsightCallback(reader=hooked[2]))
    trainer.train()
    logged = [row for row in spy.logs if "oomsight/hook_running" in row]
    assert len(logged) == len(spy.logs) == 3  # steps 2 and 4, then the train summary
    for row in logged:
        assert {k: v for k, v in row.items() if k.startswith("oomsight/")} == pytest.approx(EXPECTED)
    history = [h for h in trainer.state.log_history if "oomsight/headroom_gib" in h]
    assert [h["step"] for h in history] == [2, 4, 4] and history[0]["oomsight/headroom_gib"] == 135.0


@CPU_ONLY
def test_a_hf_trainer_on_cpu_starts_the_hook_and_logs_that_it_has_no_device(tmp_path):
    from oomsight.tools.integrations.hf import OomsightCallback

    cb = OomsightCallback()
    trainer = hf_trainer(tmp_path, [cb])
    trainer.train()
    assert cb.feed.hook_started is False
    history = [h for h in trainer.state.log_history if "oomsight/hook_running" in h]
    assert len(history) == 3 and all(h["oomsight/hook_running"] == 0.0 for h in history)
    assert not [k for h in history for k in h if k.startswith("oomsight/") and k != "oomsight/hook_running"]


def test_a_callback_that_has_read_the_spool_can_be_pickled_for_spawned_workers(hooked):
    import pickle

    from oomsight.tools.integrations.lightning import OomsightCallback

    cb = OomsightCallback(reader=hooked[2])
    assert cb.feed.values() == pytest.approx(EXPECTED)
    again = pickle.loads(pickle.dumps(cb))
    assert type(again) is type(cb) and again.feed.values() == pytest.approx(EXPECTED)


def test_the_lightning_callback_for_a_package_that_is_not_installed_says_how_to_get_it():
    from oomsight.tools.integrations.lightning import callback_class

    with pytest.raises(ImportError, match=r"pip install 'oomsight\[lightning\]'"):
        callback_class("no_such_lightning")


def test_the_hf_callback_without_transformers_says_how_to_get_it():
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "try:\n    import oomsight.tools.integrations.hf\nexcept ImportError as exc:\n    print(exc)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "oomsight's Hugging Face callback needs transformers: pip install 'oomsight[hf]'"


def test_the_reader_follows_a_restarted_hook_to_its_new_process(hooked, tmp_path):
    hook = hooked[0]
    first = Source(hook.settings.spool.dir, hook.process["id"])
    again, _cuda = hooked_process(str(tmp_path / "again"), allocated=1 * GIB, reserved=2 * GIB)
    current = [first]
    reader = MemoryReader(find=lambda: current[0], interval_seconds=0.0)
    assert reader.read().values["oomsight/allocated_gib"] == 3.0
    current[0] = Source(again.settings.spool.dir, again.process["id"])
    assert reader.read().values["oomsight/allocated_gib"] == 1.0
