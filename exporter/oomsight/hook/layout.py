"""How the job lays out its model's memory in this process: every parameter of the live modules
(trainable and frozen), their gradients and the optimizers' state, each counted by the *local*
storage that really holds it, and the parallelism in use.

The rules (``shared/reference/distributed-memory.md`` §0, checked with torch 2.13 on gloo):

- A wrapper tensor subclass (DTensor, torchao's quantised tensors) reports its global, logical
  size through its outer storage and a data pointer of 0: it is counted by its inner tensors
  (``__tensor_flatten__``), recursively. A DTensor is therefore its local shard.
- Storages are counted, not tensors: each ``(device, data_ptr)`` once. Views (DDP's
  ``gradient_as_bucket_view``, FSDP1's ``use_orig_params`` views, ZeRO's flat buffers, FSDP2's
  padded shards) come out right, and a storage resized to 0 (a freed FSDP buffer, a ZeRO-3
  parameter while partitioned) counts nothing.
- Sharded wrappers are read through their own objects, before the generic walk: FSDP2's
  ``FSDPParam`` (the padded shard, and the all-gathered buffers while they are alive), FSDP1's
  flat parameters (the local shard, and the full padded parameter while unsharded), ZeRO-3's
  partitions (``ds_tensor``). What they gather for a forward is *unsharded* memory, apart from
  the parameters.
- DDP keeps one flat bucket per group of gradients, allocated at construction: beside the
  gradients unless they are views of it (``gradient_as_bucket_view``).

Only attribute reads: nothing here launches a kernel or communicates. Pure of the hook's state:
:func:`measure` takes the root modules and the optimizers and returns a :class:`Layout`.
"""

from __future__ import annotations

import dataclasses
import os
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Callable, Optional, Union

FROZEN_MODULES_MAX = 8
FROZEN_CHILD_SHARE = 0.25
"""A child of a partly trained root is named as a frozen module when it holds at least this share of
the root's parameter bytes (a teacher kept as an attribute of the student's wrapper, a frozen
vision tower): smaller frozen pieces (an embedding, a norm) are details, not a second model."""
ADAPTER_MARKS = ("lora_",)
EXPERT_MARKS = ("expert",)
"""A parameter whose qualified name has one of these is an expert's of a mixture of experts (``experts.3.w1``,
``block_sparse_moe.experts``, ``shared_expert``): its memory follows the routing (wire 1.10)."""
"""Parameter names of adapters (PEFT: lora_A, lora_B, lora_embedding_A/B, lora_magnitude_vector)."""
QUANTIZED_CLASSES = frozenset(("Params4bit", "Int8Params"))
"""bitsandbytes' quantised parameters: plain storages plus side tensors (``quant_state``, ``SCB``)."""

STATE_FACTORS = {"Adam": 2, "AdamW": 2, "NAdam": 2, "RAdam": 2, "Adamax": 2, "Adadelta": 2, "Rprop": 2, "Adagrad": 1}
"""Optimizer state per trainable parameter byte, by class: Adam keeps exp_avg and exp_avg_sq, ..."""


def state_factor(opt: Any) -> Optional[float]:
    """Expected optimizer-state bytes per trainable parameter byte; None for an unknown kind."""
    groups = getattr(opt, "param_groups", [{}])
    for cls in type(opt).__mro__:
        name = cls.__name__
        if name in STATE_FACTORS:
            return STATE_FACTORS[name] + (1 if any(g.get("amsgrad") for g in groups) else 0)
        if name == "SGD":
            return 1.0 if any(g.get("momentum") for g in groups) else 0.0
        if name == "RMSprop":
            return 1.0 + any(g.get("momentum") for g in groups) + any(g.get("centered") for g in groups)
    return None


