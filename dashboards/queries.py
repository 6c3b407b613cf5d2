"""Every PromQL query of the dashboards: panels, template variables and annotations.

Layout lives in ``*.dashboard.py``; thresholds in ``config``; recorded series in ``rules``.
Grafana fills in ``$namespace`` and friends, ``$__rate_interval``, ``$__range`` and
``${__from:date:seconds}`` (the start of the time range, in Unix seconds).
"""

from __future__ import annotations

import dataclasses

from dashboards import config as c
from dashboards import rules as r


@dataclasses.dataclass(frozen=True)
class Query:
    """One panel target: an expression, its legend, and how Grafana runs it."""

    expr: str
    legend: str = "__auto"
    instant: bool = False
    table: bool = False
    """Table format: labels become columns (instant tables and the OOM event log)."""


def row(expr: str, legend: str = "__auto") -> Query:
    """A query whose result is read as table rows at the end of the range."""
    return Query(expr, legend, instant=True, table=True)


T = c.THRESHOLDS
FROM = "${__from:date:seconds}"
RANGE = "$__range"
RATE = "$__rate_interval"
STEP = "$__interval"
CL = 'cluster=~"$cluster"'
WL = f'{{{CL}, namespace=~"$namespace", workload=~"$workload"}}'
POD = f'{{{CL}, namespace=~"$namespace", pod=~"$pod"}}'
PROC = f'{{{CL}, namespace=~"$namespace", pod=~"$pod", rank=~"$rank"}}'
DEV = f'{{{CL}, namespace=~"$namespace", pod=~"$pod", rank=~"$rank", device=~"$device"}}'
EVENT = f'{{{CL}, namespace=~"$namespace", workload=~"$workload", pod=~"$pod"}}'
ID = "{{namespace}}/{{pod}} rank {{rank}} GPU {{device}}"
EVENT_LABELS = "workload, workload_type, cause, remedy"


def capacity(selector: str) -> str:
    """``config.CAPACITY`` for the series ``selector`` picks."""
    return f"(oomsight_torch_memory_limit_bytes{selector} or oomsight_gpu_memory_total_bytes{selector})"


def peak(series: str) -> str:
    """The highest sample of ``series`` (a selector) within each step of a time-series panel: with
    a step wider than the scrape interval, plain values would skip the peaks between two points."""
    return f"max_over_time({series}[{STEP}])"


def low(series: str) -> str:
    """The lowest sample within each step (for floors, as :func:`peak` for peaks)."""
    return f"min_over_time({series}[{STEP}])"


def peak_capacity(selector: str) -> str:
    limit = peak("oomsight_torch_memory_limit_bytes" + selector)
    return f"({limit} or {peak('oomsight_gpu_memory_total_bytes' + selector)})"


def ms(seconds: str) -> str:
    """A Unix time in seconds as milliseconds: Grafana reads a series value used as an annotation's
    time ("Series value as timestamp") and a table cell of unit dateTimeAsIso as ms."""
    return f"1000 * {seconds}"


# ------------------------------------------------------------------ template variables
CLUSTERS = "label_values(oomsight_build_info, cluster)"
NAMESPACES = f"label_values(oomsight_build_info{{{CL}}}, namespace)"
WORKLOADS = f'label_values({r.OWNER}{{{CL}, namespace=~"$namespace"}}, workload)'
PODS = f"label_values({r.OWNER}{WL}, pod)"
RANKS = f"label_values(oomsight_process_up{POD}, rank)"
DEVICES = f"label_values(oomsight_torch_allocated_bytes{PROC}, device)"

# ------------------------------------------------------------------ OOM events
OOM_ANNOTATION_CLUSTER = ms(f"{r.OOM_EVENT}{WL}")
OOM_ANNOTATION_POD = ms(f"{r.OOM_EVENT}{EVENT}")


def last_event(selector: str) -> str:
    """Per rank and GPU the last OOM in the time range (one series each; value = its Unix time)."""
    return f"topk by ({c.DEVICE}) (1, max_over_time({r.OOM_EVENT}{selector}[{RANGE}]) >= {FROM})"


