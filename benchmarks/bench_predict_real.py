"""Issue 34, step 3: ``oomsight predict`` against the programs users run, not the predictor's own.

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/bench_predict_real.py --out $OUT/predict-real.json

``bench_predict_llm.py`` measures the predictor's own programs (its training step, its decode loop,
its 8-bit optimizer emulation): it shows the trace reproduces CUDA for the same operations. Here the
measuring child runs what a user runs, on ``cuda``, with random weights:

* ``generate``: transformers' ``model.generate()``, greedy, ``max_new_tokens`` from ``--generate``
  (the model built in its dtype on the GPU, as ``from_pretrained(dtype=...)`` leaves it; no EOS stop);
* ``trainer``: ``transformers.Trainer`` for ``max_steps`` steps (no saving, no evaluation, no logging,
  ``report_to=[]``; ``optim="adamw_torch"``, the foreach AdamW the predictor's ``--optimizer adamw`` is);
* ``accelerate``: the loop of transformers' ``run_clm_no_trainer.py`` example on an ``Accelerator``
  (``prepare``, ``accelerator.backward``, ``optimizer.step()``, ``zero_grad()``; the outputs held as there).

Each row is one ``oomsight predict`` command line; the prediction runs in a fresh process with the GPU
hidden, through the CLI (``--json``), concurrently with the measurements. The measurement, in a fresh
process per row, reads ``torch.cuda.max_memory_allocated/reserved()`` after a reset taken with the model
resident. Error = predicted / measured - 1, for both peaks. A row is ``real`` (in the summary's median),
``emulated`` (bitsandbytes not importable: the predictor's own 4-bit layers or 8-bit AdamW run inside the
same real Trainer, reported apart) or ``skipped`` (PEFT missing, a deadline: the reason in words).

``--device cpu`` runs every row's prediction and program at tiny sizes on the CPU without peaks: a
check of the code paths, not a measurement (``--in-process`` runs them in this process:
``tests/test_bench_predict_real.py``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import importlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # common.py beside it

LLAMA_1B = (  # Llama-3.2-1B's shape
    "llama:hidden_size=2048,intermediate_size=8192,num_hidden_layers=16,num_attention_heads=32,"
    "num_key_value_heads=8,vocab_size=128256,max_position_embeddings=8192,rope_theta=500000,tie_word_embeddings=true"
)
GPT2_MEDIUM = "gpt2:n_embd=1024,n_layer=24,n_head=16,n_positions=1024"  # gpt2-medium's shape, dropout 0.1
GPT2_SMALL = "gpt2:n_positions=1024"  # GPT-2 small (124M) as transformers' defaults make it, dropout 0.1
BERT = "bert"  # oomsight's named model: BERT-base, masked LM, 512 tokens, dropout 0 (models.py)
TINY = {
    "llama": "llama:hidden_size=128,intermediate_size=256,num_hidden_layers=2,num_attention_heads=4,"
    "num_key_value_heads=2,vocab_size=512,max_position_embeddings=256",
    "gpt2": "gpt2:n_embd=64,n_layer=2,n_head=2,vocab_size=512,n_positions=128",
    "bert": "bert:hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=2,vocab_size=512,"
    "max_position_embeddings=128,hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0",
}
"""The ``--device cpu`` stand-ins, by model family (``TYPE`` of ``TYPE:KEY=VALUE``; ``bert`` for the named one)."""


@dataclasses.dataclass(frozen=True)
class Row:
    """One job: the ``oomsight predict`` flags (``argv``) and the user program that runs it."""

    program: str  # generate | trainer | accelerate
    model: str  # TYPE:KEY=VALUE,... (transformers' AutoConfig.for_model), or "bert" (named)
    batch: int
    validates: str  # what the row checks, in words (docs/prediction.md's table)
    seq_len: int = 0  # tokens per training sample (0: the named model's own)
    dtype: str = ""  # "bf16": the parameters built in bf16 (else fp32)
    autocast: bool = False  # bf16 mixed precision: Trainer(bf16=True), Accelerator(mixed_precision="bf16")
    generate: str = ""  # PROMPT:NEW
    cache: str = "dynamic"  # generate's cache: dynamic | static
    lora: int = 0  # PEFT LoRA rank on q_proj, v_proj (alpha 2 x rank, no dropout)
    bnb: str = ""  # "adamw8bit" | "4bit": bitsandbytes' (emulated where it does not import)
    steps: int = 2  # optimizer steps (Trainer max_steps)
    prepare: bool = False  # PEFT's prepare_model_for_kbit_training before get_peft_model (as TRL calls it)


ROWS: dict[str, Row] = {
    "llama1b-generate-bf16-2048+256-b8": Row(
        "generate", LLAMA_1B, 8, "model.generate(), greedy, DynamicCache, Llama, bf16", dtype="bf16",
        generate="2048:256"),
    "llama1b-generate-static-bf16-1024+256-b8": Row(
        "generate", LLAMA_1B, 8, "model.generate(cache_implementation='static'), eager (disable_compile)",
        dtype="bf16", generate="1024:256", cache="static"),
    "gpt2medium-generate-fp32-512+256-b16": Row(
        "generate", GPT2_MEDIUM, 16, "model.generate() of GPT-2 (Conv1D, learned positions), fp32 attention kernels",
        generate="512:256"),
    "llama1b-trainer-bf16-s512-b4": Row(
        "trainer", LLAMA_1B, 4, "one Trainer run of 2 steps: Trainer's AdamW param groups, grad-norm clipping, "
        "its loss path (num_items_in_batch)", seq_len=512, dtype="bf16"),
    "bert-mlm-trainer-bf16-amp-b32": Row(
        "trainer", BERT, 32, "Trainer(bf16=True) on an fp32 BERT masked LM: accelerate's autocast and its "
        "outputs converted to fp32", autocast=True),
    "llama1b-lora16-trainer-bf16-s1024-b4": Row(
        "trainer", LLAMA_1B, 4, "Trainer on PEFT's get_peft_model (LoRA 16 on q_proj, v_proj): trainable-only "
        "optimizer", seq_len=1024, dtype="bf16", lora=16),
    "gpt2-accelerate-bf16-amp-s1024-b8": Row(
        "accelerate", GPT2_SMALL, 8, "an Accelerator(mixed_precision='bf16') loop as run_clm_no_trainer.py writes "
        "it: outputs held across steps, use_cache left on, dropout 0.1", seq_len=1024, autocast=True, steps=3),
    "llama1b-lora16-adamw8bit-trainer-bf16-s1024-b4": Row(
        "trainer", LLAMA_1B, 4, "bitsandbytes' AdamW8bit (Trainer optim='adamw_bnb_8bit') under LoRA", seq_len=1024,
        dtype="bf16", lora=16, bnb="adamw8bit"),
    "llama1b-qlora4bit-trainer-bf16-s1024-b4": Row(
        "trainer", LLAMA_1B, 4, "bitsandbytes' Linear4bit (NF4, bf16 compute) from from_pretrained, LoRA 16",
        seq_len=1024, dtype="bf16", lora=16, bnb="4bit"),
    "llama1b-qlora4bit-prepared-trainer-bf16-s1024-b4": Row(
        "trainer", LLAMA_1B, 4, "the same after PEFT's prepare_model_for_kbit_training (TRL's path): 16-bit "
        "parameters cast to fp32, checkpointing as transformers defaults it, input embeddings requiring grad",
        seq_len=1024, dtype="bf16", lora=16, bnb="4bit", prepare=True),
}  # fmt: skip


def tiny(row: Row) -> Row:
    """The row at ``--device cpu`` sizes: its family's tiny model, batch 2, 32 tokens, 16 + 8 generated."""
    family = row.model.partition(":")[0]
    return dataclasses.replace(
        row, model=TINY[family], batch=2, seq_len=0 if row.generate else 32, generate="16:8" if row.generate else ""
    )


