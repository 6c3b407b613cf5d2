"""The self-contained HTML report: ``oomsight report --html FILE SPOOL_DIR``.

One file that needs no network to view: the style sheet is inline, every chart is an inline
SVG drawn by matplotlib (``oomsight.tools.chart``), and nothing refers to a script, style, font or
image elsewhere. Every string read from the spool goes through ``html.escape``: spool
content is untrusted (any process that can write the spool can write an op name).
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import logging
import os
import stat
import sys
from collections.abc import Iterator
from typing import Any, Callable

from oomsight.analysis import advice, timeline
from oomsight.analysis.inventory import EventView, Inventory, take_inventory
from oomsight.analysis.units import format_bytes as fb
from oomsight.analysis.units import format_ratio
from oomsight.tools import chart, demo, report_parts, tape
from oomsight.tools.report import claimed_share, prediction_error
from oomsight.tools.report_parts import e as _e
from oomsight.tools.report_parts import figure as _figure
from oomsight.tools.report_parts import table as _table
from oomsight.tools.report_parts import when as _when
from oomsight.wire.schema import OomEvent, Snapshot
from oomsight.wire.spool import SpoolReader, SpoolState, write_atomic

logger = logging.getLogger(__name__)

TITLE = "oomsight memory report"
CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:70em;color:#222;
padding:0 1em}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}h3{margin-bottom:.3em}
table{border-collapse:collapse;margin:.5em 0 1em}th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;
vertical-align:top}th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:.5em 0 1.5em}figcaption{color:#555;font-size:.9em}svg{max-width:100%;height:auto}
.fatal{color:#b00;font-weight:bold}.recovered{color:#070;font-weight:bold}.pending{color:#a60;font-weight:bold}
.note{color:#555}.estimate{background:#fffbe6;border-left:4px solid #e6c200;padding:.4em .8em}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:12px}nav a{margin-right:1em}
"""


@dataclasses.dataclass
class Report:
    """Everything one page is made of."""

    spool_dir: str
    state: SpoolState
    inventory: Inventory
    timelines: dict[str, list[list[Any]]]
    generated_at: float
    origin: float
    replay: tuple[str, ...] = ()
    """The lines that say the spool was written by a replay (the demo's, ``oomsight replay``'s), and how
    time was rescaled: shown above everything, so no page of a replay passes for a live run."""
    ids: Iterator[int] = dataclasses.field(default_factory=lambda: itertools.count(1))

    def chart(self, draw: Callable[..., str], *args: Any) -> str:
        """A chart as an inline ``<svg>``; a chart that cannot be drawn (numbers from the spool
        that matplotlib refuses) becomes a note instead of failing the whole report."""
        try:
            return draw(*args, f"c{next(self.ids)}")
        except (ValueError, OverflowError) as exc:
            logger.warning("oomsight report: a chart could not be drawn (%s); the page says so", exc)
            return f'<p class="note">chart not drawn: {_e(exc)}</p>'


def build(spool_dir: str, now: float, retention_seconds: float) -> str:
    """Read the spool and its timelines; return the page."""
    state = SpoolReader(spool_dir).read()
    inv = take_inventory(state, now, retention_seconds=retention_seconds)
    timelines = timeline.read_all(spool_dir, state.snapshots)
    replay = tuple(line for line in (demo.replay_label(spool_dir), tape.replayed(spool_dir)) if line)
    return render(Report(spool_dir, state, inv, timelines, now, timeline.origin(state, timelines, now), replay))


def write(path: str, page: str) -> None:
    """Write the page where the user named it, replacing nothing that is not a regular file (issue 36):
    ``-`` is standard output; a regular file (or a new one) is written atomically (a reader never sees
    half a page); a symbolic link is followed and its target written (the link stays a link); a FIFO or a
    device is written through (``/dev/null``, a pipe to a browser); anything else (a folder, a socket) is
    refused. Raises ``OSError`` on any failure (the command line says it in one line, exit 1)."""
    data = page.encode("utf-8")
    if path == "-":
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    target = os.path.realpath(path)  # a link's target; the link itself is never replaced
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = stat.S_IFREG  # a new file
    if stat.S_ISREG(mode):
        write_atomic(target, data, durable=False)
    elif stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        with open(target, "wb", buffering=0) as fh:  # no O_CREAT race: it exists, and is not replaced
            fh.write(data)
    elif stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    else:
        raise OSError(errno.EINVAL, "not a file, a FIFO or a device", path)


