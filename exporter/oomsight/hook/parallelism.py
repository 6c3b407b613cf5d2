"""The parallelism a job uses (the wire's ``Parallelism``): DDP, FSDP1, FSDP2 (``fully_shard``, hybrid
sharding, resharding after forward), DeepSpeed's ZeRO, ``ZeroRedundancyOptimizer`` and plain DTensors, read
off the wrappers' own objects, and the world size. Beside it, the readers of those wrappers that the byte
accounting (``hook/accounting.py``) shares: an object's class names, FSDP2's parameters of a module, whether
a process group exists.

Only attribute reads: nothing here launches a kernel or communicates.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Optional, Union


def type_names(obj: Any) -> set[str]:
    return {c.__name__ for c in type(obj).__mro__}


def distributed(torch: Any) -> bool:
    """A process group exists: only then can a module be DDP, FSDP or FSDP2 (each needs one)."""
    dist = getattr(torch, "distributed", None)
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:  # a group being torn down
        return False


def world_size(torch: Any) -> int:
    dist = getattr(torch, "distributed", None)
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except Exception:  # a group being torn down: fall back to the launcher's variable
        pass
    try:
        return max(int(os.environ.get("WORLD_SIZE", "1")), 1)
    except ValueError:
        return 1


def fsdp_params(module: Any) -> list[Any]:
    """FSDP2's ``FSDPParam`` s of ``module`` (none for another module)."""
    get_state = getattr(module, "_get_fsdp_state", None)
    if get_state is None or "FSDPModule" not in type_names(module):
        return []
    group = getattr(get_state(), "_fsdp_param_group", None)
    return list(getattr(group, "fsdp_params", None) or [])


def detect(
    torch: Any, roots: list[Any], modules: list[Any], kinds: set[str], optimizers: Iterable[Any] = ()
) -> dict[str, Any]:
    """The parallelism in use (the wire's ``Parallelism``), from the live modules (``modules``: every
    module of the roots where a process group exists, so a wrapper is found wherever it sits: inside
    ``torch.compile``'s ``OptimizedModule``, inside a user's module), the kinds of parameters seen
    (``kinds``) and the optimizers (ZeRO-1 by ``ZeroRedundancyOptimizer``)."""
    found: dict[str, Any] = {
        "world_size": world_size(torch),
        "strategy": "none",
        "zero_stage": None,
        "sharding": None,
        "shard_size": None,
        "reshard_after_forward": None,
        "gradient_as_bucket_view": None,
        "offload": None,
        "mixed_precision": None,
    }
    candidates = [*roots, *modules]
    engine = next((m for m in candidates if "DeepSpeedEngine" in type_names(m)), None)
    if engine is not None:
        return _zero(engine, found)
    ddp = next((m for m in candidates if "DistributedDataParallel" in type_names(m)), None)
    if ddp is not None:
        found.update(strategy="ddp", gradient_as_bucket_view=bool(getattr(ddp, "gradient_as_bucket_view", False)))
        found["mixed_precision"] = _dtype_name(getattr(getattr(ddp, "mixed_precision", None), "param_dtype", None))
    if any("ZeroRedundancyOptimizer" in type_names(opt) for opt in optimizers):
        found.update(zero_stage=1, strategy="zero" if found["strategy"] == "none" else found["strategy"])
    fsdp2 = [m for m in modules if "FSDPModule" in type_names(m)]
    if fsdp2:
        return _fsdp2(fsdp2, found)
    fsdp1 = [m for m in modules if "FullyShardedDataParallel" in type_names(m)]
    if fsdp1:
        m = fsdp1[0]
        strategy = getattr(getattr(m, "sharding_strategy", None), "name", None)
        offload = getattr(getattr(m, "cpu_offload", None), "offload_params", None)
        found.update(strategy="fsdp", sharding=strategy, shard_size=getattr(m, "world_size", None), offload=offload)
        found["mixed_precision"] = _dtype_name(getattr(getattr(m, "mixed_precision", None), "param_dtype", None))
        return found
    if "zero" in kinds:
        found.update(strategy="zero", zero_stage=3, shard_size=found["world_size"])
    elif found["strategy"] == "none" and "dtensor" in kinds:
        found["strategy"] = "dtensor"
    return found


def _dtype_name(dtype: Any) -> Optional[str]:
    """``torch.bfloat16`` -> ``"bfloat16"``; None for None."""
    return None if dtype is None else str(dtype).replace("torch.", "")


def _fsdp2(modules: list[Any], found: dict[str, Any]) -> dict[str, Any]:
    """FSDP2: the shard size, resharding after forward (judged on the inner groups, as the outermost
    group's default is not to), hybrid sharding, CPU offload and the mixed-precision policy's
    ``param_dtype``, from the parameter groups."""
    inner = {id(c) for m in modules for c in m.modules() if c is not m}  # the outermost FSDP modules are roots
    reshard: Optional[Union[bool, int]] = None
    hybrid, offload, shard, mixed = False, False, None, None
    for m in modules:
        group = getattr(m._get_fsdp_state(), "_fsdp_param_group", None)
        if group is None:
            continue
        info = getattr(group, "mesh_info", None)
        shard = getattr(info, "shard_mesh_size", shard)
        hybrid = hybrid or type(info).__name__ == "HSDPMeshInfo"
        offload = offload or any(getattr(fp, "offload_to_cpu", False) for fp in group.fsdp_params)
        for fp in group.fsdp_params:
            mixed = mixed or _dtype_name(getattr(getattr(fp, "mp_policy", None), "param_dtype", None))
        if id(m) in inner or reshard is None:
            resharded = _resharding(group)
            reshard = resharded if id(m) in inner else (reshard or resharded)
    sharding = "HYBRID_SHARD" if hybrid else "FULL_SHARD" if reshard is not False else "SHARD_GRAD_OP"
    found.update(strategy="fsdp2", sharding=sharding, shard_size=shard, reshard_after_forward=reshard, offload=offload)
    found["mixed_precision"] = mixed
    return found


def _resharding(group: Any) -> Union[bool, int]:
    """A parameter group's ``reshard_after_forward``: False, True (back to the full shard group), or the
    integer size of the smaller group it reshards to (torch keeps that group's mesh apart)."""
    post = getattr(group, "post_forward_mesh_info", None)
    if post is None:
        return False
    if post is getattr(group, "mesh_info", None):
        return True
    size = getattr(post, "shard_mesh_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) else True


def _zero(engine: Any, found: dict[str, Any]) -> dict[str, Any]:
    def call(name: str) -> Any:
        fn = getattr(engine, name, None)
        try:
            return fn() if callable(fn) else None
        except Exception:  # an engine of another DeepSpeed version: unknown, not an error
            return None

    stage = call("zero_optimization_stage")
    offload = bool(call("zero_cpu_offload") or call("zero_offload_param"))
    found.update(strategy="zero", zero_stage=stage, shard_size=found["world_size"], offload=offload)
    found["mixed_precision"] = "bfloat16" if call("bfloat16_enabled") else "float16" if call("fp16_enabled") else None
    return found
