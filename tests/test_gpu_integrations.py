"""The framework callbacks on a real CUDA GPU (``pytest -m gpu``; skipped where CUDA is absent).

Each test runs a real fit in its own process (its own hook, its own spool): a Hugging Face
``Trainer`` on a tiny GPT-2 built from its config (nothing is downloaded) and a Lightning fit,
then one Lightning fit that runs out of memory for real. What the callback logged is checked
against the device and torch's own numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
PY = sys.executable
EXPORTER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "exporter")
CAPACITY = """
def capacity():
    import pynvml
    pynvml.nvmlInit()
    nvml = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())).total
    return max(nvml, torch.cuda.mem_get_info()[1], torch.cuda.get_device_properties(0).total_memory)
"""
FAST = "sample_interval_seconds=0.05, publish_interval_seconds=0.2"

HF = f"""
import json, time, torch, transformers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from oomsight.tools.integrations.hf import OomsightCallback, install
{CAPACITY}
class Spy(TrainerCallback):
    logs = []
    def on_log(self, args, state, control, logs=None, **kw):
        Spy.logs.append(dict(logs or {{}}, step=state.global_step))
    def on_step_end(self, args, state, control, **kw):
        time.sleep(0.05)  # the hook publishes every 0.2 s: several snapshots during the fit

model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=128, vocab_size=512, n_positions=64))
ids = torch.randint(0, 512, (512, 64))
data = [{{"input_ids": row, "labels": row}} for row in ids]
args = TrainingArguments(output_dir="out", max_steps=40, logging_steps=10, per_device_train_batch_size=16,
                         report_to=[], save_strategy="no", disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Spy()])
install(trainer, OomsightCallback({FAST}))
trainer.train()
print("RESULT", json.dumps({{"logs": Spy.logs, "max_allocated": torch.cuda.max_memory_allocated(),
       "total": capacity()}}))
"""

LIGHTNING = f"""
import json, sys, time, torch
import pytorch_lightning as pl
from oomsight.tools.integrations.lightning import OomsightCallback
{CAPACITY}
class Net(pl.LightningModule):
    def __init__(self, oom_at=None):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
        self.oom_at = oom_at
    def training_step(self, batch, i):
        if i == self.oom_at:
            torch.empty(1 << 40, dtype=torch.uint8, device="cuda")  # 1 TiB: a real CUDA OOM
        time.sleep(0.05)
        return self.net(batch[0]).pow(2).mean()
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters())
    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(2048, 1024)), batch_size=64)

class Rec(pl.loggers.Logger):
    name, version = "rec", 0
    def __init__(self):
        super().__init__()
        self.rows = []
    def log_hyperparams(self, *a, **k):
        pass
    def log_metrics(self, metrics, step=None):
        self.rows.append(dict(metrics, step=step))

def fit(model):
    rec = Rec()
    trainer = pl.Trainer(max_steps=30, log_every_n_steps=10, accelerator="gpu", devices=1, logger=rec,
                         callbacks=[OomsightCallback({FAST})], enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    try:
        trainer.fit(model)
    except torch.OutOfMemoryError:
        print("OOM raised to the script", flush=True)
    return [r for r in rec.rows if "oomsight/hook_running" in r]

rows = fit(Net())
oom_rows = fit(Net(oom_at=12))
print("RESULT", json.dumps({{"rows": rows, "oom_rows": oom_rows, "max_allocated": torch.cuda.max_memory_allocated(),
       "total": capacity()}}))
"""


def run_script(tmp_path, body):
    path = tmp_path / "fit.py"
    path.write_text(textwrap.dedent(body))
    # The script runs in tmp_path, so a relative PYTHONPATH (exporter:...) would not find the package.
    path_now = os.environ.get("PYTHONPATH", "")
    env = {
        **os.environ,
        "OOMSIGHT_DIR": str(tmp_path / "spool"),
        "PYTHONPATH": os.pathsep.join(filter(None, [EXPORTER, path_now])),
    }
    out = subprocess.run([PY, str(path)], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :]), out


def assert_memory_logged(row, result):
    gib = float(1 << 30)
    assert row["oomsight/hook_running"] == 1.0, row
    assert 0 < row["oomsight/peak_allocated_gib"] <= result["max_allocated"] / gib + 1e-9, row
    assert row["oomsight/peak_reserved_gib"] >= row["oomsight/peak_allocated_gib"], row
    # capacity as NVML and cudaMemGetInfo see it: headroom plus the window's peak fits in it
    assert 0 < row["oomsight/headroom_gib"] + row["oomsight/window_peak_reserved_gib"] <= result["total"] / gib, row
    assert 0 < row["oomsight/headroom_ratio"] < 1, row
    assert row["oomsight/leak_suspected"] == 0.0 and row["oomsight/oom_events"] == 0.0, row


def test_a_hf_trainer_on_cuda_logs_headroom_and_peaks(tmp_path):
    result, _ = run_script(tmp_path, HF)
    logs = [r for r in result["logs"] if "oomsight/hook_running" in r]
    assert [r["step"] for r in logs] == [10, 20, 30, 40, 40], logs  # every logging step and the summary
    for row in logs[1:]:  # the first log may come before the hook's first snapshot
        assert_memory_logged(row, result)
    print("HF", json.dumps(logs[-1]))  # shown with -rP


def test_a_lightning_fit_on_cuda_logs_headroom_and_peaks_and_the_cause_of_a_real_oom(tmp_path):
    result, out = run_script(tmp_path, LIGHTNING)
    rows = result["rows"]
    assert [r["step"] for r in rows] == [10, 20, 30, 30], rows  # the log steps, then the end of the fit
    for row in rows[1:]:
        assert_memory_logged(row, result)
    last = result["oom_rows"][-1]
    assert "OOM raised to the script" in out.stdout
    assert last["step"] == 12 and last["oomsight/oom_events"] == 1.0, last
    assert last["oomsight/last_oom_cause/oversized_request"] == 1.0, last
    assert "oomsight: CUDA out of memory on cuda:0 at step " in out.stderr and "oversized_request" in out.stderr
    print("LIGHTNING", json.dumps(rows[-1]), json.dumps(last))
