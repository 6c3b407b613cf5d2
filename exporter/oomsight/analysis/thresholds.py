"""Every number the diagnosis rules use: one table, each row with its unit and the reason it has
its value (``docs/diagnosis.md`` prints it: :func:`markdown`).

The rules read a number when they run (:func:`value`, :func:`count`), never a copy taken at
import, so :func:`moved` can move one number for a while: ``tests/test_thresholds.py`` moves each
by -25 % and +25 % and re-judges the recorded corpus and held-out tapes. A row whose ``sensitive``
text is set moves a verdict there; the text says which and why the number stands (the known
limit is written down in ``docs/diagnosis.md``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

MIB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Threshold:
    value: float
    unit: str
    reason: str
    used_by: str
    """The modules whose rules read it (``analysis.<module>``, comma-separated)."""
    integer: bool = False
    """A count (rows, steps, readings): moved by at least one."""
    sensitive: str = ""
    """Non-empty where moving it by 25 % changes a verdict on the recorded tapes: which, and why
    the value stands."""


TABLE: dict[str, Threshold] = {
    # --- the step rows (analysis.trend) -------------------------------------------------------
    "warmup_steps": Threshold(
        2, "optimizer steps", "the first optimizer.step() allocates the optimizer state and the second may "
        "still allocate lazily (DDP rebuilds its buckets after iteration 1): rows of these steps are skipped",
        "trend", integer=True,
    ),
    "min_rows": Threshold(
        6, "rows", "the fewest rows after warm-up whose line fit keeps 4 degrees of freedom; with fewer, only "
        "the short-series rule judges, and only at an OOM", "trend", integer=True,
        sensitive="at 4 rows (-25 %) the held-out gpt2_debug_keeps_attentions_fast, a leak, is flagged from its "
        "step rows before it runs out (a right flag, earlier; no false one). Fewer rows make the line fit's bar "
        "(4 + 48/2 = 28 standard errors at 4 rows) the only guard against noise: 6 stays",
    ),
    "recent_rows": Threshold(
        12, "rows", "the recent window judged for a leak that starts late and for growing peaks; the larger "
        "windows are 2, 4 and 8 times it (a leak in stairs every few steps)", "trend", integer=True,
    ),
    "rise_share": Threshold(
        0.8, "share of consecutive rows", "a leak keeps something from every step, so the floor rises at "
        "almost every row; one row in five may fall back (what the loop keeps across the boundary varies)",
        "trend",
    ),
    "growth_share": Threshold(
        0.02, "share of capacity", "a leak must have grown by min(growth_bytes, this share): below, it is "
        "noise of what the loop keeps, not what fills the GPU", "trend",
    ),
    "growth_bytes": Threshold(
        256 * MIB, "bytes", "half of what one NCCL communicator takes (544-688 MB observed) and less than a "
        "CUDA context (300-600 MB): a rise smaller than either cannot decide an OOM, a larger one can",
        "trend",
    ),
    "transient_share": Threshold(
        0.5, "share of the floor's growth", "a leak raises the floor, not the step's own memory (peak - "
        "floor): that may grow by less than half the floor's rise (a larger input raises both)", "trend",
    ),
    "release_share": Threshold(
        0.5, "share of the floor's range before", "a floor that falls back by half of what it rose (and by half a "
        "leak's least growth) was released by the job (metric buffers reset each epoch, a cache emptied): what rose "
        "before was not kept, and a rise since is a leak only beyond what the job released", "trend",
    ),
    "release_moves": Threshold(
        6.0, "median moves of the floor", "... and by this many times the floor's median move from row to row: "
        "noise of what the loop keeps across the boundary (a variable batch's outputs) falls back this far about "
        "once in a million rows; an epoch of 7 or more rows releases that much (shorter epochs never fill a "
        "window judged for a leak without a fall in it)", "trend",
    ),
    "plateau_share": Threshold(
        0.05, "share of the floor's growth", "a new high of the floor counts when it is above the last one by "
        "this much: a buffer that filled to its cap sets none for recent_rows rows (and twice its longest wait "
        "while it rose), a leak sets one every few rows or in stairs of its own period", "trend",
    ),
    "growing_share": Threshold(
        0.6, "share of consecutive rows", "peaks that rise at most rows of the recent window: growing input "
        "(batches, sequences) varies, so fewer rows than a leak's rise", "trend",
    ),
    "clean_t": Threshold(
        4.0, "standard errors", "a floor rising at almost every row must also fit a rising line this far "
        "above zero: noise rises at 4 rows of 5 now and then, never along a line", "trend",
    ),
    "few_rows_t": Threshold(
        48.0, "standard errors x degrees of freedom", "added to both t bars over the rows' degrees of freedom (the "
        "clean bar is 16 for 6 rows, 8.8 for 12, 5.2 for 42): Student's t has heavy tails at few of them", "trend",
    ),
    "noisy_t": Threshold(
        6.0, "standard errors", "a floor that does not rise at almost every row is a leak only with a "
        "steeper fit and its lowest value rising through each third", "trend",
    ),
    "short_min_rows": Threshold(
        3, "rows", "at an OOM within a few steps, two rises of the floor are the least that shows a "
        "steady amount kept per step", "trend", integer=True,
    ),
    "short_growth_share": Threshold(
        0.05, "share of capacity", "a short series is a leak only when its rise is large enough to have "
        "caused the OOM by itself within a few steps", "trend",
    ),
    "short_steady_ratio": Threshold(
        0.3, "smallest rise / largest rise", "a leak keeps about the same every step; a warm-up or a "
        "growing input rises by uneven amounts", "trend",
    ),
    "outside_growth_bytes": Threshold(
        256 * MIB, "bytes", "memory outside the allocator that rose by this much along the step rows is a "
        "leak of its own: half of one NCCL communicator, less than a CUDA context, so a communicator or an "
        "extension's buffer made per step shows within a few steps (not only at 25 % of the GPU)", "trend",
    ),
    # --- the time-to-OOM forecast (analysis.forecast) -----------------------------------------------
    "forecast_min_points": Threshold(
        4, "points", "the fewest points a forecast line is fitted through (2 degrees of freedom for its "
        "residual): a demand's running peak sets a new high at fewer rows than a leak's floor rises", "forecast",
        integer=True,
    ),
    "forecast_interval_t": Threshold(
        3.0, "standard errors", "the earliest plausible time takes the slope and the line's level this far "
        "above their fit: a one-sided 95 % bound at 3 degrees of freedom (2.35), widened because a floor's "
        "noise is correlated from step to step (what the loop keeps varies by batch), which the standard "
        "error of independent residuals understates", "forecast",
    ),
    "forecast_spans": Threshold(
        24, "spans of steps", "over hours the hook's rows are dense at the end and ever sparser before (its "
        "older half thinned again and again): the forecast also judges the rows averaged over this many equal "
        "spans of steps, so a slow leak under the recent rows' noise still shows, with two windows of "
        "recent_rows", "forecast", integer=True,
    ),
    "forecast_min_earliest_share": Threshold(
        0.2, "share of the slope's upper bound", "a slope below a fifth of the upper end of its interval says "
        "the rows cannot tell how fast memory rises within a factor of five: no forecast (too_noisy) rather "
        "than a page on noise. Headroom inside the noise band is not this: its earliest time is near 0 "
        "and pages", "forecast",
    ),
    "stair_jump_share": Threshold(
        0.5, "share of the largest rise", "a rise at least half the largest one is a jump of a stair; "
        "smaller rises between jumps are noise of what the loop keeps", "forecast",
    ),
    "forecast_crossing_sd": Threshold(
        8.0, "standard deviations", "the median time of the first crossing sums each step's chance to cross "
        "from where the line stands this far below the limit: a step crosses there once in 10^15", "forecast",
    ),
    "forecast_crossing_slices": Threshold(
        400, "slices", "the median time of the first crossing sums the steps' chances in this many slices of "
        "the band where a step may cross (forecast_crossing_sd of the floor's noise and the outliers' rise): "
        "50 a standard deviation, within a few percent of summing step by step, at every scrape",
        "forecast", integer=True,
    ),
    "forecast_outlier_sd": Threshold(
        4.0, "standard deviations", "a new lifetime peak this far above the line plus the most a step rose "
        "above its floor is an outlier (a long sample, padding to it): the floor's noise reaches 4 standard "
        "deviations about once in 30,000 steps. The median time of the first crossing counts them per step "
        "seen", "forecast",
    ),
    "forecast_central_error": Threshold(
        0.5, "share of the time left", "a central time is said only where it can be right to within this "
        "much (abs(central / truth - 1)): the bar the forecast is judged by (issue 37: p90 of the error at most "
        "50 %); the OOM of a noisy series is a first crossing of its noise, which no line can time closer",
        "forecast",
    ),
    "forecast_central_share": Threshold(
        0.9, "chance", "... with at least this chance by the series' own noise, outliers and line error (the "
        "bar's p90); below it no central time (too_noisy), while the earliest time, which the alert reads, "
        "stands", "forecast",
    ),
    "forecast_line_draws": Threshold(
        9, "draws", "the line's own error at the crossing (normal, from its fit) and the outliers' rate "
        "(log-normal) are each taken at this many equal-chance values when the chance of a central time within "
        "the bar is summed: 7 or 11 draws move at most one of 400 generated central times", "forecast",
        integer=True,
    ),
    "stair_jump_noise": Threshold(
        4.0, "standard deviations", "every jump of a stair stands this many standard deviations of the "
        "other row-to-row changes above them: the noise of a floor (what the loop keeps varies by batch) "
        "has its own largest rises, which are no stairs (its largest of 24 changes is about 2.5 of them)",
        "forecast",
    ),
    "stair_min_jumps": Threshold(
        2, "jumps", "two jumps give one interval: the least that says when the next comes", "forecast",
        integer=True,
    ),
    "stair_rise_share": Threshold(
        0.8, "share of the whole rise", "stairs rise by their jumps: at least this much of the rise is in "
        "jumps at no more than a third of the rows (a steady leak spreads it over most rows)", "forecast",
    ),
    "stair_overdue": Threshold(
        3.0, "usual intervals", "a running peak that rose in stairs still rises while its last jump is "
        "within this many usual intervals: a curriculum that reached its last stage, or a steady load's "
        "ever rarer records, stops being a growing demand", "forecast",
    ),
    # --- sampled readings between steps (analysis.trend) ---------------------------------------
    "pile_min_readings": Threshold(
        8, "readings", "0.8 s of the 10 Hz sampler: fewer readings cannot show four quarters rising",
        "trend", integer=True,
    ),
    "pile_min_seconds": Threshold(
        3.0, "seconds", "in a process that never stepped, nothing tells one long forward from many; three "
        "seconds of rising lows is many forwards of any model that fits", "trend, evidence",
    ),
    "pile_step_times": Threshold(
        3.0, "step times", "after optimizer steps memory must keep rising for this many step times: a "
        "forward takes less than one step (and the hook rows forwards again after such a pause)", "evidence",
    ),
    "pile_after_steps_seconds": Threshold(
        1.0, "seconds", "... and for at least this long (ten sampler readings)", "evidence",
    ),
    "kept_share": Threshold(
        0.10, "of capacity", "tensors outside the model states that the census finds held by a container, a module "
        "attribute or a framework's buffer decide the OOM when they hold at least this share of the capacity: "
        "freeing them makes room for a step's worth of activations; below it they are named, not blamed",
        "findings",
    ),
    "pile_consumed_multiple": Threshold(
        4.0, "x the most forwards one backward consumed", "forwards recording a graph since the last backward "
        "are a leak only beyond this many times what this job's own backwards have consumed together: a step "
        "that sums its micro-batch losses, a REINFORCE episode or a truncated-BPTT window keeps its graphs until "
        "its backward, and the next may be longer than any before (a longer episode); an evaluation that keeps "
        "every batch's graph grows without a backward", "trend, evidence",
    ),
    "forwards_churn": Threshold(
        2.0, "x the lifetime peak", "forwards ran before the failing one when the bytes allocated in the "
        "last seconds reach twice the peak (allocated and freed again and again); loading a model "
        "allocates its weights once", "trend",
    ),
    "forwards_quiet_seconds": Threshold(
        1.0, "seconds", "the failing forward's own rise is left out of the earlier forwards' peak", "trend",
    ),
    "falls_back_share": Threshold(
        0.01, "share of the readings' rise", "a fall smaller than this is the sampler's noise, not a "
        "forward freeing its temporaries", "trend",
    ),
    "falls_back_count": Threshold(
        3, "falls", "forwards free their temporaries again and again; a model loading only rises",
        "trend", integer=True,
    ),
    # --- the OOM rules (analysis.evidence, analysis.diagnosis) ----------------------------------
    "outside_share": Threshold(
        0.25, "share of capacity", "memory outside this process's allocator (or of other processes) this "
        "large is the cause whatever the job's own need: several NCCL communicators and contexts", "diagnosis",
    ),
    "outside_large_bytes": Threshold(
        2 * 1024 * MIB, "bytes", "this process's memory outside its allocator above what a CUDA context "
        "(300-600 MB) and one NCCL communicator (544 MB to 1.6 GB observed) take: several communicators, NVLS "
        "buffers or a library's pool, the cause when the job's own need fits beside a context alone",
        "diagnosis",
    ),
    "context_bytes": Threshold(
        600 * MIB, "bytes", "what a CUDA context takes at most (300-600 MB, by architecture and lazy loading): "
        "memory outside the allocator that no remedy removes", "diagnosis",
    ),
    "decisive_share": Threshold(
        0.05, "share of capacity", "other processes holding less are still the cause when the job's own "
        "known need fits the GPU without them", "diagnosis",
    ),
    "oversized_share": Threshold(
        0.5, "share of usable bytes", "a request more than half of what the process could use cannot be "
        "served by any arrangement of the rest", "diagnosis",
    ),
    "fragmentation_share": Threshold(
        0.05, "share of capacity", "cached-free bytes below this are the allocator's normal rounding and "
        "small-pool slack, not the cause", "diagnosis",
    ),
    "private_pool_share": Threshold(
        0.05, "share of capacity", "bytes reserved in private pools (CUDA graphs, MemPool) below this are "
        "a graph's own working set, not what starved the default pool", "diagnosis",
    ),
    "model_states_share": Threshold(
        0.7, "share of capacity", "parameters, gradients and optimizer state above this leave activations "
        "too little room for any activation remedy to help", "diagnosis",
        sensitive="at 0.875 (+25 %) issue 43's gpt2_frozen_base_lora_no_room (states ~80 % of its GPU) is told "
        "activations, checkpointing first, and gpt2_progressive_unfreezing_adamw (out in optimizer.step()) the "
        "fused optimizer first: 0.7 sees both as the states they are",
    ),
    "frozen_dominant_share": Threshold(
        0.5, "share of the model states", "frozen weights that are most of the model states are what a "
        "remedy must shrink (a quantised or offloaded base), not the trained part", "diagnosis",
    ),
    "light_optimizer_state_ratio": Threshold(
        0.1, "x the parameter bytes", "Adafactor's factored second moment is a few % of the parameters; 10 % "
        "covers its row/column statistics and small tensors kept whole", "diagnosis",
    ),
    "demand_margin": Threshold(
        0.1, "share of the earlier steps' own memory", "the failing step outgrew earlier ones when its own "
        "memory exceeds theirs by more than the allocator's rounding and the sampler's miss", "evidence",
    ),
    "demand_slack_share": Threshold(
        0.01, "share of capacity", "... plus this much (steps that need almost nothing of their own)",
        "evidence, diagnosis",
    ),
    "forwards_margin": Threshold(
        0.25, "share of the earlier forwards' peak", "a 10 Hz reading misses a forward's short-lived peak "
        "by up to this much", "diagnosis",
    ),
}


_moved: dict[str, float] = {}


SHAPES: dict[str, tuple[tuple[float, ...], str]] = {
    "trend._analyse": ((5,), "a full step row has 5 columns (the wire's columns)"),
    "trend.leak_in": ((2, 4, 8), "the windows judged are 1, 2, 4 and 8 x recent_rows (its row says so)"),
    "trend._leak_growth": ((2, 3), "a line fit's degrees of freedom (n - 2); the series cut in thirds"),
    "trend._transient_flat": ((2, 3), "the row's transient column; the series cut in thirds"),
    "trend._envelope_rises": ((2, 3), "the lower envelope of three thirds, which needs two values in each"),
    "trend.leak_before_oom": ((5,), "a full step row has 5 columns"),
    "trend.legacy_leak": ((2, 3), "the legacy trough rows' columns [time, floor, steps]"),
    "trend.forward_pile": ((2, 3, 4), "the forward rows' columns [forward, time, allocated, peak]"),
    "trend.piled_up": ((2, 3, 4), "the readings judged from a quarter, a half and three quarters of the way in"),
    "trend._pile": ((3, 4), "the readings cut in quarters"),
    "trend.forwards_peak": ((2, 3, 4), "the sampler readings' columns [time, allocated, peak, allocated total]"),
    "trend._falls_back": ((2,), "the readings' halves"),
    "trend.demand_rise": ((2, 3), "the rows cut in halves and thirds"),
    "trend.kept_in_window": ((2, 3), "the backward rows' columns [backward, time, allocated]"),
    "trend.since_release": ((2,), "a fall needs two points before it; half a leak's least growth"),
    "trend.plateaued": ((2,), "twice the longest wait between two highs"),
    "trend._median": ((2,), "the middle of the sorted values"),
    "trend._fit": ((2,), "a square"),
    "trend._slope": ((2,), "a line needs two points"),
    "trend._t_stat": ((0.5, 2, 3), "Student's t of a line fit: n - 2 degrees of freedom, a square root"),
    "trend._seconds_per_step": ((2,), "a step time needs two rows"),
    "diagnosis._states_rose": ((2,), "a rise needs two rows"),
    "evidence.census_facts": ((3,), "the census's three largest holders are named in every diagnosis's facts"),
    "findings.bounded_holder": ((2,), "a buffer holding at least half the growth explains it"),
    "findings.kept_tensors": ((3,), "the three largest holders are said"),
    "findings.own_children": ((4,), "the first four children are named"),
    "forecast._Rates": ((2, 32, 50), "whole steps sum exactly below 2**50; at most 32 partly counted rows a row "
                        "before the one-pass sum; a rise's two bounds"),
    "forecast._leak": ((2,), "the stairs are looked for in the last two windows of recent_rows"),
    "forecast._demand": ((2,), "the running peak's later half"),
    "forecast._fit": ((2,), "a line fit's degrees of freedom (n - 2), a square"),
    "forecast._Line": ((2,), "a square (the standard error of the line's level)"),
    "forecast._stair_reach": ((1e-09, 2), "a float's rounding below a whole jump; a change of two levels"),
    "forecast._stairs": ((3,), "the jumps are at most a third of the rows (stair_rise_share's row says so)"),
    "forecast._pace": ((4,), "the rows' quarters, the fastest of which gives the earliest step time"),
    "forecast._spread": ((2,), "a standard deviation needs two values, a square"),
    "forecast._crossing": ((0.5, 2), "a slice's midpoint; the table reaches as far below the limit as above"),
    "forecast._Crossing": ((2,), "the median (a chance of one half, log 2)"),
    "forecast._draws": ((0.5,), "an equal-chance draw sits at the middle of its share"),
    "forecast._record_rise": ((2,), "midway between two rows"),
    "forecast._none_crossed": ((0.5, 2), "the normal tail: erfc(z / sqrt 2) / 2"),
    "forecast._median": ((0.5,), "the median"),
    "diagnosis._outside_rule": ((2,), "two processes listed by NVML: another besides this one"),
    "diagnosis._model_states_order": ((2,), "bf16 parameters are half of fp32's; ZeRO stages 1 and 2"),
    "remedies.sharded": ((3,), "ZeRO stage 3 shards the parameters"),
}
"""The numbers rule functions may write inline, other than 0 and 1: shapes of the tests and of the
wire's rows, and ratios that follow from dtypes, never a judgement. ``tests/test_thresholds.py``
walks every rule function and fails on any other inline number: a judgement is a row of ``TABLE``."""

def value(name: str) -> float:
    """The threshold ``name`` as it stands now (moved by :func:`moved`, else the table's)."""
    return _moved.get(name, TABLE[name].value)


def count(name: str) -> int:
    """An integer threshold (rows, readings, steps)."""
    return round(value(name))


def moved_value(name: str, factor: float) -> float:
    """``name`` times ``factor``; a count moves by at least one."""
    row = TABLE[name]
    if not row.integer:
        return row.value * factor
    moved = float(round(row.value * factor))
    if moved == row.value:
        moved = row.value + (1 if factor > 1 else -1)
    return max(moved, 1.0)


@contextlib.contextmanager
def moved(name: str, factor: float) -> Iterator[float]:
    """Within the block, ``name`` is its table value times ``factor`` (for the sensitivity test)."""
    _moved[name] = moved_value(name, factor)
    try:
        yield _moved[name]
    finally:
        del _moved[name]


def markdown() -> str:
    """The table as ``docs/diagnosis.md`` prints it (a test checks the two agree)."""
    lines = ["| name | value | unit | used by | why this value |", "| --- | --- | --- | --- | --- |"]
    for name, t in TABLE.items():
        shown = f"{int(t.value):,}" if t.integer or t.value >= MIB else f"{t.value:g}"
        why = t.reason + (f". **Moves a verdict at ±25 %:** {t.sensitive}" if t.sensitive else "")
        lines.append(f"| `{name}` | {shown} | {t.unit} | `{t.used_by}` | {why} |")
    return "\n".join(lines) + "\n"
