"""The bytes of the job's model memory in this process: every parameter of the live modules (trainable
and frozen), their gradients and the optimizers' state, each counted by the *local* storage that really
holds it.

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

Only attribute reads: nothing here launches a kernel or communicates. Pure of the hook's state: :func:`count`
takes the parameters, modules and optimizers that ``hook/discovery.py`` finds and returns the bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Callable, Optional

from oomsight.hook.discovery import delegates
from oomsight.hook.parallelism import fsdp_params, type_names

FROZEN_MODULES_MAX = 8
FROZEN_CHILD_SHARE = 0.25
"""A child of a partly trained root is named as a frozen module when it holds at least this share of
the root's parameter bytes (a teacher kept as an attribute of the student's wrapper, a frozen
vision tower): smaller frozen pieces (an embedding, a norm) are details, not a second model."""
ADAPTER_MARKS = ("lora_",)
"""Parameter names of adapters (PEFT: lora_A, lora_B, lora_embedding_A/B, lora_magnitude_vector)."""
EXPERT_MARKS = ("expert",)
"""A parameter whose qualified name has one of these is an expert's of a mixture of experts (``experts.3.w1``,
``block_sparse_moe.experts``, ``shared_expert``): its memory follows the routing (wire 1.10)."""
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


def _quantized(torch: Any, p: Any, wrapper: bool) -> bool:
    if type(p).__name__ in QUANTIZED_CLASSES:
        return True
    if wrapper and "DTensor" not in type_names(p):
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


def _flat_originals(p: Any) -> list[Any]:
    """The original parameters an FSDP1 flat parameter stands for (kept with ``use_orig_params``)."""
    if not getattr(p, "_is_flat_param", False):
        return []
    return [*(getattr(p, "_params", None) or []), *(getattr(p, "_shared_params", None) or [])]


COPYING_PACKAGES = ("deepspeed", "apex")
"""Packages whose optimizers step fp32 copies of the model's parameters (not the parameters)."""


def _steps_copies(opt: Any) -> bool:
    return type(opt).__module__.partition(".")[0] in COPYING_PACKAGES


@dataclasses.dataclass
class Counted:
    """What :func:`count` found."""

    devices: dict[int, Totals]
    dtypes: dict[str, int]
    """Parameter bytes by dtype name (``float32``, ``bfloat16``)."""
    kinds: set[str]
    """The kinds of parameters seen (``zero``, ``dtensor``, ``adapters``)."""
    trains: Callable[[Any], bool]
    """Whether a parameter trains (a gathered FSDP2 parameter as its shard)."""


def count(
    torch: Any, named: list[tuple[Any, str, Any]], modules: list[Any], optimizers: list[Any], *,
    innermost: list[Any], device_type: str,
) -> Counted:
    """The bytes per device of the parameters ``named`` ((root, name, parameter) of each), of the sharded
    wrappers and DDP buckets among ``modules`` and of the state of ``optimizers`` (wrappers and what they
    wrap; ``innermost``: those that hold the state), each storage once."""
    counter = _Counter(torch, device_type)
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
    return Counted(devices=counter.devices, dtypes=counter.dtypes, kinds=kinds, trains=trains)


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
        if wrapper and "DTensor" in type_names(p):
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


def _bump(counter: _Counter, device: int, slot: str, size: int) -> None:
    if device >= 0 and size:
        totals = counter.totals(device)
        setattr(totals, slot, getattr(totals, slot) + size)


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


def _fsdp2_aliases(counter: _Counter, module: Any) -> None:
    """The parameters FSDP2 registers on a module in place of its shard (gathered in a forward, or, after
    a forward with an integer ``reshard_after_forward``, gathered over a smaller group) stand for it."""
    for fp in fsdp_params(module):
        sharded = getattr(fp, "sharded_param", None)
        for stand_in in (getattr(fp, "_unsharded_param", None), getattr(fp, "_sharded_post_forward_param", None)):
            if stand_in is not None and sharded is not None:
                counter.aliases[id(stand_in)] = sharded


def _fsdp2_params(counter: _Counter, module: Any, trains: Callable[[Any], bool]) -> None:
    """FSDP2 (``fully_shard``): each parameter's padded local shard, and its all-gathered buffers
    while they are alive (0 bytes once resharded), the partial ones an integer ``reshard_after_forward``
    keeps from a forward to its backward included."""
    for fp in fsdp_params(module):
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
    if "DistributedDataParallel" not in type_names(ddp):
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
