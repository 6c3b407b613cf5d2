"""Charts of the HTML report, drawn with matplotlib and returned as inline SVG.

The only module that imports matplotlib (the optional extra ``oomsight[report]``). It uses
``Figure`` objects with the Agg canvas, never pyplot: no global state, no display needed.
Charts carry only text made here (numbers, ranks, our own labels), never strings read from
the spool, so nothing untrusted reaches matplotlib's text or mathtext parser.
"""

from __future__ import annotations

import dataclasses
import io
import math
import re
from collections.abc import Sequence
from typing import Any, Optional

import matplotlib
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from oomsight.analysis.advice import Estimate
from oomsight.analysis.timeline import MemoryPanel, Segment
from oomsight.wire.schema import BatchAdvice

GIB = float(1 << 30)
MAX_POINTS = 600
"""A line is drawn from at most this many points; longer timelines are cut into buckets and
each bucket drawn as its maximum, so no peak disappears."""
OFF_SCALE = 3.0
"""A capacity more than this many times the highest value is written in the title, not drawn."""
COLORS = {
    "allocated": "#1f77b4",
    "reserved": "#ff7f0e",
    "window_peak": "#2ca02c",
    "capacity": "#d62728",
    "oom": "#d62728",
    "profile": "#9467bd",
}
CATEGORY_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd")
_STYLE: dict[Any, Any] = {"svg.fonttype": "none", "svg.hashsalt": "oomsight", "font.size": 9.0}


@dataclasses.dataclass
class CategoryBar:
    label: str
    parts_bytes: tuple[int, int, int, int]
    """parameters, gradients, optimizer state, activations."""


def to_svg(fig: Figure, chart_id: str) -> str:
    """The figure as an ``<svg>`` element for inline use, its ids prefixed with ``chart_id``
    so that several charts in one page never share an id."""
    FigureCanvasAgg(fig)
    buf = io.StringIO()
    with matplotlib.rc_context({**_STYLE, "svg.hashsalt": chart_id}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None, "Format": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r'\bid="([^"]+)"', rf'id="{chart_id}-\1"', text)
    text = text.replace('href="#', f'href="#{chart_id}-').replace("url(#", f"url(#{chart_id}-")
    return re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)


def envelope(xs: Sequence[float], ys: Sequence[float], max_points: int = MAX_POINTS) -> tuple[list[float], list[float]]:
    """At most ``max_points`` points: each bucket of consecutive points as its last x and its maximum y."""
    if len(xs) <= max_points:
        return list(xs), list(ys)
    size = math.ceil(len(xs) / max_points)
    out_x, out_y = [], []
    for start in range(0, len(xs), size):
        out_x.append(xs[min(start + size, len(xs)) - 1])
        out_y.append(max(ys[start : start + size]))
    return out_x, out_y


def memory_over_time(panel: MemoryPanel, chart_id: str) -> str:
    """Allocated, reserved and window-peak bytes over time, the capacity, OOMs and profiling windows."""
    with matplotlib.rc_context(_STYLE):
        fig = _figure(8.0, 2.8)
        ax = fig.subplots()
        top = _lines(ax, panel.segments)
        title = panel.title
        cap = panel.capacity_bytes
        if cap and cap <= OFF_SCALE * max(top, 1.0):
            ax.axhline(cap / GIB, color=COLORS["capacity"], linewidth=1.0, label=panel.capacity_label)
        elif cap:
            title += f"  ({panel.capacity_label} {cap / GIB:.1f} GiB, off scale)"
        for n, (start, end) in enumerate(panel.windows):
            ax.axvspan(start, end, color=COLORS["profile"], alpha=0.2, label="profiling" if n == 0 else None)
        for n, (at, label) in enumerate(panel.ooms):
            ax.axvline(at, color=COLORS["oom"], linestyle=":", linewidth=1.5, label="OOM" if n == 0 else None)
            ax.annotate(
                label, (at, 0.03), xycoords=("data", "axes fraction"), color=COLORS["oom"], rotation=90, ha="right"
            )
        ax.set_title(title, loc="left")
        _finish_xy(ax, "seconds since the first sample", "GiB")
        return to_svg(fig, chart_id)


