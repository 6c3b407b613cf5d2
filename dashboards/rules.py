"""Recording rules: the workload label, OOM events with their cause and remedy, and
per-GPU / per-pod / per-workload aggregates that keep the cluster overview fast.

Names follow ``level:metric:operations`` (prometheus.io/docs/practices/rules): the level lists the
labels kept (``workload`` stands for workload and workload_type, ``gpu`` for gpu_uuid, ``device`` for
rank, local_rank, device and gpu_uuid; ``cluster`` is kept where present but, as in
kubernetes-mixin, not named), the metric is the exported one, the operations are the last
aggregation (``OPERATIONS``). Device-wide NVML
values are repeated by every process on a GPU, so they are aggregated with ``max by
(gpu_uuid)``; allocator values belong to one process each and are summed.
"""

from __future__ import annotations

import textwrap
from typing import Any

from dashboards import config as c
from dashboards.knob import fill, knob

OPERATIONS = {"sum", "max", "min", "count", "relabel", "max_over_time"}
OWNER = "namespace_workload_pod:oomsight_pod_owner_info:relabel"
OOM_EVENT = "namespace_workload_pod_rank_device_cause:oomsight_last_oom_timestamp_seconds:max"
GPU_RESERVED = "namespace_workload_pod_gpu:oomsight_torch_reserved_bytes:sum"
GPU_ALLOCATED = "namespace_workload_pod_gpu:oomsight_torch_allocated_bytes:sum"
GPU_PEAK_RESERVED = "namespace_workload_pod_gpu:oomsight_torch_window_peak_reserved_bytes:sum"
GPU_USED = "namespace_workload_pod_gpu:oomsight_gpu_memory_used_bytes:max"
GPU_TOTAL = "namespace_workload_pod_gpu:oomsight_gpu_memory_total_bytes:max"
GPU_HEADROOM = "namespace_workload_pod_gpu:oomsight_gpu_headroom_bytes_per_capacity_bytes:min"
GPU_DCGM_FB_USED = "namespace_workload_pod_gpu:dcgm_fi_dev_fb_used_bytes:max"
"""dcgm-exporter's framebuffer used (``DCGM_FI_DEV_FB_USED`` in MiB up to 4.8, the bytes field of 4.9+) in
bytes, per GPU of each pod that oomsight sees, joined on the GPU's UUID (dcgm's ``UUID`` = oomsight's ``gpu_uuid``)."""
POD_PEAK_RESERVED = "namespace_workload_pod:oomsight_torch_window_peak_reserved_bytes:max"
POD_HEADROOM = "namespace_workload_pod:oomsight_gpu_headroom_bytes_per_capacity_bytes:min"
POD_BUDGET = "namespace_workload_pod:oomsight_gpu_memory_budget_bytes:min"
"""The smallest GPU memory share the pod claimed through DRA (a claim names no GPU UUID, so a pod's
GPUs are each measured against the tightest of its shares); absent without a claimed share."""
GPU_PEAK_PER_BUDGET = "namespace_workload_pod_gpu:oomsight_torch_window_peak_reserved_bytes_per_budget_bytes:max"
"""Each GPU's peak reserved bytes (all the pod's processes on it) over the pod's claimed share: above 1
the pod uses memory promised to another claim."""
GPU_BUDGET_FORECAST = "namespace_workload_pod_gpu:budget_forecast_seconds:min"
"""Seconds until that peak reaches the claimed share at its growth over ``forecast_lookback``; only
where it grows and is still below the share."""
WL_RESERVED = "namespace_workload:oomsight_torch_reserved_bytes:sum"
WL_ALLOCATED = "namespace_workload:oomsight_torch_allocated_bytes:sum"
WL_USED = "namespace_workload:oomsight_gpu_memory_used_bytes:sum"
WL_TOTAL = "namespace_workload:oomsight_gpu_memory_total_bytes:sum"
WL_GPUS = "namespace_workload:oomsight_torch_reserved_bytes:count"

