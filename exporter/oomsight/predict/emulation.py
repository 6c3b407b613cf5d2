"""What a CUDA device changes in a training step, applied to fake CPU tensors.

The trace runs on ``FakeTensorMode`` tensors of the CPU device: PyTorch's autograd engine
refuses fake CUDA tensors on a machine without a GPU (it asks the driver for each device's
streams), and a CPU-only build cannot even build their gradient nodes. Memory follows
from shapes and dtypes alone, so a CPU fake step allocates what the CUDA step allocates —
except where PyTorch picks a different path on CUDA. Those paths are emulated here:

* **autocast** — ``torch.autocast("cuda", dtype)`` in the user's step sets CUDA's autocast
  state (inside the trace it does so on a machine without a GPU too); ``autocast.py``
  then casts at the dispatcher, above autograd, by CUDA's op lists, caching the casts of
  leaf weights for the autocast region as PyTorch does;
* **scaled_dot_product_attention** — the fused CUDA kernel PyTorch would choose (cuDNN for
  fp16/bf16 where its filters take the mask and dropout, else FlashAttention-2 or
  memory-efficient; memory-efficient for fp32, math where neither applies, e.g. fp32
  grouped-query attention), called through its own ATen op with its inputs prepared as
  ``scaled_dot_product_attention`` prepares them (a bias padded for memory-efficient), so
  what is saved for backward is that kernel's (its log-sum-exp, not the attention matrix);
* **libraries that detect fake tensors** — ``transformers`` takes them for an export trace
  and builds explicit masks; inside the trace it is told that the step runs eagerly;
* **activation checkpointing** — recomputation re-enters the forward's CUDA autocast state
  (``torch.utils.checkpoint`` infers the device from non-CPU tensors, else its default);
* **optimizers** — CUDA's default ``foreach`` implementation (its list-wide temporaries)
  where the user left ``foreach`` unset.

Each rule names its source; ``tests/test_predict.py`` checks them on the CPU, and the GPU
verification (``benchmarks/bench_predict.py``) checks the outcome against real steps.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import importlib.util
import math
from collections.abc import Iterator
from typing import Any, Optional
from unittest import mock

import torch
import torch.utils.checkpoint as checkpoint

from oomsight.predict import autocast

FLASH_DTYPES = (torch.float16, torch.bfloat16)
FLASH_MAX_HEAD_DIM = 256


CAPABILITY: contextvars.ContextVar[tuple[int, int]] = contextvars.ContextVar("capability", default=(9, 0))
"""The compute capability the trace emulates (``predict_peak(capability=...)``, ``--gpu``)."""


def sdpa_backend(
    q: torch.Tensor, attn_mask: Optional[torch.Tensor], dropout_p: float, gqa: bool = False,
    capability: Optional[tuple[int, int]] = None,
) -> str:  # fmt: skip
    """The kernel PyTorch picks. On compute capability 9.0 and later as measured on the H200 with
    torch 2.11 (``benchmarks/results/predict.json``, "calibration"): cuDNN attention for fp16/bf16
    (with a mask and with fewer key/value heads too) where it takes the mask and the dropout
    (``cudnn_takes``), memory-efficient for fp32 (not with grouped-query attention), else the math
    composite. Where cuDNN refuses, PyTorch's next is FlashAttention-2, which takes no mask, then
    memory-efficient, which does (``select_sdp_backend`` in ``sdp_utils.cpp``). On 8.x (A100, L4,
    L40S; not measured by us) PyTorch's order is FlashAttention-2 first, which takes fp16/bf16
    without a mask, grouped-query attention included (the ``scaled_dot_product_attention``
    docstring: GQA "works only for Flash_attention and math"); memory-efficient takes a mask and
    fp32. Below 8.0 no flash."""
    cc = capability or CAPABILITY.get()
    if q.dim() != 4 or q.shape[-1] % 8 != 0:
        return "math"
    half = q.dtype in FLASH_DTYPES and q.shape[-1] <= FLASH_MAX_HEAD_DIM
    if cc >= (9, 0):
        if half and cudnn_takes(attn_mask, dropout_p):
            return "cudnn"
        if half and attn_mask is None:
            return "flash"
        return "efficient" if (half or q.dtype == torch.float32) and not gqa else "math"
    if half and cc >= (8, 0) and attn_mask is None:
        return "flash"
    if gqa or (q.dtype == torch.bfloat16 and cc < (8, 0)):
        return "math"
    return "efficient"


def cudnn_takes(attn_mask: Optional[torch.Tensor], dropout_p: float) -> bool:
    """Whether cuDNN attention takes this mask and dropout, by ``sdp_utils``' filters (torch's
    ``sdp_utils_cpp.h`` ``check_attn_mask_shape``, ``cuda/sdp_utils.cpp`` ``check_cudnn_dropout``):
    no mask that requires grad (cuDNN gives the bias no gradient: T5's learned position bias), a
    mask of 2 or 4 dimensions (each broadcast to its size or 1, which ``validate_sdpa_input``
    already demands), and a dropout probability that is a multiple of 1/16 (0.1 is not)."""
    if dropout_p * 16.0 != math.floor(dropout_p * 16.0):
        return False
    return attn_mask is None or (not attn_mask.requires_grad and attn_mask.dim() in (2, 4))


def cuda_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``scaled_dot_product_attention`` through the ATen op of the kernel CUDA would run."""
    gqa = enable_gqa and key.shape[-3] != query.shape[-3]
    backend = sdpa_backend(query, attn_mask, dropout_p, gqa)
    aten = torch.ops.aten
    grad = query.requires_grad or key.requires_grad or value.requires_grad
    if backend == "cudnn":
        out = aten._scaled_dot_product_cudnn_attention(
            query, key, value, _float_bias(attn_mask, query.dtype), grad, dropout_p, is_causal, False, scale=scale
        )
        return out[0]
    if backend == "flash":
        return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False, scale=scale)[0]
    if backend == "efficient":
        out = aten._scaled_dot_product_efficient_attention(
            query, key, value, _efficient_bias(attn_mask, query, key), grad, dropout_p, is_causal, scale=scale
        )
        return out[0]
    return aten._scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
    )[0]


