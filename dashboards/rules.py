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

OPERATIONS = {"sum", "max", "min", "count", "relabel"}
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
    ]


def recording_group() -> dict[str, Any]:
    return {"name": "oomsight.rules", "rules": recording_rules()}
