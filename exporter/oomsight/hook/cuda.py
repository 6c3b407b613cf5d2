"""The one module that touches ``torch.cuda``, private APIs included.

Rules (``docs/architecture.md``): read-only calls never initialise CUDA; private
APIs are feature-detected with ``hasattr``/``inspect``, never by version string;
memory-history recording is turned on only if the user has not, and off only if
we turned it on. Everything here may raise; callers in the hook count and swallow.
"""

from __future__ import annotations

import inspect
import os
import pickle
from collections.abc import Mapping
from typing import Any, Callable, NamedTuple, Protocol

OomObserver = Callable[[int, int, int, int], None]
"""``(device, requested_bytes, device_total_bytes, device_free_bytes)`` as the allocator calls it."""


class Reading(NamedTuple):
    """The allocator counters the sampler keeps, from one ``_cuda_memoryStats`` call."""

    allocated_bytes: int
    reserved_bytes: int
    active_bytes: int
    requested_bytes: int
    inactive_split_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    alloc_retries: int
    ooms: int
    device_allocs: int
    device_frees: int
    allocated_total_bytes: int


def reading_from_nested(raw: Mapping[str, Any]) -> Reading:
    """Pick our counters out of the nested dict ``torch._C._cuda_memoryStats`` returns.

    ``num_device_alloc``/``num_device_free`` exist from torch 2.4 on; before, they read 0.
    """
    alloc = raw["allocated_bytes"]["all"]
    reserved = raw["reserved_bytes"]["all"]
    return Reading(
        allocated_bytes=alloc["current"],
        reserved_bytes=reserved["current"],
        active_bytes=raw["active_bytes"]["all"]["current"],
        requested_bytes=raw.get("requested_bytes", raw["allocated_bytes"])["all"]["current"],
        inactive_split_bytes=raw["inactive_split_bytes"]["all"]["current"],
        peak_allocated_bytes=alloc["peak"],
        peak_reserved_bytes=reserved["peak"],
        alloc_retries=raw.get("num_alloc_retries", 0),
        ooms=raw.get("num_ooms", 0),
        device_allocs=raw.get("num_device_alloc", 0),
        device_frees=raw.get("num_device_free", 0),
        allocated_total_bytes=alloc.get("allocated", 0),
    )