@dataclasses.dataclass
class Totals:
    """Bytes of one device, by what they hold."""

    parameters: int = 0
    """Every parameter, trainable and frozen, by its local storage (a shard for a sharded one)."""
    gradients: int = 0
    """Their gradients, DDP's bucket copies included."""
    state: int = 0
    expected_state: Optional[int] = 0
    """What the optimizers will hold once every state exists (None: an optimizer of unknown kind)."""
    frozen: int = 0
    quantized: int = 0
    adapters: int = 0
    buckets: int = 0
    untrained_grads: int = 0
    """Gradients of parameters no optimizer trains: a model left with ``requires_grad`` on (waste)."""
    unsharded: int = 0
    """Gathered (all-gathered) parameters alive now, besides their shards."""
    experts: int = 0
    """Parameters of a mixture of experts' experts (:data:`EXPERT_MARKS`)."""

    def as_states(self) -> dict[str, Any]:
        """The wire's ``ModelStates`` / ``Categories`` keys of these totals."""
        return {
            "parameters_bytes": self.parameters,
            "gradients_bytes": self.gradients,
            "optimizer_state_bytes": self.state,
            "optimizer_state_expected_bytes": self.expected_state,
            "frozen_parameters_bytes": self.frozen,
            "quantized_parameters_bytes": self.quantized,
            "adapter_parameters_bytes": self.adapters,
            "gradient_buckets_bytes": self.buckets,
            "untrained_gradients_bytes": self.untrained_grads,
            "unsharded_parameters_bytes": self.unsharded,
            "expert_parameters_bytes": self.experts,
        }


@dataclasses.dataclass
class Layout:
    devices: dict[int, Totals]
    dtypes: dict[str, int]
    """Parameter bytes by dtype name (``float32``, ``bfloat16``)."""
    frozen_modules: list[str]
    parallelism: dict[str, Any]
    adapters: bool

    def states(self, device: int) -> dict[str, Any]:
        totals = self.devices.get(device, Totals())
        return {**totals.as_states(), "frozen_modules": list(self.frozen_modules)}


PARAMS, GRADS, STATE, UNSHARDED = "parameters", "gradients", "state", "unsharded"


class _Counter:
    """Adds each storage's bytes once to its device's totals."""

    def __init__(self, torch: Any, device_type: str) -> None:
        self.device_type = device_type
        self.devices: dict[int, Totals] = {}
        self.seen: set[tuple[int, int]] = set()
        self.dtypes: dict[str, int] = {}
        """Parameter bytes by dtype name (``float32``, ``bfloat16``)."""
        self.aliases: dict[int, Any] = {}
        """id of a gathered (unsharded) parameter -> the sharded one it stands for during a forward."""
        dispatch = getattr(getattr(torch, "utils", None), "_python_dispatch", None)
        self.is_wrapper = getattr(dispatch, "is_traceable_wrapper_subclass", lambda t: False)
        self.plain = (torch.Tensor, torch.nn.Parameter)

    def totals(self, device: int) -> Totals:
        found = self.devices.get(device)
        if found is None:
            found = self.devices[device] = Totals()
        return found

    def add(self, t: Any, slot: str) -> tuple[int, int]:
        """Count ``t`` in ``slot``: (its device, the bytes new to the count); (-1, 0) when not here."""
        device, size = -1, 0
        for index, key, nbytes in self._storages(t, 0):
            if key in self.seen:
                continue
            self.seen.add(key)
            device, size = index, size + nbytes
            totals = self.totals(index)
            setattr(totals, slot, getattr(totals, slot) + nbytes)
        if slot == PARAMS and size:
            name = str(getattr(t, "dtype", "unknown")).replace("torch.", "")
            self.dtypes[name] = self.dtypes.get(name, 0) + size
        return device, size

    def _storages(self, t: Any, depth: int) -> Iterator[tuple[int, tuple[int, int], int]]:
        """(device index, storage key, bytes) of every plain storage behind ``t`` on this device type."""
        if depth > 4 or t is None:
            return
        if type(t) not in self.plain and self.is_wrapper(t):
            names = t.__tensor_flatten__()[0]
            for name in names:
                yield from self._storages(getattr(t, name, None), depth + 1)
            return
        device = getattr(t, "device", None)
        if device is None or getattr(device, "type", None) != self.device_type:
            return
        storage = t.untyped_storage()
        nbytes = int(storage.nbytes())
        if nbytes:
            index = device.index if device.index is not None else 0
            yield index, (index, storage.data_ptr()), nbytes
        for side in _side_tensors(t):
            yield from self._storages(side, depth + 1)