# Right-sizing (issue 38; docs/kubernetes.md, "Right-sizing"). ``oomsight recommend`` queries these by name:
# oomsight.tools.recommend keeps the same names (the library cannot import dashboards/), a test compares them.
RS_PEAK = "namespace_workload_pod_gpu:oomsight_torch_peak_reserved_bytes:sum"
"""The exact lifetime peak reserved of every process on each GPU (torch's own peak, never reset by
oomsight), summed; exited processes count while their series linger: their peak is final."""
RS_OUTSIDE = "namespace_workload_pod_gpu:oomsight_gpu_non_torch_bytes:sum"
"""What the allocator cannot see on each GPU (CUDA context, NCCL, cuBLAS workspaces): each process's own,
summed, where NVML lists the processes' PIDs; elsewhere a process's figure is device used minus its
reserved (the neighbours included), so the largest one counts, once."""
RS_OOM_ASK = "namespace_workload_pod_gpu:oomsight_last_oom_requested_bytes:sum"
"""The allocation that failed, of each process on the GPU that died of its OOM: such a run needed at
least its peak plus this."""
RS_NEED_GPU = "namespace_workload_pod_gpu:memory_need_bytes:sum"
"""Peak reserved + outside the allocator + the failed allocation of a run that died: the memory the
GPU's processes needed."""
RS_NEED = "namespace_workload:memory_need_bytes:max"
"""The workload's most demanding GPU now (a request is per device)."""
RS_NEED_WINDOW = "namespace_workload:memory_need_bytes:max_over_time"
"""The highest need over ``rightsizing_window``: the observed peak."""
RS_REQUEST = "namespace_workload:memory_request_bytes:max"
"""The recommended memory per GPU: the observed peak plus ``rightsizing_margin_ratio``."""
RS_GRANTED = "namespace_workload_pod_gpu:memory_granted_bytes:min"
"""What each running pod's GPU gives it now: its DRA memory claim where it has one, else the whole device
(a MIG instance is its own device)."""
RS_WASTE_GPU = "namespace_workload_pod_gpu:memory_waste_bytes:sum"
RS_WASTE = "namespace_workload:memory_waste_bytes:sum"
"""Granted minus recommended, over the workload's running GPUs (0 where the grant is below)."""

GPU_LEVEL = f"{c.WORKLOAD}, pod, gpu_uuid"
POD_LEVEL = f"{c.WORKLOAD}, pod"


def promql(text: str) -> str:
    """An expression written as an indented block, without the indentation."""
    return textwrap.dedent(text).strip()


def with_remedy(expr: str) -> str:
    """Add a ``remedy`` label from ``cause`` (config.CAUSE_REMEDY), one label_replace per cause;
    a cause missing from the table keeps its series, without a remedy."""
    lines = []
    for cause, remedy in c.CAUSE_REMEDY.items():
        text = remedy.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$")
        lines.append(f'  "remedy", "{text}", "cause", "{cause}")')
    opening = "label_replace(" * len(lines)
    return f"{opening}\n{textwrap.indent(expr, '  ')},\n" + ",\n".join(lines)


def live(metric: str) -> str:
    """Series of ``metric`` from processes that still run (exited ones linger for the retention)."""
    return f"({metric} and on ({c.PROCESS}) oomsight_process_up == 1)"


def owned(expr: str) -> str:
    """``expr`` with the pod's workload and workload_type labels."""
    return f"{expr} * on ({c.POD}) group_left ({c.OWNER_LABELS}) {OWNER}"


def owner_expr() -> str:
    """The pod's owner from the sidecar's owner info; where that is absent, the pod itself."""
    lb = c.OOM_LOOKBACK
    return promql(f"""
        group by ({c.POD}, {c.OWNER_LABELS}) (
          label_replace(
            label_replace(
              last_over_time(oomsight_pod_owner_info[{lb}])
              or on ({c.POD})
              label_replace(
                label_replace(last_over_time(oomsight_build_info[{lb}]), "owner_name", "$1", "pod", "(.+)"),
                "owner_kind", "Pod", "", ""
              ),
              "workload", "$1", "owner_name", "(.+)"
            ),
            "workload_type", "$1", "owner_kind", "(.+)"
          )
        )""")


