"""``oomsight predict``'s inputs (issue 34, step 4): every bad input is one line on stderr and exit 2
within 10 s of the child's CPU time (never wall time: docs/testing.md), no traceback, run through the real
command; ``--module``'s contract by its example file; the head of each architecture; sliding windows in the
key/value cache figure."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from oomsight.predict import generation, hfmodel, inputs, job  # noqa: E402
from oomsight.tools import exitcode  # noqa: E402
from oomsight.tools import predict_command as command  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SMALL = (
    "llama:hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,num_key_value_heads=2,"
    "vocab_size=128,max_position_embeddings=256"
)
VIT = "vit:hidden_size=64,num_hidden_layers=2,num_attention_heads=4,image_size=32,patch_size=8"
GPT2_SMALL = "gpt2:n_embd=64,n_head=4,n_layer=2,n_positions=64,vocab_size=128"
MISTRAL = (
    "mistral:hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,num_key_value_heads=2,"
    "vocab_size=128,max_position_embeddings=256,sliding_window="
)
BAD_MODULE = """
import torch

def wrong_key():
    return {"build": lambda: torch.nn.Linear(4, 4), "batch": lambda n: torch.randn(n, 4), "optimiser": None}

def wrong_batch():
    return {"build": lambda: torch.nn.Linear(4, 4), "batch": lambda n, device, dtype: torch.randn(n, 4)}

def not_a_function():
    return {"build": lambda: torch.nn.Linear(4, 4), "batch": lambda n: torch.randn(n, 4), "optimizer": "adamw"}

def a_model_made():
    return {"build": torch.nn.Linear(4, 4), "batch": lambda n: torch.randn(n, 4)}