def _side_tensors(t: Any) -> list[Any]:
    """The tensors a quantised parameter keeps beside its storage (bitsandbytes)."""
    if type(t).__name__ not in QUANTIZED_CLASSES:
        return []
    out = [getattr(t, "SCB", None)]
    qs = getattr(t, "quant_state", None)
    while qs is not None:
        out += [getattr(qs, "absmax", None), getattr(qs, "code", None), getattr(qs, "offset", None)]
        qs = getattr(qs, "state2", None)
    return [x for x in out if hasattr(x, "untyped_storage")]


def _names(obj: Any) -> set[str]:
    return {c.__name__ for c in type(obj).__mro__}


def _quantized(torch: Any, p: Any, wrapper: bool) -> bool:
    if type(p).__name__ in QUANTIZED_CLASSES:
        return True
    if wrapper and "DTensor" not in _names(p):
        return True  # torchao's quantised tensors, NF4
    dtype = getattr(p, "dtype", None)
    return dtype in (torch.uint8, torch.int8) or "float8" in str(dtype)


def trained_by(optimizers: Iterable[Any], params: Iterable[Any]) -> Callable[[Any], bool]:
    """Whether a parameter is trained: it requires grad and one of the optimizers holds it. A teacher
    left with ``requires_grad`` on but in no optimizer is frozen all the same (its gradients, if autograd
    makes them, are waste), and so is a model whose parameters were all replaced after its optimizer was
    made (``load_state_dict(assign=True)``: the optimizer trains the old tensors). ``requires_grad``
    alone decides only where no optimizer holds a parameter yet, or where an optimizer steps copies of
    the parameters (DeepSpeed's ZeRO, apex's master weights). A parameter frozen for one phase (a GAN's
    discriminator, ``requires_grad_(False)`` during the generator's update) that an optimizer holds and
    has stepped (it has state there) trains all the same; one it holds but never stepped (a layer not
    yet unfrozen) does not. ``params``: the models' parameters."""
    del params  # what decides is what the optimizers hold, not whether it overlaps the models
    optimizers = list(optimizers)
    held = {id(p) for opt in optimizers for g in getattr(opt, "param_groups", []) for p in g.get("params", [])}
    if not held or any(_steps_copies(opt) for opt in optimizers):
        return lambda p: bool(getattr(p, "requires_grad", False))
    stepped = {id(p) for opt in optimizers for p in _stateful(opt)}

    def trains(p: Any) -> bool:
        # FSDP1's flat parameter with use_orig_params: the optimizer holds the original parameters
        mine = [p, *_flat_originals(p)]
        if not getattr(p, "requires_grad", False):
            return any(id(q) in stepped for q in mine)
        return any(id(q) in held for q in mine)

    return trains


def _stateful(opt: Any) -> list[Any]:
    """The parameters ``opt`` keeps state for (it has stepped them); none where its state is no mapping."""
    state = getattr(opt, "state", None)
    if not isinstance(state, Mapping):
        return []
    return [p for p, entry in state.items() if entry]


def held_parameters(module: Any) -> list[Any]:
    """The parameters ``module`` holds, as an optimizer would see them: inside a sharded wrapper's forward
    the module shows gathered tensors (FSDP1's views as plain tensors with ``use_orig_params``, FSDP2's
    unsharded parameters) where the optimizer holds FSDP1's flat parameters (or their originals) and
    FSDP2's sharded ones; both are added. Walks the module tree: at an OOM only."""
    found = list(module.parameters())
    for m in module.modules():
        flat = getattr(getattr(m, "_handle", None), "flat_param", None)
        if flat is not None and getattr(flat, "_is_flat_param", False):
            found.append(flat)
        found += [fp.sharded_param for fp in _fsdp_params(m) if getattr(fp, "sharded_param", None) is not None]
    return found