def row_of(name: str, device: str) -> Row:
    return ROWS[name] if device == "cuda" else tiny(ROWS[name])


def predict_argv(row: Row) -> list[str]:
    """The ``oomsight predict`` flags of the job the row's program runs."""
    argv = ["--model", row.model, "--batch", str(row.batch)]
    if row.seq_len:
        argv += ["--seq-len", str(row.seq_len)]
    if row.dtype:
        argv += ["--dtype", row.dtype]
    if row.autocast:
        argv += ["--autocast", "bf16"]
    if row.generate:
        argv += ["--generate", row.generate, "--cache", row.cache]
    else:
        argv += ["--steps", str(row.steps)]
    if row.program == "accelerate":
        argv += ["--keep-outputs"]  # the loop's ``outputs`` lives until the next forward returns
    if row.lora:
        argv += ["--lora", str(row.lora)]
    if row.bnb == "adamw8bit":
        argv += ["--optimizer", "adamw8bit"]
    elif row.bnb == "4bit":
        argv += ["--quantize", "4bit"]
    if row.prepare:
        argv += ["--prepare-kbit"]
    return argv


def importable(name: str) -> bool:
    """Whether ``import name`` works here (bitsandbytes may be found and still fail to load)."""
    try:
        importlib.import_module(name)
    except Exception:
        return False
    return True