def _lines(ax: Axes, segments: list[Segment]) -> float:
    """Draw every segment's three lines (labelled once); return the highest value drawn."""
    top = 0.0
    for i, seg in enumerate(segments):
        for key, values in (
            ("allocated", seg.allocated_bytes),
            ("reserved", seg.reserved_bytes),
            ("window_peak", seg.window_peak_bytes),
        ):
            xs, ys = envelope(seg.seconds, values)
            top = max([top, *ys])
            style = "--" if key == "window_peak" else "-"
            label = key.replace("_", " ") if i == 0 else None
            ax.plot(xs, [y / GIB for y in ys], style, color=COLORS[key], label=label, linewidth=1.2)
    return top


def categories(bars: list[CategoryBar], chart_id: str) -> str:
    with matplotlib.rc_context(_STYLE):
        fig = _figure(8.0, 0.6 + 0.45 * len(bars))
        ax = fig.subplots()
        names = ("parameters", "gradients", "optimizer state", "activations")
        labels = [b.label for b in bars]
        left = [0.0] * len(bars)
        for i, name in enumerate(names):
            widths = [b.parts_bytes[i] / GIB for b in bars]
            ax.barh(labels, widths, left=left, color=CATEGORY_COLORS[i], label=name)
            left = [x + w for x, w in zip(left, widths)]
        ax.invert_yaxis()
        ax.set_xlabel("GiB")
        ax.grid(axis="x", alpha=0.3)
        _legend(ax)
        return to_svg(fig, chart_id)


def estimates(peak_bytes: int, found: list[Estimate], target_bytes: int, judged: bool, chart_id: str) -> str:
    """The peak now and after each estimated remedy, against the target (capacity minus margin).
    Bars are green where the estimate fits, orange where not, grey where not judged (a leak)."""
    with matplotlib.rc_context(_STYLE):
        shown = [e for e in found if e.peak_bytes is not None]
        labels = ["now", *(e.title for e in shown)]
        values = [peak_bytes / GIB, *((e.peak_bytes or 0) / GIB for e in shown)]
        colors = ["#7f7f7f", *(_fit_color(e.fits if judged else None) for e in shown)]
        fig = _figure(8.0, 0.6 + 0.35 * len(labels))
        ax = fig.subplots()
        ax.barh(labels, values, color=colors)
        label = "estimated peak, GiB"
        if target_bytes <= OFF_SCALE * max([*values, 1e-9]) * GIB:
            ax.axvline(target_bytes / GIB, color=COLORS["capacity"], linewidth=1.0, label="capacity minus margin")
            _legend(ax)
        else:
            label += f" (capacity minus margin {target_bytes / GIB:.1f} GiB, off scale)"
        ax.invert_yaxis()
        ax.set_xlabel(label)
        ax.grid(axis="x", alpha=0.3)
        return to_svg(fig, chart_id)


def _fit_color(fits: Optional[bool]) -> str:
    return {True: "#2ca02c", False: "#ff7f0e", None: "#9ecae1"}[fits]


def batch_fit(advice: BatchAdvice, chart_id: str) -> str:
    """Measured (batch size, peak) points, the fitted line and the largest batch that keeps the margin."""
    with matplotlib.rc_context(_STYLE):
        points = [p for p in advice["points"] if len(p) >= 2 and math.isfinite(p[0]) and math.isfinite(p[1])]
        top = max([advice["max_batch_size"], *(p[0] for p in points), 1])
        fig = _figure(6.0, 2.6)
        ax = fig.subplots()
        ax.plot([p[0] for p in points], [p[1] / GIB for p in points], "o", color=COLORS["allocated"], label="measured")
        line_x = [0.0, float(top)]
        line_y = [(advice["fixed_bytes"] + advice["bytes_per_sample"] * x) / GIB for x in line_x]
        ax.plot(line_x, line_y, "-", color=COLORS["window_peak"], label="fit")
        limit = advice["capacity_bytes"] * (1 - advice["margin_ratio"]) / GIB
        ax.axhline(limit, color=COLORS["capacity"], linewidth=1.0, label="capacity minus margin")
        ax.axvline(advice["max_batch_size"], color="#7f7f7f", linestyle=":", label="largest batch that fits")
        _finish_xy(ax, "batch size", "peak GiB")
        return to_svg(fig, chart_id)


def _finish_xy(ax: Axes, xlabel: str, ylabel: str) -> None:
    """Labels, a y axis from zero, a light grid and the legend of a line chart."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _legend(ax)


def _legend(ax: Axes) -> None:
    """The legend to the right of the plot, where it hides no data."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)


def _figure(width_inches: float, height_inches: float) -> Figure:
    return Figure(figsize=(width_inches, height_inches), layout="constrained")