def _flat_originals(p: Any) -> list[Any]:
    """The original parameters an FSDP1 flat parameter stands for (kept with ``use_orig_params``)."""
    if not getattr(p, "_is_flat_param", False):
        return []
    return [*(getattr(p, "_params", None) or []), *(getattr(p, "_shared_params", None) or [])]


COPYING_PACKAGES = ("deepspeed", "apex")
"""Packages whose optimizers step fp32 copies of the model's parameters (not the parameters)."""
DELEGATE_ATTRIBUTES = ("optim", "optimizer", "_optimizer", "base_optimizer", "inner_optimizer")
"""Where an optimizer that wraps another keeps it: ``ZeroRedundancyOptimizer.optim``, Accelerate's
``AcceleratedOptimizer.optimizer``, Lightning's ``LightningOptimizer._optimizer``, SAM's
``base_optimizer``, ..."""
DELEGATE_DEPTH = 4


def _steps_copies(opt: Any) -> bool:
    return type(opt).__module__.partition(".")[0] in COPYING_PACKAGES


def delegates(opt: Any) -> list[Any]:
    """``opt`` and the optimizers it wraps, outermost first (attribute reads; at most four deep)."""
    chain = [opt]
    for _ in range(DELEGATE_DEPTH):
        inner = next((getattr(chain[-1], a, None) for a in DELEGATE_ATTRIBUTES if _optimizer_like(
            getattr(chain[-1], a, None))), None)
        if inner is None or any(inner is o for o in chain):
            break
        chain.append(inner)
    return chain


def _optimizer_like(obj: Any) -> bool:
    return obj is not None and hasattr(obj, "param_groups") and hasattr(obj, "state") and hasattr(obj, "step")


def measure(torch: Any, roots: Iterable[Any], optimizers: Iterable[Any], device_type: str = "cuda") -> Layout:
    """The layout of ``roots`` (the outermost live modules) and ``optimizers``, per device of ``device_type``.
    A wrapping optimizer is counted through the one it wraps (:func:`delegates`)."""
    roots = list(roots)
    chains = [delegates(opt) for opt in optimizers]
    optimizers = list({id(o): o for chain in chains for o in chain}.values())
    innermost = list({id(chain[-1]): chain[-1] for chain in chains}.values())
    named = _named_parameters(roots, optimizers)  # one walk of the module trees, reused below
    counter = _Counter(torch, device_type)
    modules = [m for root in roots for m in _modules(root)] if _distributed(torch) else []
    for m in modules:  # FSDP2's gathered parameters stand for their shards, which the optimizers hold
        _fsdp2_aliases(counter, m)
    held = trained_by(optimizers, ())

    def trains(p: Any) -> bool:
        return held(counter.aliases.get(id(p), p))

    for m in modules:  # sharded wrappers first, wherever they sit in the tree: their shards, what they gathered
        _fsdp2_params(counter, m, trains)
        _fsdp1_params(counter, m, trains)
    for m in {id(m): m for m in modules}.values():
        _ddp_buckets(counter, m)
    kinds = _count_parameters(torch, counter, named, trains)
    _optimizer_states(counter, innermost, optimizers)
    return Layout(
        devices=counter.devices,
        dtypes=counter.dtypes,
        frozen_modules=frozen_modules(roots, named, trains),
        parallelism=parallelism(torch, roots, modules, kinds, optimizers),
        adapters="adapters" in kinds,
    )