def label_of(row: Row) -> tuple[str, str]:
    """``(label, why)``: ``real``, ``emulated`` (no bitsandbytes) or ``skipped`` (no PEFT)."""
    if row.lora and not importable("peft"):
        return "skipped", "PEFT is not importable on this machine: no LoRA row can run"
    if row.bnb and not importable("bitsandbytes"):
        return "emulated", "bitsandbytes is not importable: the predictor's own emulation ran inside the real Trainer"
    return "real", ""


def predict(row: Row) -> dict[str, Any]:
    """``oomsight predict ARGV --json`` through the CLI's own entry point; its peaks and wall time."""
    from oomsight.tools import cli

    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["predict", *predict_argv(row), "--json"])
    if rc != 0:
        return {"error": f"exit {rc}: {err.getvalue().strip()[-600:]}"}
    found = json.loads(out.getvalue())["prediction"]
    keep = ("peak_allocated_bytes", "peak_reserved_bytes", "by_category_bytes", "seconds")
    return {**{k: found[k] for k in keep if k in found}, "wall_seconds": round(time.perf_counter() - started, 1)}


def _config(model: str) -> Any:
    """The transformers configuration a row names, read as a user would build it (not the predictor's reader)."""
    import transformers

    if model == "bert":  # oomsight's named BERT-base (models.py): transformers' defaults, dropout 0
        return transformers.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    kind, _, rest = model.partition(":")
    overrides = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        overrides[key] = json.loads(value)
    return transformers.AutoConfig.for_model(kind, **overrides)


def build(row: Row, device: str, label: str) -> Any:
    """The model on ``device`` as the user has it when the job starts: built in its dtype there, then
    PEFT's adapters; bitsandbytes' 4-bit base from ``from_pretrained``, or the predictor's emulation."""
    import torch
    import transformers

    if label == "emulated" and row.bnb == "4bit":  # the predictor's QuantLinear base (no Linear4bit here)
        return _emulated_build(row, device)
    config = _config(row.model)
    auto = transformers.AutoModelForMaskedLM if row.model.startswith("bert") else transformers.AutoModelForCausalLM
    dtype = torch.bfloat16 if row.dtype == "bf16" else torch.float32
    if row.bnb == "4bit":
        model = _bnb_4bit(auto, config, dtype, device)
        if row.prepare:
            import peft

            model = peft.prepare_model_for_kbit_training(model)
    else:
        with torch.device(device):
            model = auto.from_config(config, dtype=dtype)
    if row.lora:
        import peft

        targets = ["q_proj", "v_proj"]
        lora = peft.LoraConfig(r=row.lora, lora_alpha=2 * row.lora, lora_dropout=0.0, target_modules=targets)
        model = peft.get_peft_model(model, lora)
    return model


def _bnb_4bit(auto: Any, config: Any, dtype: Any, device: str) -> Any:
    """A random checkpoint saved and loaded back with ``BitsAndBytesConfig(load_in_4bit=True)``, NF4."""
    import torch
    import transformers

    quant = transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16
    )
    with tempfile.TemporaryDirectory() as folder:
        auto.from_config(config, dtype=dtype).save_pretrained(folder)
        return auto.from_pretrained(folder, quantization_config=quant, dtype=dtype, device_map={"": device})


def _emulated_build(row: Row, device: str) -> Any:
    """The predictor's own build of the flags (its ``QuantLinear`` base for ``--quantize``), on ``device``;
    the cached blocks of its fp32 build released (a ``from_pretrained(dtype=...)`` leaves none)."""
    import gc

    import torch
    from bench_predict_llm import _args

    from oomsight.predict.spec import spec_of

    with torch.device(device):
        model = spec_of(_args(predict_argv(row)))["build"]()
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return model


def _tokens(row: Row, model: Any, n: int) -> list[dict[str, Any]]:
    """``n`` samples of random token ids, their labels the same ids (what a causal LM collator makes)."""
    import torch

    ids = torch.randint(0, int(model.config.vocab_size), (n, row.seq_len or 512))
    return [{"input_ids": ids[i], "labels": ids[i].clone()} for i in range(n)]