"""


def cli(*argv: str) -> tuple[subprocess.CompletedProcess, float]:
    """``python -m oomsight predict ARGV`` as a user runs it: the result and the CPU seconds it took (user and
    system, the child's own: docs/testing.md, no wall-clock deadline on a shared machine)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "exporter")}
    return _cpu_timed([sys.executable, "-m", "oomsight", "predict", *argv], env)


def _cpu_timed(cmd: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return done, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


REFUSED = [
    ("heads", ["--model", "llama:hidden_size=100,num_attention_heads=3"],
     "the hidden size 100 is not a multiple of the 3 attention heads"),
    ("kv-heads", ["--model", "llama:num_attention_heads=32,num_key_value_heads=5"],
     "the 32 attention heads are not a multiple of the 5 key/value heads"),
    ("not-a-number", ["--model", "llama:hidden_size=abc"], "hidden_size=abc must be a whole number"),
    ("negative-layers", ["--model", "llama:num_hidden_layers=-2"], "num_hidden_layers=-2 must be at least 1"),
    ("misspelt-key", ["--model", "llama:hiden_size=64"], "no setting named 'hiden_size' (did you mean hidden_size?)"),
    ("seq-past-positions", ["--model", SMALL, "--seq-len", "1000"], "--seq-len 1,000 is past the 256 positions"),
    ("seq-absurd", ["--model", SMALL, "--seq-len", "10000000"], "past the 1,048,576 tokens per sample"),
    ("generate-too-long", ["--model", SMALL, "--generate", "16:100000"], "at most 2,048 new tokens"),
    ("generate-past-learned-positions", ["--model", GPT2_SMALL, "--generate", "60:10"],
     "70 tokens, past the 64 positions"),
    ("capacity-without-unit", ["--model", "gpt2", "--capacity", "40"], "'40' has no unit: write 40GB"),
    ("capacity-negative", ["--model", "gpt2", "--capacity", "-5GiB"], "--capacity: '-5GiB' is negative"),
    ("flag-without-value", ["--model", "gpt2", "--capacity"], "argument --capacity: expected one argument"),
    ("model-misspelt", ["--model", "lama"], "no model of that name (did you mean llama?"),
    ("model-hub-id-not-cached", ["--model", "no-such-org/no-such-model"],
     "not in the local Hugging Face cache, and predict downloads nothing"),
    ("model-path-missing", ["--model", "./no/such/config.json"], "no such file or folder"),
    ("lora-target-missing", ["--model", SMALL, "--lora", "8:nonexistent"], "the model has no module named nonexistent"),
    ("lora-target-misspelt", ["--model", SMALL, "--lora", "8:q_prj"], "did you mean q_proj?"),
    ("lora-target-a-norm", ["--model", SMALL, "--lora", "8:input_layernorm"],
     "input_layernorm is a LlamaRMSNorm, not a layer LoRA adapts"),
    ("shard-size-alone", ["--model", SMALL, "--shard-size", "2"], "--shard-size (hybrid sharding) applies to"),
    ("cache-without-generate", ["--model", SMALL, "--cache", "static"], "--cache applies to --generate"),
    ("mixed-precision-with-ddp", ["--model", SMALL, "--world-size", "2", "--parallel", "ddp", "--mixed-precision",
                                  "bf16"], "--mixed-precision applies to --parallel fsdp2"),
    ("keep-outputs-with-generate", ["--model", SMALL, "--generate", "8:8", "--keep-outputs"],
     "--keep-outputs applies to a training step, not --generate"),
    ("seq-len-with-generate", ["--model", SMALL, "--generate", "8:8", "--seq-len", "64"],
     "--seq-len does not apply with --generate"),
    ("seq-len-with-an-image-model", ["--model", VIT, "--seq-len", "64"],
     "--seq-len does not apply to --model vit: it takes images, not tokens"),
    ("generate-with-an-image-model", ["--model", VIT, "--generate", "8:8"],
     "--generate applies to a model that generates tokens; --model vit takes images"),
    ("prepare-kbit-without-lora", ["--model", SMALL, "--quantize", "4bit", "--prepare-kbit"],
     "--prepare-kbit applies to a QLoRA job: --model, --quantize and --lora"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "said"), [pytest.param(a, s, id=i) for i, a, s in REFUSED])
def test_each_bad_input_is_one_line_and_exit_2_within_10_s_of_cpu(argv: list[str], said: str) -> None:
    done, seconds = cli(*argv)
    assert done.returncode == exitcode.USAGE, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("oomsight predict: "), done.stderr
    assert said in done.stderr
    assert seconds < 10, f"{seconds:.1f} s of CPU"


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("wrong_key", "returned 'optimiser' (did you mean optimizer?"),
        ("wrong_batch", "'batch' must take (n) or (n, device), not (n, device, dtype)"),
        ("not_a_function", "'optimizer' must be a function, not str"),
        ("a_model_made", "'build' must be a function that makes the model (lambda: Linear(...))"),
    ],
)
def test_a_module_that_breaks_the_contract_is_one_line_and_exit_2(tmp_path: Path, name: str, said: str) -> None:
    path = tmp_path / "bad_spec.py"
    path.write_text(BAD_MODULE)
    done, seconds = cli("--module", f"{path}:{name}")
    assert done.returncode == exitcode.USAGE and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
    assert seconds < 10


def test_the_module_example_in_the_docs_runs_with_its_batch_of_one_argument() -> None:
    docs = (ROOT / "docs" / "prediction.md").read_text()
    assert "oomsight predict --module examples/predict_module.py:spec" in docs
    done, _ = cli("--module", "examples/predict_module.py:spec", "--batch", "4", "--steps", "2", "--json")
    assert done.returncode == exitcode.OK, done.stderr
    p = json.loads(done.stdout)["prediction"]
    width, vocab = 256, 8000
    layer = 4 * width * width + 4 * width + 2 * 4 * width * width + 4 * width + width + 4 * width  # attn, ff, norms
    params = vocab * width + 4 * layer + width * vocab + vocab
    assert p["by_category_bytes"]["parameters"] == 4 * params  # fp32, as built
    assert p["by_category_bytes"]["optimizer_state"] == 8 * params  # the example's AdamW: two fp32 moments