def nested_from_flat(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Rebuild the nested form from ``torch.cuda.memory_stats()``'s flat keys."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


_observer_target: list[OomObserver | None] = [None]
_trampoline_attached = False


def _trampoline(device: int, requested: int, total: int, free: int) -> None:
    target = _observer_target[0]
    if target is not None:
        target(device, requested, total, free)


class CudaApi(Protocol):
    """What the hook needs from torch; tests pass a fake fed with recorded H200 data."""

    def unavailable_reason(self) -> str | None: ...
    def is_initialized(self) -> bool: ...
    def device_count(self) -> int: ...
    def current_device(self) -> int: ...
    def read(self, device: int) -> Reading: ...
    def device_identity(self, device: int) -> tuple[str, str, int]: ...
    def on_init(self, fn: Callable[[], None]) -> bool: ...
    def attach_oom_observer(self, fn: OomObserver) -> bool: ...
    def memory_limit(self, device: int) -> int | None: ...
    def reset_peak(self, device: int) -> None: ...
    def summary(self, device: int) -> str: ...
    def backend(self) -> str: ...
    def versions(self) -> tuple[str, str]: ...
    def start_history(self, max_entries: int, mode: str) -> bool: ...
    def stop_history(self) -> None: ...
    def dump_snapshot(self, path: str) -> None: ...
    def allocation_sites(self, ptrs: list[int]) -> dict[int, str]: ...
    def largest_free_block(self, device: int) -> int | None: ...
    def in_backward(self) -> bool: ...
    def autocast_enabled(self) -> bool: ...
    def open_contexts(self) -> dict[str, bool]: ...
    def saved_tensor_hooks(self) -> str | None: ...
    def private_pools(self, device: int) -> tuple[int, int] | None: ...
    def compiled(self) -> bool: ...
    def grad_enabled(self) -> bool: ...


def expandable_segments_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the allocator config asks for expandable segments (both env names)."""
    env = os.environ if environ is None else environ
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        for option in env.get(name, "").split(","):
            key, _, value = option.partition(":")
            if key.strip() == "expandable_segments":
                return value.strip().lower() == "true"
    return False


CHECKPOINT_TYPES = frozenset({"_CheckpointFrame", "CheckpointFunctionBackward"})
"""What ``torch.utils.checkpoint`` keeps alive between a checkpointed forward and its backward
(non-reentrant, reentrant)."""


class TorchCuda:
    """:class:`CudaApi` over the real ``torch``."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.cuda = torch.cuda
        raw = getattr(torch._C, "_cuda_memoryStats", None)
        # The raw binding costs ~20 µs on an H200; memory_stats() adds ~120 µs of flattening.
        self._raw_stats: Callable[[int], Mapping[str, Any]] = raw or (
            lambda d: nested_from_flat(self.cuda.memory_stats(d))
        )

    def unavailable_reason(self) -> str | None:
        if not hasattr(self.torch, "cuda") or not hasattr(self.cuda, "is_available"):
            return f"torch {getattr(self.torch, '__version__', '?')} has no torch.cuda"
        if getattr(self.torch.version, "hip", None):
            return "ROCm builds of torch are not supported yet"
        if not self.cuda.is_available():
            return "torch.cuda.is_available() is False (no GPU visible or a CPU-only torch build)"
        return None

    def is_initialized(self) -> bool:
        return bool(self.cuda.is_initialized())

    def device_count(self) -> int:
        return int(self.cuda.device_count())

    def current_device(self) -> int:
        return int(self.cuda.current_device())

    def read(self, device: int) -> Reading:
        return reading_from_nested(self._raw_stats(device))

    def device_identity(self, device: int) -> tuple[str, str, int]:
        """(UUID as NVML and dcgm-exporter spell it, model name, capacity in bytes)."""
        props = self.cuda.get_device_properties(device)
        uuid = str(getattr(props, "uuid", "") or "")
        if uuid and not uuid.startswith(("GPU-", "MIG-")):
            uuid = "GPU-" + uuid
        return uuid, str(props.name), int(props.total_memory)

    def on_init(self, fn: Callable[[], None]) -> bool:
        """Run ``fn`` when CUDA initialises (now, if it already has). False if unsupported."""
        lazy_call = getattr(self.cuda, "_lazy_call", None)
        if lazy_call is None:
            return False
        lazy_call(fn)
        return True

    def attach_oom_observer(self, fn: OomObserver) -> bool:
        """Route the allocator's OOM observer to ``fn``. Torch has no detach, so one
        trampoline is attached per process and later calls only change its target."""
        global _trampoline_attached
        attach = getattr(self.torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None or self.backend() not in ("native", ""):
            return False  # cudaMallocAsync and pluggable allocators raise: OOMs are taken from the exception
        _observer_target[0] = fn
        if not _trampoline_attached:
            attach(_trampoline)
            _trampoline_attached = True
        return True

    def memory_limit(self, device: int) -> int | None:
        """The per-process cap set with ``set_per_process_memory_fraction``, if any."""
        get = getattr(self.cuda, "get_per_process_memory_fraction", None)
        if get is None:
            return None
        fraction = float(get(device))
        if fraction >= 1.0:
            return None
        return int(fraction * self.cuda.get_device_properties(device).total_memory)

    def reset_peak(self, device: int) -> None:
        self.cuda.reset_peak_memory_stats(device)

    def summary(self, device: int) -> str:
        return str(self.cuda.memory_summary(device, abbreviated=True))

    def backend(self) -> str:
        get = getattr(self.cuda, "get_allocator_backend", None)
        return str(get()) if get else "native"

    def versions(self) -> tuple[str, str]:
        return str(self.torch.__version__), str(getattr(self.torch.version, "cuda", "") or "")

    def start_history(self, max_entries: int, mode: str) -> bool:
        """Record allocation history with Python stacks at allocation (``mode`` ``all`` or
        ``state``); False if unsupported or already on."""
        memory = self.cuda.memory
        record = getattr(memory, "_record_memory_history", None)
        if record is None or "stacks" not in inspect.signature(record).parameters:
            return False  # torch 2.0 has only the legacy boolean form
        if any(memory._snapshot().get("device_traces") or []):
            return False  # somebody (the user) is already recording: leave theirs alone
        record(enabled=mode, context="alloc", stacks="python", max_entries=max_entries)
        return True

    def stop_history(self) -> None:
        self.cuda.memory._record_memory_history(enabled=None)

    def allocation_sites(self, ptrs: list[int]) -> dict[int, str]:
        """Where the blocks at ``ptrs`` were allocated (first user frame of the recorded Python
        stack), from the allocator's history; {} when history is off."""
        wanted = set(ptrs)
        found: dict[int, str] = {}
        for seg in self.cuda.memory._snapshot().get("segments", []):
            for block in seg.get("blocks", []):
                if block.get("address") in wanted and block.get("frames"):
                    found[block["address"]] = _user_frame(block["frames"])
        return found

    def dump_snapshot(self, path: str) -> None:
        memory = self.cuda.memory
        dump = getattr(memory, "_dump_snapshot", None)
        if dump is not None:
            dump(path)
            return
        with open(path, "wb") as fh:
            pickle.dump(memory._snapshot(), fh)


    def largest_free_block(self, device: int) -> int | None:
        """The largest cached-but-unallocated block of ``device``'s large default pool, from the
        allocator's segment snapshot (no history needed; read at an OOM only). Blocks of private pools
        (CUDA graphs, ``MemPool``) cannot serve other allocations. None if unsupported."""
        segments = self._segments(device)
        if segments is None:
            return None
        largest = 0
        for seg in segments:
            if seg.get("segment_type", "large") != "large" or _private(seg):
                continue
            for block in seg.get("blocks", []):
                if block.get("state") == "inactive" and int(block.get("size", 0)) > largest:
                    largest = int(block["size"])
        return largest

    def private_pools(self, device: int) -> tuple[int, int] | None:
        """(reserved, unallocated) bytes of ``device``'s private pools: CUDA graphs' (torch.compile's
        ``reduce-overhead``) and ``MemPool`` s, which serve only their own allocations. At an OOM only."""
        segments = self._segments(device)
        if segments is None:
            return None
        private = [seg for seg in segments if _private(seg)]
        reserved = sum(int(seg.get("total_size", 0)) for seg in private)
        return reserved, reserved - sum(int(seg.get("allocated_size", 0)) for seg in private)

    def _segments(self, device: int) -> list[dict[str, Any]] | None:
        snap = getattr(self.cuda.memory, "_snapshot", None)
        if snap is None:
            return None
        return [seg for seg in snap().get("segments", []) if seg.get("device") == device]

    def in_backward(self) -> bool:
        """True while this thread runs an autograd backward pass (the engine's graph task)."""
        task = getattr(self.torch._C, "_current_graph_task_id", None)
        return task is not None and int(task()) != -1

    def autocast_enabled(self) -> bool:
        """Whether CUDA autocast is on in this thread now (``is_autocast_enabled("cuda")`` from 2.4).
        Exact between ops (a module's forward hook); inside an op autocast wraps it reads False."""
        check = self.torch.is_autocast_enabled
        try:
            return bool(check("cuda"))
        except TypeError:
            return bool(check())

    def open_contexts(self) -> dict[str, bool]:
        """At an OOM: what the job has open now, from one scan of the garbage collector (an OOM is
        rare; the scan is not cheap). ``autocast``: an enabled CUDA autocast block is open in this
        thread. Inside an op that autocast wraps (a matmul casting its inputs) autocast excludes its
        own dispatch key while the kernel runs, so :meth:`autocast_enabled` reads False exactly
        where an OOM is most likely; the thread's nesting count says a block is open, and a live,
        enabled CUDA autocast object that it is not an ``enabled=False`` one. ``checkpointing``:
        activations saved by ``torch.utils.checkpoint`` are waiting for their backward (a
        non-reentrant checkpoint frame or a reentrant checkpoint's backward node is alive)."""
        import gc
        import sys

        found = {"autocast": self.autocast_enabled(), "checkpointing": False}
        increment = getattr(self.torch, "autocast_increment_nesting", None)
        nesting = 0
        if increment is not None:
            nesting = int(increment()) - 1
            self.torch.autocast_decrement_nesting()
        want_autocast = not found["autocast"] and nesting > 0
        want_checkpoint = f"{self.torch.__name__}.utils.checkpoint" in sys.modules
        if not (want_autocast or want_checkpoint):
            return found
        kind = self.torch.amp.autocast_mode.autocast
        for o in gc.get_objects():
            t = type(o)  # type(), not isinstance(): no lazy object's __class__ property runs
            if want_autocast and issubclass(t, kind):
                found["autocast"] |= getattr(o, "device", "") == "cuda" and bool(getattr(o, "_enabled", False))
            elif want_checkpoint and t.__name__ in CHECKPOINT_TYPES:
                found["checkpointing"] = True
        return found

    def saved_tensor_hooks(self) -> str | None:
        """What the saved-tensor hooks on in this thread are: ``checkpoint`` (non-reentrant
        activation checkpointing), ``offload`` (``save_on_cpu``: activations go to the host, nothing
        is recomputed), ``other`` (a user's hooks, which may hide either), None when none is on."""
        top = getattr(self.torch._C._autograd, "_top_saved_tensors_default_hooks", None)
        if top is None:
            return None
        try:
            hooks = top(True)
        except TypeError:
            hooks = top()
        if not hooks:
            return None
        pack = hooks[0]
        where = f"{getattr(pack, '__module__', '')}.{getattr(pack, '__qualname__', '')}"
        if "save_on_cpu" in where:
            return "offload"
        return "checkpoint" if ".utils.checkpoint" in where else "other"

    def grad_enabled(self) -> bool:
        """Whether autograd records in this thread now (False under no_grad and inference_mode)."""
        return bool(self.torch.is_grad_enabled())

    def compiled(self) -> bool:
        """Whether torch.compile has captured a graph in this process (dynamo's own counter)."""
        import sys

        dynamo = sys.modules.get(f"{self.torch.__name__}._dynamo.utils")
        counters = getattr(dynamo, "counters", None)
        return bool(counters and counters.get("stats", {}).get("unique_graphs", 0))


def _private(segment: Mapping[str, Any]) -> bool:
    """A segment of a private pool: its pool id is not the default pool's ``(0, 0)``."""
    pool = segment.get("segment_pool_id") or (0, 0)
    return tuple(pool) != (0, 0)


def _user_frame(frames: list[dict[str, Any]]) -> str:
    """The innermost frame outside torch itself: where user code asked for the memory."""
    for f in frames:
        name = str(f.get("filename", ""))
        if "/torch/" not in name and not name.startswith("<"):
            return f"{name}:{f.get('line')} in {f.get('name')}"
    f = frames[0]
    return f"{f.get('filename')}:{f.get('line')} in {f.get('name')}"
