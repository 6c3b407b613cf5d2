"""How the job lays out its model's memory in this process (:class:`Layout`), from one walk that composes
the three concerns of the hook's model accounting: ``hook/discovery.py`` finds the modules, their parameters
and the optimizers behind wrappers; ``hook/accounting.py`` counts every parameter, gradient and optimizer
state by the local storage that holds it (its rules are written there); ``hook/parallelism.py`` names the
parallelism in use. How each layout is counted: ``docs/memory-layout.md``.

Only attribute reads: nothing here launches a kernel or communicates. Pure of the hook's state:
:func:`measure` takes the root modules and the optimizers and returns a :class:`Layout`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from oomsight.hook import accounting, discovery, parallelism


@dataclasses.dataclass
class Layout:
    devices: dict[int, accounting.Totals]
    dtypes: dict[str, int]
    """Parameter bytes by dtype name (``float32``, ``bfloat16``)."""
    frozen_modules: list[str]
    parallelism: dict[str, Any]
    adapters: bool

    def states(self, device: int) -> dict[str, Any]:
        totals = self.devices.get(device, accounting.Totals())
        return {**totals.as_states(), "frozen_modules": list(self.frozen_modules)}


def measure(torch: Any, roots: Iterable[Any], optimizers: Iterable[Any], device_type: str = "cuda") -> Layout:
    """The layout of ``roots`` (the outermost live modules) and ``optimizers``, per device of ``device_type``.
    A wrapping optimizer is counted through the one it wraps (:func:`discovery.delegates`)."""
    roots = list(roots)
    chains = [discovery.delegates(opt) for opt in optimizers]
    optimizers = list({id(o): o for chain in chains for o in chain}.values())
    innermost = list({id(chain[-1]): chain[-1] for chain in chains}.values())
    named = discovery.named_parameters(roots, optimizers)  # one walk of the module trees, reused below
    modules = [m for root in roots for m in discovery.modules_of(root)] if parallelism.distributed(torch) else []
    counted = accounting.count(torch, named, modules, optimizers, innermost=innermost, device_type=device_type)
    return Layout(
        devices=counted.devices,
        dtypes=counted.dtypes,
        frozen_modules=accounting.frozen_modules(roots, named, counted.trains),
        parallelism=parallelism.detect(torch, roots, modules, counted.kinds, optimizers),
        adapters="adapters" in counted.kinds,
    )
