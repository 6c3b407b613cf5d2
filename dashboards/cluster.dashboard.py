"""Cluster overview: GPU memory by namespace and workload, the pods with the highest peaks and
the least headroom, GPUs whose processes peak far below capacity, and CUDA OOMs over time.

Reads only recorded series (``dashboards/rules.py``), so it stays fast on thousands of GPUs.
"""

from dashboards import config as c
from dashboards import panels as p
from dashboards import queries as q

T = c.THRESHOLDS
FULL = p.steps((p.GREEN, None), (p.ORANGE, 0.75), (p.RED, T.busy_ratio))
IDLE = p.steps((p.RED, None), (p.GREEN, T.underused_peak_ratio))
POD_LINK = c.POD_LINK
COUNT = p.steps((p.GREEN, None), (p.RED, 1))

fleet = [
    (
        p.stat(
            "GPUs reporting",
            "GPUs with at least one running PyTorch process that publishes to oomsight.",
            q.FLEET_GPUS,
            "none",
            p.steps((p.GREEN, None)),
        ),
        4,
    ),
    (
        p.stat(
            "GPU memory used",
            "NVML used memory of those GPUs as a share of their capacity, all processes included.",
            q.FLEET_USED,
            "percentunit",
            FULL,
        ),
        4,
    ),
    (
        p.stat(
            "PyTorch reserved",
            "Memory held by PyTorch's caching allocators on those GPUs.",
            q.FLEET_RESERVED,
            "bytes",
            p.steps((p.GREEN, None)),
        ),
        4,
    ),
    (
        p.stat(
            "Pods with a CUDA OOM",
            "Pods with at least one CUDA out-of-memory error in the time range.",
            q.FLEET_OOM_PODS,
            "none",
            COUNT,
        ),
        4,
    ),
    (
        p.stat(
            "GPUs nearly full",
            f"GPUs whose headroom at the step peak fell below {T.near_capacity_warning_ratio:.0%} in the time range.",
            q.FLEET_FULL,
            "none",
            COUNT,
        ),
        4,
    ),
    (
        p.stat(
            "GPUs peaking low",
            f"GPUs whose PyTorch processes never reserved {T.underused_peak_ratio:.0%} of the GPU in the time range: "
            "memory requested but idle.",
            q.FLEET_IDLE,
            "none",
            p.steps((p.GREEN, None), (p.ORANGE, 1)),
        ),
        4,
    ),
]

by_workload = [
    (
        p.timeseries(
            "PyTorch reserved memory by namespace",
            "Bytes held by the caching allocators of running processes, summed per namespace.",
            q.RESERVED_BY_NAMESPACE,
            stack=True,
        ),
        12,
    ),
    (
        p.timeseries(
            "GPU memory used by workload (NVML)",
            "Device memory in use (all processes, the CUDA context included) on the GPUs of each workload. "
            "Workload is the pod's owner; pods without owner information count as their own workload.",
            q.USED_BY_WORKLOAD,
            stack=True,
        ),
        12,
    ),
]

workloads = p.table(
    "Workloads",
    "Per workload now: GPUs, PyTorch allocated and reserved bytes, NVML used bytes and the share of GPU memory used.",
    q.WORKLOAD_TABLE,
    {
        "namespace": "namespace",
        "workload": "workload",
        "workload_type": "kind",
        "Value #A": "GPUs",
        "Value #B": "Allocated",
        "Value #C": "Reserved",
        "Value #D": "NVML used",
        "Value #E": "Used share",
    },
    [
        p.column("Allocated", "bytes"),
        p.column("Reserved", "bytes"),
        p.column("NVML used", "bytes"),
        p.column("Used share", "percentunit", FULL),
    ],
)

