"""The prose ``oomsight predict`` prints without ``--json``: the prediction's lines, then the lines of what
the job asked beside it (``--generate``, ``--gpu``, ``--parallel``, the searches, the cheapest change that
fits), from the dict ``orchestration.result`` returns and ``--json`` prints as it is."""

from __future__ import annotations

from typing import Any

from oomsight.analysis.units import format_bytes


def _named_sizes(sizes: dict[str, int]) -> str:
    """``parameters 3.23 MiB, buffers 128 B, ...``: each name with its size, in the dict's order."""
    return ", ".join(f"{k.replace('_', ' ')} {format_bytes(v)}" for k, v in sizes.items())


def job_lines(result: dict[str, Any]) -> list[str]:
    """The lines of --generate, --gpu and --parallel."""
    lines = []
    gen = result.get("generate")
    if gen:
        window = gen.get("sliding_window")
        lines.append(
            f"generating {gen['new_tokens']} tokens after a {gen['prompt_tokens']}-token prompt, {gen['cache']} cache: "
            f"the cache holds {format_bytes(gen['kv_cache_bytes_at_the_end'])} at the end (in temporaries above)"
            + (f"; its sliding-window layers keep {window:,} tokens" if window else "")
        )
    g = result.get("gpu")
    if g:
        outside = _named_sizes(g["outside_allocator_bytes"])
        lines.append(
            f"{g['name']}: {format_bytes(g['total_bytes'])}, compute capability "
            f"{g['capability'][0]}.{g['capability'][1]} ({g['attention_kernel']}); "
            f"less {outside}: {format_bytes(g['usable_bytes'])} for the allocator"
        )
    par = result.get("parallel")
    if par:
        parts = _named_sizes(par["parts_bytes"])
        lines.append(
            f"{par['parallel']} over {par['world_size']} ranks: peak allocated per rank "
            f"{format_bytes(par['per_rank_peak_allocated_bytes'])} ({parts}); peak reserved "
            f"{format_bytes(par['per_rank_peak_reserved_bytes'])}"
        )
        lines.extend(f"note: {note}" for note in par.get("notes", []))
        if "fits" in par:
            lines.append(f"per rank its peak reserved {'fits' if par['fits'] else 'does not fit'} "
                         f"{format_bytes(par['usable_bytes'])} (the GPU less context, NCCL, margin)")  # fmt: skip
        search = result.get("largest_batch_per_rank")
        if search:
            lines.append(f"largest micro-batch per rank that fits: {search['max_batch_size']} "
                         f"({len(search['tried'])} predictions)")  # fmt: skip
        if "gpus_needed" in par:
            needed = par["gpus_needed"]
            traces = f" ({par['gpus_needed_traces']} traced counts)" if "gpus_needed_traces" in par else ""
            none = "GPUs needed: no count of these GPUs fits this job"
            lines.append(f"GPUs needed: {needed}{traces}" if needed else none)
    return lines


def text(result: dict[str, Any]) -> str:
    """The lines of a result, joined: the prediction, then the job's, then the changes tried."""
    p = result["prediction"]
    if "rank" in p:  # a traced rank of a sharded job: the per-rank lines say it all
        lines = job_lines(result)
        par = result["parallel"]
        lines.insert(1 if result.get("gpu") else 0, f"traced: {par['traced']}; the peak falls in the {par['moment']}")
        return "\n".join([*lines, *change_lines(result)])
    lines = [
        f"batch {p['batch_size']}, {p['steps']} steps: peak allocated {format_bytes(p['peak_allocated_bytes'])}, "
        f"peak reserved {format_bytes(p['peak_reserved_bytes'])}"
        + (" (expandable segments)" if p["expandable_segments"] else ""),
        "at the peak: " + _named_sizes(p["by_category_bytes"]),
        f"(workspace: {p['workspace_handles']} cuBLAS handle(s) of {format_bytes(p['workspace_bytes'])} "
        "each, forward and backward, and cuBLASLt's own; a category at 0 has nothing alive at the peak)",
        "per step: " + ", ".join(format_bytes(v) for v in p["step_peak_allocated_bytes"]),
    ]
    lines.extend(job_lines(result))
    search = result.get("largest_batch")
    if search:
        lines.append(
            f"largest batch under {format_bytes(search['capacity_bytes'])} with {search['margin']:.0%} kept free: "
            f"{search['max_batch_size']} ({len(search['tried'])} predictions, {search['seconds']:.0f} s)"
        )
    lines.extend(change_lines(result))
    lines.append(f"(predicted in {p['seconds']:.1f} s on the CPU; docs/prediction.md says how and how well)")
    return "\n".join(lines)


def change_lines(result: dict[str, Any]) -> list[str]:
    """The cheapest change that fits, and the changes tried before it."""
    found = result.get("changes")
    if not found:
        return []
    budget = format_bytes(found["budget_bytes"])

    def said(t: dict[str, Any]) -> str:
        results = "changes results" if t["changes_results"] else "results unchanged"
        margin = " (within the GPU, not its margin)" if t.get("within_capacity") and not t["fits"] else ""
        return f"{t['flags']} ({t['why']}; {results}): peak reserved {format_bytes(t['peak_reserved_bytes'])}{margin}"

    cheapest = found["cheapest"]
    lines = [f"does not fit {budget} as given; " + (f"the cheapest change that fits: {said(cheapest)}" if cheapest
             else "no single change tried fits")]  # fmt: skip
    lines.extend(f"  tried: {said(t)}" for t in found["tried"] if t is not cheapest and not t["fits"])
    return lines
