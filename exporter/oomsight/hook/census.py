"""A census at the OOM: what holds the device's bytes, read from the job's own objects (wire 1.11).

The diagnosis rules read allocator counters and the job's step rows; this reads the objects. At the OOM,
in the failing thread and within a budget (``Budget``: seconds and objects; a census cut short says so and
counts), it walks the garbage collector's objects once and sorts every tensor on the failing device that
Python holds:

- **model states**: parameters (by top-level module, and whether an optimizer holds them), their
  gradients, optimizer state and module buffers; the layout walk counts their bytes, the census only
  leaves them out of what follows;
- **tensors with a graph** (``grad_fn`` set, not a parameter): each keeps its forward's autograd graph, and
  the saved activations with it until a backward consumes them;
- **detached tensors** (no graph): outputs, metrics, queues, caches.

Each of the last two is put under what holds it: a container (``list``, ``dict``, ``deque``, ``tuple``,
``set``) or an object's attribute, named by the frame local, module attribute or global that reaches it
(up to ``NAME_DEPTH`` containers up), with the framework whose code holds it (``transformers``' evaluation
loop) and, for a ``deque`` with ``maxlen``, its cap. Tensors a running frame holds directly as a plain local
(the step's own ``x``, ``loss``) are the computation in flight and counted apart. Key/value caches
(``...Cache`` objects) are named as such: the working memory of generation, by design.

The GPU's other processes are split by the process tree (``/proc``): the job's own children (DataLoader
workers, launched helpers), its launcher's other children (sibling ranks) and other tenants. NVML reports host
PIDs: where this process's own PID is not among them (a container), the split is not made and says so.

Never raises into the caller: the recorder guards it, and a census that fails leaves the diagnosis to the
counters (``analysis.diagnosis``) and the event says why."""

from __future__ import annotations

import collections
import dataclasses
import gc
import os
import sys
import time
from collections.abc import Iterable, Sequence
from types import FrameType
from typing import Any, Callable, Optional

HOLDERS = 8
"""Holders recorded, the largest first."""
MODULES = 8
"""Top-level modules recorded with their parameter bytes."""
PROCESSES = 8
"""Processes recorded per group."""
NAME_DEPTH = 3
"""Containers walked up from a holder to find a name (a list of dicts of tensors: two)."""
CHECK_EVERY = 2048
"""Objects between two looks at the clock."""
NAME_CHARS = 160


@dataclasses.dataclass(frozen=True)
class Budget:
    """What one census may spend, in the failing thread. The OOM has already happened: a second more is
    cheap beside a crashed job, yet a huge program must not hang in it."""

    seconds: float = 2.0
    """Wall time for the whole census; past it the walk stops and the census says ``cut_short: time`` (the H100
    ResNet job, one of eight on 16 cores, took 1.02 s over 271,432 objects: 1 s cut its naming short)."""
    objects: int = 4_000_000
    """The most garbage-collected objects walked (memory: one list of references, 8 bytes each)."""


@dataclasses.dataclass
class _Holder:
    kind: str
    graph: int = 0
    detached: int = 0
    cap: Optional[int] = None
    length: Optional[int] = None
    name: str = ""
    framework: Optional[str] = None
    parameter_copies: bool = True
    """Every tensor it holds has a parameter's shape and no graph (an EMA copy, a weight snapshot)."""
    fallback: str = ""
    """An attribute holder's name by its owner's class, kept while the walk up looks for a name the job uses."""
    attr: str = ""
    items: list[tuple[int, int, bool]] = dataclasses.field(default_factory=list)
    """(storage pointer, bytes, has a graph) of each tensor it holds: a storage two holders share counts once."""


