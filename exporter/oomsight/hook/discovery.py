"""Finding what the layout walk measures: the live models (every ``nn.Module`` no other module holds, found
through the garbage collector in bounded time, held by weak reference), the modules and parameters of each,
the parameters a module holds as an optimizer sees them, and the optimizers behind a wrapping optimizer.

Only attribute reads (and one ``gc.get_objects()`` per scan): nothing here launches a kernel.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Callable, Optional

from oomsight.hook.parallelism import fsdp_params

DELEGATE_ATTRIBUTES = ("optim", "optimizer", "_optimizer", "base_optimizer", "inner_optimizer")
"""Where an optimizer that wraps another keeps it: ``ZeroRedundancyOptimizer.optim``, Accelerate's
``AcceleratedOptimizer.optimizer``, Lightning's ``LightningOptimizer._optimizer``, SAM's
``base_optimizer``, ..."""
DELEGATE_DEPTH = 4


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


def modules_of(root: Any) -> Iterator[Any]:
    modules = getattr(root, "modules", None)
    if modules is not None:
        yield from modules()


def named_parameters(roots: list[Any], optimizers: list[Any]) -> list[tuple[Any, str, Any]]:
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
        found += [fp.sharded_param for fp in fsdp_params(m) if getattr(fp, "sharded_param", None) is not None]
    return found


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
