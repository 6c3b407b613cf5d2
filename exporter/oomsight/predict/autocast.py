"""CUDA's autocast, applied at the dispatcher to fake CPU tensors.

CUDA autocast is a dispatch key above autograd: every ATen call of a listed op — from a
module, a functional, or the inside of a Python composite such as
``F.multi_head_attention_forward`` — has its floating arguments cast before autograd sees
it, so the casts are in the graph and the lower-precision copies are what backward saves.
A ``TorchFunctionMode`` sees only the outermost Python call (a mode is off inside its own
handler), so the composites' inner products stayed fp32 there. Here the same place is
taken on the CPU: Python kernels on the ``AutocastCPU`` key, with CPU autocast kept on for
the trace, apply CUDA's policy whenever CUDA autocast is on (``torch.autocast("cuda")``
in the user's step) and pass the call through otherwise. Every op that has an autocast
kernel for either device gets one, so the CPU's own policy never applies.

The op lists are CUDA's (``aten/src/ATen/autocast_mode.cpp`` and the "CUDA Op-Specific
Behavior" table of https://docs.pytorch.org/docs/stable/amp.html), by ATen name; the ops
that have a CUDA autocast kernel are read from the dispatcher itself, and a test checks
that each of them has a policy here. ``scaled_dot_product_attention`` always goes to the
kernel CUDA would pick (``cuda_sdpa``), under autocast or not.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any, Callable, Optional

import torch
from torch.utils._pytree import tree_map

LOWER = "lower"
FLOAT32 = "float32"
SET_DTYPE = "set_dtype"
PROMOTE = "promote"
BANNED = "banned"
SDPA = "sdpa"
PASS = "pass"

_POLICY_NAMES: dict[str, frozenset[str]] = {
    LOWER: frozenset(
        {
            "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
            "conv_transpose3d", "convolution", "cudnn_convolution", "cudnn_convolution_transpose", "prelu",
            "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm",
            "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
            "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
            "_scaled_dot_product_flash_attention",
        }
    ),
    FLOAT32: frozenset(
        {
            "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
            "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "group_norm",
            "rms_norm", "frobenius_norm", "nuclear_norm", "cosine_similarity", "poisson_nll_loss",
            "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss",
            "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
            "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits",
            "dist", "pdist", "cdist", "renorm", "logsumexp", "upsample_nearest1d", "upsample_nearest2d",
            "upsample_nearest3d", "_upsample_nearest_exact1d", "_upsample_nearest_exact2d",
            "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
            "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
            "norm",  # CUDA appends dtype=float32 (no input copy); cast here, a rare op
        }
    ),
    SET_DTYPE: frozenset(
        {"prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm", "linalg_matrix_norm", "sum"}
    ),
    PROMOTE: frozenset(
        {
            "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
            "scatter_add", "tensordot",
        }
    ),
    BANNED: frozenset({"binary_cross_entropy"}),
    SDPA: frozenset({"scaled_dot_product_attention"}),
}  # fmt: skip
POLICY: dict[str, str] = {name: policy for policy, names in _POLICY_NAMES.items() for name in names}
"""CUDA's autocast policy by ATen op name (without the overload)."""

_AUTOCAST_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)


def autocast_ops() -> list[str]:
    """Every ATen op overload with an autocast kernel for the CPU or for CUDA, as
    ``name.overload`` (``overload`` empty for the default)."""
    found = []
    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith("aten::"):
            continue
        if any(torch._C._dispatch_has_kernel_for_dispatch_key(qualified, k) for k in ("AutocastCPU", "AutocastCUDA")):
            found.append(qualified[len("aten::") :])
    return sorted(found)


def cuda_autocast_ops() -> list[str]:
    """The ATen ops CUDA autocast has a kernel for (read from this build's dispatcher)."""
    return sorted(
        q[len("aten::") :]
        for q in torch._C._dispatch_get_all_op_names()
        if q.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(q, "AutocastCUDA")
    )


def policy_of(op_name: str) -> str:
    return POLICY.get(op_name.split(".", 1)[0], PASS)