class _Walk:
    """One census's state: the tensors on the device outside the model states, and who holds them."""

    def __init__(self, torch: Any, device: int, device_type: str, budget: Budget, clock: Callable[[], float]):
        self.torch = torch
        self.device = device
        self.device_type = device_type
        self.budget = budget
        self.clock = clock
        self.deadline = clock() + budget.seconds
        self.cut_short: Optional[str] = None
        self.walked = 0
        self.state_ptrs: set[int] = set()
        self.param_shapes: set[tuple[Any, ...]] = set()
        self.tensors: dict[int, tuple[int, int, bool]] = {}
        """id(tensor) -> (storage pointer, storage bytes, has a graph)."""
        self.holders: dict[Any, _Holder] = {}
        """By id(container), or (id(object), attribute) for a tensor held as an object's attribute."""
        self.modules: list[Any] = []
        self.optimizers: list[Any] = []
        """Every live module and optimizer the walk met: the model states where the hook knew none."""
        self.module_names: dict[int, str] = {}
        self.module_dicts: dict[int, str] = {}
        """id(a module's ``__dict__``) -> the module's name: a tensor attribute of a module is held there."""
        self.local_names: dict[int, tuple[str, Optional[str]]] = {}
        """id(an object a running frame holds as a local) -> (its name and frame, the frame's package)."""
        self.owners: dict[Any, Any] = {}
        """Holder key -> the container or object, while the census runs."""

    def late(self, i: int) -> bool:
        if i % CHECK_EVERY == 0 and self.clock() > self.deadline:
            self.cut_short = "time"
        return self.cut_short is not None

    def on_device(self, obj: Any) -> bool:
        try:
            d = obj.device
            return bool(d.type == self.device_type and (d.index if d.index is not None else 0) == self.device)
        except Exception:
            return False


