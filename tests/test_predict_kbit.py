"""``oomsight predict --prepare-kbit`` (issue 34, "recipes it cannot express"): a QLoRA job prepared with
PEFT's ``prepare_model_for_kbit_training``, as TRL prepares it. The model the flags build is compared with
the real PEFT function applied to the same quantized model, and the trace's parameter bytes with hand
arithmetic; bitsandbytes' 4-bit layer computes in its compute dtype and answers in the input's."""

from __future__ import annotations

import gc
import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from oomsight.predict import adapter  # noqa: E402
from oomsight.predict.job import job_from_args  # noqa: E402
from oomsight.predict.spec import spec_of  # noqa: E402
from oomsight.tools import cli  # noqa: E402
from oomsight.tools import predict_command as command  # noqa: E402

SMALL = (
    "llama:hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,num_key_value_heads=2,"
    "vocab_size=512,max_position_embeddings=256"
)
QLORA = ["--model", SMALL, "--dtype", "bf16", "--lora", "8", "--quantize", "4bit", "--batch", "2", "--seq-len", "64"]


@pytest.fixture(autouse=True)
def _collected() -> Any:
    """PEFT's models hold reference cycles (hooks, wrappers): collect them, so no later test's walk of
    live modules in this process finds them."""
    yield
    gc.collect()


def _args(*argv: str) -> Any:
    import argparse

    parser = argparse.ArgumentParser()
    command.add(parser.add_subparsers())
    return job_from_args(parser.parse_args(["predict", *argv]))


def _built(*argv: str) -> Any:
    torch.manual_seed(0)
    return spec_of(_args(*argv))["build"]()


def test_the_flag_leaves_the_model_as_peft_s_own_function_leaves_it() -> None:
    ours = _built(*QLORA, "--prepare-kbit")
    theirs = _built(*QLORA)
    theirs.base_model.model.is_loaded_in_4bit = True  # what from_pretrained(load_in_4bit) sets
    theirs = peft.prepare_model_for_kbit_training(theirs)  # freezes the adapters too: compare dtypes and layout
    assert {n: p.dtype for n, p in ours.named_parameters()} == {n: p.dtype for n, p in theirs.named_parameters()}
    assert any(p.dtype == torch.float32 and "norm" in n for n, p in ours.named_parameters())
    assert {n: p.dtype for n, p in ours.named_parameters() if "lora_" in n} == {
        n: torch.float32 for n, _ in ours.named_parameters() if "lora_" in n
    }
    flags = [(n, getattr(m, "gradient_checkpointing", None)) for n, m in ours.named_modules()]
    assert flags == [(n, getattr(m, "gradient_checkpointing", None)) for n, m in theirs.named_modules()]
    assert any(on is True for _, on in flags)
    ids = torch.zeros(1, 4, dtype=torch.long)
    assert ours.get_input_embeddings()(ids).requires_grad  # the hook PEFT's reentrant checkpointing needs
    assert theirs.get_input_embeddings()(ids).requires_grad


def test_the_trace_holds_the_16_bit_parameters_in_fp32(capsys: Any) -> None:
    plain = _built(*QLORA)
    cast = sum(p.numel() * 2 for n, p in plain.named_parameters()
               if p.dtype == torch.bfloat16 and "lora_" not in n)  # fmt: skip
    found = {}
    for extra in ([], ["--prepare-kbit"]):
        assert cli.main(["predict", *QLORA, "--steps", "2", "--json", *extra]) == 0
        found[bool(extra)] = json.loads(capsys.readouterr().out)["prediction"]["by_category_bytes"]["parameters"]
    assert cast > 0 and found[True] - found[False] == cast  # each bf16 byte pair became four bytes


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.seen.append((func.overloadpacket.__name__, getattr(out, "dtype", None)))
        return out


def test_a_4bit_layer_computes_in_its_dtype_and_answers_in_the_input_s() -> None:
    layer = adapter.QuantLinear(torch.nn.Linear(16, 8, dtype=torch.bfloat16), "4bit")
    with _Ops() as ops:
        out = layer(torch.randn(3, 16))  # fp32 input, as after the norms were cast to fp32
    assert out.dtype == torch.float32
    products = [dtype for name, dtype in ops.seen if name in ("mm", "addmm", "linear", "matmul")]
    assert products and set(products) == {torch.bfloat16}
    with _Ops() as ops:
        assert layer(torch.randn(3, 16, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert not [name for name, _ in ops.seen if name == "_to_copy"]  # the same dtype copies nothing