peaks = [
    (
        p.table(
            "Top pods by peak",
            "The 10 pods with the highest window peak of PyTorch reserved memory on one GPU in the time range.",
            q.TOP_PEAK_PODS,
            {"namespace": "namespace", "workload": "workload", "pod": "pod", "Value": "Peak reserved"},
            [p.column("Peak reserved", "bytes"), p.column("pod", link=POD_LINK)],
        ),
        8,
    ),
    (
        p.table(
            "Pods nearest capacity",
            "The 10 pods whose fullest GPU had the least headroom at its peak in the time range "
            "(share used at the peak of what its processes may use: the GPU, or their memory-fraction cap).",
            q.NEAR_CAPACITY_PODS,
            {"namespace": "namespace", "workload": "workload", "pod": "pod", "Value": "Used at peak"},
            [p.column("Used at peak", "percentunit", FULL), p.column("pod", link=POD_LINK)],
        ),
        8,
    ),
    (
        p.histogram(
            "Headroom distribution",
            "How many GPUs had how much headroom at their tightest moment in the time range "
            "(share left at the step peak of what its processes may use: the GPU, or their memory-fraction cap).",
            q.HEADROOM_DISTRIBUTION,
            "percentunit",
        ),
        8,
    ),
]

idle = p.table(
    "Requested but idle: GPUs whose processes peak far below capacity",
    f"GPUs whose PyTorch processes reserved less than {T.underused_peak_ratio:.0%} of the GPU at their highest "
    "peak in the time range: a larger batch would train faster, or a smaller GPU or MIG slice would do.",
    q.IDLE_GPUS,
    {"namespace": "namespace", "workload": "workload", "pod": "pod", "gpu_uuid": "GPU", "Value": "Peak share"},
    [p.column("Peak share", "percentunit", IDLE), p.column("pod", link=POD_LINK)],
)

right_sizing = p.table(
    "Right-sizing: workloads that would fit a smaller request",
    f"Per workload with GPUs running now: the memory they grant (a DRA claim, else the whole GPU or MIG instance) "
    f"beyond the recommended request, largest first. Recommended: the highest per-GPU need of its runs over "
    f"{T.rightsizing_window} (exact lifetime peak reserved + memory outside PyTorch's allocator + the failed "
    f"allocation of a run that died of an OOM) plus {T.rightsizing_margin_ratio:.0%}. `oomsight recommend` names "
    "the MIG profile, GPU and DRA claim that fit.",
    q.RIGHT_SIZING,
    {
        "namespace": "namespace",
        "workload": "workload",
        "workload_type": "kind",
        "Value #A": "Wasted",
        "Value #B": "Recommended",
        "Value #C": "Observed peak",
        "Value #D": "Granted now",
    },
    [
        p.column("Wasted", "bytes"),
        p.column("Recommended", "bytes"),
        p.column("Observed peak", "bytes"),
        p.column("Granted now", "bytes"),
    ],
)

ooms = [
    (
        p.timeseries(
            "CUDA OOM events by workload",
            "OOMs per interval from oomsight_oom_events_total. A counter's first sample cannot show an "
            "increase: the red annotations (from the last-OOM timestamp) mark every OOM, first ones included.",
            q.OOM_RATE,
            unit="none",
            bars=True,
        ),
        16,
    ),
    (
        p.pie(
            "OOM causes",
            "Diagnosed cause of the last OOM of each rank and GPU that ran out of memory in the time range.",
            q.OOM_CAUSES,
        ),
        8,
    ),
]

dashboard = p.dashboard(
    c.UID_CLUSTER,
    "oomsight / Cluster GPU memory",
    "GPU memory of PyTorch jobs across the cluster: usage by namespace and workload, peaks, headroom, waste "
    "and CUDA OOMs.",
    [p.variable("namespace", "Namespace", q.NAMESPACES), p.variable("workload", "Workload", q.WORKLOADS)],
    q.OOM_ANNOTATION_CLUSTER,
    [
        "Fleet",
        (4, fleet),
        "GPU memory by namespace and workload",
        (8, by_workload),
        (7, [(workloads, 24)]),
        "Peaks, headroom and waste",
        (9, peaks),
        (7, [(idle, 24)]),
        (7, [(right_sizing, 24)]),
        "CUDA out-of-memory errors",
        (8, ooms),
    ],
    q.CLUSTERS,
)
