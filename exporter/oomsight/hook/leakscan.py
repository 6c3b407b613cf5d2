"""Finding tensors that survive an optimizer step still holding their autograd graph —
the classic leak of ``outputs.append(model(x))`` or ``total_loss += loss``.

Runs in the training thread at a step boundary (the only moment the answer means
something), and only when the between-steps floor of allocated memory has been rising
(``diagnosis.leak_growth``), at most once every few minutes: ``gc.get_objects()``
costs tens of milliseconds in a large program.
"""

from __future__ import annotations

import collections
import gc
import time
from collections.abc import Mapping
from typing import Any, Callable, Optional, cast

from oomsight.analysis import findings as census_findings
from oomsight.analysis.units import format_bytes
from oomsight.wire.documents import CensusHolder
from oomsight.wire.schema import LeakFinding

SITES = 5
OWN_STEP_GRAPHS = 4
"""Tensors with a graph that a loop keeps past its step of its own: the last step's ``loss``, ``outputs``
and the like stay bound to their names until the next forward rebinds them. More are a pile."""


def scan(torch: Any, step: int, growth: Optional[int], sites_of: Callable[[list[int]], dict[int, str]]) -> LeakFinding:
    """Count CUDA tensors alive with a ``grad_fn``; group them by where they came from.

    ``sites_of`` maps storage pointers to allocation sites (Python stacks recorded by the
    allocator history), or returns {} when history is off; then the groups are named by
    the autograd node, dtype and shape that produced them.
    """
    groups: dict[tuple[str, str], list[int]] = collections.defaultdict(lambda: [0, 0])
    seen: set[int] = set()
    ptrs: list[int] = []
    total = count = 0
    tensor = torch.Tensor
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance reads __class__, which some lazy proxies override
        if not issubclass(type(obj), tensor) or obj.grad_fn is None or not obj.is_cuda:
            continue
        storage = obj.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        ptrs.append(ptr)
        size = storage.nbytes()
        count += 1
        total += size
        key = (type(obj.grad_fn).__name__, f"{str(obj.dtype).replace('torch.', '')} {tuple(obj.shape)}")
        groups[key][0] += 1
        groups[key][1] += size
    located = sites_of(ptrs) if ptrs else {}
    return LeakFinding(
        checked_at=time.time(),
        step=step,
        graph_tensors=count,
        graph_bytes=total,
        growth_bytes=growth,
        sites=_describe(groups, located),
    )


def with_census(finding: LeakFinding, taken: Optional[Mapping[str, Any]]) -> LeakFinding:
    """The scan with what the census saw holding tensors outside the model states (``hook.census``): the holders
    by name, and a bounded one (a ``deque`` with a ``maxlen``) that holds at least half of the rise, with what it
    holds at its cap: the same veto the diagnosis applies at an OOM (``analysis.findings.bounded_holder``)."""
    holders = [h for h in (taken or {}).get("holders") or [] if isinstance(h, Mapping)]
    if not holders:
        return finding
    out = LeakFinding(**finding)
    out["holders"] = cast(list[CensusHolder], holders)
    # one the job names, as the diagnosis reads them
    h = census_findings.bounded_holder(census_findings.named(holders), finding.get("growth_bytes"))
    if h is not None and int(h.get("length") or 0) > 0:
        out["bounded_by"] = str(h.get("name"))
        out["bounded_cap_bytes"] = int(h.get("bytes") or 0) * int(h["cap"]) // int(h["length"])
    return out


BOUNDED_SLACK = 0.1
"""A rise this share past the bounded holder's bytes at its cap is no longer explained by it: the flag returns."""


def bounded(finding: Optional[Mapping[str, Any]], growth: float) -> bool:
    """Whether a rise of ``growth`` stays within the cap of the bounded holder the last scan named."""
    cap = (finding or {}).get("bounded_cap_bytes")
    return cap is not None and 0 < growth <= int(cap) * (1 + BOUNDED_SLACK)


def _describe(groups: dict[tuple[str, str], list[int]], located: dict[int, str]) -> list[str]:
    by_site = collections.Counter(located.values())
    if by_site:
        return [f"{site} ({n} tensors)" for site, n in by_site.most_common(SITES)]
    top = sorted(groups.items(), key=lambda kv: kv[1][1], reverse=True)[:SITES]
    return [f"{node} {what} x{n} = {format_bytes(size)}" for (node, what), (n, size) in top]


def message(finding: LeakFinding) -> str:
    """The warning of a scan, said as what it found: tensors piling with their graphs (a leak, keep nothing
    alive), or none beyond the last step's own: what grew is kept without a graph, and a buffer filling to
    its cap rises as a leak does until it stays (the flag then clears)."""
    n, growth = finding["graph_tensors"], finding["growth_bytes"]
    head = (
        f"oomsight: memory between steps grew by {format_bytes(growth or 0)}; {n} CUDA tensors hold an autograd "
        f"graph past the step ({format_bytes(finding['graph_bytes'])})"
    )
    sites = "; ".join(finding["sites"][:3])
    if finding.get("bounded_by"):
        return (
            f"{head}. The census saw the rise held by {finding.get('bounded_by')}, a buffer with a cap "
            f"({format_bytes(finding.get('bounded_cap_bytes') or 0)} when full): no leak while the rise stays within it"
        )
    named = [h for h in finding.get("holders") or [] if int(h.get("graph_tensors") or 0) > 0]
    if named:
        sites = f"held by {named[0].get('name')} ({named[0].get('graph_tensors')} tensors with a graph)" + (
            f"; {sites}" if sites else ""
        )
    if n > OWN_STEP_GRAPHS:
        return f"{head}. Likely a leak of tensors kept with their graph (keep .item() or .detach()): {sites}"
    return (
        f"{head}, no more than a loop keeps of its last step: what grew is kept without a graph (a buffer, "
        "a cache, detached tensors). A leak if it never stops; a buffer with a cap stops rising and the flag "
        f"clears{': ' + sites if sites else ''}"
    )
