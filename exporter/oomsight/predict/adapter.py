"""LoRA adapters, a quantized frozen base and an 8-bit optimizer, as the tracer sees them.

Each is applied to the model ``build()`` returns (on the meta device) and then traced like any
other step, so their bytes come from the same allocator replay:

- ``lora``: PEFT's ``get_peft_model`` where PEFT is installed; otherwise the same arithmetic by
  ``LoraLinear`` (A: rank x in, B: out x rank, both trained, the base frozen).
- ``quantize``: every ``nn.Linear`` but the output head and the adapters (bitsandbytes' ``get_keys_to_not_convert``
  keeps it) becomes ``QuantLinear``, holding the bytes bitsandbytes stores
  (/work/shared/reference/distributed-memory.md §5.2-5.3): 4-bit ``ceil(n/2)`` packed bytes +
  an fp32 absmax per 64 weights (double quantization: a uint8 absmax per 64, an fp32 one per 256
  blocks and a 256-entry fp32 code); 8-bit ``n`` bytes + an fp32 scale per output row. Its forward
  and backward make the dequantized weight they use and free it, as ``bnb.matmul_4bit`` does.
- ``AdamW8bit``: bitsandbytes' 8-bit state (§5.5): uint8 ``state1``/``state2`` and an fp32 absmax
  per 256 for a tensor of at least 4,096 elements, fp32 state below; one update in place.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from typing import Any, Callable, Optional

import torch
from torch import nn

QUANT_BLOCK = 64
"""Weights per absmax of bitsandbytes' 4-bit quantization (``blocksize`` default)."""
NESTED_BLOCK = 256
"""Absmax values per second-level absmax under double quantization (``quantize_blockwise``)."""
CODE_ENTRIES_4BIT = 16
"""Entries of the NF4/FP4 code (fp32)."""
CODE_ENTRIES_NESTED = 256
"""Entries of the nested state's dynamic code (fp32)."""
OPTIM_BLOCK = 256
"""Elements per absmax of the 8-bit optimizer state (``blockwise`` updates)."""
OPTIM_MIN_8BIT = 4096
"""bitsandbytes' ``min_8bit_size``: smaller tensors keep fp32 state."""
LORA_ALPHA_PER_RANK = 2
"""``lora_alpha = 2 x rank`` (a common choice; the scaling multiplies, it holds no memory)."""
QUANTIZE = ("4bit", "4bit-double", "8bit")


