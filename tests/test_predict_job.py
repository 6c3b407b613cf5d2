"""``oomsight predict`` for the jobs people size (issue 28): a transformers configuration, --dtype,
--seq-len, LoRA (PEFT and without it), a quantized base, the 8-bit optimizer, --gpu. Each runs the
real tracer on a small Llama-shaped configuration (a second or two) and checks bytes that follow
from the model's shapes, not from the tracer."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from oomsight.predict import adapter, gpu, hfmodel, prose  # noqa: E402
from oomsight.tools import exitcode  # noqa: E402
from oomsight.tools import predict_command as command  # noqa: E402

SMALL = dict(
    hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=512, max_position_embeddings=256,
)  # fmt: skip
MODEL = "llama:" + ",".join(f"{k}={v}" for k, v in SMALL.items())


def predict(capsys: Any, *argv: str) -> tuple[int, Any]:
    """Run ``oomsight predict ARGV --json`` in this process: (exit code, the JSON or stderr)."""
    parser = argparse.ArgumentParser()
    command.add(parser.add_subparsers())
    args = parser.parse_args(["predict", *argv, "--json", "--steps", "2"])
    code = args.handler(args)
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == exitcode.OK else err)


def llama(dtype: Any = torch.float32) -> Any:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL)).to(dtype)


def numel(model: Any, trained: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trained)


def test_a_model_type_with_overrides_predicts_its_exact_parameters_in_the_asked_dtype(capsys: Any) -> None:
    with torch.device("meta"):
        n = numel(llama())
    code, fp32 = predict(capsys, "--model", MODEL, "--seq-len", "64", "--batch", "2")
    assert code == exitcode.OK
    assert fp32["prediction"]["by_category_bytes"]["parameters"] == 4 * n
    assert fp32["prediction"]["seq_len"] == 64
    _, bf16 = predict(capsys, "--model", MODEL, "--seq-len", "64", "--batch", "2", "--dtype", "bf16")
    assert bf16["prediction"]["by_category_bytes"]["parameters"] == 2 * n
    assert bf16["prediction"]["peak_allocated_bytes"] < fp32["prediction"]["peak_allocated_bytes"]


def test_a_config_folder_and_its_config_json_predict_as_the_model_type_does(capsys: Any, tmp_path: Any) -> None:
    transformers.LlamaConfig(**SMALL).save_pretrained(tmp_path)
    found = [
        predict(capsys, "--model", m, "--seq-len", "32", "--batch", "1")[1]["prediction"]["peak_allocated_bytes"]
        for m in (str(tmp_path), str(tmp_path / "config.json"), MODEL)
    ]
    assert found[0] == found[1] == found[2]


def test_the_sequence_length_moves_the_activations(capsys: Any) -> None:
    short = predict(capsys, "--model", MODEL, "--seq-len", "32", "--batch", "2")[1]["prediction"]
    long = predict(capsys, "--model", MODEL, "--seq-len", "128", "--batch", "2")[1]["prediction"]
    assert long["by_category_bytes"]["activations"] > 3 * short["by_category_bytes"]["activations"]


def test_model_to_bfloat16_inside_the_users_build_is_traced(capsys: Any, tmp_path: Any) -> None:
    path = tmp_path / "bf16model.py"
    path.write_text(
        "import torch\n"
        "def build():\n"
        "    net = torch.nn.Sequential(torch.nn.Embedding(100, 64), torch.nn.Linear(64, 8))\n"
        "    return net.to(torch.bfloat16)\n"
        "def spec():\n"
        "    return {'build': build, 'batch': lambda n, device: torch.randint(0, 100, (n, 16), device=device)}\n"
    )
    code, found = predict(capsys, "--module", f"{path}:spec", "--batch", "4")
    assert code == exitcode.OK, found
    assert found["prediction"]["by_category_bytes"]["parameters"] == 2 * (100 * 64 + 64 * 8 + 8)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--model", "nosuchtype:hidden_size=4"], "unknown model type 'nosuchtype'"),
        (["--model", "llama:hidden_size"], "is not KEY=VALUE"),
        (["--model", "gpt2", "--seq-len", "64"], "--seq-len applies to a transformers configuration"),
        (["--model", MODEL, "--lora", "x"], "give RANK[:MODULE,...]"),
        (["--model", MODEL, "--gpu", "Z80"], "unknown GPU"),
        (["--model", MODEL, "--world-size", "2"], "needs --parallel"),
        (["--model", MODEL, "--parallel", "ddp", "--offload", "optimizer"], "DDP keeps everything"),
        (["--model", MODEL, "--world-size", "2", "--parallel", "fsdp2", "--offload", "optimizer"],
         "FSDP2 offloads parameters, gradients and optimizer state together"),
        (["--model", MODEL, "--parallel", "zero2", "--no-reshard"], "--no-reshard applies to fsdp"),
    ],
)
def test_bad_job_flags_get_one_line_and_exit_2(capsys: Any, argv: list[str], said: str) -> None:
    code, err = predict(capsys, *argv)
    assert code == exitcode.USAGE
    assert said in err and "Traceback" not in err


def test_a_missing_config_folder_is_named(capsys: Any, tmp_path: Any) -> None:
    code, err = predict(capsys, "--model", str(tmp_path))
    assert code == exitcode.USAGE and "has no config.json" in err


def test_bitsandbytes_storage_per_weight_is_half_a_byte_plus_its_absmax() -> None:
    n = 4096 * 4096
    assert sum(adapter.quantized_bytes(4096, 4096, "4bit").values()) == n // 2 + 4 * n // 64 + 64
    double = sum(adapter.quantized_bytes(4096, 4096, "4bit-double").values())
    assert double == n // 2 + 64 + n // 64 + 4 + 4 * math.ceil(n / 64 / 256) + 1024
    assert 0.515 < double / n < 0.517  # the reference's ~0.516 B/param
    assert sum(adapter.quantized_bytes(4096, 11008, "8bit").values()) == 4096 * 11008 + 4 * 4096


def lora_argv(*extra: str) -> list[str]:
    return ["--model", MODEL, "--seq-len", "32", "--batch", "2", "--dtype", "bf16", *extra]


def test_lora_trains_only_the_adapters_with_peft_and_without_it(capsys: Any, monkeypatch: Any) -> None:
    pytest.importorskip("peft")
    rank, hidden, layers = 8, SMALL["hidden_size"], SMALL["num_hidden_layers"]
    kv = hidden // SMALL["num_attention_heads"] * SMALL["num_key_value_heads"]
    adapters = layers * rank * ((hidden + hidden) + (hidden + kv))  # q_proj: in->r->out, v_proj: in->r->kv
    with_peft = predict(capsys, *lora_argv("--lora", f"{rank}:q_proj,v_proj"))[1]["prediction"]
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "peft" else object())
    without = predict(capsys, *lora_argv("--lora", f"{rank}:q_proj,v_proj"))[1]["prediction"]
    for found in (with_peft, without):  # fp32 adapters (PEFT's autocast_adapter_dtype), AdamW: 2 fp32 states
        assert found["by_category_bytes"]["optimizer_state"] == 2 * 4 * adapters
    assert with_peft["peak_allocated_bytes"] == without["peak_allocated_bytes"]


def test_a_quantized_base_holds_bitsandbytes_bytes_and_its_head_unquantized(capsys: Any) -> None:
    with torch.device("meta"):
        model = llama(dtype=torch.bfloat16)
    linears = [m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    quantized = sum(sum(adapter.quantized_bytes(m.out_features, m.in_features, "4bit").values()) for m in linears)
    rest = 2 * (numel(model) - sum(m.weight.numel() for m in linears))
    for mode, expected in (("4bit", quantized), ("8bit", None)):
        found = predict(capsys, *lora_argv("--quantize", mode, "--lora", "4"))[1]["prediction"]
        params = found["by_category_bytes"]["parameters"]
        hidden = SMALL["hidden_size"]
        lora = SMALL["num_hidden_layers"] * 4 * 4 * (2 * hidden + hidden + hidden // 2)  # fp32 A and B of q, v
        if expected is not None:
            assert params == expected + rest + lora
        else:
            assert params == sum(m.weight.numel() + 4 * m.out_features for m in linears) + rest + lora


def test_the_8bit_optimizer_keeps_a_byte_per_state_and_an_absmax_per_256(capsys: Any) -> None:
    found = predict(capsys, *lora_argv("--optimizer", "adamw8bit"))[1]["prediction"]
    with torch.device("meta"):
        sizes = [p.numel() for p in llama().parameters()]
    eight = sum(2 * n + 2 * 4 * math.ceil(n / 256) for n in sizes if n >= adapter.OPTIM_MIN_8BIT)
    small = sum(2 * 4 * n for n in sizes if n < adapter.OPTIM_MIN_8BIT)
    assert found["by_category_bytes"]["optimizer_state"] == eight + small + 2 * 256 * 4


def test_gpu_gives_capacity_less_context_and_nccl_and_its_capability_s_workspace(capsys: Any) -> None:
    small = ["--model", MODEL, "--seq-len", "32", "--batch", "1", "--parallel", "fsdp2"]
    found = predict(capsys, *small, "--gpu", "l4", "--world-size", "2")[1]
    l4 = gpu.get("L4")
    assert found["gpu"]["capability"] == [8, 9]
    assert found["gpu"]["usable_bytes"] == l4.total_bytes - gpu.CUDA_CONTEXT_BYTES - gpu.NCCL_BYTES_2
    assert found["parallel"]["usable_bytes"] == int(found["gpu"]["usable_bytes"] * 0.9)  # --margin 0.10
    assert found["prediction"]["workspace_bytes"] == 4096 * 1024 * 2 + 16 * 1024 * 8  # not sm90's 32 MiB
    h200 = predict(capsys, *small, "--gpu", "H200", "--world-size", "8")[1]
    assert h200["prediction"]["workspace_bytes"] == 32 * 1024 * 1024
    assert h200["gpu"]["outside_allocator_bytes"]["nccl"] == gpu.NCCL_BYTES_MORE


def test_seq_len_defaults_to_1024_capped_by_the_model_s_positions() -> None:
    assert hfmodel.seq_len_of(transformers.LlamaConfig(**SMALL), None) == 256
    assert hfmodel.seq_len_of(transformers.GPT2Config(), None) == 1024
    assert hfmodel.seq_len_of(transformers.GPT2Config(), 77) == 77


def test_the_attention_kernel_follows_the_gpu_s_capability(capsys: Any) -> None:
    from oomsight.predict import emulation

    q = torch.empty(2, 4, 16, 64, dtype=torch.bfloat16)
    assert emulation.sdpa_backend(q, None, 0.0, capability=(9, 0)) == "cudnn"
    assert emulation.sdpa_backend(q, None, 0.0, gqa=True, capability=(8, 0)) == "flash"
    assert emulation.sdpa_backend(q, torch.zeros(16, 16), 0.0, capability=(8, 9)) == "efficient"
    assert emulation.sdpa_backend(q.float(), None, 0.0, capability=(8, 0)) == "efficient"
    assert emulation.sdpa_backend(q, None, 0.0, capability=(7, 0)) == "math"
    argv = ["--model", MODEL, "--seq-len", "128", "--batch", "2", "--autocast", "bf16", "--parallel", "ddp"]
    peaks = {g: predict(capsys, *argv, "--gpu", g)[1]["prediction"] for g in ("H100", "A100-80GB", "V100-32GB")}
    workspace = {g: p["workspace_bytes"] for g, p in peaks.items()}
    rest = {g: p["peak_allocated_bytes"] - p["by_category_bytes"]["workspace"] for g, p in peaks.items()}
    assert workspace["A100-80GB"] == workspace["V100-32GB"] < workspace["H100"]
    assert rest["V100-32GB"] > rest["A100-80GB"]  # the math composite keeps the score matrix


def test_generate_holds_the_key_value_cache_and_a_dynamic_one_grows_with_new_tokens(capsys: Any) -> None:
    from oomsight.predict import generation

    argv = ["--model", MODEL, "--batch", "2", "--dtype", "bf16"]
    found = {
        (cache, new): predict(capsys, *argv, "--generate", f"8:{new}", "--cache", cache)[1]
        for cache in ("dynamic", "static") for new in (30, 60)
    }  # fmt: skip
    cache = generation.cache_bytes(transformers.LlamaConfig(**SMALL), 2, 8 + 60, 2)
    assert found[("dynamic", 60)]["generate"]["kv_cache_bytes_at_the_end"] == cache == 2 * 2 * 2 * 2 * 68 * 32 * 2
    for kind in ("dynamic", "static"):
        p = found[(kind, 60)]["prediction"]
        assert p["by_category_bytes"]["gradients"] == p["by_category_bytes"]["optimizer_state"] == 0
        assert p["by_category_bytes"]["temporaries"] >= cache - generation.cache_bytes(
            transformers.LlamaConfig(**SMALL), 2, 1, 2
        )
    dyn = [found[("dynamic", n)]["prediction"]["peak_allocated_bytes"] for n in (30, 60)]
    assert dyn[1] > dyn[0]
    _, sized = predict(capsys, *argv, "--generate", "8:4", "--capacity", "1GiB")
    assert "largest_batch" not in sized  # a try is a whole decode loop: searched only when asked


def test_generate_refuses_what_it_cannot_do(capsys: Any) -> None:
    assert "PROMPT:NEW" in predict(capsys, "--model", MODEL, "--generate", "64")[1]
    assert "--generate takes neither" in predict(capsys, "--model", MODEL, "--generate", "8:8", "--lora", "4")[1]
    assert "needs a transformers configuration" in predict(capsys, "--model", "gpt2", "--generate", "8:8")[1]


def test_the_prose_names_the_cache_the_gpu_and_the_per_rank_peak(capsys: Any) -> None:
    _, gen = predict(capsys, "--model", MODEL, "--batch", "2", "--generate", "16:8")
    assert "generating 8 tokens after a 16-token prompt, dynamic cache" in "\n".join(prose.job_lines(gen))
    argv = ["--model", MODEL, "--seq-len", "32", "--batch", "1", "--world-size", "4", "--parallel", "zero3"]
    _, par = predict(capsys, *argv, "--gpu", "H100", "--gpus-needed")
    text = "\n".join(prose.job_lines(par))
    assert "H100: " in text and "compute capability 9.0" in text
    assert "zero3 over 4 ranks: peak allocated per rank" in text and "GPUs needed: 1" in text


def test_quantize_without_lora_still_stores_every_linear_but_the_head_quantized(capsys: Any) -> None:
    with torch.device("meta"):
        model = llama(torch.bfloat16)
    linears = [m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    stored = sum(sum(adapter.quantized_bytes(m.out_features, m.in_features, "8bit").values()) for m in linears)
    rest = 2 * (numel(model) - sum(m.weight.numel() for m in linears))
    found = predict(capsys, *lora_argv("--quantize", "8bit"))[1]["prediction"]
    assert found["by_category_bytes"]["parameters"] == stored + rest


@pytest.mark.parametrize(
    ("text", "cls"),
    [
        ("t5:d_model=128,d_ff=256,num_layers=2,num_heads=4,vocab_size=512", "T5ForConditionalGeneration"),
        ("bert:hidden_size=64,num_hidden_layers=2,num_attention_heads=2,intermediate_size=128,vocab_size=512",
         "BertForMaskedLM"),
    ],
)  # fmt: skip
def test_seq2seq_and_masked_lm_configurations_are_built_by_their_head(capsys: Any, text: str, cls: str) -> None:
    config = hfmodel.load_config(text)
    with torch.device("meta"):
        model = getattr(transformers, cls)(config)
    code, found = predict(capsys, "--model", text, "--seq-len", "32", "--batch", "2")
    assert code == exitcode.OK, found
    assert found["prediction"]["by_category_bytes"]["parameters"] == 4 * sum(
        p.numel() for p in {id(p): p for p in model.parameters()}.values()
    )


def test_largest_batch_per_rank_is_searched_when_asked_and_fits_the_budget(capsys: Any) -> None:
    argv = ["--model", MODEL, "--seq-len", "32", "--batch", "4", "--world-size", "4", "--parallel", "fsdp2"]
    _, plain = predict(capsys, *argv, "--capacity", "1GiB")
    assert "largest_batch_per_rank" not in plain
    _, found = predict(capsys, *argv, "--capacity", "1GiB", "--largest-batch")
    search = found["largest_batch_per_rank"]
    assert search["budget_bytes"] == int((1 << 30) * 0.9)
    fitting = [b for b, ok in search["tried"] if ok]
    assert search["max_batch_size"] == max(fitting) and [search["max_batch_size"] + 1, False] in search["tried"]
    code, err = predict(capsys, "--model", MODEL, "--largest-batch")
    assert code == exitcode.USAGE and "--largest-batch needs --gpu or --capacity" in err


def test_lora_on_gpt2_s_conv1d_matches_peft_without_it(capsys: Any, monkeypatch: Any) -> None:
    pytest.importorskip("peft")
    argv = ["--model", "gpt2:n_layer=2,n_embd=128,n_head=4,vocab_size=512,n_positions=128", "--seq-len", "32",
            "--batch", "2", "--lora", "4:c_attn"]  # fmt: skip
    with_peft = predict(capsys, *argv)[1]["prediction"]
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "peft" else object())
    without = predict(capsys, *argv)[1]["prediction"]
    adapters = 2 * 4 * (128 + 3 * 128)  # per layer: A 128 -> 4, B 4 -> 384
    assert with_peft["by_category_bytes"]["optimizer_state"] == without["by_category_bytes"]["optimizer_state"]
    assert without["by_category_bytes"]["optimizer_state"] == 2 * 4 * adapters


VIT = "vit:hidden_size=64,num_hidden_layers=2,num_attention_heads=4,intermediate_size=128,image_size=32,patch_size=8"
T5 = "t5:d_model=128,num_layers=2,num_heads=4,d_kv=32,d_ff=256,vocab_size=512"
CLIP = {
    "model_type": "clip", "projection_dim": 32,
    "text_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "vocab_size": 512, "max_position_embeddings": 40},
    "vision_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                      "image_size": 32, "patch_size": 8},
}  # fmt: skip


def weights_bytes(config: Any, itemsize: int) -> int:
    """Parameters, gradients and AdamW's two states of the model ``config`` builds: all alive in its step."""
    with torch.device("meta"):
        model = hfmodel.builder(config)()
    return 4 * itemsize * int(sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()))