def run_generate(row: Row, model: Any, device: str, label: str) -> dict[str, Any]:
    """``model.generate()``, greedy, every one of ``NEW`` tokens made (no EOS stop), a tokenizer's all-ones mask."""
    import copy

    import torch

    prompt, new = (int(x) for x in row.generate.split(":"))
    ids = torch.randint(0, int(model.config.vocab_size), (row.batch, prompt), device=device)
    config = copy.deepcopy(model.generation_config)
    config.update(max_new_tokens=new, min_new_tokens=None, do_sample=False, num_beams=1, eos_token_id=None)
    if row.cache == "static":  # eager: on a GPU generate() would compile the static-cache forward (CUDA graphs)
        config.update(cache_implementation="static", disable_compile=True)
    model.eval()
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return {"program": f"model.generate() greedy, {row.cache} cache", "generated_tokens": int(out.shape[1]) - prompt}


def run_trainer(row: Row, model: Any, device: str, label: str) -> dict[str, Any]:
    """``transformers.Trainer(...).train()`` for ``row.steps`` steps: no saving, evaluation or logging."""
    import transformers

    emulated_8bit = row.bnb == "adamw8bit" and label == "emulated"
    optim = "adamw_bnb_8bit" if row.bnb == "adamw8bit" and label == "real" else "adamw_torch"
    optimizers: tuple[Any, Any] = (None, None)
    if emulated_8bit:  # the predictor's AdamW8bit (its state tensors) as the Trainer's optimizer
        from oomsight.predict import adapter

        optimizers = (adapter.AdamW8bit([p for p in model.parameters() if p.requires_grad], lr=1e-4), None)
    with tempfile.TemporaryDirectory() as folder:
        args = transformers.TrainingArguments(
            output_dir=folder, max_steps=row.steps, per_device_train_batch_size=row.batch, learning_rate=1e-4,
            optim=optim, bf16=row.autocast, report_to=[], save_strategy="no", eval_strategy="no",
            logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0, use_cpu=device == "cpu", seed=0,
        )  # fmt: skip
        trainer = transformers.Trainer(
            model=model, args=args, train_dataset=_tokens(row, model, row.batch * row.steps), optimizers=optimizers
        )
        result = trainer.train()
    used = "oomsight's AdamW8bit emulation" if emulated_8bit else f"optim={optim}"
    return {"program": f"transformers.Trainer, max_steps={row.steps}, {used}, bf16={row.autocast}",
            "optimizer_steps": int(result.global_step)}  # fmt: skip