def quantized_bytes(out_features: int, in_features: int, mode: str) -> dict[str, int]:
    """The tensors bitsandbytes keeps for one weight, name → bytes."""
    n = out_features * in_features
    if mode == "8bit":
        return {"data": n, "SCB": 4 * out_features}
    blocks = math.ceil(n / QUANT_BLOCK)
    found = {"data": (n + 1) // 2, "code": 4 * CODE_ENTRIES_4BIT}
    if mode == "4bit-double":
        found.update(absmax=blocks, offset=4, nested_absmax=4 * math.ceil(blocks / NESTED_BLOCK))
        found["nested_code"] = 4 * CODE_ENTRIES_NESTED
    else:
        found["absmax"] = 4 * blocks
    return found


class _Dequantized(torch.autograd.Function):
    """``x @ dequantize(W).T``: the full weight made for the product and freed after it, again in
    backward for the input's gradient; only the input is kept, never the weight."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, shape: tuple[int, int], int8: bool) -> torch.Tensor:
        ctx.shape = shape
        if int8:  # LLM.int8: int8 rows of the input and their scales, an int32 product
            rows = x.numel() // shape[1]
            quantized = torch.empty(x.shape, dtype=torch.int8, device=x.device)
            scales = torch.empty(rows, dtype=torch.float32, device=x.device)
            product = torch.empty((*x.shape[:-1], shape[0]), dtype=torch.int32, device=x.device)
            out = product.to(x.dtype)
            del quantized, scales, product
            return out
        weight = torch.empty(shape, dtype=x.dtype, device=x.device)
        return nn.functional.linear(x, weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Optional[torch.Tensor], None, None]:
        weight = torch.empty(ctx.shape, dtype=grad.dtype, device=grad.device)
        return grad @ weight, None, None


class QuantLinear(nn.Module):
    """A frozen ``nn.Linear`` stored as bitsandbytes stores it (``quantized_bytes``). A 4-bit layer computes
    in the dtype the linear had (``bnb_4bit_compute_dtype``): bitsandbytes' ``Linear4bit.forward`` casts the
    input to it and the output back to the input's dtype (a copy each way where they differ, as after
    ``--prepare-kbit`` made the norms fp32)."""

    def __init__(self, linear: nn.Linear, mode: str) -> None:
        super().__init__()
        self.in_features, self.out_features, self.mode = linear.in_features, linear.out_features, mode
        self.compute_dtype = None if mode == "8bit" else linear.weight.dtype
        for name, size in quantized_bytes(linear.out_features, linear.in_features, mode).items():
            stored = torch.empty(size, dtype=torch.uint8, device=linear.weight.device)
            self.register_parameter(name, nn.Parameter(stored, requires_grad=False))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x if self.compute_dtype is None else x.to(self.compute_dtype)
        out = _Dequantized.apply(x, (self.out_features, self.in_features), self.mode == "8bit")
        return (out if self.bias is None else out + self.bias.to(out.dtype)).to(dtype)


class LoraLinear(nn.Module):
    """PEFT's LoRA arithmetic without PEFT (``peft/tuners/lora/layer.py``, ``Linear.forward``): the
    input cast to the adapters' dtype, ``base(x) + B(A(x)) * alpha / rank`` cast back to the base's."""

    def __init__(self, base: nn.Module, rank: int) -> None:
        super().__init__()
        self.base_layer = base
        fan_in, fan_out = in_out(base)
        self.lora_A = nn.Linear(fan_in, rank, bias=False, device=base.weight.device)
        self.lora_B = nn.Linear(rank, fan_out, bias=False, device=base.weight.device)
        self.scaling = LORA_ALPHA_PER_RANK

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.base_layer(x)
        dtype = result.dtype
        result = result + self.lora_B(self.lora_A(x.to(self.lora_A.weight.dtype))) * self.scaling
        return result.to(dtype)


def in_out(layer: nn.Module) -> tuple[int, int]:
    """(in, out) features of an ``nn.Linear`` or of transformers' ``Conv1D`` (GPT-2's; weight in x out)."""
    if isinstance(layer, nn.Linear):
        return layer.in_features, layer.out_features
    rows, cols = getattr(layer, "weight").shape  # noqa: B009 - a Conv1D's weight, typed as any attribute
    return int(rows), int(cols)


def adaptable(layer: nn.Module, peft: bool = False) -> bool:
    """Whether LoRA adapts ``layer``: ``nn.Linear`` and transformers' ``Conv1D`` (``LoraLinear``), and with
    PEFT also its embeddings and convolutions."""
    if isinstance(layer, nn.Linear) or type(layer).__name__ == "Conv1D":
        return True
    return peft and isinstance(layer, (nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d))


def targeted(name: str, targets: tuple[str, ...]) -> bool:
    """PEFT's rule for a list of target names: the module's name, or its last dotted parts."""
    return any(name == t or name.endswith("." + t) for t in targets)


def with_lora(
    build: Callable[[], nn.Module], rank: int, targets: tuple[str, ...], peft: bool
) -> Callable[[], nn.Module]:
    """``build`` with LoRA adapters of ``rank`` on the ``targets`` (PEFT's if ``peft``), the base frozen."""

    def build_adapted() -> nn.Module:
        model = build()
        if peft:
            import peft as peft_lib

            config = peft_lib.LoraConfig(
                r=rank, lora_alpha=LORA_ALPHA_PER_RANK * rank, lora_dropout=0.0, target_modules=list(targets)
            )
            return peft_lib.get_peft_model(model, config).train()
        model.requires_grad_(False)
        found = _replace(model, lambda name, m: adaptable(m) and targeted(name, targets),
                         lambda m: LoraLinear(m, rank))  # fmt: skip
        if not found:
            raise ValueError(f"--lora: no nn.Linear or Conv1D named {', '.join(targets)} in the model")
        return model

    return build_adapted


def with_quantized_base(build: Callable[[], nn.Module], mode: str) -> Callable[[], nn.Module]:
    """``build`` with each ``nn.Linear`` but the output head and LoRA's stored quantized and frozen
    (``QuantLinear``), with or without adapters."""

    def build_quantized() -> nn.Module:
        model = build()
        head = _output_head(model)

        def base(name: str, m: nn.Module) -> bool:  # the adapters stay (ours lora_A; PEFT's lora_A.default)
            return type(m) is nn.Linear and m is not head and not _adapter(name)

        _replace(model, base, lambda m: QuantLinear(m, mode))
        return model

    return build_quantized


def prepared_for_kbit_training(build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """``build`` (quantized, its adapters in place) as PEFT's ``prepare_model_for_kbit_training`` leaves a
    model (``peft/utils/other.py``), which TRL and the QLoRA recipes call before ``get_peft_model``: every
    fp16/bf16 parameter cast to fp32 (norms, embeddings, output head, biases; the quantized storage is
    uint8 and the adapters are fp32 already, as PEFT makes them), activation checkpointing enabled the way
    PEFT enables it (``gradient_checkpointing_kwargs={}``: the installed transformers and torch decide
    whether it is reentrant) and the input embeddings' output made to require grad. The base was frozen
    by ``with_lora``, as PEFT's function freezes it."""

    def build_prepared() -> nn.Module:
        model = build()
        for name, param in model.named_parameters():
            if param.dtype in (torch.float16, torch.bfloat16) and not _adapter(name):
                param.data = param.data.to(torch.float32)
        enable = getattr(model, "gradient_checkpointing_enable", None)
        input_grads = getattr(model, "enable_input_require_grads", None)
        if not (callable(enable) and callable(input_grads)):
            raise ValueError("--prepare-kbit: the model has no gradient_checkpointing_enable (not transformers')")
        with warnings.catch_warnings():  # transformers 5 renames the method: PEFT's call, not the user's to fix
            warnings.simplefilter("ignore", FutureWarning)
            enable(gradient_checkpointing_kwargs={})
            input_grads()
        return model

    return build_prepared


def _adapter(name: str) -> bool:
    """A LoRA adapter's parameter (ours ``lora_A.weight``; PEFT's ``lora_A.default.weight``)."""
    return any(part.startswith("lora_") for part in name.split("."))


def _output_head(model: nn.Module) -> Optional[nn.Module]:
    get = getattr(model, "get_output_embeddings", None)
    return get() if callable(get) else None


def _replace(model: nn.Module, pick: Callable[[str, nn.Module], bool], make: Callable[[Any], nn.Module]) -> int:
    """Swap every submodule ``pick`` selects for ``make(it)``; how many were swapped."""
    chosen = [(name, m) for name, m in model.named_modules() if name and pick(name, m)]
    for name, m in chosen:
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, make(m))
    return len(chosen)


class AdamW8bit(torch.optim.Optimizer):
    """bitsandbytes' ``AdamW8bit`` as memory: its state tensors, one in-place update, no temporaries."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(self._state_for(p))
                p.add_(p.grad, alpha=-group["lr"])

    def _state_for(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        if p.numel() < OPTIM_MIN_8BIT:
            return {k: torch.zeros(p.shape, dtype=torch.float32, device=p.device) for k in ("state1", "state2")}
        shared: dict[Any, Any] = self.state  # keyed by parameters, and here once by name
        if "qmap" not in shared:  # name2qmap: one signed and one unsigned map per device, shared
            shared["qmap"] = {k: torch.zeros(256, dtype=torch.float32, device=p.device) for k in ("1", "2")}
        blocks = math.ceil(p.numel() / OPTIM_BLOCK)
        found = {k: torch.zeros(p.shape, dtype=torch.uint8, device=p.device) for k in ("state1", "state2")}
        found.update({k: torch.zeros(blocks, dtype=torch.float32, device=p.device) for k in ("absmax1", "absmax2")})
        return found