def oom_event_expr() -> str:
    """Each device's last OOM: value = its Unix time; labels = cause, remedy, workload.

    Cause is on the left of the join (many-to-one) so two causes within the lookback never make
    the rule fail; the lookback keeps the event after a pod that died of it is gone."""
    lb = c.OOM_LOOKBACK
    joined = promql(f"""
        max by ({c.EVENT}, cause) (
          (
            last_over_time(oomsight_last_oom_cause_info[{lb}])
            * on ({c.DEVICE}) group_left ()
            last_over_time(oomsight_last_oom_timestamp_seconds[{lb}])
          )
          * on ({c.POD}) group_left ({c.OWNER_LABELS}) {OWNER}
        )""")
    return with_remedy(joined)


def dcgm_used_bytes(matcher: str = "") -> str:
    """dcgm-exporter's framebuffer used per GPU in bytes, labelled ``gpu_uuid``: the 4.9+ bytes field where
    the GPU has it, else the MiB field of older exporters times 2^20 (``or on``: never both). ``matcher``:
    one more label matcher for both forms (the dashboards' cluster)."""
    extra = f", {matcher}" if matcher else ""
    new = c.DCGM_FB_USED_BYTES[:-1] + extra + "}"
    old = f"{c.DCGM_FB_USED}{{{matcher}}}" if matcher else c.DCGM_FB_USED
    by_gpu = 'max by (cluster, gpu_uuid) (label_replace({}, "gpu_uuid", "$1", "UUID", "(.+)"))'
    return f"{by_gpu.format(new)}\nor on (cluster, gpu_uuid)\n{by_gpu.format(old)} * {c.MIB}"


def dcgm_expr() -> str:
    """Each pod's GPUs (from oomsight) with dcgm-exporter's framebuffer used of that GPU. The right
    side is one series per GPU, so pods sharing a GPU (time-slicing) each get its value."""
    used = textwrap.indent(dcgm_used_bytes(), "  ")
    return f"group by ({GPU_LEVEL}) ({GPU_RESERVED})\n* on (cluster, gpu_uuid) group_left ()\n(\n{used}\n)"


def budget_rules() -> list[dict[str, str]]:
    """Headroom and the forecast against the pod's DRA memory budget, where it claimed one."""
    lookback = c.THRESHOLDS.forecast_lookback
    per_pod = f"on ({c.POD}) group_left () {POD_BUDGET}"
    return [
        {"record": POD_BUDGET, "expr": f"min by ({POD_LEVEL}) (\n  {owned('oomsight_gpu_memory_budget_bytes')}\n)"},
        {"record": GPU_PEAK_PER_BUDGET, "expr": f"{GPU_PEAK_RESERVED}\n/ {per_pod}"},
        {
            "record": GPU_BUDGET_FORECAST,
            "expr": promql(f"""
                (({POD_BUDGET}) - on ({c.POD}) group_right () {GPU_PEAK_RESERVED})
                / (deriv({GPU_PEAK_RESERVED}[{lookback}]) > 0)
                > 0"""),
        },
    ]


def outside_expr() -> str:
    """:data:`RS_OUTSIDE`: the sum of the processes' own where NVML sees them all, else the largest."""
    own = f"(oomsight_gpu_non_torch_bytes and on ({c.DEVICE}) oomsight_gpu_process_visible == 1)"
    return promql(f"""
        sum by ({GPU_LEVEL}) (
          {owned(own)}
        )
        unless on ({GPU_LEVEL}) max by ({GPU_LEVEL}) (
          {owned("(oomsight_gpu_process_visible == 0)")}
        )
        or max by ({GPU_LEVEL}) (
          {owned("oomsight_gpu_non_torch_bytes")}
        )""")


