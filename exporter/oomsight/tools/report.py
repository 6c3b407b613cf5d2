"""The text memory report of ``oomsight run`` and ``oomsight report DIR``."""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Mapping
from typing import Any, Optional

from oomsight.analysis import advice
from oomsight.analysis.inventory import EventView, Inventory, ProcessView
from oomsight.analysis.units import format_bytes as fb
from oomsight.analysis.units import format_ratio
from oomsight.metrics.family import headroom_bytes, non_torch_bytes
from oomsight.wire import budget as budget_doc
from oomsight.wire.budget import Budget
from oomsight.wire.schema import DeviceSnapshot, OomEvent


def render(inv: Inventory, spool_dir: str, title: str = "oomsight memory report") -> str:
    lines = [f"== {title} ==", f"spool: {spool_dir}"]
    if not inv.readable:
        lines.append(f"spool not readable: {inv.error}")
        return "\n".join(lines) + "\n"
    if not inv.processes and not inv.events:
        lines.append("no process wrote data: did the program use CUDA? (oomsight waits for CUDA initialisation)")
    for view in inv.processes:
        lines.extend(_process(view))
    lines.extend(_budget(inv, spool_dir))
    if inv.events:
        lines.append("")
        lines.append(f"CUDA out-of-memory events: {len(inv.events)}")
        for i, ev in enumerate(inv.events, 1):
            lines.extend(_event(i, ev, spool_dir))
    skipped = {k: v for k, v in inv.skipped_total.items() if v}
    if skipped:
        lines.append("skipped spool files: " + ", ".join(f"{k} {v}" for k, v in sorted(skipped.items())))
    return "\n".join(lines) + "\n"


def _process(view: ProcessView) -> list[str]:
    s = view.snapshot
    p = s["process"]
    state = "running" if view.up else f"exited ({view.exit_reason})"
    steps = s["steps"]
    mean = ""
    if steps["count"] > 1 and steps["duration_seconds_total"] > 0:
        mean = f", mean {1000 * steps['duration_seconds_total'] / (steps['count'] - 1):.1f} ms/step"
    out = [
        "",
        f"rank {p['rank']} (local rank {p['local_rank']}, world {p.get('world_size', 1)}) "
        f"pid {p['pid']} {p.get('argv0', '')}: {state}; {steps['count']} optimizer steps{mean}",
        f"  torch {p.get('torch_version', '?')} CUDA {p.get('cuda_version', '?')}, allocator "
        f"{p.get('allocator_backend', '?')}, expandable_segments "
        f"{'on' if p.get('expandable_segments') else 'off'}",
        *_layout(s.get("job")),
    ]
    for d in s["devices"]:
        out.extend(_device(d))
        out.extend(_predicted(d, steps["count"]))
    off = [k for k, ok in sorted(s.get("sources", {}).items()) if not ok]
    if off:
        out.append(f"  sources off: {', '.join(off)}")
    if s.get("errors"):
        out.append("  hook errors (swallowed): " + ", ".join(f"{k} {v}" for k, v in sorted(s["errors"].items())))
    return out


@dataclasses.dataclass(frozen=True)
class ClaimedShare:
    """The GPU memory the pod claimed through DRA (the sidecar's ``sidecar/dra-budget.json``) against
    the peak its processes reserved on each GPU (docs/alerts.md). Both reports show it."""

    budgets: list[Budget]
    share_bytes: int
    """The smallest claimed share: a claim names a DRA device, not the GPU UUID a process runs on."""
    peaks: dict[str, int]
    """Peak reserved bytes by GPU UUID, summed over the pod's processes on that GPU."""

    def ratio(self, peak: int) -> Optional[float]:
        return peak / self.share_bytes if self.share_bytes else None

    def verdict(self, peak: int) -> str:
        if peak > self.share_bytes:
            return "over the share (memory promised to the GPU's other claims)"
        return "within the share"

    def claims(self) -> str:
        """``<claim> (<pool>/<device>) <bytes>`` for each claim, as both reports name them."""
        return ", ".join(f"{b.claim} ({b.dra_device}) {fb(b.memory_bytes)}" for b in self.budgets)


