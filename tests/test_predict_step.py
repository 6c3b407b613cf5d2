"""The predictor's default training step against the programs it stands for: accelerate's mixed
precision converts the forward's 16-bit outputs to fp32 (``convert_outputs_to_fp32``, which
``Trainer(bf16=True)`` and ``Accelerator(mixed_precision=...)`` apply), and ``tracing.outputs_in_fp32``
converts what accelerate's own ``convert_to_fp32`` converts, into the same container types."""

from __future__ import annotations

from collections import namedtuple

import pytest

torch = pytest.importorskip("torch")
accelerate_utils = pytest.importorskip("accelerate.utils")
modeling_outputs = pytest.importorskip("transformers.modeling_outputs")

from oomsight.predict import tracing  # noqa: E402

Pair = namedtuple("Pair", "first second")


def _outputs() -> list:
    half = torch.ones(2, 3, dtype=torch.bfloat16)
    return [
        half,
        torch.ones(2, dtype=torch.float16),
        torch.ones(2, dtype=torch.int64),
        modeling_outputs.CausalLMOutputWithPast(loss=torch.tensor(1.0), logits=half),
        {"loss": torch.tensor(1.0), "logits": half, "hidden": (half, torch.ones(1))},
        (half, [half, torch.ones(1, dtype=torch.float64)]),
        Pair(half, torch.ones(1)),
    ]


def _shape(x: object) -> object:
    """The container types and each tensor's dtype, nested as ``x`` is."""
    if isinstance(x, torch.Tensor):
        return x.dtype
    if isinstance(x, dict):
        return (type(x).__name__, {k: _shape(v) for k, v in x.items()})
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [_shape(v) for v in x])
    return type(x).__name__


@pytest.mark.parametrize("index", range(len(_outputs())))
def test_outputs_are_converted_as_accelerate_converts_them(index: int) -> None:
    ours = tracing.outputs_in_fp32(_outputs()[index])
    theirs = accelerate_utils.convert_to_fp32(_outputs()[index])
    assert _shape(ours) == _shape(theirs)
    assert "float16" not in str(_shape(ours))  # neither bfloat16 nor float16 is left


def test_a_16_bit_output_is_copied_and_an_fp32_one_is_kept_as_is() -> None:
    logits, loss = torch.ones(4, dtype=torch.bfloat16), torch.tensor(2.0)
    out = tracing.outputs_in_fp32({"logits": logits, "loss": loss})
    assert out["loss"] is loss
    assert out["logits"].dtype == torch.float32 and out["logits"].data_ptr() != logits.data_ptr()