def take(
    torch: Any,
    device: int,
    roots: Sequence[Any] = (),
    optimizers: Sequence[Any] = (),
    budget: Budget = Budget(),
    device_type: str = "cuda",
    gpu_processes: Optional[Sequence[tuple[int, Optional[int]]]] = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """The census of ``device`` (see the module's doc). ``gpu_processes``: NVML's (pid, used bytes) of the
    device's compute processes, None where unknown."""
    start = clock()
    walk = _Walk(torch, device, device_type, budget, clock)
    modules = _model_states(walk, roots, optimizers)
    objects = gc.get_objects()
    if len(objects) > budget.objects:
        del objects[budget.objects :]
        walk.cut_short = "objects"
    walk.walked = len(objects)
    held = _find_tensors(walk, objects)
    del objects
    if not roots or not optimizers:  # before the first step the hook may know neither: the walk found them
        found = _model_states(
            walk, _roots_of(walk.modules) if not roots else [], walk.optimizers if not optimizers else []
        )
        modules = modules or found
        held = [t for t in held if walk.tensors[id(t)][0] not in walk.state_ptrs]
        walk.tensors = {id(t): walk.tensors[id(t)] for t in held}
    walk.modules.clear()
    walk.optimizers.clear()
    in_flight = {"tensors": 0, "bytes": 0}
    if held and walk.cut_short != "time":
        own = {id(held), id(walk.tensors), id(walk.holders), id(walk.owners)}
        frames = _frame_locals(own)
        own.add(id(frames))
        own.update(id(local) for _, _, local in frames)
        for where, framework, local in frames:
            for k, v in local.items():
                walk.local_names.setdefault(id(v), (f"local `{k}` of {where}", framework))
        in_flight = _find_holders(walk, held, own, frames)
        _name_holders(walk, own, frames)
        del frames
    walk.owners.clear()
    walk.local_names.clear()
    del held
    return _result(walk, modules, in_flight, gpu_processes, clock() - start)


def _model_states(walk: _Walk, roots: Sequence[Any], optimizers: Sequence[Any]) -> list[dict[str, Any]]:
    """Mark the storages of parameters, gradients, buffers and optimizer state; parameter bytes by top-level
    module with whether an optimizer holds them."""
    trained: set[int] = set()
    for opt in optimizers:
        for group in getattr(opt, "param_groups", ()):
            trained.update(id(p) for p in group.get("params", ()))
        for st in list(getattr(opt, "state", {}).values()):
            for v in st.values() if isinstance(st, dict) else ():
                _mark(walk, v)
    out: list[dict[str, Any]] = []
    for root in roots:
        for name, m in root.named_modules():
            qualified = f"{type(root).__name__}.{name}" if name else type(root).__name__
            walk.module_names.setdefault(id(m), qualified)
            d = _instance_dict(m)
            if d is not None:
                walk.module_dicts.setdefault(id(d), qualified)
        children = list(root.named_children()) or [(type(root).__name__, root)]
        for name, child in children:
            size, held = 0, False
            for p in child.parameters():
                size += _mark(walk, p)
                if p.is_leaf:  # a non-leaf's .grad is never populated (and reading it warns)
                    _mark(walk, p.grad)
                walk.param_shapes.add(tuple(p.shape))
                held = held or id(p) in trained
            for b in child.buffers():
                _mark(walk, b)
            if size:
                out.append({"module": f"{type(root).__name__}.{name}"[:NAME_CHARS], "bytes": size, "trained": held})
    out.sort(key=lambda m: -m["bytes"])
    return out[:MODULES]


def _roots_of(modules: list[Any]) -> list[Any]:
    children: set[int] = set()
    for m in modules:
        for child in m.children():
            children.add(id(child))
    return [m for m in modules if id(m) not in children]


def _mark(walk: _Walk, t: Any) -> int:
    if t is None or not isinstance(t, walk.torch.Tensor) or not walk.on_device(t):
        return 0
    try:
        storage = t.untyped_storage()
        walk.state_ptrs.add(storage.data_ptr())
        return int(storage.nbytes())
    except Exception:
        return 0


def _find_tensors(walk: _Walk, objects: list[Any]) -> list[Any]:
    """The tensors on the device outside the model states (one pass; ``type()``, never ``isinstance``: a lazy
    object's ``__class__`` may run code or warn)."""
    tensor = walk.torch.Tensor
    parameter = walk.torch.nn.Parameter
    module, optimizer = walk.torch.nn.Module, walk.torch.optim.Optimizer
    kinds: dict[type, int] = {}
    found: list[Any] = []
    for i, obj in enumerate(objects):
        if walk.late(i):
            break
        t = type(obj)
        kind = kinds.get(t)
        if kind is None:
            kind = kinds[t] = (
                1 if issubclass(t, tensor) and not issubclass(t, parameter)
                else 2 if issubclass(t, module) else 3 if issubclass(t, optimizer) else 0
            )
        if kind == 2:
            walk.modules.append(obj)
        elif kind == 3:
            walk.optimizers.append(obj)
        if kind != 1 or not walk.on_device(obj):
            continue
        try:
            storage = obj.untyped_storage()
            ptr = storage.data_ptr()
            if ptr in walk.state_ptrs:
                continue
            walk.tensors[id(obj)] = (ptr, int(storage.nbytes()), obj.grad_fn is not None)
            found.append(obj)
        except Exception:
            continue
    return found


_CONTAINERS = (list, tuple, dict, set, frozenset, collections.deque)


def _container_kind(obj: Any) -> Optional[str]:
    t = type(obj)
    for base in _CONTAINERS:
        if issubclass(t, base):
            return "deque" if base is collections.deque else base.__name__
    return None


def _find_holders(walk: _Walk, held: list[Any], own: set[int], frames: list[Any]) -> dict[str, int]:
    """Who refers to the held tensors (one pass of the collector in C): containers, objects' attributes,
    running frames (the computation in flight, counted apart)."""
    in_flight = {"tensors": 0, "bytes": 0}
    flight_seen: set[int] = set()
    for _, _, local in frames:
        for v in local.values():
            entry = walk.tensors.get(id(v))
            if entry is not None and id(v) not in flight_seen:
                flight_seen.add(id(v))
                in_flight["tensors"] += 1
                in_flight["bytes"] += entry[1]
    for ref in gc.get_referrers(*held):
        if id(ref) in own or isinstance(ref, FrameType):
            continue
        kind = _container_kind(ref)
        if kind == "dict" and id(ref) in walk.module_dicts:
            _attributes(walk, ref, ref, walk.module_dicts[id(ref)], None)
        elif kind is not None:
            items: Iterable[Any] = list(ref.values()) if kind == "dict" else list(ref)
            _count(walk, id(ref), kind, items, ref)
        else:
            d = _instance_dict(ref)
            if d is not None:
                owner, framework = _owner(walk, ref)
                _attributes(walk, ref, d, owner, framework)
    return in_flight


def _attributes(walk: _Walk, obj: Any, d: dict[str, Any], owner: str, framework: Optional[str]) -> None:
    """Tensors held as attributes of ``obj`` (its ``__dict__`` ``d``): one holder per attribute."""
    for attr, v in list(d.items()):
        if id(v) in walk.tensors:
            h = _count(walk, (id(obj), attr), "attribute", (v,), obj)
            h.name = f"{owner}.{attr}"[:NAME_CHARS]
            h.framework = framework
            h.length = 1
            h.attr = attr
            if id(obj) not in walk.module_names and id(obj) not in walk.local_names:
                h.fallback, h.name = h.name, ""  # only its class names it: look further up (_name_holders)


def _frame_locals(own: set[int]) -> list[tuple[str, Optional[str], dict[str, Any]]]:
    """Every thread's running frames but ours: (where, framework, locals). A running frame is no referrer the
    collector sees, so its locals are read here; the dict a frame keeps of them once asked (Python before 3.13)
    is one more view of the same locals, added to ``own``."""
    out: list[tuple[str, Optional[str], dict[str, Any]]] = []
    for top in list(sys._current_frames().values()):
        f: Optional[FrameType] = top
        while f is not None:
            code = f.f_code
            if not code.co_filename.startswith(_HERE):
                try:
                    view = f.f_locals
                    own.add(id(view))
                    local = dict(view)
                except Exception:
                    local = {}
                where = f"{code.co_name} ({_short(code.co_filename)}:{f.f_lineno})"
                out.append((where, _framework_of_file(code.co_filename), local))
            f = f.f_back
    return out


_HERE = os.path.dirname(__file__)


def _instance_dict(obj: Any) -> Optional[dict[str, Any]]:
    if isinstance(obj, type) or getattr(type(obj), "__dictoffset__", 0) == 0:
        return None
    try:
        d = object.__getattribute__(obj, "__dict__")
    except Exception:
        return None
    return d if isinstance(d, dict) else None


def _count(walk: _Walk, key: Any, kind: str, items: Iterable[Any], container: Any) -> _Holder:
    tensors = walk.tensors
    h = walk.holders.get(key) or _Holder(kind)
    found = False
    for v in items:
        entry = tensors.get(id(v))
        if entry is None:
            continue
        found = True
        h.items.append(entry)
        if entry[2]:
            h.graph += 1
            h.parameter_copies = False
        else:
            h.detached += 1
            if tuple(getattr(v, "shape", ())) not in walk.param_shapes:
                h.parameter_copies = False
    if found:
        walk.holders[key] = h
        walk.owners[key] = container
        if container is not None and kind != "attribute":
            h.length = len(container)
            if isinstance(container, collections.deque):
                h.cap = container.maxlen
    return h


def _name_holders(walk: _Walk, own: set[int], frames: list[Any]) -> None:
    """Names for the containers that hold tensors, walking up through what refers to them: a running frame's
    local, a module's global, an object's (a module's) attribute, up to ``NAME_DEPTH`` containers."""
    named = [(h, walk.owners[k]) for k, h in walk.holders.items() if h.kind != "attribute" or h.fallback]
    pending = {id(c): (h, f".{h.attr}" if h.kind == "attribute" else "") for h, c in named}
    objects = {id(c): c for h, c in named}
    del named
    for _ in range(NAME_DEPTH):
        # the running frames' locals first, even past the deadline: a dictionary lookup each, no collector pass
        for where, framework, local in frames:
            for k, v in local.items():
                entry = pending.get(id(v))
                if entry is not None and not entry[0].name and v is objects[id(v)]:
                    entry[0].name = f"local `{k}` of {where}{entry[1]}"[:NAME_CHARS]
                    entry[0].framework = entry[0].framework or framework
        pending = {k: v for k, v in pending.items() if not v[0].name}
        objects = {k: objects[k] for k in pending}
        if not pending:
            break
        if walk.clock() > walk.deadline:
            walk.cut_short = walk.cut_short or "time"
            break
        targets = list(objects.values())
        own_now = own | {id(targets), id(objects), id(pending), id(walk.owners)}
        nxt: dict[int, tuple[_Holder, str]] = {}
        nxt_objects: dict[int, Any] = {}
        for ref in gc.get_referrers(*targets):
            if id(ref) in own_now:
                continue
            for target_id, (h, path) in list(pending.items()):
                if h.name:
                    continue
                target = objects[target_id]
                name = _named_by(walk, ref, target)
                if name is not None:
                    h.name = f"{name[0]}{path}"[:NAME_CHARS]
                    h.framework = h.framework or name[1]
                    continue
                step = _step(ref, target)
                if step is not None and id(ref) not in nxt:
                    nxt[id(ref)] = (h, step + path)
                    nxt_objects[id(ref)] = ref
        pending = {k: v for k, v in nxt.items() if not v[0].name}
        objects = {k: nxt_objects[k] for k in pending}
    for h in walk.holders.values():
        if not h.name:
            h.name = h.fallback or f"an unnamed {h.kind}"
    walk.owners.clear()


def _named_by(walk: _Walk, ref: Any, target: Any) -> Optional[tuple[str, Optional[str]]]:
    """The name ``ref`` gives ``target``: a frame's local, a module's global, an object's attribute."""
    if isinstance(ref, FrameType):
        return None  # running frames are read apart (_frame_locals); a finished one names nothing
    if isinstance(ref, dict) and id(ref) in walk.module_dicts:
        for k, v in list(ref.items()):
            if v is target:
                return f"{walk.module_dicts[id(ref)]}.{k}", None
        return None
    if isinstance(ref, dict):
        module = _module_of_globals(ref)
        if module is not None:
            for k, v in list(ref.items()):
                if v is target:
                    return f"global `{k}` of {module}", _framework_of_file(str(ref.get("__file__") or ""))
        return None
    d = _instance_dict(ref)
    if d is not None and _container_kind(ref) is None:
        owner, framework = _owner(walk, ref)
        for k, v in list(d.items()):
            if v is target:
                return f"{owner}.{k}", framework
    return None


def _owner(walk: _Walk, obj: Any) -> tuple[str, Optional[str]]:
    """How the job reaches an object whose attribute holds something: a module's path, a running frame's local,
    else its class; and the package whose code holds it."""
    if id(obj) in walk.module_names:
        return walk.module_names[id(obj)], None
    local = walk.local_names.get(id(obj))
    framework = _framework_of_class(type(obj))
    if local is not None:
        return local[0], local[1] or framework
    return type(obj).__qualname__, framework


def _module_of_globals(d: dict[Any, Any]) -> Optional[str]:
    name = d.get("__name__")
    if isinstance(name, str) and "__builtins__" in d and sys.modules.get(name) is not None:
        mod = sys.modules[name]
        if getattr(mod, "__dict__", None) is d:
            return name
    return None


def _step(ref: Any, target: Any) -> Optional[str]:
    """How a container ``ref`` holds ``target`` (a key or an index), for the name's path; None: not a container."""
    kind = _container_kind(ref)
    if kind == "dict":
        for k, v in list(ref.items()):
            if v is target:
                return f"[{k!r}]"
        return None
    return "[]" if kind is not None else None


def _framework_of_file(filename: str) -> Optional[str]:
    marker = f"{os.sep}site-packages{os.sep}"
    at = filename.find(marker)
    if at < 0:
        return "torch" if f"{os.sep}torch{os.sep}" in filename else None
    top = filename[at + len(marker) :].split(os.sep, 1)[0]
    return None if top == "oomsight" or top.endswith(".py") else top


def _framework_of_class(cls: type) -> Optional[str]:
    top = (getattr(cls, "__module__", "") or "").split(".", 1)[0]
    return None if top in ("", "__main__", "builtins", "torch", "oomsight") else top


def _short(filename: str) -> str:
    parts = filename.split(os.sep)
    return os.sep.join(parts[-2:])


def _is_cache(h: _Holder) -> bool:
    owner = h.name.split(".", 1)[0].split("`")[-1]
    return "Cache" in owner or ".key_cache" in h.name or ".value_cache" in h.name or "past_key_values" in h.name


def _records(walk: _Walk, in_flight: dict[str, int]) -> list[dict[str, Any]]:
    """The holders, each storage counted once: named holders first, the largest first; a storage a named holder
    keeps is its, whatever else refers to it for the moment (the call concatenating onto it). An unnamed tuple or
    dict (a running call's arguments, a frame's own view of its locals) is the computation in flight, counted
    there with what no named holder keeps."""
    kept = sorted((h for h in walk.holders.values() if not _in_flight(h)), key=lambda h: -sum(i[1] for i in h.items))
    kept.sort(key=lambda h: h.name.startswith("an unnamed"))
    seen: set[int] = set()
    records = []
    roots = {name.split(".", 1)[0] for name in walk.module_names.values()}
    for h in kept:
        fresh = [i for i in h.items if i[0] not in seen]
        seen.update(i[0] for i in fresh)
        if not fresh:
            continue
        graph = sum(1 for i in fresh if i[2])
        records.append(
            {
                "name": h.name or f"an unnamed {h.kind}",
                "kind": "kv_cache" if _is_cache(h) else h.kind,
                "framework": h.framework,
                "graph_tensors": graph,
                "detached_tensors": len(fresh) - graph,
                "bytes": sum(i[1] for i in fresh),
                "length": h.length,
                "cap": h.cap,
                "parameter_copies": h.parameter_copies and graph == 0,
                "reached_by": _reached_by(h.name, roots),
            }
        )
    for ptr, size, _ in (i for h in walk.holders.values() if _in_flight(h) for i in h.items):
        if ptr not in seen:
            seen.add(ptr)
            in_flight["bytes"] += size
            in_flight["tensors"] += 1
    records.sort(key=lambda r: -int(r["bytes"] or 0))
    return records[:HOLDERS]


def _reached_by(name: str, roots: set[str]) -> str:
    """How the job reaches a holder, read off its name: a frame's ``local``, a ``global``, a model's ``module`` path,
    only its ``class`` (an object no name of the job's leads to), or ``none``."""
    if name.startswith("local `"):
        return "local"
    if name.startswith("global `"):
        return "global"
    if not name or name.startswith("an unnamed"):
        return "none"
    return "module" if name.split(".", 1)[0] in roots else "class"


def _in_flight(h: _Holder) -> bool:
    """A holder that is the computation in flight, not something kept: a tuple (it cannot grow: a call's
    arguments, an output pair), an unnamed dict (a call's keyword arguments, a frame's own dict of its locals) or
    a local of torch's own frames (checkpointing's unpacking, compile's and the module call's arguments)."""
    unnamed = not h.name or h.name.startswith("an unnamed")
    torch_local = h.framework == "torch" and h.name.startswith("local")
    return h.kind == "tuple" or (h.kind == "dict" and unnamed) or torch_local


def _result(
    walk: _Walk,
    modules: list[dict[str, Any]],
    in_flight: dict[str, int],
    gpu_processes: Optional[Sequence[tuple[int, Optional[int]]]],
    seconds: float,
) -> dict[str, Any]:
    graph_ptrs = {ptr: size for ptr, size, graph in walk.tensors.values() if graph}
    detached_ptrs = {ptr: size for ptr, size, graph in walk.tensors.values() if not graph}
    records = _records(walk, in_flight)
    return {
        "complete": walk.cut_short is None,
        "cut_short": walk.cut_short,
        "seconds": round(seconds, 4),
        "objects": walk.walked,
        "graph_tensors": sum(1 for _, _, g in walk.tensors.values() if g),
        "graph_bytes": sum(graph_ptrs.values()),
        "detached_tensors": sum(1 for _, _, g in walk.tensors.values() if not g),
        "detached_bytes": sum(detached_ptrs.values()),
        "in_flight_tensors": in_flight["tensors"],
        "in_flight_bytes": in_flight["bytes"],
        "holders": records,
        "modules": modules,
        "processes": processes(gpu_processes),
    }


def processes(
    gpu_processes: Optional[Sequence[tuple[int, Optional[int]]]], pid: Optional[int] = None
) -> dict[str, Any]:
    """The device's other compute processes split by the process tree: this process's descendants
    (``children``: DataLoader workers that opened CUDA, helpers it started), its parent's other descendants
    (``siblings``: the launcher's other ranks) and the rest (``others``). ``split`` is False where NVML's PIDs
    are not this process's namespace (this PID is not among them) or NVML gave no list."""
    pid = os.getpid() if pid is None else pid
    out: dict[str, Any] = {"split": False, "children": [], "siblings": [], "others": []}
    if not gpu_processes:
        return out
    pids = {p for p, _ in gpu_processes}
    if pid not in pids:
        return out
    out["split"] = True
    parent = _ppid(pid)
    for p, used in gpu_processes:
        if p == pid:
            continue
        chain = _ancestors(p)
        group = "children" if pid in chain else "siblings" if parent is not None and parent in chain else "others"
        if len(out[group]) < PROCESSES:
            out[group].append({"pid": p, "bytes": used if used is not None else -1, "name": _comm(p)})
    return out


def _ppid(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
        return int(text[text.rindex(")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _ancestors(pid: int, depth: int = 8) -> list[int]:
    chain = []
    p: Optional[int] = pid
    for _ in range(depth):
        p = _ppid(p) if p is not None else None
        if p is None or p <= 1:
            break
        chain.append(p)
    return chain


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip()[:64]
    except OSError:
        return ""