def test_batch_takes_n_or_n_and_device() -> None:
    assert inputs.batch_of(lambda n: n, "f")(3, "cpu") == 3
    assert inputs.batch_of(lambda n, device: (n, device), "f")(3, "cpu") == (3, "cpu")
    assert inputs.batch_of(lambda n, device=None: (n, device), "f")(3, "cpu") == (3, "cpu")
    assert inputs.batch_of(lambda *a: a, "f")(3, "cpu") == (3, "cpu")
    with pytest.raises(inputs.InputError, match=r"must take \(n\) or \(n, device\)"):
        inputs.batch_of(lambda: 0, "f")


@pytest.mark.parametrize(
    "text",
    [
        "llama:rope_theta=500000",  # a legacy key transformers folds into rope_parameters
        "gpt2:hidden_size=64,num_attention_heads=4",  # GPT-2's attribute_map aliases
        "gemma2:hidden_size=64,num_attention_heads=4,num_key_value_heads=2,head_dim=32",
        "t5:d_model=64,d_kv=24,num_heads=3",  # T5 sizes its heads apart: no divisibility
        "mixtral:hidden_size=64,num_attention_heads=4,num_key_value_heads=2,num_local_experts=4",
    ],
)
def test_valid_configurations_are_accepted(text: str) -> None:
    assert hfmodel.load_config(text) is not None


def test_a_config_json_is_checked_but_may_carry_keys_of_its_own(tmp_path: Path) -> None:
    good = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "_name_or_path": "x", "foo": 1}
    (tmp_path / "config.json").write_text(json.dumps(good))
    assert hfmodel.load_config(str(tmp_path)).hidden_size == 64
    (tmp_path / "config.json").write_text(json.dumps({**good, "num_hidden_layers": -1}))
    with pytest.raises(inputs.InputError, match="num_hidden_layers=-1 must be at least 1"):
        hfmodel.load_config(str(tmp_path / "config.json"))


@pytest.mark.parametrize(
    ("text", "head"),
    [
        ("bert:hidden_size=64,num_attention_heads=2", "AutoModelForMaskedLM"),
        ("roberta:hidden_size=64,num_attention_heads=2", "AutoModelForMaskedLM"),
        ("t5:d_model=64", "AutoModelForSeq2SeqLM"),
        ("bart:d_model=64", "AutoModelForSeq2SeqLM"),
        ("llama:hidden_size=64,num_attention_heads=4", "AutoModelForCausalLM"),
        ("gpt2:n_embd=64,n_head=4", "AutoModelForCausalLM"),
        ("vit:hidden_size=64,num_attention_heads=2", "AutoModelForImageClassification"),
        ("deit:hidden_size=64,num_attention_heads=2", "AutoModelForImageClassification"),
        ("convnext:num_labels=10", "AutoModelForImageClassification"),
        ("clip:projection_dim=64", None),
    ],
)
def test_each_architecture_is_built_by_the_head_the_docs_name(text: str, head: str | None) -> None:
    config = hfmodel.load_config(text)
    assert hfmodel.head_of(config) == head
    if text.startswith("bert"):
        with torch.device("meta"):
            assert type(hfmodel.builder(config)()).__name__ == "BertForMaskedLM"  # not BertLMHeadModel
    if text.startswith("deit"):  # a head of several classes: transformers' first, not its error on None
        with torch.device("meta"):
            assert type(hfmodel.builder(config)()).__name__ == "DeiTForImageClassification"


def predict(capsys: Any, *argv: str) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    command.add(parser.add_subparsers())
    args = parser.parse_args(["predict", *argv, "--json"])
    assert args.handler(args) == exitcode.OK
    return dict(json.loads(capsys.readouterr().out))