def _count_parameters(
    torch: Any, counter: _Counter, named: list[tuple[Any, str, Any]], trains: Callable[[Any], bool]
) -> set[str]:
    """Every parameter (each storage once) and its gradient; the kinds of parameters seen."""
    kinds: set[str] = set()
    for _root, name, p in named:
        wrapper = type(p) not in counter.plain and counter.is_wrapper(p)
        device, size = counter.add(getattr(p, "ds_tensor", p), PARAMS)
        if hasattr(p, "ds_tensor"):
            kinds.add("zero")
            if getattr(getattr(p, "ds_status", None), "name", "") != "NOT_AVAILABLE":
                counter.add(p, UNSHARDED)  # a ZeRO-3 parameter gathered for its module
        if wrapper and "DTensor" in _names(p):
            kinds.add("dtensor")
        trained = trains(p)
        if trained:
            if any(mark in name for mark in ADAPTER_MARKS):
                kinds.add("adapters")
                _bump(counter, device, "adapters", size)
        else:
            _bump(counter, device, "frozen", size)
        if size and _quantized(torch, p, wrapper):
            _bump(counter, device, "quantized", size)
        if size and any(mark in name.lower() for mark in EXPERT_MARKS):
            _bump(counter, device, "experts", size)
        if p.grad is not None:
            device, size = counter.add(p.grad, GRADS)
            if not trained:
                _bump(counter, device, "untrained_grads", size)
    return kinds


def _distributed(torch: Any) -> bool:
    """A process group exists: only then can a module be DDP, FSDP or FSDP2 (each needs one)."""
    dist = getattr(torch, "distributed", None)
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:  # a group being torn down
        return False


def _bump(counter: _Counter, device: int, slot: str, size: int) -> None:
    if device >= 0 and size:
        totals = counter.totals(device)
        setattr(totals, slot, getattr(totals, slot) + size)


def _modules(root: Any) -> Iterator[Any]:
    modules = getattr(root, "modules", None)
    if modules is not None:
        yield from modules()


def _named_parameters(roots: list[Any], optimizers: list[Any]) -> list[tuple[Any, str, Any]]:
    """Every parameter once, as (its root, its name, it): the modules', then any only an optimizer holds
    (root None)."""
    seen: set[int] = set()
    out: list[tuple[Any, str, Any]] = []
    for root in roots:
        named = getattr(root, "named_parameters", None)
        for name, p in named() if named is not None else ():
            if id(p) not in seen:
                seen.add(id(p))
                out.append((root, name, p))
    for opt in optimizers:
        for group in getattr(opt, "param_groups", []):
            for p in group.get("params", []):
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append((None, "", p))
    return out


def _optimizer_states(counter: _Counter, innermost: list[Any], optimizers: list[Any]) -> None:
    """The state the optimizers hold (``optimizers``, wrappers and what they wrap, each storage once), and
    what the ones that hold the state (``innermost``) will hold: the factor of their kind times the bytes
    of the (local) parameters that will have state, each storage once (:func:`_will_have_state`)."""
    trained: set[tuple[int, int]] = set()
    for opt in innermost:
        factor = state_factor(opt)
        for p in _will_have_state(opt):
            for index, key, nbytes in counter._storages(getattr(p, "ds_tensor", p), 0):
                if key in trained:
                    continue
                trained.add(key)
                totals = counter.totals(index)
                if factor is None or totals.expected_state is None:
                    totals.expected_state = None
                else:
                    totals.expected_state += int(factor * nbytes)
    for opt in optimizers:
        for state in getattr(opt, "state", {}).values():
            for value in state.values() if isinstance(state, dict) else ():
                if hasattr(value, "untyped_storage"):
                    counter.add(value, STATE)


def state_entries(optimizers: Iterable[Any]) -> int:
    """How many parameters the optimizers (and those they wrap) hold state for: attribute reads and
    ``len`` only, so a step row can tell when state appeared (a layer unfrozen, a param group added)."""
    total = 0
    for opt in optimizers:
        for o in delegates(opt):
            state = getattr(o, "state", None)
            total += len(state) if isinstance(state, Mapping) else 0
    return total