def render(r: Report) -> str:
    body = [*_header(r)]
    if r.inventory.readable:
        for section in (_budget, _memory, _categories, _ooms, _estimates):
            body.extend(section(r))
        body.extend(report_parts.leaks(r.state.snapshots))
        body.extend(_batch_advice(r))
        body.extend(_predictions(r))
        body.extend(report_parts.profiles(r.state.profiles))
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{_e(TITLE)}</title>\n'
        f"<style>{CSS}</style>\n</head>\n<body>\n" + "\n".join(body) + "\n</body>\n</html>\n"
    )


def _header(r: Report) -> list[str]:
    inv = r.inventory
    out = [
        f"<h1>{_e(TITLE)}{' (REPLAY)' if r.replay else ''}</h1>",
        *(f'<p class="estimate">{_e(line.strip("= "))}</p>' for line in r.replay),
        f'<p class="note">spool {_e(r.spool_dir)}; generated {_e(_when(r.generated_at))}; '
        f"{len(inv.processes)} processes, {len(inv.events)} OOM events, {len(r.state.profiles)} profiles</p>",
    ]
    if not inv.readable:
        return [*out, f"<p>spool not readable: {_e(inv.error)}</p>"]
    links = (
        ("memory", "memory over time"),
        ("categories", "by category"),
        ("ooms", "OOM events"),
        ("estimates", "remedy estimates"),
        ("profiles", "profiles"),
    )
    out.append("<nav>" + "".join(f'<a href="#{k}">{_e(v)}</a>' for k, v in links) + "</nav>")
    if not inv.processes and not inv.events:
        out.append("<p>No process wrote data: did the program use CUDA? (oomsight waits for CUDA initialisation)</p>")
    rows = [_process_row(v.snapshot, "running" if v.up else f"exited ({v.exit_reason})") for v in inv.processes]
    out.append(_table(("rank", "local rank", "pid", "host", "program", "state", "steps", "torch", "CUDA"), rows))
    skipped = {k: v for k, v in inv.skipped_total.items() if v}
    if skipped:
        out.append(f'<p class="note">skipped spool files: {_e(skipped)}</p>')
    return out


def _process_row(s: Snapshot, state: str) -> list[object]:
    p = s["process"]
    return [
        p["rank"],
        p["local_rank"],
        p["pid"],
        p.get("hostname", ""),
        p.get("argv0", ""),
        state,
        s["steps"]["count"],
        p.get("torch_version", "?"),
        p.get("cuda_version", "?"),
    ]


def _budget(r: Report) -> list[str]:
    """The GPU memory claimed through DRA against each GPU's peak, as in the text report; nothing
    without a claimed share."""
    share = claimed_share(r.inventory, r.spool_dir)
    if share is None:
        return []
    rows = [
        [uuid, fb(peak), format_ratio(share.ratio(peak)), fb(share.share_bytes), share.verdict(peak)]
        for uuid, peak in share.peaks.items()
    ]
    return [
        '<h2 id="budget">GPU memory claimed through DRA</h2>',
        f"<p>{_e(share.claims())}</p>",
        _table(("GPU", "peak reserved", "of the claimed share", "claimed share", "verdict"), rows, numeric=(1, 2, 3)),
    ]


def _memory(r: Report) -> list[str]:
    out = ['<h2 id="memory">Memory over time</h2>']
    panels = timeline.panels(r.state, r.inventory.events, r.timelines, r.origin)
    if not panels:
        return [*out, "<p>No timelines in the spool.</p>"]
    out.append(
        f'<p class="note">Time 0 is {_e(_when(r.origin))}. Allocated: bytes in live tensors; reserved: bytes the '
        "caching allocator holds; window peak: the highest sampled allocated bytes of the publish window. Long "
        f"timelines are drawn as the maximum of each of at most {chart.MAX_POINTS} intervals.</p>"
    )
    for panel in panels:
        cap = f"{panel.capacity_label} {fb(panel.capacity_bytes)}" if panel.capacity_bytes else "capacity unknown"
        out.append(_figure(r.chart(chart.memory_over_time, panel), f"{panel.title}: {cap}"))
    return out