def test_a_vision_configuration_is_an_image_classifier_fed_images_of_its_size(capsys: Any) -> None:
    config = hfmodel.load_config(VIT)
    assert hfmodel.inputs_of(config) == hfmodel.IMAGES
    with torch.device("meta"):
        assert type(hfmodel.builder(config)()).__name__ == "ViTForImageClassification"
    batch = hfmodel.image_inputs(config)(3, "cpu")
    assert batch["pixel_values"].shape == (3, 3, 32, 32) and batch["labels"].dtype == torch.int64
    assert int(batch["labels"].max()) < config.num_labels
    code, found = predict(capsys, "--model", VIT, "--batch", "4")
    assert code == exitcode.OK, found
    assert found["prediction"]["peak_allocated_bytes"] > weights_bytes(config, 4)
    assert "seq_len" not in found["prediction"]  # an image model has none


def test_a_dual_encoder_takes_images_and_tokens_and_returns_its_contrastive_loss(capsys: Any, tmp_path: Any) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CLIP))
    config = hfmodel.load_config(str(path))
    assert hfmodel.inputs_of(config) == hfmodel.IMAGES_AND_TEXT and hfmodel.head_of(config) is None
    batch = hfmodel.batch_of(config, 16)(2, "cpu")
    assert batch["pixel_values"].shape == (2, 3, 32, 32) and batch["input_ids"].shape == (2, 16)
    assert batch["return_loss"] is True and "labels" not in batch
    code, found = predict(capsys, "--model", str(path), "--batch", "4")
    assert code == exitcode.OK, found
    assert found["prediction"]["seq_len"] == 40  # the text encoder's positions
    assert found["prediction"]["peak_allocated_bytes"] > weights_bytes(config, 4)
    code, err = predict(capsys, "--model", str(path), "--seq-len", "41")
    assert code == exitcode.USAGE and "--seq-len 41 is past the 40 positions" in err