def held(torch: Any, optimizers: Iterable[Any], device_type: str = "cuda") -> dict[int, int]:
    """Per device, the bytes of the gradients and the optimizer state the optimizers hold (each storage
    once): what a step row subtracts from its floor, so state that appears as parameters start to train
    is not read as something kept from every step. One pass over the optimizers' parameters."""
    counter = _Counter(torch, device_type)
    for opt in optimizers:
        for o in delegates(opt):
            for group in getattr(o, "param_groups", []):
                for p in group.get("params", []):
                    counter.add(getattr(p, "grad", None), GRADS)
            for state in getattr(o, "state", {}).values():
                for value in state.values() if isinstance(state, dict) else ():
                    if hasattr(value, "untyped_storage"):
                        counter.add(value, STATE)
    return {index: t.gradients + t.state for index, t in counter.devices.items()}


def _will_have_state(opt: Any) -> list[Any]:
    """The parameters of ``opt`` whose state exists or will at its next step: those with state or a
    gradient. An optimizer makes state only for a parameter that has a gradient at a step, so an expert
    no token is routed to, or a parameter no loss reaches, never has any. Before the optimizer has state
    or any of its parameters a gradient, every parameter that requires grad may get both."""
    groups = getattr(opt, "param_groups", [])
    params = [p for g in groups for p in g.get("params", []) if getattr(p, "requires_grad", True)]
    state = getattr(opt, "state", None)
    if not isinstance(state, Mapping):
        return params
    live = [p for p in params if getattr(p, "grad", None) is not None or state.get(p)]
    return live if live or len(state) else params


def _fsdp_params(module: Any) -> list[Any]:
    """FSDP2's ``FSDPParam`` s of ``module`` (none for another module)."""
    get_state = getattr(module, "_get_fsdp_state", None)
    if get_state is None or "FSDPModule" not in _names(module):
        return []
    group = getattr(get_state(), "_fsdp_param_group", None)
    return list(getattr(group, "fsdp_params", None) or [])


def _fsdp2_aliases(counter: _Counter, module: Any) -> None:
    """The parameters FSDP2 registers on a module in place of its shard (gathered in a forward, or, after
    a forward with an integer ``reshard_after_forward``, gathered over a smaller group) stand for it."""
    for fp in _fsdp_params(module):
        sharded = getattr(fp, "sharded_param", None)
        for stand_in in (getattr(fp, "_unsharded_param", None), getattr(fp, "_sharded_post_forward_param", None)):
            if stand_in is not None and sharded is not None:
                counter.aliases[id(stand_in)] = sharded


def _fsdp2_params(counter: _Counter, module: Any, trains: Callable[[Any], bool]) -> None:
    """FSDP2 (``fully_shard``): each parameter's padded local shard, and its all-gathered buffers
    while they are alive (0 bytes once resharded), the partial ones an integer ``reshard_after_forward``
    keeps from a forward to its backward included."""
    for fp in _fsdp_params(module):
        shard = getattr(fp, "_sharded_param_data", None)
        sharded = getattr(fp, "sharded_param", None)
        if shard is not None:
            device, size = counter.add(shard, PARAMS)
            if sharded is not None and not trains(sharded):
                _bump(counter, device, "frozen", size)
        for gathered in getattr(fp, "all_gather_outputs", None) or []:
            counter.add(gathered, UNSHARDED)
        counter.add(getattr(fp, "_sharded_post_forward_param_data", None), UNSHARDED)
        if sharded is not None and sharded.grad is not None:
            counter.add(sharded.grad, GRADS)
        # without gradient sync (no_sync accumulation) the unsharded gradients stay until the sync
        unsharded = getattr(fp, "_unsharded_param", None)
        for grad in (getattr(unsharded, "grad", None), getattr(fp, "unsharded_accumulated_grad", None)):
            if grad is not None:
                counter.add(grad, GRADS)


