"""The parts of the HTML report that stand alone: escaping, tables and figures, and the
sections read straight off the spool's documents (leak findings, profiles). Every string read
from the spool goes through ``e`` (``html.escape``): spool content is untrusted."""

from __future__ import annotations

import datetime
import html
from collections.abc import Sequence

from oomsight.analysis.units import format_bytes as fb
from oomsight.wire.schema import Profile, ProfileOp, Snapshot

LEAK_COLUMNS = ("rank", "step", "tensors with a graph", "their bytes", "floor growth", "allocated at")
OP_COLUMNS = ("operator", "calls", "self CUDA memory", "self CUDA time", "CUDA time (with children)", "CPU time")


def e(value: object) -> str:
    return html.escape(str(value), quote=True)


def when(t: float) -> str:
    try:
        return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return str(t)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], numeric: Sequence[int] = ()) -> str:
    """A table; every cell escaped. ``numeric`` columns are right-aligned."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=num' if i in numeric else ''}>{e(c)}</td>" for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{e(caption)}</figcaption></figure>"


def leaks(snapshots: Sequence[Snapshot]) -> list[str]:
    """Tensors that survived an optimizer step with their autograd graph, per snapshot that found some."""
    rows = []
    for s in snapshots:
        leak = s.get("leak")
        if leak:
            sites = "; ".join(str(x) for x in leak["sites"]) or "(record history to see them)"
            growth = fb(leak.get("growth_bytes"))
            p = s["process"]
            rows.append([p["rank"], leak["step"], leak["graph_tensors"], fb(leak["graph_bytes"]), growth, sites])
    if not rows:
        return []
    return [
        "<h2 id='leak'>Leak findings</h2>",
        "<p>Tensors that survived an optimizer step still holding their autograd graph.</p>",
        table(LEAK_COLUMNS, rows, numeric=(1, 2, 3, 4)),
    ]


def profiles(found: Sequence[Profile]) -> list[str]:
    """Every profiling window: its top operators by self CUDA memory and by self CUDA time."""
    out = ['<h2 id="profiles">Profiles: top operators</h2>']
    if not found:
        return [*out, "<p>No profiles in the spool.</p>"]
    for prof in sorted(found, key=lambda x: (x["started_at"], x["process"]["rank"])):
        out.extend(profile(prof))
    return out


def profile(prof: Profile) -> list[str]:
    p = prof["process"]
    duration = prof["ended_at"] - prof["started_at"]
    out = [
        f"<h3>rank {e(p['rank'])} cuda:{e(prof['device'])}, request {e(prof['request_id'])}: steps "
        f"{e(prof['start_step'] + 1)} to {e(prof['start_step'] + prof['steps'])}</h3>",
        f"<p>{e(when(prof['started_at']))}, {e(f'{duration:.2f}')} s; peak allocated "
        f"{fb(prof['peak_allocated_bytes'])}</p>",
        "<p>By self CUDA memory</p>",
        ops_table(prof["top_by_memory"]),
    ]
    if prof.get("cuda_time", True):
        out += ["<p>By self CUDA time</p>", ops_table(prof["top_by_time"])]
    else:
        out.append("<p>A memory-only window: CUDA time was not traced.</p>")
    artifacts = [x for x in (prof.get("table_artifact"), prof.get("trace_artifact")) if x]
    if artifacts:
        out.append("<p>in the spool's artifacts/: " + ", ".join(f"<code>{e(a)}</code>" for a in artifacts) + "</p>")
    return out


def ops_table(ops: list[ProfileOp]) -> str:
    rows = [
        [
            op["op"],
            op["calls"],
            fb(op["self_cuda_memory_bytes"]),
            us(op["self_cuda_time_us"]),
            us(op["cuda_time_us"]),
            us(op["cpu_time_us"]),
        ]
        for op in ops
    ]
    return table(OP_COLUMNS, rows, numeric=(1, 2, 3, 4, 5))


def us(value: float) -> str:
    return f"{value / 1000:,.3f} ms"