def _floating(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


class WeightCasts:
    """The cast cache of an autocast region: fp32 leaf tensors that need a gradient (the
    weights) are cast once per region, as PyTorch's ``cached_cast`` does."""

    def __init__(self) -> None:
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def clear(self) -> None:
        self.cache.clear()

    def cast(self, tree: Any, dtype: torch.dtype) -> Any:
        return tree_map(lambda t: self.cast_one(t, dtype), tree)

    def cast_one(self, t: Any, dtype: torch.dtype) -> Any:
        if not _floating(t) or t.dtype == dtype:
            return t
        cacheable = dtype != torch.float32 and t.dtype == torch.float32 and t.is_leaf and t.requires_grad
        if not (cacheable and torch.is_autocast_cache_enabled()):
            return t.to(dtype)
        hit = self.cache.get(id(t))
        if hit is not None and hit[0] is t:
            return hit[1]
        cast = t.to(dtype)
        self.cache[id(t)] = (t, cast)
        return cast


def _tensors(tree: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    tree_map(lambda t: found.append(t) if isinstance(t, torch.Tensor) else None, tree)
    return found


def _widest(args: Any, kwargs: Any) -> Optional[torch.dtype]:
    dtypes = [t.dtype for t in _tensors((args, kwargs)) if _floating(t)]
    return max(dtypes, key=lambda d: torch.finfo(d).bits) if dtypes else None


def _kernel(op: Any, policy: str, casts: WeightCasts, sdpa: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            on = torch.is_autocast_enabled("cuda")
            if policy == SDPA:
                if on:
                    low = torch.get_autocast_dtype("cuda")
                    args, kwargs = casts.cast(args, low), casts.cast(kwargs, low)
                return sdpa(*args, **kwargs)
            if not on:
                return op(*args, **kwargs)
            return _apply(op, policy, casts, args, kwargs)

    return run


def _apply(op: Any, policy: str, casts: WeightCasts, args: Any, kwargs: dict[str, Any]) -> Any:
    if policy == LOWER:
        low = torch.get_autocast_dtype("cuda")
        return op(*casts.cast(args, low), **casts.cast(kwargs, low))
    if policy == FLOAT32:
        return op(*casts.cast(args, torch.float32), **casts.cast(kwargs, torch.float32))
    if policy == SET_DTYPE:  # an explicit dtype is kept (``set_opt_dtype``)
        first = _tensors(args[:1])
        if first and _floating(first[0]) and first[0].dtype != torch.float32 and not _dtype_given(op, args, kwargs):
            return op(*args, **{**kwargs, "dtype": torch.float32})
        return op(*args, **kwargs)
    if policy == PROMOTE:
        widest = _widest(args, kwargs)
        if widest is not None:
            return op(*casts.cast(args, widest), **casts.cast(kwargs, widest))
        return op(*args, **kwargs)
    if policy == BANNED:
        raise RuntimeError(
            f"{op} is unsafe to autocast on CUDA (torch raises here too): use binary_cross_entropy_with_logits"
        )
    return op(*args, **kwargs)


def _dtype_given(op: Any, args: Any, kwargs: dict[str, Any]) -> bool:
    if kwargs.get("dtype") is not None:
        return True
    names = [a.name for a in op._schema.arguments]
    at = names.index("dtype") if "dtype" in names else len(args)
    return at < len(args) and args[at] is not None


def _overload(op_name: str) -> Any:
    name, _, overload = op_name.partition(".")
    return getattr(getattr(torch.ops.aten, name), overload or "default")


@contextlib.contextmanager
def dispatcher_autocast(sdpa: Callable[..., Any]) -> Iterator[WeightCasts]:
    """Inside: CUDA's autocast policy applies at the dispatcher to CPU tensors whenever
    CUDA autocast is on; ``scaled_dot_product_attention`` always runs ``sdpa``."""
    casts = WeightCasts()
    lib = torch.library.Library("aten", "IMPL")
    was_on = torch.is_autocast_enabled("cpu")
    try:
        with warnings.catch_warnings():  # "overriding a previously registered kernel": meant
            warnings.simplefilter("ignore")
            for op_name in autocast_ops():
                policy = policy_of(op_name)
                if policy == PASS:  # no CUDA kernel here: the call and the ops inside it go on as on CUDA
                    lib.impl(op_name, torch.library.fallthrough_kernel, "AutocastCPU")
                else:
                    lib.impl(op_name, _kernel(_overload(op_name), policy, casts, sdpa), "AutocastCPU")
        torch.set_autocast_enabled("cpu", True)
        yield casts
    finally:
        torch.set_autocast_enabled("cpu", was_on)
        lib._destroy()