def test_t5_in_bf16_attends_by_the_memory_efficient_kernel_as_a_gpu_would(capsys: Any, monkeypatch: Any) -> None:
    from oomsight.predict import emulation

    chosen: list[tuple[str, bool]] = []
    plain = emulation.sdpa_backend

    def recorded(q: Any, mask: Any, *args: Any, **kwargs: Any) -> str:
        chosen.append((plain(q, mask, *args, **kwargs), mask is not None and mask.requires_grad))
        return chosen[-1][0]

    monkeypatch.setattr(emulation, "sdpa_backend", recorded)
    code, found = predict(capsys, "--model", T5, "--seq-len", "36", "--batch", "2", "--dtype", "bf16")
    assert code == exitcode.OK, found
    # the learned position bias requires grad, which cuDNN refuses, and T5 drops 0.1 of attention,
    # not a multiple of 1/16: memory-efficient takes both (FlashAttention-2 takes no bias)
    assert {kernel for kernel, _ in chosen} == {"efficient"} and any(grad for _, grad in chosen)
    assert found["prediction"]["peak_allocated_bytes"] > weights_bytes(hfmodel.load_config(T5), 2)


def test_cudnn_attention_is_refused_where_pytorch_s_rules_refuse_it() -> None:
    from oomsight.predict import emulation

    q = torch.empty(2, 4, 16, 64, dtype=torch.bfloat16)
    learned = torch.zeros(1, 4, 16, 16, requires_grad=True)
    assert emulation.sdpa_backend(q, torch.zeros(1, 4, 16, 16), 0.0, capability=(9, 0)) == "cudnn"
    assert emulation.sdpa_backend(q, learned, 0.0, capability=(9, 0)) == "efficient"
    assert emulation.sdpa_backend(q, torch.zeros(4, 16, 16), 0.0, capability=(9, 0)) == "efficient"  # 3-D
    assert emulation.sdpa_backend(q, None, 0.125, capability=(9, 0)) == "cudnn"  # 2/16
    assert emulation.sdpa_backend(q, None, 0.1, capability=(9, 0)) == "flash"
    assert emulation.sdpa_backend(q, learned, 0.0, gqa=True, capability=(9, 0)) == "math"
    assert emulation.sdpa_backend(q, learned, 0.0, capability=(8, 0)) == "efficient"


def test_the_memory_efficient_kernel_gets_its_bias_padded_to_8_as_pytorch_pads_it() -> None:
    from oomsight.predict import emulation

    q, k = torch.empty(2, 4, 36, 32), torch.empty(2, 4, 36, 32)
    bias = emulation._efficient_bias(torch.zeros(1, 4, 36, 36), q, k)
    assert bias is not None and bias.shape == (2, 4, 36, 36)
    assert bias.untyped_storage().nbytes() == 4 * 4 * 36 * 40  # 36 keys padded to 40: a copy
    aligned = torch.zeros(1, 4, 36, 40)
    assert emulation._efficient_bias(aligned, q, torch.empty(2, 4, 40, 32)).data_ptr() == aligned.data_ptr()
