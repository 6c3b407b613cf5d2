"""The optimizers ``oomsight predict`` builds, and their implementations (issue 51).

torch's AdamW, Adam and SGD run one of three implementations, chosen by their ``foreach`` and
``fused`` arguments (``torch/optim/adamw.py``, ``_default_to_fused_or_foreach``); each makes different
temporaries during ``optimizer.step()``, and the trace sees them because it runs the real code:

- ``foreach`` (``foreach=True``, CUDA's default where ``foreach`` is left unset): list-wide temporaries,
  ``_foreach_sqrt`` of every ``exp_avg_sq`` at once, then divided in place: one copy of the whole parameter
  list (AdamW; SGD's momentum is updated in place);
- ``fused`` (``fused=True``): nothing; one kernel updates parameter, ``exp_avg`` and ``exp_avg_sq`` in place
  (its ``step`` counters live on the device, 4 B each);
- ``for-loop`` (``foreach=False``): one parameter's temporaries at a time, ``exp_avg_sq.sqrt()`` and its
  division out of place: two copies of the largest parameter.

None of the three changes what the job computes (the same update, to rounding). A lighter state
(``--optimizer adamw8bit``, ``sgd``) does: it is a different optimizer.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

IMPLEMENTATIONS = ("foreach", "fused", "for-loop")
"""``--optimizer-impl``'s choices; None (not given) is torch's default on CUDA: ``foreach``."""
TORCH_OPTIMIZERS = ("adamw", "sgd")
"""The ``--optimizer`` choices that are torch's own, so take ``foreach=``/``fused=``."""
IMPL_ARGUMENTS: dict[str, dict[str, Any]] = {
    "foreach": {"foreach": True},
    "fused": {"fused": True},
    "for-loop": {"foreach": False},
}
"""The keyword arguments of torch's optimizers that select each implementation."""
SGD_MOMENTUM = 0.9
"""``--optimizer sgd``: SGD with momentum (one state tensor a parameter), as the benchmarks train it."""


def factory(name: str, impl: Optional[str] = None) -> Callable[[Any], Any]:
    """``params -> Optimizer`` for ``--optimizer name --optimizer-impl impl``; ``impl`` None leaves
    ``foreach`` unset, which the trace turns into CUDA's default (``emulation.prepare_optimizer``)."""
    import torch

    if name == "adamw8bit":
        from oomsight.predict import adapter

        return adapter.AdamW8bit
    chosen: dict[str, Any] = IMPL_ARGUMENTS.get(impl or "", {})
    if name == "sgd":
        return functools.partial(torch.optim.SGD, lr=0.01, momentum=SGD_MOMENTUM, **chosen)
    return functools.partial(torch.optim.AdamW, **chosen) if chosen else torch.optim.AdamW


def check(name: str, impl: Optional[str]) -> Optional[str]:
    """What is wrong with ``--optimizer-impl`` for ``--optimizer``, in one line, or None."""
    if impl is not None and name not in TORCH_OPTIMIZERS:
        return (
            f"--optimizer-impl applies to torch's optimizers ({', '.join(TORCH_OPTIMIZERS)}); "
            f"{name} has one implementation"
        )
    return None