def claimed_share(inv: Inventory, spool_dir: str) -> Optional[ClaimedShare]:
    """The claimed share and the peaks set against it; None without a claimed share."""
    budgets = budget_doc.read(spool_dir)
    if not budgets:
        return None
    peaks: dict[str, int] = {}
    for view in inv.processes:
        for d in view.snapshot["devices"]:
            peaks[d["uuid"]] = peaks.get(d["uuid"], 0) + d["allocator"]["peak_reserved_bytes"]
    return ClaimedShare(budgets, min(b.memory_bytes for b in budgets), dict(sorted(peaks.items())))


def _budget(inv: Inventory, spool_dir: str) -> list[str]:
    """The claimed share's lines; none without one."""
    share = claimed_share(inv, spool_dir)
    if share is None:
        return []
    out = ["", f"GPU memory claimed through DRA: {share.claims()}"]
    for uuid, peak in share.peaks.items():
        out.append(
            f"  {uuid}: peak reserved {fb(peak)}, {format_ratio(share.ratio(peak))} of the claimed "
            f"{fb(share.share_bytes)}, {share.verdict(peak)}"
        )
    return out


def _device(d: DeviceSnapshot) -> list[str]:
    a = d["allocator"]
    nv = d["nvml"]
    total: Optional[int] = nv["total_bytes"] if nv else d.get("total_bytes") or None
    outside = non_torch_bytes(d)
    limit = d.get("limit_bytes")
    headroom = headroom_bytes(d, peak=a["peak_reserved_bytes"])
    capacity = limit or total
    share = headroom / capacity if headroom is not None and capacity else None
    lines = [
        f"  cuda:{d['index']} {d.get('name', '')} {d['uuid']}  capacity {fb(total)}"
        + (f", process cap {fb(limit)} (set_per_process_memory_fraction)" if limit else ""),
        f"    peak allocated {fb(a['peak_allocated_bytes'])}, "
        f"peak reserved {fb(a['peak_reserved_bytes'])}, "
        f"headroom at peak {fb(headroom)} ({format_ratio(share)})",
        f"    now allocated {fb(a['allocated_bytes'])}, reserved {fb(a['reserved_bytes'])}; fragmentation: "
        f"reserved but unallocated {fb(a['reserved_bytes'] - a['allocated_bytes'])}, inactive split "
        f"{fb(a['inactive_split_bytes'])}",
        f"    non-PyTorch memory of the process {fb(outside)}"
        + (_outside_basis(d) if outside is not None else " (NVML unavailable)"),
        f"    cudaMalloc retries {a['alloc_retries']}, allocator OOMs {a['ooms']}",
    ]
    c = d.get("categories")
    if c:
        lines.append(
            f"    by category: parameters {fb(c['parameters_bytes'])}, gradients {fb(c['gradients_bytes'])}, "
            f"optimizer state {fb(c['optimizer_state_bytes'])}, activations {fb(c['activations_bytes'])} "
            f"(from the {c['basis'].replace('_', ' ')})"
        )
        layout: Mapping[str, Any] = c
        parts = [f"{fb(layout.get(key))} {label}" for key, label in LAYOUT_PARTS if layout.get(key)]
        if parts:
            frozen = ", ".join(layout.get("frozen_modules") or [])
            lines.append(f"    of these: {', '.join(parts)}" + (f"; frozen models: {frozen}" if frozen else ""))
    return lines


LAYOUT_PARTS = (
    ("frozen_parameters_bytes", "frozen parameters"),
    ("adapter_parameters_bytes", "adapters"),
    ("quantized_parameters_bytes", "quantised"),
    ("gradient_buckets_bytes", "DDP bucket copies"),
    ("untrained_gradients_bytes", "gradients of untrained parameters"),
)
"""The parts of a snapshot's categories worth a line when they are there (wire 1.6)."""


def _layout(job: Optional[Mapping[str, Any]]) -> list[str]:
    """The parallelism in use, as the hook found it in the live modules (wire 1.6)."""
    par = (job or {}).get("parallelism")
    if not par or par.get("strategy") in (None, "none"):
        return []
    details = [f"{k.replace('_', ' ')} {v}" for k in LAYOUT_DETAILS if (v := par.get(k)) is not None]
    line = f"  parallelism: {par['strategy']} over {par.get('world_size')} ranks"
    return [line + (f" ({', '.join(details)})" if details else "")]