def at_event(expr: str, selector: str = EVENT) -> str:
    """``expr`` per rank and GPU, for those with an OOM in range, labelled like the event."""
    return (
        f"max by ({c.DEVICE}) ({expr})\n"
        f"* on ({c.DEVICE}) group_left ({EVENT_LABELS})\n"
        f"({last_event(selector)} > bool 0)"
    )


def before_oom(expr: str) -> str:
    """``expr`` for the ranks and GPUs that had an OOM in range, over the whole range."""
    return f"{expr}\nand on ({c.DEVICE}) max_over_time({r.OOM_EVENT}{EVENT}[{RANGE}] @ end())"


OOM_TABLE = [
    row(ms(last_event(EVENT)), "time"),
    row(at_event(f"last_over_time(oomsight_last_oom_requested_bytes{POD}[{RANGE}])"), "requested"),
    row(at_event(f"last_over_time(oomsight_last_oom_device_free_bytes{POD}[{RANGE}])"), "free"),
    row(at_event(f"last_over_time(oomsight_oom_events_total{POD}[{RANGE}])"), "events"),
    row(at_event(f"last_over_time(oomsight_oom_fatal_events_total{POD}[{RANGE}])"), "fatal"),
]
OOM_LOG = [Query(ms(f"{r.OOM_EVENT}{EVENT}"), "{{pod}} rank {{rank}}", table=True)]
OOM_CAUSES = [
    Query(f"count by (cause) (max_over_time({r.OOM_EVENT}{WL}[{RANGE}]) >= {FROM})", "{{cause}}", instant=True)
]
OOM_RATE = [
    Query(
        f"sum by (namespace, workload) (\n"
        f'  increase(oomsight_oom_events_total{{{CL}, namespace=~"$namespace"}}[{RATE}])\n'
        f"  * on ({c.POD}) group_left (workload) {r.OWNER}{WL}\n)",
        "{{namespace}}/{{workload}}",
    )
]

# ------------------------------------------------------------------ cluster overview
FLEET_GPUS = [Query(f"sum({r.WL_GPUS}{WL})", "GPUs", instant=True)]
FLEET_USED = [Query(f"sum({r.WL_USED}{WL}) / sum({r.WL_TOTAL}{WL})", "used", instant=True)]
FLEET_RESERVED = [Query(f"sum({r.WL_RESERVED}{WL})", "reserved", instant=True)]
FLEET_OOM_PODS = [
    Query(
        f"count(count by ({c.POD}) (max_over_time({r.OOM_EVENT}{WL}[{RANGE}]) >= {FROM})) or vector(0)",
        "pods",
        instant=True,
    )
]
FLEET_FULL = [
    Query(
        f"count(min_over_time({r.GPU_HEADROOM}{WL}[{RANGE}]) < {T.near_capacity_warning_ratio}) or vector(0)",
        "GPUs",
        instant=True,
    )
]
GPU_PEAK_SHARE = f"max_over_time({r.GPU_PEAK_RESERVED}{WL}[{RANGE}])\n/ max_over_time({r.GPU_TOTAL}{WL}[{RANGE}])"
FLEET_IDLE = [Query(f"count({GPU_PEAK_SHARE} < {T.underused_peak_ratio}) or vector(0)", "GPUs", instant=True)]

