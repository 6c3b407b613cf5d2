"""Memory CUDA kernels take from the caching allocator inside one ATen call.

A trace sees what an ATen call returns; a CUDA kernel may also allocate tensors of its
own through the caching allocator and free them before it returns — they count in
``max_memory_allocated`` when the call is where the peak falls. The fake (meta) kernels
allocate outputs only. ``private_bytes`` lists, for an ATen call and its arguments, the
sizes CUDA's implementation allocates and frees inside it, from its source
(``aten/src/ATen/native/transformers/cuda/attention_backward.cu``, torch 2.11):

* ``_scaled_dot_product_efficient_attention_backward`` calls ``_efficient_attention_backward``
  on the (batch, sequence, heads, dim) views of its arguments, which

  - copies the output's gradient where that view is not contiguous
    (``grad_out_.contiguous()``): the gradient of an attention output that the model
    permuted before its output projection (``nn.MultiheadAttention``, most decoders)
    arrives in the layout of that permute;
  - for fp32, computes the softmax's ``delta`` with tensor ops where the half-precision
    kernels compute it inside (``kKernelComputesDelta`` is ``kIsHalf && ...``):
    ``(grad_out.float() * out.float()).sum(-1).transpose(-2, -1).contiguous()``, a
    product of the output's size and two (batch, heads, queries) fp32 tensors.

The kernel's own workspace (CUTLASS's ``workspace_size()``: accumulators for split keys)
depends on the template instance it dispatches to and is not modelled;
``benchmarks/predict_diff.py --kernels`` measures what these calls take on a GPU.
"""

from __future__ import annotations

from typing import Any

import torch

_aten = torch.ops.aten


def _nbytes(shape: Any, dtype: torch.dtype) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n * dtype.itemsize


def _efficient_backward(args: Any) -> list[int]:
    grad_out, query = args[0], args[1]
    sizes: list[int] = []
    if not grad_out.transpose(1, 2).is_contiguous():
        sizes.append(_nbytes(grad_out.shape, grad_out.dtype))
    if query.dtype == torch.float32:
        batch, heads, queries, dim_v = grad_out.shape
        sizes.append(_nbytes((batch, queries, heads, dim_v), torch.float32))  # the product
        sizes.append(_nbytes((batch, queries, heads), torch.float32))  # its sum over dim
        sizes.append(_nbytes((batch, heads, queries), torch.float32))  # delta, contiguous
    return sizes


_RULES = {_aten._scaled_dot_product_efficient_attention_backward.default: _efficient_backward}


def private_bytes(func: Any, args: Any) -> list[int]:
    """Sizes (bytes, in allocation order) CUDA's implementation of ``func`` allocates and
    frees inside the call; empty where it allocates only what it returns."""
    rule = _RULES.get(func)
    return rule(args) if rule is not None else []