def run_accelerate(row: Row, model: Any, device: str, label: str) -> dict[str, Any]:
    """The training loop of transformers' ``examples/pytorch/language-modeling/run_clm_no_trainer.py``."""
    import torch
    import transformers
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # a fresh state (the in-process smoke ran Trainers)
    accelerator = Accelerator(mixed_precision="bf16" if row.autocast else "no", cpu=device == "cpu")
    no_decay = ("bias", "layer_norm.weight")  # the example's two parameter groups
    named = list(model.named_parameters())
    groups = [
        {"params": [p for n, p in named if not any(nd in n for nd in no_decay)], "weight_decay": 0.0},
        {"params": [p for n, p in named if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=1e-4)
    samples: Any = _tokens(row, model, row.batch * row.steps)  # a list of dicts serves as a map-style dataset
    loader: Any = torch.utils.data.DataLoader(
        samples, batch_size=row.batch, shuffle=True,
        collate_fn=transformers.default_data_collator,
    )  # fmt: skip
    scheduler = transformers.get_scheduler("linear", optimizer, num_warmup_steps=0, num_training_steps=row.steps)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    model.train()
    steps = 0
    for batch in loader:
        with accelerator.accumulate(model):
            outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        steps += 1
    return {"program": f"accelerate loop (run_clm_no_trainer.py), mixed_precision={accelerator.mixed_precision}",
            "optimizer_steps": steps}  # fmt: skip


PROGRAMS: dict[str, Callable[[Row, Any, str, str], dict[str, Any]]] = {
    "generate": run_generate,
    "trainer": run_trainer,
    "accelerate": run_accelerate,
}


def measure(row: Row, device: str) -> dict[str, Any]:
    """Build the row's model on ``device``, reset the peaks with it resident, run the user program, read them."""
    import torch

    label, why = label_of(row)
    if label == "skipped":
        return {"label": label, "why": why}
    torch.manual_seed(0)
    started = time.perf_counter()
    model = build(row, device, label)
    resident: dict[str, Any] = {}
    if device == "cuda":
        torch.cuda.synchronize()
        resident = {"allocated_at_reset_bytes": torch.cuda.memory_allocated(),
                    "reserved_at_reset_bytes": torch.cuda.memory_reserved()}  # fmt: skip
        torch.cuda.reset_peak_memory_stats()
    facts = PROGRAMS[row.program](row, model, device, label)
    peaks: dict[str, Any] = {"peak_allocated_bytes": None, "peak_reserved_bytes": None}
    if device == "cuda":
        torch.cuda.synchronize()
        peaks = {"peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                 "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
                 "gpu": torch.cuda.get_device_name(0)}  # fmt: skip
    seconds = round(time.perf_counter() - started, 1)
    return {**peaks, **resident, **facts, "label": label, "why": why, "seconds": seconds, "versions": versions()}


def versions() -> dict[str, str]:
    found = {}
    for name in ("torch", "transformers", "accelerate", "peft", "bitsandbytes"):
        with contextlib.suppress(Exception):
            found[name] = str(importlib.import_module(name).__version__)
    return found


def _child(what: str, name: str, device: str, timeout: float) -> dict[str, Any]:
    """``--predict NAME`` (the GPU hidden) or ``--measure NAME`` in a fresh process: its ``RESULT`` line."""
    from common import child_result

    env = dict(os.environ)
    if what == "predict":
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif device == "cuda":  # one GPU: with several visible, Trainer would wrap the model in DataParallel
        env["CUDA_VISIBLE_DEVICES"] = (env.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    cmd = [sys.executable, os.path.abspath(__file__), f"--{what}", name, "--device", device]
    return child_result(cmd, env, timeout, tail=1500)


def errors(row: dict[str, Any]) -> dict[str, Any]:
    """``error_allocated`` and ``error_reserved``: predicted / measured - 1, where both peaks are known."""
    found = {}
    for peak in ("allocated", "reserved"):
        p, m = row["predicted"].get(f"peak_{peak}_bytes"), row["measured"].get(f"peak_{peak}_bytes")
        if p and m:
            found[f"error_{peak}"] = p / m - 1.0
    return found


def summarize(rows: list[dict[str, Any]], device: str) -> dict[str, Any]:
    """Real rows and emulated rows apart (only real ones in the median); skipped and failed rows by name."""
    summary: dict[str, Any] = {}
    for label in ("real", "emulated"):
        chosen = [r for r in rows if r["label"] == label and "error_reserved" in r]
        part: dict[str, Any] = {"rows": len(chosen)}
        for peak in ("reserved", "allocated"):
            errs = [r[f"error_{peak}"] for r in chosen]
            if errs:
                part.update({f"median_error_{peak}": statistics.median(errs), f"min_error_{peak}": min(errs),
                             f"max_error_{peak}": max(errs),
                             f"median_abs_error_{peak}": statistics.median(abs(e) for e in errs)})  # fmt: skip
        summary[label] = part
    summary["skipped"] = {r["name"]: r["why"] for r in rows if r["label"] == "skipped"}
    summary["failed"] = {
        r["name"]: (r["measured"].get("error") or r["predicted"].get("error") or "no peak")[-300:]
        for r in rows
        if r["label"] != "skipped" and "error_reserved" not in r and device == "cuda"
    }
    real = summary["real"]
    if device == "cuda":  # issue 34's line: >= 4 real rows, reserved error <= 3 % median, none below -5 %
        summary["issue_34_met"] = bool(
            real["rows"] >= 4
            and real.get("median_abs_error_reserved", 1.0) <= 0.03
            and real.get("min_error_reserved", -1.0) >= -0.05
        )
    return summary


def _write(path: Optional[str], rows: list[dict[str, Any]], device: str) -> None:
    if not path:
        return
    doc = {"benchmark": "bench_predict_real", "device": device, "rows": rows, "summary": summarize(rows, device)}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="the JSON file to (re)write after each row")
    parser.add_argument("--only", default=None, help="comma-separated row names (default: all)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per child process")
    parser.add_argument("--jobs", type=int, default=6, help="predictions run at once (CPU processes, GPU hidden)")
    parser.add_argument("--deadline", type=float, default=None, help="seconds after which no measurement starts")
    parser.add_argument("--in-process", action="store_true", help="run predictions and programs in this process")
    parser.add_argument("--list", action="store_true", help="print each row's oomsight predict command and exit")
    parser.add_argument("--measured", default=None, metavar="FILE",
                        help="a GPU run's result: its measurements kept, every prediction made again here")  # fmt: skip
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--predict", default=None, help=argparse.SUPPRESS)
    return parser


def run_rows(names: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Predictions in a pool of children (or here), measurements one at a time; ``--out`` after each row."""
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    for name in names:
        row = row_of(name, args.device)
        label, why = label_of(row)
        rows.append({"name": name, "label": label, "why": why, "program": row.program, "validates": row.validates,
                     "command": ["oomsight", "predict", *predict_argv(row)],
                     "predicted": {}, "measured": {}})  # fmt: skip
    todo = [r for r in rows if r["label"] != "skipped"]
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1 if args.in_process else max(1, args.jobs))
    if args.in_process:  # here, one at a time (the CLI's output is taken by swapping sys.stdout: not in threads)
        for r in todo:
            r["predicted"] = predict(row_of(r["name"], args.device))
    pending = {r["name"]: pool.submit(_predicted, r["name"], args) for r in todo if not r["predicted"]}
    for r in todo:
        if args.deadline is not None and time.monotonic() - started > args.deadline:
            r.update(label="skipped", why=f"not measured: past --deadline {args.deadline:.0f} s")
            continue
        r["measured"] = _measured(r["name"], args)
        r.update({k: r["measured"][k] for k in ("label", "why") if k in r["measured"]})
        _collect(rows, pending)
        _write(args.out, rows, args.device)
        print(f"{r['name']}: {r['label']} {_brief(r)}", flush=True)
    concurrent.futures.wait(pending.values())
    pool.shutdown()
    _collect(rows, pending)
    return rows


def repredict(names: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rows of a GPU run (``--measured``) with their measurements as recorded and their predictions
    made again by this tree (the predictor's output is the same on any CPU): what a change to the
    predictor does to the errors, without the GPU. Rows the run did not measure stay as they were."""
    with open(args.measured, encoding="utf-8") as fh:
        recorded = {r["name"]: r for r in json.load(fh)["rows"]}
    args.device = "cuda"  # the rows' sizes as measured
    rows = []
    for name in names:
        r = dict(recorded.get(name) or {"name": name, "label": "skipped", "why": "not in --measured",
                                          "predicted": {}, "measured": {}})  # fmt: skip
        if r["measured"].get("peak_reserved_bytes"):
            row = row_of(name, "cuda")
            r.update(command=["oomsight", "predict", *predict_argv(row)], predicted=_predicted(name, args))
            r.pop("error_allocated", None), r.pop("error_reserved", None)
            r.update(errors(r))
            print(f"{name}: {r['label']} {_brief(r)}", flush=True)
        rows.append(r)
    return rows


def _predicted(name: str, args: argparse.Namespace) -> dict[str, Any]:
    return _child("predict", name, args.device, args.timeout)


def _measured(name: str, args: argparse.Namespace) -> dict[str, Any]:
    if args.in_process:
        return measure(row_of(name, args.device), args.device)
    return _child("measure", name, args.device, args.timeout)


def _collect(rows: list[dict[str, Any]], pending: dict[str, Any]) -> None:
    """The predictions finished so far into their rows, and the errors where both sides are in."""
    for r in rows:
        future = pending.get(r["name"])
        if future is not None and future.done() and not r["predicted"]:
            r["predicted"] = future.result()
        r.update(errors(r))


def _brief(row: dict[str, Any]) -> str:
    if "error_reserved" in row:
        return f"error allocated {row['error_allocated']:+.2%}, reserved {row['error_reserved']:+.2%}"
    return str(row["measured"].get("error") or row["why"] or "no peaks (cpu)")[:300]


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.measure or args.predict:
        row = row_of(args.measure or args.predict, args.device)
        found = measure(row, args.device) if args.measure else predict(row)
        print("RESULT " + json.dumps(found), flush=True)
        return 0
    names = args.only.split(",") if args.only else list(ROWS)
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        print(f"bench_predict_real: no row {', '.join(unknown)} (rows: {', '.join(ROWS)})", file=sys.stderr)
        return 2
    if args.list:
        for name in names:
            print(f"{name}: oomsight predict {' '.join(predict_argv(row_of(name, args.device)))}")
        return 0
    rows = repredict(names, args) if args.measured else run_rows(names, args)
    _write(args.out, rows, args.device)
    print(json.dumps(summarize(rows, args.device), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