def _float_bias(mask: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    """A boolean mask as the additive bias PyTorch makes of it (``convert_boolean_attn_mask``)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.where(mask.logical_not(), -math.inf, torch.zeros((), dtype=dtype))


def _efficient_bias(mask: Optional[torch.Tensor], query: torch.Tensor, key: torch.Tensor) -> Optional[torch.Tensor]:
    """The bias as ``scaled_dot_product_attention`` hands it to the memory-efficient kernel
    (``attention.cpp`` ``preprocess_mask``): where a stride but the last is not a multiple of 8
    elements, or the last is not 1, padded on its last dimension by ``8 - last % 8`` (a copy
    autograd keeps) and sliced back; then expanded to (batch, heads, queries, keys), a view."""
    bias = _float_bias(mask, query.dtype)
    if bias is None:
        return None
    if bias.stride(-1) != 1 or any(stride % 8 for stride in bias.stride()[:-1]):
        last = bias.shape[-1]
        bias = torch.nn.functional.pad(bias, (0, 8 - last % 8))[..., :last]
    return bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])


def _foreach_by_default(optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:
        if group.get("foreach", False) is None and not group.get("fused"):
            group["foreach"] = True


@contextlib.contextmanager
def cuda_like() -> Iterator[autocast.WeightCasts]:
    """Inside: CUDA autocast state can be set and is applied; SDPA and optimizers behave as on CUDA."""
    autocast_cls = torch.amp.autocast_mode.autocast
    plain_init = autocast_cls.__init__

    def init_on_cpu(self: Any, *args: Any, **kwargs: Any) -> None:
        # torch.autocast("cuda") turns itself off where no GPU is; the trace needs its state
        with (
            mock.patch.object(torch.cuda.amp.common, "amp_definitely_not_available", lambda: False),
            mock.patch.object(torch.cuda, "is_bf16_supported", lambda *a, **k: True),
        ):
            plain_init(self, *args, **kwargs)

    with contextlib.ExitStack() as stack:
        casts = stack.enter_context(autocast.dispatcher_autocast(cuda_sdpa))
        clear = torch.clear_autocast_cache

        def clear_both() -> None:
            casts.clear()
            clear()

        patches: list[Any] = [
            mock.patch.object(autocast_cls, "__init__", init_on_cpu),
            mock.patch.object(torch, "clear_autocast_cache", clear_both),
            # checkpointing takes its device from non-CPU tensors, else this default: "cuda"
            # makes recomputation re-enter the forward's CUDA autocast state
            mock.patch.object(checkpoint.DefaultDeviceType, "_default_device_type", "cuda"),
        ]
        for p in patches + _eager_libraries():
            stack.enter_context(p)
        yield casts


def _eager_libraries() -> list[Any]:
    """``transformers`` takes a FakeTensor for an export trace and then never skips its
    causal mask (``_ignore_causal_mask_sdpa``, ``find_packed_sequence_indices``), where the
    eager step passes ``is_causal`` and no mask. Its decisions are taken here as in eager
    mode; where they would read tensor values, a padding mask stays and position ids count
    as one sequence per row (packed sequences are not predicted)."""
    if importlib.util.find_spec("transformers") is None:
        return []
    masking = importlib.import_module("transformers.masking_utils")
    decide = getattr(masking, "_ignore_causal_mask_sdpa", None)
    if decide is None or not hasattr(masking, "is_tracing"):
        return []

    def eager_decision(*args: Any, **kwargs: Any) -> bool:
        with mock.patch.object(masking, "is_tracing", lambda *_a, **_k: False):
            try:
                return bool(decide(*args, **kwargs))
            except Exception:  # it needed the values of a fake tensor: keep the mask
                return False

    patches = [mock.patch.object(masking, "_ignore_causal_mask_sdpa", eager_decision)]
    packed = getattr(masking, "find_packed_sequence_indices", None)
    if packed is not None:

        def eager_packing(*args: Any, **kwargs: Any) -> Any:
            with mock.patch.object(masking, "is_tracing", lambda *_a, **_k: False):
                try:
                    return packed(*args, **kwargs)
                except Exception:  # position ids of unknown values: taken as one sequence per row
                    return None

        patches.append(mock.patch.object(masking, "find_packed_sequence_indices", eager_packing))
    return patches


def prepare_optimizer(optimizer: Any) -> None:
    """CUDA's default implementation for an optimizer built inside the trace."""
    if isinstance(optimizer, torch.optim.Optimizer):
        _foreach_by_default(optimizer)
