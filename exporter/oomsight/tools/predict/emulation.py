"""What a CUDA device changes in a training step, applied to fake CPU tensors.

The trace runs on ``FakeTensorMode`` tensors of the CPU device: PyTorch's autograd engine
refuses fake CUDA tensors on a machine without a GPU (it asks the driver for each device's
streams), and a CPU-only build cannot even build their gradient nodes. Memory follows
from shapes and dtypes alone, so a CPU fake step allocates what the CUDA step allocates —
except where PyTorch picks a different path on CUDA. Those paths are emulated here:

* **autocast** — ``torch.autocast("cuda", dtype)`` in the user's step sets CUDA's autocast
  state (inside the trace it does so on a machine without a GPU too);
  ``CudaAutocast`` then casts the arguments of each call by CUDA's published op lists
  (https://docs.pytorch.org/docs/stable/amp.html, "CUDA Op-Specific Behavior"), caching
  the casts of leaf weights for the autocast region as PyTorch does;
* **scaled_dot_product_attention** — the fused CUDA kernel PyTorch would choose (cuDNN for
  fp16/bf16, memory-efficient for fp32, math where neither applies, e.g. fp32 grouped-query
  attention), called through its own ATen op, so what is saved for backward is that
  kernel's (its log-sum-exp, not the attention matrix);
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
import importlib
import importlib.util
import math
from collections.abc import Iterator
from typing import Any, Callable, Optional
from unittest import mock

import torch
import torch.utils.checkpoint as checkpoint
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

# CUDA autocast op lists (docs, "CUDA Ops that can autocast to float16/float32", plus the
# ops the lists reach through: einsum and scaled_dot_product_attention run their matmuls in
# the lower precision too).
LOWER_PRECISION = frozenset(
    {
        "__matmul__", "__rmatmul__", "addbmm", "addmm", "addmv", "addr", "baddbmm", "bmm", "chain_matmul",
        "multi_dot", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
        "linear", "matmul", "mm", "mv", "prelu", "einsum", "lstm_cell", "gru_cell", "rnn_tanh_cell",
        "rnn_relu_cell", "scaled_dot_product_attention",
    }
)  # fmt: skip
FLOAT32 = frozenset(
    {
        "__pow__", "__rdiv__", "__rpow__", "__rtruediv__", "acos", "asin", "binary_cross_entropy_with_logits",
        "cosh", "cosine_embedding_loss", "cdist", "cosine_similarity", "cross_entropy", "cumprod", "cumsum",
        "dist", "erfinv", "exp", "expm1", "group_norm", "hinge_embedding_loss", "kl_div", "l1_loss",
        "layer_norm", "log", "log_softmax", "log10", "log1p", "log2", "margin_ranking_loss", "mse_loss",
        "multilabel_margin_loss", "multi_margin_loss", "nll_loss", "norm", "normalize", "pdist",
        "poisson_nll_loss", "pow", "prod", "reciprocal", "rsqrt", "sinh", "smooth_l1_loss", "soft_margin_loss",
        "softmax", "softmin", "softplus", "sum", "renorm", "tan", "triplet_margin_loss", "huber_loss",
        "logsumexp",
    }
)  # fmt: skip
SET_DTYPE = frozenset({"softmax", "log_softmax", "cumsum", "cumprod", "prod", "sum", "softmin"})
"""fp32 ops CUDA runs by passing ``dtype=float32`` rather than casting the input first."""
PROMOTE = frozenset(
    {"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sample", "index_put", "scatter_add", "tensordot"}
)
FLASH_DTYPES = (torch.float16, torch.bfloat16)
FLASH_MAX_HEAD_DIM = 256


def _name(func: Callable[..., Any]) -> str:
    return getattr(func, "__name__", "")


def _floating(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


class CudaAutocast(TorchFunctionMode):
    """Apply CUDA's autocast policy while ``torch.is_autocast_enabled("cuda")``."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def clear(self) -> None:
        self.cache.clear()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = _name(func)
        if name == "backward":
            return self._backward(func, args, kwargs)
        if name == "scaled_dot_product_attention":
            return self._sdpa(args, kwargs)
        if not torch.is_autocast_enabled("cuda") or (name.endswith("_") and not name.startswith("__")):
            return func(*args, **kwargs)
        low = torch.get_autocast_dtype("cuda")
        if name in LOWER_PRECISION:
            return func(*self._cast(args, low), **self._cast(kwargs, low))
        if name in SET_DTYPE and kwargs.get("dtype") is None:
            if any(_floating(t) and t.dtype != torch.float32 for t in _tensors(args[:1])):
                return func(*args, **{**kwargs, "dtype": torch.float32})
            return func(*args, **kwargs)
        if name in FLOAT32 and kwargs.get("dtype") is None:
            return func(*self._cast(args, torch.float32), **self._cast(kwargs, torch.float32))
        if name in PROMOTE:
            widest = _widest(args, kwargs)
            if widest is not None:
                return func(*self._cast(args, widest), **self._cast(kwargs, widest))
        return func(*args, **kwargs)

    def _backward(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """``Tensor.backward`` / ``torch.autograd.backward`` with this mode on in the engine.

        A mode is off inside its own handler, and the backward pass — checkpoint
        recomputation included — runs inside this call; calling ``func`` again would only
        come back here, so the engine is entered directly, as ``torch.autograd.backward`` does.
        """
        run = getattr(torch.autograd.graph, "_engine_run_backward", None)
        if run is None:
            return func(*args, **kwargs)
        tensors = args[0] if args else kwargs["tensors"]
        tensors = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
        grads = kwargs.get("gradient", kwargs.get("grad_tensors", args[1] if len(args) > 1 else None))
        if grads is None:
            grads = tuple(torch.ones_like(t) for t in tensors)
        elif isinstance(grads, torch.Tensor):
            grads = (grads,)
        create = bool(kwargs.get("create_graph", args[3] if len(args) > 3 else False))
        retain = kwargs.get("retain_graph", args[2] if len(args) > 2 else None)
        inputs = kwargs.get("inputs") or ()
        inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
        with self:
            run(tensors, tuple(grads), create if retain is None else retain, create, inputs, True, True)
        return None

    def _cast(self, tree: Any, dtype: torch.dtype) -> Any:
        return tree_map(lambda t: self._cast_one(t, dtype), tree)

    def _cast_one(self, t: Any, dtype: torch.dtype) -> Any:
        if not _floating(t) or t.dtype == dtype:
            return t
        cacheable = dtype != torch.float32 and t.dtype == torch.float32 and t.is_leaf and t.requires_grad
        if cacheable and torch.is_autocast_cache_enabled():
            hit = self.cache.get(id(t))
            if hit is not None and hit[0] is t:
                return hit[1]
            cast = t.to(dtype)
            self.cache[id(t)] = (t, cast)
            return cast
        return t.to(dtype)

    def _sdpa(self, args: Any, kwargs: dict[str, Any]) -> Any:
        if torch.is_autocast_enabled("cuda"):
            low = torch.get_autocast_dtype("cuda")
            args, kwargs = self._cast(args, low), self._cast(kwargs, low)
        return cuda_sdpa(*args, **kwargs)


def _widest(args: Any, kwargs: Any) -> Optional[torch.dtype]:
    dtypes = [t.dtype for t in _tensors((args, kwargs)) if _floating(t)]
    if not dtypes:
        return None
    return max(dtypes, key=lambda d: torch.finfo(d).bits)


def _tensors(tree: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    tree_map(lambda t: found.append(t) if isinstance(t, torch.Tensor) else None, tree)
    return found


def sdpa_backend(q: torch.Tensor, attn_mask: Optional[torch.Tensor], dropout_p: float, gqa: bool = False) -> str:
    """The kernel PyTorch picks on compute capability 9.0, as measured on the H200 with torch
    2.11 (``benchmarks/results/predict.json``, "calibration"): cuDNN attention for fp16/bf16
    (with a mask and with fewer key/value heads too), memory-efficient for fp32 (not with
    grouped-query attention), else the math composite."""
    if q.dim() != 4 or q.shape[-1] % 8 != 0:
        return "math"
    if q.dtype in FLASH_DTYPES and q.shape[-1] <= FLASH_MAX_HEAD_DIM:
        return "cudnn"
    if q.dtype == torch.float32 and not gqa:
        return "efficient"
    return "math"


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
    if backend == "efficient":
        out = aten._scaled_dot_product_efficient_attention(
            query, key, value, _float_bias(attn_mask, query.dtype), grad, dropout_p, is_causal, scale=scale
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


def _foreach_by_default(optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:
        if group.get("foreach", False) is None and not group.get("fused"):
            group["foreach"] = True


@contextlib.contextmanager
def cuda_like() -> Iterator[CudaAutocast]:
    """Inside: CUDA autocast state can be set and is applied; SDPA and optimizers behave as on CUDA."""
    mode = CudaAutocast()
    clear = torch.clear_autocast_cache

    def clear_both() -> None:
        mode.clear()
        clear()

    autocast_cls = torch.amp.autocast_mode.autocast
    plain_init = autocast_cls.__init__

    def init_on_cpu(self: Any, *args: Any, **kwargs: Any) -> None:
        # torch.autocast("cuda") turns itself off where no GPU is; the trace needs its state
        with (
            mock.patch.object(torch.cuda.amp.common, "amp_definitely_not_available", lambda: False),
            mock.patch.object(torch.cuda, "is_bf16_supported", lambda *a, **k: True),
        ):
            plain_init(self, *args, **kwargs)

    patches: list[Any] = [
        mock.patch.object(autocast_cls, "__init__", init_on_cpu),
        mock.patch.object(torch, "clear_autocast_cache", clear_both),
        # checkpointing takes its device from non-CPU tensors, else this default: "cuda"
        # makes recomputation re-enter the forward's CUDA autocast state
        mock.patch.object(checkpoint.DefaultDeviceType, "_default_device_type", "cuda"),
    ]
    patches += _eager_libraries()
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        stack.enter_context(mode)
        yield mode


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