def _categories(r: Report) -> list[str]:
    bars: list[chart.CategoryBar] = []
    for v in r.inventory.processes:
        p = v.snapshot["process"]
        for d in v.snapshot["devices"]:
            c = d.get("categories")
            if c and c["activations_bytes"] is not None:
                bars.append(_bar(f"rank {p['rank']} cuda:{d['index']}", c))
    for i, ev in enumerate(r.inventory.events, 1):
        c = ev.event.get("categories")
        if c and c["activations_bytes"] is not None:
            bars.append(_bar(f"rank {ev.event['process']['rank']} cuda:{ev.event['device']} at OOM #{i}", c))
    out = ['<h2 id="categories">Memory by category</h2>']
    if not bars:
        return [*out, "<p>No category breakdown yet (it needs an optimizer step).</p>"]
    out.append(
        _figure(
            r.chart(chart.categories, bars),
            "parameters, gradients and optimizer state are exact; activations are the peak minus those three",
        )
    )
    rows = [[b.label, *(fb(x) for x in b.parts_bytes)] for b in bars]
    out.append(_table(("", "parameters", "gradients", "optimizer state", "activations"), rows, numeric=(1, 2, 3, 4)))
    return out


def _bar(label: str, c: Any) -> chart.CategoryBar:
    parts = (c["parameters_bytes"], c["gradients_bytes"], c["optimizer_state_bytes"], c["activations_bytes"] or 0)
    return chart.CategoryBar(label, parts)


def _ooms(r: Report) -> list[str]:
    out = ['<h2 id="ooms">CUDA out-of-memory events</h2>']
    if not r.inventory.events:
        return [*out, "<p>None.</p>"]
    for i, ev in enumerate(r.inventory.events, 1):
        out.extend(_oom(r, i, ev))
    return out


def _oom(r: Report, i: int, ev: EventView) -> list[str]:
    e = ev.event
    d = e["diagnosis"]
    p = e["process"]
    outcome = ev.outcome if ev.outcome in ("fatal", "recovered", "pending") else "pending"
    facts = [
        ("requested", fb(e["requested_bytes"])),
        ("allocated", fb(e["allocated_bytes"])),
        ("reserved", fb(e["reserved_bytes"])),
        ("reserved but unallocated", _bytes(e.get("reserved_unallocated_bytes"))),
        ("inactive split", fb(e.get("inactive_split_bytes"))),
        ("free for the process", fb(e["device_free_bytes"])),
        ("total (or the process cap)", fb(e["device_total_bytes"])),
    ]
    out = [
        f"<h3>OOM #{i}: rank {_e(p['rank'])} (local {_e(p['local_rank'])}) cuda:{_e(e['device'])}, "
        f"step {_e(e.get('step', '?'))}, {_e(_when(e['time']))}: "
        f'<span class="{outcome}">{_e(ev.outcome.upper())}</span></h3>',
        f"<p><b>cause: {_e(d['cause'])}</b>: {_e(d['summary'])}</p>",
        "<ol>" + "".join(f"<li>{_e(x)}</li>" for x in d["remedies"]) + "</ol>",
        _table(("at the OOM", "bytes"), facts, numeric=(1,)),
    ]
    out.extend(_oom_details(e))
    fp = advice.at_oom(e)
    if fp is not None:
        out.append("<h4>What a remedy would save at this OOM (estimates)</h4>")
        out.extend(_estimate_block(r, fp, d["cause"]))
    return out


def _oom_details(e: OomEvent) -> list[str]:
    """The stack, the allocator's own summary and the memory snapshot's name, when recorded."""
    out = []
    stack = e.get("stack")  # not checked by the schema: anything may be here
    if isinstance(stack, list) and stack:
        frames = "\n".join(str(x) for x in stack)
        out.append(f"<details><summary>stack ({len(stack)} frames)</summary><pre>{_e(frames)}</pre></details>")
    if e.get("allocator_summary"):
        out.append(f"<details><summary>allocator summary</summary><pre>{_e(e['allocator_summary'])}</pre></details>")
    if e.get("snapshot_artifact"):
        out.append(
            f"<p>memory snapshot: <code>{_e(e['snapshot_artifact'])}</code> in the spool's artifacts/ "
            "(open it in pytorch.org/memory_viz)</p>"
        )
    return out


def _estimates(r: Report) -> list[str]:
    out = ['<h2 id="estimates">What a remedy would save (estimates)</h2>', f'<p class="note">{_e(ESTIMATE_NOTE)}</p>']
    found = False
    for v in r.inventory.processes:
        p = v.snapshot["process"]
        for d in v.snapshot["devices"]:
            events = timeline.events_on(r.state.events, (p["rank"], p["local_rank"], d["index"]))
            fp = advice.of_device(d, events)
            if fp is None:
                continue
            found = True
            if events:
                out.append(f"<p>rank {_e(p['rank'])} cuda:{_e(d['index'])}: see its OOM above.</p>")
                continue
            cause = "leak" if v.snapshot.get("leak") else ""
            out.append(f"<h3>rank {_e(p['rank'])} cuda:{_e(d['index'])}, latest breakdown</h3>")
            out.extend(_estimate_block(r, fp, cause))
    return out if found else [*out, "<p>No category breakdown to estimate from.</p>"]