def test_the_cache_figure_holds_a_sliding_window_as_transformers_caches_do(capsys: Any) -> None:
    config = hfmodel.load_config(MISTRAL + "16")
    per_token = 2 * 2 * 2 * 16 * 4  # keys and values, batch 2, 2 key/value heads, head size 16, fp32
    assert generation.cached_tokens(config, 48, "dynamic") == [15, 15]  # the last window - 1 tokens
    assert generation.cached_tokens(config, 48, "static") == [16, 16]
    assert generation.cache_bytes(config, 2, 48, 4) == 2 * 15 * per_token
    gemma = hfmodel.load_config("gemma2:hidden_size=64,num_attention_heads=4,num_key_value_heads=2,head_dim=16,"
                                "num_hidden_layers=4,sliding_window=16")  # fmt: skip
    assert generation.cached_tokens(gemma, 48) == [15, 48, 15, 48]  # its alternate layers by layer_types
    found = {}
    for window in ("16", "null"):
        out = predict(capsys, "--model", MISTRAL + window, "--generate", "8:40", "--batch", "2")
        found[window] = out
    assert found["16"]["generate"]["kv_cache_bytes_at_the_end"] == 2 * 15 * per_token
    assert found["null"]["generate"]["kv_cache_bytes_at_the_end"] == 2 * 48 * per_token
    temporaries = {w: f["prediction"]["by_category_bytes"]["temporaries"] for w, f in found.items()}
    assert temporaries["16"] < temporaries["null"]  # the traced cache is windowed too


def test_keep_outputs_holds_the_logits_of_a_hand_written_loop_through_the_next_forward(capsys: Any) -> None:
    """Without the flag the step is Trainer's, whose ``compute_loss`` returns the loss alone: the logits
    (not saved for the backward: the loss saved its own fp32 softmax) are freed before the backward. A
    hand-written loop's ``outputs`` holds them through the backward, the optimizer step and the next
    forward, so every moment of the step rises by the logits and nothing else."""
    wide = SMALL.replace("vocab_size=128", "vocab_size=8192")  # the logits large beside the rest
    argv = ("--model", wide, "--batch", "2", "--seq-len", "64", "--steps", "2")
    dropped = predict(capsys, *argv)["prediction"]
    kept = predict(capsys, *argv, "--keep-outputs")["prediction"]
    logits = 2 * 64 * 8192 * 4  # batch, tokens, vocabulary, fp32
    for moment in ("optimizer_peak_bytes", "forward_peak_bytes"):  # the previous step's logits, nothing else
        more = kept["moments"]["last_step"][moment] - dropped["moments"]["last_step"][moment]
        assert logits <= more <= logits + 16 * 1024, (moment, more)
    assert kept["step_peak_allocated_bytes"][0] - dropped["step_peak_allocated_bytes"][0] >= logits
    # the backward's peak (here the answer) holds this step's logits too
    assert logits <= kept["peak_allocated_bytes"] - dropped["peak_allocated_bytes"] <= logits + 16 * 1024


def test_a_wrong_model_name_is_refused_before_torch_is_imported_with_the_local_folder_named(tmp_path: Path) -> None:
    """Issue 50: a wrong name took 14-33 s (the transformers import) and gave no hint; now the name's form is
    checked first, and the line says that a local folder holding config.json works."""
    code = (
        "import argparse, sys\n"
        "from oomsight.tools import predict_command as command\n"
        "p = argparse.ArgumentParser(prog='oomsight'); command.add(p.add_subparsers())\n"
        "for name in ('lama', 'some-org/some-model', 'gone/config.json'):\n"
        "    a = p.parse_args(['predict', '--model', name]); assert a.handler(a) == 2\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "exporter"), "HF_HUB_CACHE": str(tmp_path)}
    done, seconds = _cpu_timed([sys.executable, "-c", code], env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]" and seconds < 3, f"{seconds:.1f} s of CPU"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 3 and all("a local folder holding config.json" in line for line in lines)


def test_a_hub_id_in_the_local_cache_is_read_from_its_snapshot(tmp_path: Path, monkeypatch: Any) -> None:
    folder = tmp_path / "models--org--tiny"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("abc123")
    snapshot = folder / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}  # fmt: skip
    (snapshot / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    found = job.model_found("org/tiny")
    assert found == str(snapshot / "config.json")
    assert hfmodel.load_config(found).hidden_size == 64
    with pytest.raises(inputs.InputError, match="not in the local Hugging Face cache"):
        job.model_found("org/other")


def test_the_names_checked_before_torch_are_the_named_models() -> None:
    from oomsight.predict import models

    assert set(inputs.NAMED_MODELS) == set(models.MODELS)