LAYOUT_DETAILS = ("zero_stage", "sharding", "shard_size", "reshard_after_forward", "gradient_as_bucket_view", "offload")


def prediction_error(predicted: Optional[int], measured: int) -> Optional[float]:
    """``(predicted - measured) / measured``: negative when the prediction was too low (as in
    docs/prediction.md); None without a prediction or a measured peak."""
    return None if predicted is None or measured <= 0 else (predicted - measured) / measured


def _predicted(d: DeviceSnapshot, steps: int) -> list[str]:
    """Predicted against measured peaks, where the job carries a prediction."""
    p = d.get("prediction")
    if not p:
        return []
    a = d["allocator"]
    about = ", ".join(
        x for x in (p["source"], p.get("model"), f"batch {p['batch_size']}" if p.get("batch_size") else None) if x
    )
    pairs: list[tuple[str, Optional[int], int]] = [("allocated", p["peak_allocated_bytes"], a["peak_allocated_bytes"])]
    if p.get("peak_reserved_bytes") is not None:
        pairs.append(("reserved", p.get("peak_reserved_bytes"), a["peak_reserved_bytes"]))
    parts = []
    for what, predicted, measured in pairs:
        error = prediction_error(predicted, measured) if steps else None
        judged = f"error {100 * error:+.1f} %" if error is not None else "no optimizer step measured yet"
        parts.append(f"peak {what} predicted {fb(predicted)}, measured {fb(measured)}: {judged}")
    return [f"    prediction ({about}): " + "; ".join(parts)]


def _outside_basis(d: DeviceSnapshot) -> str:
    nv = d["nvml"]
    if nv and nv["process_visible"] and nv["process_used_bytes"] is not None:
        return " (NVML process entry minus reserved)"
    return " (device used minus reserved: includes other processes on this GPU)"


def _event(i: int, ev: EventView, spool_dir: str) -> list[str]:
    e = ev.event
    d = e["diagnosis"]
    when = datetime.datetime.fromtimestamp(e["time"], datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    lines = [
        f"  #{i} {when} rank {e['process']['rank']} cuda:{e['device']} step {e['step']}: "
        f"requested {fb(e['requested_bytes'])}, {_room(e)}, allocated {fb(e['allocated_bytes'])}, reserved "
        f"{fb(e['reserved_bytes'])} -> {ev.outcome.upper()}",
        f"     cause: {d['cause']}: {d['summary']}",
    ]
    lines.extend(f"     remedy: {r}" for r in d["remedies"])
    if e.get("snapshot_artifact"):
        path = os.path.join(spool_dir, "artifacts", str(e["snapshot_artifact"]))
        lines.append(f"     memory snapshot: {path} (open in https://pytorch.org/memory_viz)")
    fp = advice.at_oom(e)
    if fp is not None:
        lines.extend(_estimates(fp, d["cause"]))
    return lines


def _room(e: OomEvent) -> str:
    """Free memory and what it is out of. Under ``set_per_process_memory_fraction`` the
    allocator reports the cap as the total, and the device can have more free than that."""
    free, total = e["device_free_bytes"], e["device_total_bytes"]
    if free > total:
        return f"process cap {fb(total)} (set_per_process_memory_fraction), {fb(free)} free on the device"
    return f"free {fb(free)} of {fb(total)}"


def _estimates(fp: advice.Footprint, cause: str) -> list[str]:
    """The remedies estimated to fit (``oomsight.analysis.advice``); ``--html`` shows every estimate."""
    choice = advice.choose(fp, advice.estimate_all(fp), cause=cause)
    lines = [f"     estimate (peak {fb(fp.peak_bytes)}, target {fb(choice.target_bytes)}): {choice.message}"]
    lines.extend(
        f"       {e.title}: peak about {fb(e.peak_bytes)}, saves {fb(e.saving_bytes)} (assumes {e.assumption})"
        for e in choice.fitting
    )
    return lines