def _fsdp1_params(counter: _Counter, module: Any, trains: Callable[[Any], bool]) -> None:
    """FSDP1: the flat parameter's local shard, and the full padded parameter while unsharded."""
    handle = getattr(module, "_handle", None)
    flat = getattr(handle, "flat_param", None)
    if flat is None or not getattr(flat, "_is_flat_param", False):
        return
    shard = getattr(flat, "_local_shard", None)
    device, size = counter.add(shard if shard is not None else flat, PARAMS)
    if not trains(flat):
        _bump(counter, device, "frozen", size)
    for name in ("_full_param_padded", "_full_prec_full_param_padded", "_mp_shard"):
        counter.add(getattr(flat, name, None), UNSHARDED)
    counter.add(flat, UNSHARDED)  # flat.data points at the gathered parameter while unsharded
    if flat.grad is not None:
        counter.add(flat.grad, GRADS)


def _ddp_buckets(counter: _Counter, ddp: Any) -> None:
    """DDP's flat buckets: one per group of gradients, in the parameters' dtype, allocated at
    construction and kept, as large as the gradients they hold. A gradient that is a view of its bucket
    (``gradient_as_bucket_view``, after a synchronised backward) shares the bucket's storage: the
    bucket is counted there, as gradients. Every other gradient (the flag off; or fresh tensors made
    by backwards after ``zero_grad()`` set them to None, inside ``no_sync``) is a second copy beside
    the buckets: the buckets not found through a view are counted besides."""
    if "DistributedDataParallel" not in _names(ddp):
        return
    views = bool(getattr(ddp, "gradient_as_bucket_view", False))
    total: dict[int, int] = {}
    counted: dict[int, int] = {}
    for p in ddp.parameters():
        if not p.requires_grad or getattr(p.device, "type", None) != counter.device_type:
            continue
        index = p.device.index if p.device.index is not None else 0
        total[index] = total.get(index, 0) + p.numel() * p.element_size()
        if views and p.grad is not None and _bucket_view(p.grad):
            device, size = counter.add(p.grad, GRADS)
            if device >= 0:
                counted[device] = counted.get(device, 0) + size
    for index, size in total.items():
        extra = max(size - counted.get(index, 0), 0)
        totals = counter.totals(index)
        totals.buckets += extra
        totals.gradients += extra


def _bucket_view(grad: Any) -> bool:
    """The gradient is a view of a larger storage (the reducer's ``narrow(...).view(...)`` of its bucket),
    not a tensor of its own (what autograd makes where ``.grad`` was None)."""
    try:
        own = grad.numel() * grad.element_size()
        return bool(grad._is_view()) or grad.untyped_storage().nbytes() > own
    except (AttributeError, RuntimeError):  # a tensor subclass without a plain storage: not DDP's
        return False


def frozen_modules(roots: list[Any], named: list[tuple[Any, str, Any]], trains: Callable[[Any], bool]) -> list[str]:
    """Roots with no trainable parameter (a teacher, a reference or reward model), and large frozen
    children of a partly trained root; largest first. ``named``: (root, name, parameter) of each."""
    found: list[tuple[int, str]] = []
    for root in roots:
        children: dict[str, list[int]] = {}  # child name -> [bytes, trained parameters]
        for _root, name, p in named:
            if _root is root:
                child = children.setdefault(name.partition(".")[0], [0, 0])
                child[0] += p.numel() * p.element_size()
                child[1] += trains(p)
        total = sum(c[0] for c in children.values())
        if total and not any(c[1] for c in children.values()):
            found.append((total, type(root).__name__))
            continue
        for child_name, (size, trained) in children.items():
            if size and not trained and size >= FROZEN_CHILD_SHARE * total:
                found.append((size, f"{type(root).__name__}.{child_name}"))
    found.sort(key=lambda x: -x[0])
    return [name for _size, name in found[:FROZEN_MODULES_MAX]]