RESERVED_BY_NAMESPACE = [Query(f"sum by (cluster, namespace) ({peak(r.WL_RESERVED + WL)})", "{{namespace}}")]
USED_BY_WORKLOAD = [
    Query(f"sum by (cluster, namespace, workload) ({peak(r.WL_USED + WL)})", "{{namespace}}/{{workload}}")
]
WORKLOAD_TABLE = [
    row(f"{r.WL_GPUS}{WL}", "gpus"),
    row(f"{r.WL_ALLOCATED}{WL}", "allocated"),
    row(f"{r.WL_RESERVED}{WL}", "reserved"),
    row(f"{r.WL_USED}{WL}", "used"),
    row(f"{r.WL_USED}{WL} / {r.WL_TOTAL}{WL}", "share"),
]
TOP_PEAK_PODS = [row(f"topk(10, max_over_time({r.POD_PEAK_RESERVED}{WL}[{RANGE}]))", "peak")]
NEAR_CAPACITY_PODS = [row(f"topk(10, 1 - min_over_time({r.POD_HEADROOM}{WL}[{RANGE}]))", "share")]
HEADROOM_DISTRIBUTION = [Query(f"min_over_time({r.GPU_HEADROOM}{WL}[{RANGE}])", "{{pod}} {{gpu_uuid}}", instant=True)]
IDLE_GPUS = [row(f"{GPU_PEAK_SHARE} < {T.underused_peak_ratio}", "share")]
RIGHT_SIZING = [
    row(f"{r.RS_WASTE}{WL} > 0", "waste"),
    row(f"{r.RS_REQUEST}{WL}", "recommended"),
    row(f"{r.RS_NEED_WINDOW}{WL}", "observed peak"),
    row(f"sum by ({c.WORKLOAD}) ({r.RS_GRANTED}{WL})", "granted"),
]
"""Workloads whose running GPUs grant more than the recommended request (``oomsight recommend``), by waste."""

# ------------------------------------------------------------------ workload / pod detail
TIMELINE = [
    Query(peak(f"oomsight_torch_allocated_bytes{DEV}"), f"allocated {ID}"),
    Query(peak(f"oomsight_torch_reserved_bytes{DEV}"), f"reserved {ID}"),
    Query(peak(f"oomsight_gpu_memory_used_bytes{DEV}"), f"NVML used {ID}"),
    Query(peak_capacity(DEV), f"capacity {ID}"),
    Query(
        f"predict_linear(oomsight_torch_window_peak_allocated_bytes{DEV}[{T.forecast_lookback}], "
        f"{T.forecast_horizon_minutes * 60})",
        f"forecast of peak allocated, {T.forecast_horizon_minutes} min ahead, {ID}",
    ),
]
TIME_TO_OOM = [Query(f"min by ({c.DEVICE}) (oomsight_oom_forecast_seconds{DEV})", ID, instant=True)]
HEADROOM_NOW = [Query(f"oomsight_gpu_headroom_bytes{DEV} / {capacity(DEV)}", ID, instant=True)]
STEP_PEAKS = [
    Query(
        f"{peak('oomsight_step_peak_allocated_bytes' + DEV)}\n"
        f"or on ({c.DEVICE}) {peak('oomsight_torch_window_peak_allocated_bytes' + DEV)}",
        f"step peak {ID}",
    ),
    Query(
        f"{low('oomsight_step_floor_allocated_bytes' + DEV)}\n"
        f"or on ({c.DEVICE}) {low('oomsight_torch_window_min_allocated_bytes' + DEV)}",
        f"between-steps floor {ID}",
    ),
    Query(peak(f"oomsight_torch_peak_allocated_bytes{DEV}"), f"lifetime peak {ID}"),
]
FRAGMENTATION = [Query(f"oomsight_torch_inactive_split_bytes{DEV} / oomsight_torch_reserved_bytes{DEV}", ID)]
RETRIES = [Query(f"increase(oomsight_torch_alloc_retries_total{DEV}[{RATE}])", ID)]
STEP_TIME = [
    Query(
        f"rate(oomsight_step_duration_seconds_total{PROC}[{RATE}])\n/ rate(oomsight_steps_total{PROC}[{RATE}])",
        "{{namespace}}/{{pod}} rank {{rank}}",
    )
]
CATEGORIES = [Query(peak(f"oomsight_memory_by_category_bytes{DEV}"), f"{{{{category}}}} {ID}")]
NON_TORCH = [Query(peak(f"oomsight_gpu_non_torch_bytes{DEV}"), ID)]
PROCESSES = [
    row(f"oomsight_process_up{PROC}", "up"),
    row(f"oomsight_snapshot_age_seconds{PROC}", "age"),
    row(f"oomsight_process_info{PROC}", "info"),
    row(f"oomsight_process_exit_info{PROC}", "exit"),
]