def rightsizing_rules() -> list[dict[str, str]]:
    """Per workload and GPU: the need, its highest value over the window, the recommended request and the
    memory granted beyond it (docs/kubernetes.md, "Right-sizing")."""
    died = f"(oomsight_last_oom_requested_bytes and on ({c.DEVICE}) oomsight_oom_fatal_events_total > 0)"
    margin = knob("rightsizing_margin_ratio")
    return [
        {"record": RS_PEAK, "expr": f"sum by ({GPU_LEVEL}) (\n  {owned('oomsight_torch_peak_reserved_bytes')}\n)"},
        {"record": RS_OUTSIDE, "expr": outside_expr()},
        {"record": RS_OOM_ASK, "expr": f"sum by ({GPU_LEVEL}) (\n  {owned(died)}\n)"},
        {
            "record": RS_NEED_GPU,
            "expr": promql(f"""
                {RS_PEAK}
                + on ({GPU_LEVEL}) ({RS_OUTSIDE} or {RS_PEAK} * 0)
                + on ({GPU_LEVEL}) ({RS_OOM_ASK} or {RS_PEAK} * 0)"""),
        },
        {"record": RS_NEED, "expr": f"max by ({c.WORKLOAD}) ({RS_NEED_GPU})"},
        {"record": RS_NEED_WINDOW, "expr": f"max_over_time({RS_NEED}[{knob('rightsizing_window')}])"},
        {"record": RS_REQUEST, "expr": f"{RS_NEED_WINDOW} * (1 + {margin})"},
        {
            "record": RS_GRANTED,
            "expr": f"({GPU_TOTAL} * 0 + on ({c.POD}) group_left () {POD_BUDGET})\nor {GPU_TOTAL}",
        },
        {
            "record": RS_WASTE_GPU,
            "expr": f"clamp_min(\n  {RS_GRANTED}\n  - on ({c.WORKLOAD}) group_left () {RS_REQUEST},\n  0\n)",
        },
        {"record": RS_WASTE, "expr": f"sum by ({c.WORKLOAD}) ({RS_WASTE_GPU})"},
    ]


def gpu_rule(record: str, metric: str, how: str) -> dict[str, str]:
    return {"record": record, "expr": f"{how} by ({GPU_LEVEL}) (\n  {owned(live(metric))}\n)"}


def recording_rules() -> list[dict[str, str]]:
    """In dependency order: a group evaluates its rules one after the other."""
    return [
        {"record": OWNER, "expr": owner_expr()},
        {"record": OOM_EVENT, "expr": oom_event_expr()},
        gpu_rule(GPU_RESERVED, "oomsight_torch_reserved_bytes", "sum"),
        gpu_rule(GPU_ALLOCATED, "oomsight_torch_allocated_bytes", "sum"),
        gpu_rule(GPU_PEAK_RESERVED, "oomsight_torch_window_peak_reserved_bytes", "sum"),
        gpu_rule(GPU_USED, "oomsight_gpu_memory_used_bytes", "max"),
        gpu_rule(GPU_TOTAL, "oomsight_gpu_memory_total_bytes", "max"),
        gpu_rule(GPU_HEADROOM, c.HEADROOM_RATIO, "min"),
        {"record": GPU_DCGM_FB_USED, "expr": dcgm_expr()},
        {"record": POD_PEAK_RESERVED, "expr": f"max by ({POD_LEVEL}) ({GPU_PEAK_RESERVED})"},
        {"record": POD_HEADROOM, "expr": f"min by ({POD_LEVEL}) ({GPU_HEADROOM})"},
        *budget_rules(),
        {"record": WL_RESERVED, "expr": f"sum by ({c.WORKLOAD}) ({GPU_RESERVED})"},
        {"record": WL_ALLOCATED, "expr": f"sum by ({c.WORKLOAD}) ({GPU_ALLOCATED})"},
        {"record": WL_USED, "expr": f"sum by ({c.WORKLOAD}) ({GPU_USED})"},
        {"record": WL_TOTAL, "expr": f"sum by ({c.WORKLOAD}) ({GPU_TOTAL})"},
        {"record": WL_GPUS, "expr": f"count by ({c.WORKLOAD}) ({GPU_RESERVED})"},
        *rightsizing_rules(),
    ]


def recording_group() -> dict[str, Any]:
    """The recording rules as the plain rule file has them (thresholds filled in)."""
    return {"name": "oomsight.rules", "rules": [{**r, "expr": fill(r["expr"])} for r in recording_rules()]}