def parallelism(
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
    engine = next((m for m in candidates if "DeepSpeedEngine" in _names(m)), None)
    if engine is not None:
        return _zero(engine, found)
    ddp = next((m for m in candidates if "DistributedDataParallel" in _names(m)), None)
    if ddp is not None:
        found.update(strategy="ddp", gradient_as_bucket_view=bool(getattr(ddp, "gradient_as_bucket_view", False)))
        found["mixed_precision"] = _dtype_name(getattr(getattr(ddp, "mixed_precision", None), "param_dtype", None))
    if any("ZeroRedundancyOptimizer" in _names(opt) for opt in optimizers):
        found.update(zero_stage=1, strategy="zero" if found["strategy"] == "none" else found["strategy"])
    fsdp2 = [m for m in modules if "FSDPModule" in _names(m)]
    if fsdp2:
        return _fsdp2(fsdp2, found)
    fsdp1 = [m for m in modules if "FullyShardedDataParallel" in _names(m)]
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


def roots_of(modules: Iterable[Any]) -> list[Any]:
    """The modules that are no other module's child: the models (at an OOM, from the garbage collector)."""
    modules = list(modules)
    children: set[int] = set()
    for m in modules:
        for child in getattr(m, "children", lambda: [])():
            children.add(id(child))
    return [m for m in modules if id(m) not in children]


SCAN_SHARE = 0.001
"""At most this share of the training thread goes to the garbage-collector scan for live models: after a
scan that took ``t`` seconds the next one waits ``t / SCAN_SHARE`` (a 30 ms scan: 30 s, the walk's own
interval; a 300 ms scan of a huge program: 5 minutes)."""
SCAN_MAX_SECONDS = 0.5
"""A scan still running after this long gives up (its partial result is dropped, the previous one kept)."""
SCAN_CHECK_EVERY = 4096
"""Objects between two looks at the clock during a scan."""


class LiveModels:
    """Every live model (``nn.Module`` that no other module holds), found through the garbage collector
    beside the models the job probe saw called: an EMA copy updated under ``no_grad``, a frozen teacher or
    reference model never called inside a detection window. Run at the layout walk's cadence, bounded in
    time (``SCAN_SHARE``, ``SCAN_MAX_SECONDS``); the models found are held by weak reference."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self._found: list[weakref.ref[Any]] = []
        self._next = 0.0
        self.last_seconds: Optional[float] = None
        """How long the last scan took (None before one)."""
        self.abandoned = 0
        """Scans given up after ``SCAN_MAX_SECONDS``."""

    @property
    def roots(self) -> list[Any]:
        return [m for m in (r() for r in self._found) if m is not None]

    def scan(self, gc_module: Any, module_type: Any) -> list[Any]:
        """The live models: scanned anew where the time share allows, else those of the last scan."""
        start = self.clock()
        if start < self._next:
            return self.roots
        modules = _scan(gc_module, module_type, self.clock, start + SCAN_MAX_SECONDS)
        self.last_seconds = took = self.clock() - start
        self._next = start + took / SCAN_SHARE
        if modules is None:
            self.abandoned += 1
            return self.roots
        self._found = [weakref.ref(m) for m in roots_of(modules)]
        return self.roots


def _scan(gc_module: Any, module_type: Any, clock: Callable[[], float], deadline: float) -> Optional[list[Any]]:
    """Every live instance of ``module_type``; None when the clock passes ``deadline`` first."""
    found: list[Any] = []
    kinds: dict[type, bool] = {}  # one subclass check per type, a dict look-up per object
    objects = gc_module.get_objects()
    for start in range(0, len(objects), SCAN_CHECK_EVERY):
        for o in objects[start : start + SCAN_CHECK_EVERY]:
            t = type(o)  # type(), not isinstance(): no lazy object's __class__ runs
            is_module = kinds.get(t)
            if is_module is None:
                is_module = kinds[t] = issubclass(t, module_type)
            if is_module:
                found.append(o)
        if clock() > deadline:
            return None
    return found