# ------------------------------------------------------------------ measured advice
LEAK_SUSPECTED = [
    Query(f"max by ({c.PROCESS}) (oomsight_leak_suspected{DEV})", "{{namespace}}/{{pod}} rank {{rank}}", instant=True)
]
LEAK_GRAPH = [Query(f"oomsight_leak_graph_bytes{PROC}", "{{namespace}}/{{pod}} rank {{rank}}")]
MAX_BATCH = [Query(f"oomsight_advice_max_batch_size{PROC}", "{{namespace}}/{{pod}} rank {{rank}}", instant=True)]

# ------------------------------------------------------------------ profiles
PROFILE_MEMORY = [row(f"oomsight_profile_op_self_cuda_memory_bytes{PROC}", "self CUDA memory")]
PROFILE_TIME = [row(f"oomsight_profile_op_self_cuda_time_seconds{PROC}", "self CUDA time")]

# ------------------------------------------------------------------ OOM forensics
BEFORE_MEMORY = [
    Query(before_oom(peak(f"oomsight_torch_allocated_bytes{POD}")), f"allocated {ID}"),
    Query(before_oom(peak(f"oomsight_torch_reserved_bytes{POD}")), f"reserved {ID}"),
    Query(before_oom(low(f"oomsight_torch_window_min_allocated_bytes{POD}")), f"between-steps floor {ID}"),
    Query(before_oom(peak_capacity(POD)), f"capacity {ID}"),
]
BEFORE_ALLOCATOR = [
    Query(before_oom(peak(f"oomsight_torch_inactive_split_bytes{POD}")), f"inactive split {ID}"),
    Query(before_oom(peak(f"oomsight_gpu_non_torch_bytes{POD}")), f"outside PyTorch {ID}"),
]

# ------------------------------------------------------------------ dcgm-exporter, where it runs
GPU_SEL = f'{{{CL}, namespace=~"$namespace", pod=~"$pod"}}'
DCGM_VS_RESERVED = [
    Query(peak(f"{r.GPU_DCGM_FB_USED}{GPU_SEL}"), "dcgm framebuffer used {{pod}} {{gpu_uuid}}"),
    Query(
        f"{peak(r.GPU_RESERVED + GPU_SEL)}\nand on (cluster, gpu_uuid) {peak(r.GPU_DCGM_FB_USED + GPU_SEL)}",
        "PyTorch reserved {{pod}} {{gpu_uuid}}",
    ),
]
# ------------------------------------------------------------------ DRA memory budget, where a pod claimed one
BUDGET_USE = [
    Query(peak(f"{r.GPU_PEAK_PER_BUDGET}{GPU_SEL}"), "{{pod}} {{gpu_uuid}}"),
]
BUDGET_FORECAST = [
    Query(f"{r.GPU_BUDGET_FORECAST}{GPU_SEL}", "{{pod}} {{gpu_uuid}}"),
]
DCGM_GPUS = [
    Query(f"count(\n{r.dcgm_used_bytes(CL)}\n)", "GPUs with dcgm framebuffer used", instant=True),
]
"""GPUs for which dcgm-exporter serves framebuffer used in either form: none means the note of the panel."""
DCGM_OUTSIDE = [
    Query(
        f"{peak(r.GPU_DCGM_FB_USED + GPU_SEL)}\n- on ({r.GPU_LEVEL}) {peak(r.GPU_RESERVED + GPU_SEL)}",
        "{{pod}} {{gpu_uuid}}",
    )
]
BEFORE_RETRIES = [
    Query(before_oom(f"increase(oomsight_torch_alloc_retries_total{POD}[{RATE}])"), f"cudaMalloc retries {ID}"),
]
