"""What the job already does, detected cheaply and rarely, so advice never repeats it.

Once early (after the third optimizer step) and then every ``interval_seconds``, one
*detection window* spans one optimizer step: a global module forward hook and a
post-accumulate-grad hook on one parameter are registered at a step boundary and removed
at the next. In between they see

- autocast: a module's forward ran with CUDA autocast on;
- activation checkpointing: a module's forward ran *inside* a backward pass (recomputation,
  reentrant or not);
- gradient accumulation: backward passes through the parameter per optimizer step;
- ``set_to_none``: the parameter's ``.grad`` was ``None`` at the first forward after a step;
- activation offload: a module's forward ran under ``save_on_cpu``'s saved-tensor hooks;
- the models: the outermost modules called (the trained model, a frozen teacher, a reference
  or reward model), whose parameters, trainable and frozen, the step tracker then measures.

``torch.compile`` is read from dynamo's own counter, the parameters' dtype from the
optimizers, ``expandable_segments`` from the allocator config. Outside a window nothing
runs. A value stays ``None`` until it was seen.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from oomsight.hook.cuda import CudaApi
from oomsight.hook.errors import ErrorBook

FIRST_WINDOW_STEP = 3
INTERVAL_SECONDS = 600.0


class JobProbe:
    def __init__(
        self,
        cuda: CudaApi,
        errors: ErrorBook,
        expandable_segments: bool,
        interval_seconds: float = INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cuda = cuda
        self.errors = errors
        self.interval = interval_seconds
        self.clock = clock
        self.setup: dict[str, Any] = {
            "autocast": None,
            "param_dtype": None,
            "checkpointing": None,
            "accumulation_steps": None,
            "compiled": None,
            "set_to_none": None,
            "expandable_segments": expandable_segments,
            "optimizers": [],
            "activation_offload": None,
            "parallelism": None,
            "adapters": None,
        }
        self.roots: list[Any] = []
        """The outermost modules called in the last window (taken by the step tracker)."""
        self._handles: list[Any] = []
        self._next = -1.0
        self._seen: Optional[dict[str, Any]] = None

    def due(self, step: int) -> bool:
        """Cheap, at every step boundary: whether :meth:`on_step` has a window to close or open."""
        return self._seen is not None or (step >= FIRST_WINDOW_STEP and self.clock() >= self._next)

    def on_step(self, torch: Any, step: int, optimizers: list[Any], param_dtype: Optional[str]) -> None:
        """At a step boundary where :meth:`due`: close an open window, maybe open the next."""
        if self._seen is not None:
            with self.errors.guard("job_probe"):
                self._close()
        if step < FIRST_WINDOW_STEP or self.clock() < self._next:
            return
        self._next = self.clock() + self.interval
        with self.errors.guard("job_probe"):
            self.setup["optimizers"] = sorted({type(o).__name__ for o in optimizers})
            self.setup["param_dtype"] = param_dtype
            self.setup["compiled"] = self.cuda.compiled()
            self._open(torch, optimizers)

    def _open(self, torch: Any, optimizers: list[Any]) -> None:
        seen: dict[str, Any] = {
            "calls": 0, "autocast": False, "recompute": False, "backwards": 0, "grad_none": None,
            "offload": False, "depth": 0, "roots": {},
        }
        self._seen = seen
        param = _first_trainable(optimizers)

        def pre_hook(module: Any, args: Any) -> None:
            if seen["depth"] == 0:
                seen["roots"][id(module)] = module
            seen["depth"] += 1

        def forward_hook(module: Any, args: Any, output: Any) -> None:
            seen["depth"] = max(seen["depth"] - 1, 0)
            seen["calls"] += 1
            if seen["calls"] == 1 and param is not None:
                seen["grad_none"] = param.grad is None
            if not seen["autocast"] and self.cuda.autocast_enabled():
                seen["autocast"] = True
            if not seen["recompute"] and self.cuda.in_backward():
                seen["recompute"] = True
            if not seen["offload"] and self.cuda.saved_tensor_hooks() == "offload":
                seen["offload"] = True

        hooks = torch.nn.modules.module
        self._handles.append(hooks.register_module_forward_pre_hook(pre_hook))
        self._handles.append(hooks.register_module_forward_hook(forward_hook))
        if param is not None and hasattr(param, "register_post_accumulate_grad_hook"):

            def grad_hook(_p: Any) -> None:
                seen["backwards"] += 1

            self._handles.append(param.register_post_accumulate_grad_hook(grad_hook))
            seen["counting"] = True

    def _close(self) -> None:
        seen, self._seen = self._seen, None
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if seen is None or not seen["calls"]:
            return  # no module forward in the window (not an nn.Module job): nothing learned
        self.setup["autocast"] = seen["autocast"]
        self.setup["checkpointing"] = seen["recompute"]
        self.setup["activation_offload"] = seen["offload"]
        self.roots = list(seen["roots"].values())
        if seen["grad_none"] is not None:
            self.setup["set_to_none"] = seen["grad_none"]
        if seen.get("counting") and seen["backwards"]:
            self.setup["accumulation_steps"] = seen["backwards"]

    def stop(self) -> None:
        """Remove an open window's hooks without learning from it (the hook stops: no step will close it)."""
        self._seen = None
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()

    def snapshot(self) -> dict[str, Any]:
        return dict(self.setup)


def _first_trainable(optimizers: list[Any]) -> Any:
    for opt in optimizers:
        for group in getattr(opt, "param_groups", []):
            for p in group.get("params", []):
                if getattr(p, "requires_grad", False):
                    return p
    return None


def dominant_dtype(byte_counts: dict[str, int]) -> Optional[str]:
    """The dtype holding the most parameter bytes (``float32``, ``bfloat16``, ...)."""
    if not byte_counts:
        return None
    return max(byte_counts.items(), key=lambda kv: kv[1])[0]