ESTIMATE_NOTE = (
    "Estimates from a simple model, not measurements: the peak is parameters + gradients + optimizer state + "
    "activations + other, each remedy changes one of them as its assumption says, and 'other' stays. A peak "
    f"fits below the capacity minus a margin of {advice.Assumptions().margin_ratio:.0%}. torch.compile is "
    "never credited with a saving: measure it."
)


def _estimate_block(r: Report, fp: advice.Footprint, cause: str) -> list[str]:
    found = advice.estimate_all(fp)
    choice = advice.choose(fp, found, cause=cause)
    rows = [
        [
            e.title,
            fb(e.peak_bytes) if e.peak_bytes is not None else "measure it",
            fb(e.saving_bytes) if e.saving_bytes is not None else "not estimated",
            {True: "yes", False: "no", None: "?"}[e.fits] if choice.judged else "not judged",
            e.assumption,
            e.cost,
        ]
        for e in found
    ]
    out = [
        f'<p class="estimate">peak {fb(fp.peak_bytes)}, capacity {fb(fp.capacity_bytes)}, target '
        f"{fb(choice.target_bytes)}: {_e(choice.message)}</p>",
        _table(("remedy", "estimated peak", "saving", "fits", "assumption", "cost"), rows, numeric=(1, 2)),
    ]
    if choice.excess_bytes > 0:  # a chart of bars far below the target says nothing
        out.append(r.chart(chart.estimates, fp.peak_bytes, found, choice.target_bytes, choice.judged))
    return out


def _batch_advice(r: Report) -> list[str]:
    out: list[str] = []
    for s in r.state.snapshots:
        b = s.get("batch_advice")
        if not b:
            continue
        out.append(f"<h3>rank {_e(s['process']['rank'])} cuda:{_e(b['device'])} ({_e(b['source'])})</h3>")
        out.append(
            f"<p>Largest batch that keeps {format_ratio(b['margin_ratio'])} of {fb(b['capacity_bytes'])} free: "
            f"<b>{_e(b['max_batch_size'])}</b> (fit: {fb(b['fixed_bytes'])} + {fb(b['bytes_per_sample'])} per "
            f"sample, {len(b['points'])} points, {_e(_when(b['measured_at']))})</p>"
        )
        out.append(r.chart(chart.batch_fit, b))
    return ["<h2 id='batch'>Batch size advice</h2>", *out] if out else []


def _predictions(r: Report) -> list[str]:
    """Predicted against measured peaks, for the devices whose job carries a prediction."""
    rows = []
    for v in r.inventory.processes:
        for d in v.snapshot["devices"]:
            p, a = d.get("prediction"), d["allocator"]
            if not p:
                continue
            errors = [
                prediction_error(p["peak_allocated_bytes"], a["peak_allocated_bytes"]),
                prediction_error(p.get("peak_reserved_bytes"), a["peak_reserved_bytes"]),
            ]
            shown = [f"{100 * e:+.1f} %" if e is not None and v.snapshot["steps"]["count"] else "n/a" for e in errors]
            label = f"rank {v.snapshot['process']['rank']} cuda:{d['index']}"
            rows.append([label, p.get("model") or p["source"], fb(p["peak_allocated_bytes"]),
                         fb(a["peak_allocated_bytes"]), shown[0], fb(p.get("peak_reserved_bytes")),
                         fb(a["peak_reserved_bytes"]), shown[1]])  # fmt: skip
    if not rows:
        return []
    head = ("", "prediction", "predicted allocated", "measured", "error", "predicted reserved", "measured", "error")
    note = (
        '<p class="note">Predicted by oomsight predict on the CPU and carried by the job; measured: torch\'s '
        "lifetime peaks. Error: (predicted - measured) / measured, negative where the prediction was too low.</p>"
    )
    return ["<h2 id='prediction'>Predicted vs measured peak</h2>", note, _table(head, rows, (2, 3, 4, 5, 6, 7))]


def _bytes(value: object) -> str:
    """Bytes of a field the schema does not check: "n/a" unless it is a number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return fb(value)
    return "n/a"
